/* maxsumexp, softmax_inplace, softmax_backward, mask_causal, logsumexp */
#define NNTILE_KERNEL_BODY "softmax.inc"
#include "instantiate.h"
