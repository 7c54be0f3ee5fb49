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

/* a group of threads per row r of ids: dst[r] += src[id] (forward) or
 * dst[id] += src[r] (backward) */
template <bool BACKWARD> struct EmbeddingRow {
    int64_t e, v_offset, v;
    template <int TPR, typename T>
    __device__ void row(int64_t r, int tid, bool active, const int64_t *ids,
                        const T *src, T *dst) const
    {
        if (!active)
            return;
        const int64_t id = ids[r] - v_offset;
        if ((uint64_t)id >= (uint64_t)v)
            return;
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
};

template <bool BACKWARD, typename Args, typename T>
void embedding_rows(const Args *a, cudaStream_t s, const int64_t *ids,
                    const T *src, T *dst)
{
    if (a->e > 0 && a->v > 0)
        launch_rows(a->rows, a->e,
                    EmbeddingRow<BACKWARD>{a->e, a->v_offset, a->v}, s, ids,
                    src, dst);
}

template <typename T>
void embedding(const nntile_embedding_args *a, cudaStream_t s,
               const int64_t *ids, const T *table, T *dst)
{
    embedding_rows<false>(a, s, ids, table, dst);
}

template <typename T>
void embedding_backward(const nntile_embedding_backward_args *a,
                        cudaStream_t s, const int64_t *ids, const T *dy,
                        T *dtable)
{
    embedding_rows<true>(a, s, ids, dy, dtable);
}

NNTILE_CUDA_END

NNTILE_CUDA_EXPORT(embedding)
NNTILE_CUDA_EXPORT(embedding_backward)
