/* Slice kernels on axis layout [m, k, n] (twins of _core/kernels/slice.inc);
 * a slice is [m, n] (axis k removed). */
#include "common.cuh"

NNTILE_CUDA_BEGIN

template <bool PROD, typename T, typename Args>
void slice_reduce(const Args *a, cudaStream_t s, const T *s1, const T *s2,
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

template <typename T>
void sum_slice(const nntile_sum_slice_args *a, cudaStream_t s, const T *src,
               T *dst)
{
    slice_reduce<false, T>(a, s, src, nullptr, dst);
}

template <typename T>
void sumprod_slice(const nntile_sumprod_slice_args *a, cudaStream_t s,
                   const T *s1, const T *s2, T *dst)
{
    slice_reduce<true>(a, s, s1, s2, dst);
}

/* dst[i,j,l] = alpha*src[i,l] + beta*dst[i,j,l] */
template <typename T>
void add_slice(const nntile_add_slice_args *a, cudaStream_t s, const T *src,
               T *dst)
{
    add_bcast<false>(a, s, src, dst);
}

/* dst[i,j,l] *= alpha*src[i,l] */
template <typename T>
void prod_slice(const nntile_prod_slice_args *a, cudaStream_t s,
                const T *src, T *dst)
{
    prod_bcast<false>(a, s, src, dst);
}

NNTILE_CUDA_END

NNTILE_CUDA_EXPORT(sum_slice)
NNTILE_CUDA_EXPORT(sumprod_slice)
NNTILE_CUDA_EXPORT(add_slice)
NNTILE_CUDA_EXPORT(prod_slice)
