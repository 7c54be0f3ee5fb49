/* add_fiber, prod_fiber, sum_fiber, sumprod_fiber (axis layout [m,k,n]) */
#define NNTILE_KERNEL_BODY "fiber.inc"
#include "instantiate.h"
