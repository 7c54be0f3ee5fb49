/* fill, copy, add, scal, prod, gelu(+backward), gelutanh(+backward), sumsq */
#define NNTILE_KERNEL_BODY "elementwise.inc"
#include "instantiate.h"
