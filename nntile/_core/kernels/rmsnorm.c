/* rmsnorm_stats, rmsnorm_forward, rmsnorm_backward_reduce, rmsnorm_backward
 * (RMSNorm over the last axis, tiled over columns) */
#define NNTILE_KERNEL_BODY "rmsnorm.inc"
#include "instantiate.h"
