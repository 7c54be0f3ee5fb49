/* gemm: (batched) C = alpha*op(A) op(B) + beta*C through CBLAS */
#define NNTILE_KERNEL_BODY "gemm.inc"
#include "instantiate.h"
