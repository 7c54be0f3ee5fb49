/* Rotary positions in place (twins of _core/kernels/rope.inc): a tile of
 * rows x heads vectors of head_dim elements, row r at position pos[r]; pair
 * j of each vector, (x[j], x[j + head_dim/2]), turns by pos * inv_freq[j].
 * A thread per (row, pair) computes the cos and sin once and turns that pair
 * of every head, four heads at a time (consecutive threads, consecutive
 * pairs: coalesced).  A template over the data type T and the inverse
 * frequencies' type A, so that mixed precision (bf16 vectors, fp32
 * frequencies) is the same function. */
#include "common.cuh"

NNTILE_CUDA_BEGIN

template <typename C> struct RopeOp {
    int64_t heads, head_dim, half;
    C scale, sign;
    template <typename A, typename T>
    __device__ void operator()(int64_t i, const int64_t *pos,
                               const A *inv_freq, T *x) const
    {
        const int64_t r = i / half, j = i - r * half;
        C c, s;
        rope_cos_sin((C)pos[r], (C)ld(inv_freq[j]), scale, &c, &s);
        s *= sign;
        T *v = x + r * heads * head_dim + j;
        int64_t h = 0;
        for (; h + 4 <= heads; h += 4, v += 4 * head_dim)
            turn<4>(v, c, s);
        for (; h < heads; ++h, v += head_dim)
            turn<1>(v, c, s);
    }
    /* the pair at v of N heads, all loaded before any is stored (the heads'
     * addresses differ by a run-time stride the compiler cannot tell apart) */
    template <int N, typename T>
    __device__ void turn(T *v, C c, C s) const
    {
        C a[N], b[N];
#pragma unroll
        for (int u = 0; u < N; ++u) {
            a[u] = (C)ld(v[u * head_dim]);
            b[u] = (C)ld(v[u * head_dim + half]);
        }
#pragma unroll
        for (int u = 0; u < N; ++u) {
            C y1, y2;
            rope_rotate(a[u], b[u], c, s, &y1, &y2);
            v[u * head_dim] = st<T>(y1);
            v[u * head_dim + half] = st<T>(y2);
        }
    }
};

template <typename Args, typename A, typename T>
void rope(const Args *a, cudaStream_t s, const int64_t *pos, const A *inv_freq,
          T *x, int sign)
{
    typedef C_t<T> C;
    const int64_t half = a->head_dim / 2;
    launch_elementwise(a->rows * half,
                       RopeOp<C>{a->heads, a->head_dim, half, (C)a->scale,
                                 (C)sign},
                       s, pos, inv_freq, x);
}

template <typename A, typename T>
void rope_forward(const nntile_rope_forward_args *a, cudaStream_t s,
                  const int64_t *pos, const A *inv_freq, T *x)
{
    rope(a, s, pos, inv_freq, x, 1);
}

template <typename A, typename T>
void rope_backward(const nntile_rope_backward_args *a, cudaStream_t s,
                   const int64_t *pos, const A *inv_freq, T *dx)
{
    rope(a, s, pos, inv_freq, dx, -1);
}

NNTILE_CUDA_END

NNTILE_CUDA_EXPORT(rope_forward)
NNTILE_CUDA_EXPORT(rope_backward)

/* mixed precision: bf16 vectors, fp32 inverse frequencies */
NNTILE_CUDA_EXPORT_MIXED(rope_forward)
NNTILE_CUDA_EXPORT_MIXED(rope_backward)
