/* rope_forward, rope_backward (rotary positions) */
#define NNTILE_KERNEL_BODY "rope.inc"
#include "instantiate.h"
