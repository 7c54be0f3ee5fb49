/* Softmax family on axis layout [m, k, n], softmax over axis k (twins of
 * _core/kernels/softmax.inc).  stats[m, n, 2] = (max, sum exp(x - max));
 * -inf entries are masked; a fully masked row gives (-inf, 0). */
#include "common.cuh"

NNTILE_CUDA_BEGIN

/* Merge a tile's (m1, s1) into the running stats st[0..1]. */
template <typename T>
__device__ void merge_stats(T *st_, C_t<T> m1, double s1, int init)
{
    C_t<T> max = m1;
    double sum = s1;
    if (!init) {
        max = ld(st_[0]);
        sum = (double)ld(st_[1]);
        merge_maxsumexp(&max, &sum, m1, s1);
    }
    st_[0] = st<T>(max);
    st_[1] = st<T>((C_t<T>)sum);
}

/* n == 1: one group of TPR threads per contiguous row of k elements.
 * Rows that stay in cache (k <= kOnlineMin) take two passes as on the CPU
 * (max, then sum of exp(x - max)).  Longer rows take one pass: each thread
 * keeps its running max mt and s = sum exp(x - mt) (rescaled in double when
 * mt grows), and the group combines (mt, s) into (M, sum s*exp(mt - M));
 * each term is then the CPU's float exp(x - shift) up to float rounding of
 * the shift. */
constexpr int64_t kOnlineMin = 8192;

template <typename T, bool ONLINE> struct MaxSumExpRow {
    int64_t k;
    int init;
    template <int TPR>
    __device__ void row(int64_t r, int tid, bool active, const T *src,
                        T *stats) const
    {
        typedef C_t<T> C;
        __shared__ C shc[kBlock / 32];
        __shared__ double shd[kBlock / 32];
        const T *x = src + r * k;
        C mt = ninf<C>();
        double s = 0.0;
        if (ONLINE) {
            if (active) {
                row_in_batches<TPR, C>(
                    k, tid, [&](int64_t j) { return ld(x[j]); },
                    [&](int64_t, C v) {
                        if (v > mt) {
                            /* mt == -inf: s == 0 and exp(-inf) == 0 */
                            s *= exp((double)mt - (double)v);
                            mt = v;
                        }
                        /* v == mt == -inf: exp_shift gives exp(-inf) = 0 */
                        s += (double)vexp(v - exp_shift(mt));
                    });
            }
        } else if (active) {
#pragma unroll 4
            for (int64_t j = tid; j < k; j += TPR) {
                const C v = ld(x[j]);
                mt = v > mt ? v : mt;
            }
        }
        const C mx = group_allreduce<TPR>(mt, MaxOp(), shc);
        if (ONLINE) {
            if (mt != ninf<C>() && mt != mx)
                s *= exp((double)mt - (double)mx);
        } else if (active) {
            const C sh = exp_shift(mx);
#pragma unroll 4
            for (int64_t j = tid; j < k; j += TPR)
                s += (double)vexp(ld(x[j]) - sh);
        }
        s = group_allreduce<TPR>(s, SumOp(), shd);
        if (active && tid == 0)
            merge_stats(stats + 2 * r, mx, s, init);
    }
};

/* all-reduce over threadIdx.y of a 32x8 block; every thread calls it */
template <typename V, typename Op>
__device__ __forceinline__ V col_allreduce(V v, Op op, V (*sh)[33])
{
    __syncthreads();
    sh[threadIdx.y][threadIdx.x] = v;
    __syncthreads();
    V r = sh[0][threadIdx.x];
#pragma unroll
    for (int t = 1; t < 8; ++t)
        r = op(r, sh[t][threadIdx.x]);
    return r;
}

/* n > 1: block 32x8, x along the contiguous l, y over j */
template <typename T>
__global__ void maxsumexp_cols_k(int64_t m, int64_t k, int64_t n, int init,
                                 const T *__restrict__ src,
                                 T *__restrict__ stats)
{
    typedef C_t<T> C;
    __shared__ C shc[8][33];
    __shared__ double shd[8][33];
    const int64_t l = (int64_t)blockIdx.x * 32 + threadIdx.x;
    const bool ok = l < n;
    for (int64_t i = blockIdx.y; i < m; i += gridDim.y) {
        const T *base = src + i * k * n + l;
        C mx = ninf<C>();
        if (ok)
            for (int64_t j = threadIdx.y; j < k; j += 8) {
                const C v = ld(base[j * n]);
                mx = v > mx ? v : mx;
            }
        mx = col_allreduce(mx, MaxOp(), shc);
        const C sh = exp_shift(mx);
        double s = 0.0;
        if (ok)
            for (int64_t j = threadIdx.y; j < k; j += 8)
                s += (double)vexp(ld(base[j * n]) - sh);
        s = col_allreduce(s, SumOp(), shd);
        if (ok && threadIdx.y == 0) {
            /* as the CPU: a shift of 0 with zero sum means the max was -inf */
            const C true_max = s == 0.0 ? ninf<C>() : sh;
            merge_stats(stats + 2 * (i * n + l), true_max, s, init);
        }
    }
}

