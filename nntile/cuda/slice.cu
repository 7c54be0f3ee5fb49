/* Slice kernels on axis layout [m, k, n] (twins of _core/kernels/slice.inc);
 * a slice is [m, n] (axis k removed). */
#include "common.cuh"

NNTILE_CUDA_BEGIN

template <typename T, bool PROD>
void slice_reduce(int64_t m, int64_t k, int64_t n, double alpha, double beta,
                  const T *s1, const T *s2, T *dst, cudaStream_t s)
{
    if (m <= 0 || n <= 0)
        return;
    if (k < 0)
        k = 0;
    const AxpbyEpi<T> epi{dst, alpha, beta, n};
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
    slice_reduce<T, false>(a->m, a->k, a->n, a->alpha, a->beta, src, nullptr,
                           dst, s);
}

template <typename T>
void sumprod_slice(const nntile_sumprod_slice_args *a, cudaStream_t s,
                   const T *s1, const T *s2, T *dst)
{
    slice_reduce<T, true>(a->m, a->k, a->n, a->alpha, a->beta, s1, s2, dst,
                          s);
}

/* dst[i,j,l] = alpha*src[i,l] + beta*dst[i,j,l] */
template <typename T> struct AddSliceOp {
    const T *src;
    T *dst;
    C_t<T> alpha, beta;
    int accumulate;
    __device__ void operator()(int64_t idx, int64_t, int64_t sl) const
    {
        const C_t<T> a = alpha * ld(src[sl]);
        dst[idx] = st<T>(accumulate ? a + beta * ld(dst[idx]) : a);
    }
};

template <typename T>
void add_slice(const nntile_add_slice_args *a, cudaStream_t s, const T *src,
               T *dst)
{
    mkn(a->m, a->k, a->n,
        AddSliceOp<T>{src, dst, (C_t<T>)a->alpha, (C_t<T>)a->beta,
                      a->beta != 0.0}, s);
}

/* dst[i,j,l] *= alpha*src[i,l] */
template <typename T> struct ProdSliceOp {
    const T *src;
    T *dst;
    C_t<T> alpha;
    __device__ void operator()(int64_t idx, int64_t, int64_t sl) const
    {
        dst[idx] = st<T>(alpha * ld(src[sl]) * ld(dst[idx]));
    }
};

template <typename T>
void prod_slice(const nntile_prod_slice_args *a, cudaStream_t s,
                const T *src, T *dst)
{
    mkn(a->m, a->k, a->n, ProdSliceOp<T>{src, dst, (C_t<T>)a->alpha}, s);
}

NNTILE_CUDA_END

using namespace nntile_cuda;

#define EXPORT(A, T, S)                                                       \
extern "C" void nntile_cuda_sum_slice_##S(                                    \
    const struct nntile_sum_slice_args *args, cudaStream_t stream,            \
    const A *src, A *dst)                                                     \
{ sum_slice<T>(args, stream, (const T *)src, (T *)dst); }                     \
extern "C" void nntile_cuda_sumprod_slice_##S(                                \
    const struct nntile_sumprod_slice_args *args, cudaStream_t stream,        \
    const A *src1, const A *src2, A *dst)                                     \
{ sumprod_slice<T>(args, stream, (const T *)src1, (const T *)src2,            \
                   (T *)dst); }                                               \
extern "C" void nntile_cuda_add_slice_##S(                                    \
    const struct nntile_add_slice_args *args, cudaStream_t stream,            \
    const A *src, A *dst)                                                     \
{ add_slice<T>(args, stream, (const T *)src, (T *)dst); }                     \
extern "C" void nntile_cuda_prod_slice_##S(                                   \
    const struct nntile_prod_slice_args *args, cudaStream_t stream,           \
    const A *src, A *dst)                                                     \
{ prod_slice<T>(args, stream, (const T *)src, (T *)dst); }

NNTILE_CUDA_INSTANTIATE(EXPORT)
