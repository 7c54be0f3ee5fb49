/* embedding, embedding_backward */
#define NNTILE_KERNEL_BODY "embedding.inc"
#include "instantiate.h"
