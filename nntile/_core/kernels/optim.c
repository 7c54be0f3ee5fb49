/* adam_step, sgd_step (torch.optim.Adam/AdamW/SGD single-tensor semantics) */
#define NNTILE_KERNEL_BODY "optim.inc"
#include "instantiate.h"
