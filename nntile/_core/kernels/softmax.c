/* maxsumexp, softmax_inplace, softmax_backward, mask_scores, logsumexp */
#define NNTILE_KERNEL_BODY "softmax.inc"
#include "instantiate.h"
