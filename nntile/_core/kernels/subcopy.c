/* subcopy: copy a box between tiles of different shapes */
#define NNTILE_KERNEL_BODY "subcopy.inc"
#include "instantiate.h"
