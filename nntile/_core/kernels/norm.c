/* layernorm_* and rmsnorm_*: stats, forward, backward_reduce, backward
 * (normalisation over the last axis, tiled over columns) */
#define NNTILE_KERNEL_BODY "norm.inc"
#include "instantiate.h"
