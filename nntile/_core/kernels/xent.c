/* xent_picked, xent_loss, xent_grad_inplace (cross-entropy over vocab tiles) */
#define NNTILE_KERNEL_BODY "xent.inc"
#include "instantiate.h"
