/* flash_forward, flash_backward (fused attention, see kernels.h) */
#define NNTILE_KERNEL_BODY "flash.inc"
#include "instantiate.h"