template <typename T>
void maxsumexp(const nntile_maxsumexp_args *a, cudaStream_t s, const T *src,
               T *stats)
{
    const int64_t m = a->m, k = a->k < 0 ? 0 : a->k, n = a->n;
    const int init = a->init != 0;
    if (m <= 0 || n <= 0)
        return;
    if (n == 1) {
        if (k > kOnlineMin)
            launch_rows(m, k, MaxSumExpRow<T, true>{k, init}, s, src, stats);
        else
            launch_rows(m, k, MaxSumExpRow<T, false>{k, init}, s, src, stats);
        return;
    }
    const dim3 grid((unsigned)ceil_div(n, 32),
                    (unsigned)(m < 65535 ? m : 65535));
    maxsumexp_cols_k<<<grid, dim3(32, 8), 0, s>>>(m, k, n, init, src, stats);
}

/* dst = exp(dst - max) / sum; -inf -> 0; a fully masked row -> 0 */
template <typename T> struct SoftmaxOp {
    const T *stats;
    T *dst;
    __device__ void operator()(int64_t idx, int64_t, int64_t sl) const
    {
        typedef C_t<T> C;
        const C sh = exp_shift(ld(stats[2 * sl]));
        const C inv = inv_sum(ld(stats[2 * sl + 1]));
        dst[idx] = st<T>(vexp(ld(dst[idx]) - sh) * inv);
    }
};

/* n == 1: a group per contiguous row, row scalars computed once */
template <typename T> struct SoftmaxRow {
    int64_t k;
    template <int TPR>
    __device__ void row(int64_t r, int tid, bool active, const T *stats,
                        T *dst) const
    {
        typedef C_t<T> C;
        if (!active)
            return;
        const C sh = exp_shift(ld(stats[2 * r]));
        const C inv = inv_sum(ld(stats[2 * r + 1]));
        T *d = dst + r * k;
#pragma unroll 4
        for (int64_t j = tid; j < k; j += TPR)
            d[j] = st<T>(vexp(ld(d[j]) - sh) * inv);
    }
};

template <typename T>
void softmax_inplace(const nntile_softmax_inplace_args *a, cudaStream_t s,
                     const T *stats, T *dst)
{
    if (a->n == 1 && a->m > 0 && a->k > 0) {
        launch_rows(a->m, a->k, SoftmaxRow<T>{a->k}, s, stats, dst);
        return;
    }
    mkn(a->m, a->k, a->n, SoftmaxOp<T>{stats, dst}, s);
}

/* dp = alpha * p * (dp - sums[i,l]) */
template <typename T> struct SoftmaxBwdOp {
    const T *p, *sums;
    T *dp;
    C_t<T> alpha;
    __device__ void operator()(int64_t idx, int64_t, int64_t sl) const
    {
        dp[idx] = st<T>(alpha * ld(p[idx]) * (ld(dp[idx]) - ld(sums[sl])));
    }
};

template <typename T>
void softmax_backward(const nntile_softmax_backward_args *a, cudaStream_t s,
                      const T *p, const T *sums, T *dp)
{
    mkn(a->m, a->k, a->n, SoftmaxBwdOp<T>{p, sums, dp, (C_t<T>)a->alpha}, s);
}

/* dst[b,i,j] = -inf where key k_offset + j is hidden from query q_offset + i:
 * a group per row */
struct MaskScoresRow {
    nntile_mask_scores_args a;
    template <int TPR, typename T>
    __device__ void row(int64_t r, int tid, bool active, T *dst) const
    {
        const T v = st<T>(ninf<C_t<T>>());
        if (!active)
            return;
        const int64_t qpos = a.q_offset + r % a.tq;
        T *d = dst + r * a.tk;
        #pragma unroll 4
        for (int64_t j = tid; j < a.tk; j += TPR)
            if (!nntile_mask_visible(a.mask, qpos, a.k_offset + j))
                d[j] = v;
    }
};

template <typename T>
void mask_scores(const nntile_mask_scores_args *a, cudaStream_t s, T *dst)
{
    if (a->batch <= 0 || a->tq <= 0 || a->tk <= 0)
        return;
    launch_rows(a->batch * a->tq, a->tk, MaskScoresRow{*a}, s, dst);
}

/* dst[i] = max + log(sum) */
struct LogSumExpOp {
    template <typename T>
    __device__ void operator()(int64_t i, const T *stats, T *dst) const
    {
        dst[i] = st<T>(ld(stats[2 * i]) + m_log(ld(stats[2 * i + 1])));
    }
};

template <typename T>
void logsumexp(const nntile_logsumexp_args *a, cudaStream_t s,
               const T *stats, T *dst)
{
    launch_elementwise(a->n, LogSumExpOp(), s, stats, dst);
}

NNTILE_CUDA_END

NNTILE_CUDA_EXPORT(maxsumexp)
NNTILE_CUDA_EXPORT(softmax_inplace)
NNTILE_CUDA_EXPORT(softmax_backward)
NNTILE_CUDA_EXPORT(mask_scores)
NNTILE_CUDA_EXPORT(logsumexp)
