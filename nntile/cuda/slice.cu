/* Slice kernels on axis layout [m, k, n] (twins of _core/kernels/slice.inc);
 * a slice is [m, n] (axis k removed). */
#include "common.cuh"

NNTILE_CUDA_BEGIN

/* sum_slice and sumprod_slice (sum_of in common.cuh) */
struct SliceSum {
    template <bool PROD, typename Args, typename T>
    static void run(const Args *a, cudaStream_t s, const T *s1, const T *s2,
                    T *dst)
    {
        const int64_t m = a->m, k = a->k > 0 ? a->k : 0, n = a->n;
        if (m <= 0 || n <= 0)
            return;
        const AxpbyEpi<T> epi{dst, a->alpha, a->beta, n};
        const SumTerm<T, PROD> term{s1, s2, k, n};
        if (n == 1) {
            if (m == 1)
                flat_reduce<1>(k, term, epi, s); /* one long row: all blocks */
            else
                rowsum<1>(m, k, term, epi, s);
            return;
        }
        colsum<1>(m, k, n, term, epi, s);
    }
};

NNTILE_CUDA_END

NNTILE_CUDA_EXPORT_AS(sum_slice, nntile_cuda::sum_of<nntile_cuda::SliceSum>)
NNTILE_CUDA_EXPORT_AS(sumprod_slice,
                      nntile_cuda::sum_of<nntile_cuda::SliceSum>)
/* dst[i,j,l] = alpha*src[i,l] + beta*dst[i,j,l] */
NNTILE_CUDA_EXPORT_AS(add_slice, nntile_cuda::add_bcast<false>)
/* dst[i,j,l] *= alpha*src[i,l] */
NNTILE_CUDA_EXPORT_AS(prod_slice, nntile_cuda::prod_bcast<false>)
