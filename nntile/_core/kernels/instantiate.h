/* Instantiates a type-generic kernel body once per dtype.
 *
 * Usage in a kernel translation unit:
 *     #define NNTILE_KERNEL_BODY "elementwise.inc"
 *     #include "instantiate.h"
 *
 * The body sees, for each instantiation:
 *   T          storage type of tensor elements (the data buffers)
 *   ACC        storage type of the accumulator buffers: statistics, reduced
 *              slices and fibers, GEMM outputs that accumulate (see
 *              README.md); T itself except in the mixed instantiation
 *   C          compute type (float for fp32 and bf16, double for fp64)
 *   LOAD(x)    T -> C conversion,  STORE(x)  C -> T conversion,
 *   LOAD_ACC(x), STORE_ACC(x): the same for ACC,
 *   STORE_DOUBLE(x) double -> T rounded once (for scalar arguments)
 *   FN(op)     -> nntile_kernel_<op>_<suffix>
 *   PRIV(name) -> nntile_priv_<name>_<suffix> (for static helpers)
 *   EXP LOG ERF TANH SQRT COS SIN: libm functions in the compute type
 *   VEXP       vectorisable exp in the compute type (see common.h)
 *   CBLAS_GEMM: cblas_sgemm / cblas_dgemm (blas.h) for the dtypes that CBLAS stores
 *              (left undefined for bf16: gemm.inc then converts to float
 *              scratch and calls cblas_sgemm)
 * plus the per-dtype reduction helpers from reduce.inc.
 * Reductions accumulate in double for every dtype.
 */
#include "common.h"
#include "blas.h"

#ifndef NNTILE_KERNEL_BODY
#error "define NNTILE_KERNEL_BODY before including instantiate.h"
#endif

#define FN(op) NNTILE_CAT(NNTILE_CAT(nntile_kernel_, op), NNTILE_CAT(_, SUFFIX))
#define PRIV(name) NNTILE_CAT(NNTILE_CAT(nntile_priv_, name), NNTILE_CAT(_, SUFFIX))

/* ---------------- fp32 ---------------- */
#define T float
#define ACC float
#define C float
#define SUFFIX fp32
#define LOAD(x) ((float)(x))
#define STORE(x) ((float)(x))
#define LOAD_ACC LOAD
#define STORE_ACC STORE
#define STORE_DOUBLE(x) ((float)(x))
#include "float_math.h"
#define CBLAS_GEMM NNTILE_BLAS(cblas_sgemm)
#include "instantiate_one.h"

/* ---------------- fp64 ---------------- */
#define T double
#define ACC double
#define C double
#define SUFFIX fp64
#define LOAD(x) ((double)(x))
#define STORE(x) ((double)(x))
#define LOAD_ACC LOAD
#define STORE_ACC STORE
#define STORE_DOUBLE(x) ((double)(x))
#define EXP exp
#define VEXP nntile_vexp
#define LOG log
#define ERF erf
#define TANH tanh
#define SQRT sqrt
#define COS cos
#define SIN sin
#define CBLAS_GEMM NNTILE_BLAS(cblas_dgemm)
#include "instantiate_one.h"

/* ---------------- bf16 ----------------
 * Storage: bfloat16 bits in uint16_t; every operation computes in float
 * (LOAD is exact, STORE rounds to nearest even once per stored value). */
#define T uint16_t
#define ACC uint16_t
#define C float
#define SUFFIX bf16
#define LOAD(x) nntile_bf16_to_float(x)
#define STORE(x) nntile_float_to_bf16((float)(x))
#define LOAD_ACC LOAD
#define STORE_ACC STORE
#define STORE_DOUBLE(x) nntile_double_to_bf16(x)
#include "float_math.h"
#include "instantiate_one.h"

/* ---------------- bf16 data, fp32 accumulators (mixed precision) ----------
 * The data buffers hold bfloat16 bits as above; the accumulator buffers (ACC)
 * are float, so statistics, reductions and GEMM outputs that sum many terms
 * are stored without a bf16 rounding. */
#define T uint16_t
#define ACC float
#define C float
#define SUFFIX bf16_fp32
#define LOAD(x) nntile_bf16_to_float(x)
#define STORE(x) nntile_float_to_bf16((float)(x))
#define LOAD_ACC(x) ((float)(x))
#define STORE_ACC(x) ((float)(x))
#define STORE_DOUBLE(x) nntile_double_to_bf16(x)
#include "float_math.h"
#include "instantiate_one.h"

#undef FN
#undef PRIV
