/* sum_slice, sumprod_slice, add_slice, prod_slice (axis layout [m,k,n]) */
#define NNTILE_KERNEL_BODY "slice.inc"
#include "instantiate.h"
