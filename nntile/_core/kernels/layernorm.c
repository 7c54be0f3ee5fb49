/* layernorm_stats, layernorm_forward, layernorm_backward_reduce,
 * layernorm_backward (normalisation over the last axis, tiled over columns) */
#define NNTILE_KERNEL_BODY "layernorm.inc"
#include "instantiate.h"
