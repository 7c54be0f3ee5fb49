/* fill, copy, add, add_out, cast, scal, prod, the activations (and their backward),
 * swiglu_forward, swiglu_backward, sumsq */
#define NNTILE_KERNEL_BODY "elementwise.inc"
#include "instantiate.h"
