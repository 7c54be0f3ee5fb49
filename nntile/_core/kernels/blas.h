/* The CBLAS of the CPU kernels. The scipy-openblas32 wheel (find_blas.py) exports and declares
 * its functions under a prefix only (scipy_cblas_sgemm, scipy_openblas_set_num_threads), so that
 * it never clashes with another BLAS in the process (numpy's, a system OpenBLAS): the build
 * defines BLAS_SYMBOL_PREFIX, and NNTILE_BLAS(cblas_sgemm) names the function. Left undefined
 * (a plain OpenBLAS, as some tests compile the kernels against), the names are CBLAS's own. */
#ifndef NNTILE_KERNELS_BLAS_H
#define NNTILE_KERNELS_BLAS_H

#include <cblas.h>

#ifndef BLAS_SYMBOL_PREFIX
#define BLAS_SYMBOL_PREFIX
#endif
#define NNTILE_BLAS_PASTE(prefix, name) prefix##name
#define NNTILE_BLAS_EXPAND(prefix, name) NNTILE_BLAS_PASTE(prefix, name)
#define NNTILE_BLAS(name) NNTILE_BLAS_EXPAND(BLAS_SYMBOL_PREFIX, name)

#endif
