/* One instantiation of a kernel body for the dtype macros that instantiate.h has just
 * defined (T, C, SUFFIX, LOAD, STORE, ...); they are undefined again for the next dtype.
 * Deliberately without include guard: included once per dtype. */
#include "reduce.inc"
#include "formulas.h"
#include NNTILE_KERNEL_BODY
#undef T
#undef ACC
#undef C
#undef SUFFIX
#undef LOAD
#undef STORE
#undef LOAD_ACC
#undef STORE_ACC
#undef STORE_DOUBLE
#undef EXP
#undef VEXP
#undef LOG
#undef ERF
#undef TANH
#undef SQRT
#undef COS
#undef SIN
#undef CBLAS_GEMM
