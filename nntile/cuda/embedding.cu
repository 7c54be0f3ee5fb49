/* Embedding lookup (twins of _core/kernels/embedding.inc): table tile [v, e]
 * covers vocabulary rows [v_offset, v_offset + v); ids outside are skipped.
 * dst += table[id] (forward), dtable[id] += dy (backward, atomics because
 * ids may repeat). */
#include "common.cuh"

NNTILE_CUDA_BEGIN

__device__ __forceinline__ void atomic_add(float *p, float v)
{
    atomicAdd(p, v);
}
__device__ __forceinline__ void atomic_add(double *p, double v)
{
    atomicAdd(p, v);
}
__device__ __forceinline__ void atomic_add(bf16 *p, float v)
{
    atomicAdd(p, __float2bfloat16_rn(v));
}

template <int TPR, bool BACKWARD, typename T>
__global__ void embedding_k(int64_t rows, int64_t e, int64_t v_offset,
                            int64_t v, const int64_t *__restrict__ ids,
                            const T *__restrict__ src, T *__restrict__ dst)
{
    NNTILE_ROW_LOOP(TPR, rows, r, tid, active) {
        if (!active)
            continue;
        const int64_t id = ids[r] - v_offset;
        if ((uint64_t)id >= (uint64_t)v)
            continue;
        if (BACKWARD) {
            const T *g = src + r * e;
            T *d = dst + id * e;
            #pragma unroll 4
            for (int64_t c = tid; c < e; c += TPR)
                atomic_add(d + c, ld(g[c]));
        } else {
            const T *t = src + id * e;
            T *d = dst + r * e;
            #pragma unroll 4
            for (int64_t c = tid; c < e; c += TPR)
                d[c] = st<T>(ld(d[c]) + ld(t[c]));
        }
    }
}

template <bool BACKWARD, typename T>
void embedding_launch(int64_t rows, int64_t e, int64_t v_offset, int64_t v,
                      const int64_t *ids, const T *src, T *dst, cudaStream_t s)
{
    if (rows <= 0 || e <= 0 || v <= 0)
        return;
    dispatch_tpr(e, [&](auto tpr) {
        constexpr int TPR = decltype(tpr)::value;
        embedding_k<TPR, BACKWARD><<<row_grid(rows, TPR), kBlock, 0, s>>>(
            rows, e, v_offset, v, ids, src, dst);
    });
}

NNTILE_CUDA_END

using namespace nntile_cuda;

#define EXPORT(A, T, S)                                                       \
extern "C" void nntile_cuda_embedding_##S(                                    \
    const struct nntile_embedding_args *args, cudaStream_t stream,            \
    const int64_t *ids, const A *table, A *dst)                               \
{ embedding_launch<false, T>(args->rows, args->e, args->v_offset, args->v,    \
                             ids, (const T *)table, (T *)dst, stream); }      \
extern "C" void nntile_cuda_embedding_backward_##S(                           \
    const struct nntile_embedding_backward_args *args, cudaStream_t stream,   \
    const int64_t *ids, const A *dy, A *dtable)                               \
{ embedding_launch<true, T>(args->rows, args->e, args->v_offset, args->v,     \
                            ids, (const T *)dy, (T *)dtable, stream); }

NNTILE_CUDA_INSTANTIATE(EXPORT)
