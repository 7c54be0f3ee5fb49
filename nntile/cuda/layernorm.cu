/* LayerNorm over the last axis of a [rows, e_total] tensor whose columns are
 * split into tiles [rows, e] (twins of _core/kernels/layernorm.inc).
 * stats[rows, 2] = (mean, M2), M2 = sum of squared deviations; variance is
 * biased (M2 / e_total).  One group of threads per row. */
#include "common.cuh"

NNTILE_CUDA_BEGIN

template <typename T>
__device__ __forceinline__ double ln_rstd(const T *st_, int64_t e_total,
                                          double eps)
{
    return 1.0 / sqrt((double)ld(st_[1]) / (double)e_total + eps);
}

/* Merge this tile's columns into (mean, M2) with Chan's parallel update. */
template <int TPR, typename T>
__global__ void layernorm_stats_k(int64_t rows, int64_t e, int64_t e_offset,
                                  const T *__restrict__ x,
                                  T *__restrict__ stats)
{
    typedef C_t<T> C;
    __shared__ double sh[kBlock / 32];
    const double na = (double)e_offset, nb = (double)e;
    const double inv_nb = 1.0 / nb;
    const double nab = na + nb;
    const double wb = nb / nab, wab = na * nb / nab;
    NNTILE_ROW_LOOP(TPR, rows, r, tid, active) {
        const T *row = x + r * e;
        double s = 0.0;
        if (active)
            #pragma unroll 4
            for (int64_t j = tid; j < e; j += TPR)
                s += (double)ld(row[j]);
        const double mean_b = group_allreduce<TPR>(s, SumOp(), sh) * inv_nb;
        double q = 0.0;
        if (active)
            #pragma unroll 4
            for (int64_t j = tid; j < e; j += TPR) {
                const double d = (double)ld(row[j]) - mean_b;
                q += d * d;
            }
        const double m2_b = group_allreduce<TPR>(q, SumOp(), sh);
        if (active && tid == 0) {
            T *st_ = stats + 2 * r;
            if (e_offset == 0) {
                st_[0] = st<T>((C)mean_b);
                st_[1] = st<T>((C)m2_b);
            } else {
                const double mean_a = (double)ld(st_[0]);
                const double m2_a = (double)ld(st_[1]);
                const double delta = mean_b - mean_a;
                st_[0] = st<T>((C)(mean_a + delta * wb));
                st_[1] = st<T>((C)(m2_a + m2_b + delta * delta * wab));
            }
        }
    }
}

template <typename T>
void layernorm_stats(const nntile_layernorm_stats_args *a, cudaStream_t s,
                     const T *x, T *stats)
{
    const int64_t rows = a->rows, e = a->e;
    if (rows <= 0)
        return;
    if (e <= 0) {
        if (a->e_offset == 0)
            cudaMemsetAsync(stats, 0, (size_t)(2 * rows) * sizeof(T), s);
        return;
    }
    dispatch_tpr(e, [&](auto tpr) {
        constexpr int TPR = decltype(tpr)::value;
        layernorm_stats_k<TPR><<<row_grid(rows, TPR), kBlock, 0, s>>>(
            rows, e, a->e_offset, x, stats);
    });
}

/* y = (x - mean)*rstd*gamma + beta_ */
template <int TPR, typename T>
__global__ void layernorm_forward_k(int64_t rows, int64_t e, int64_t e_total,
                                    double eps, const T *__restrict__ x,
                                    const T *__restrict__ stats,
                                    const T *__restrict__ gamma,
                                    const T *__restrict__ beta_,
                                    T *__restrict__ y)
{
    typedef C_t<T> C;
    NNTILE_ROW_LOOP(TPR, rows, r, tid, active) {
        if (!active)
            continue;
        const C mean = ld(stats[2 * r]);
        const C rstd = (C)ln_rstd(stats + 2 * r, e_total, eps);
        const T *xr = x + r * e;
        T *yr = y + r * e;
        #pragma unroll 4
        for (int64_t j = tid; j < e; j += TPR)
            yr[j] = st<T>((ld(xr[j]) - mean) * rstd * ld(gamma[j])
                          + ld(beta_[j]));
    }
}

template <typename T>
void layernorm_forward(const nntile_layernorm_forward_args *a, cudaStream_t s,
                       const T *x, const T *stats, const T *gamma,
                       const T *beta_, T *y)
{
    if (a->rows <= 0 || a->e <= 0)
        return;
    dispatch_tpr(a->e, [&](auto tpr) {
        constexpr int TPR = decltype(tpr)::value;
        layernorm_forward_k<TPR><<<row_grid(a->rows, TPR), kBlock, 0, s>>>(
            a->rows, a->e, a->e_total, a->eps, x, stats, gamma, beta_, y);
    });
}

/* rowacc[r] (+)= (sum_j g, sum_j g*xhat), g = dy*gamma */
template <int TPR, typename T>
__global__ void layernorm_rowacc_k(int64_t rows, int64_t e, int64_t e_total,
                                   double eps, int init,
                                   const T *__restrict__ x,
                                   const T *__restrict__ dy,
                                   const T *__restrict__ stats,
                                   const T *__restrict__ gamma,
                                   T *__restrict__ rowacc)
{
    typedef C_t<T> C;
    __shared__ double sh[2][kBlock / 32];
    NNTILE_ROW_LOOP(TPR, rows, r, tid, active) {
        double a0 = 0.0, a1 = 0.0;
        if (active) {
            const C mean = ld(stats[2 * r]);
            const C rstd = (C)ln_rstd(stats + 2 * r, e_total, eps);
            const T *xr = x + r * e;
            const T *dyr = dy + r * e;
            #pragma unroll 4
            for (int64_t j = tid; j < e; j += TPR) {
                const C g = ld(dyr[j]) * ld(gamma[j]);
                const C xh = (ld(xr[j]) - mean) * rstd;
                a0 += (double)g;
                a1 += (double)(g * xh);
            }
        }
        a0 = group_allreduce<TPR>(a0, SumOp(), sh[0]);
        a1 = group_allreduce<TPR>(a1, SumOp(), sh[1]);
        if (active && tid == 0) {
            if (!init) {
                a0 += (double)ld(rowacc[2 * r]);
                a1 += (double)ld(rowacc[2 * r + 1]);
            }
            rowacc[2 * r] = st<T>((C)a0);
            rowacc[2 * r + 1] = st<T>((C)a1);
        }
    }
}

/* column sums over rows: dgamma += sum_r dy*xhat, dbeta += sum_r dy */
template <typename T> struct LnColTerm {
    const T *x, *dy, *stats;
    int64_t e, e_total;
    double eps;
    __device__ void operator()(int64_t, int64_t r, int64_t j,
                               double (&acc)[2]) const
    {
        typedef C_t<T> C;
        const C mean = ld(stats[2 * r]);
        const C rstd = (C)ln_rstd(stats + 2 * r, e_total, eps);
        const C d = ld(dy[r * e + j]);
        const C xh = (ld(x[r * e + j]) - mean) * rstd;
        acc[0] += (double)(d * xh);
        acc[1] += (double)d;
    }
};
template <typename T> struct LnColEpi {
    T *dgamma, *dbeta;
    __device__ void operator()(int64_t, int64_t j,
                               const double (&acc)[2]) const
    {
        typedef C_t<T> C;
        dgamma[j] = st<T>((C)((double)ld(dgamma[j]) + acc[0]));
        dbeta[j] = st<T>((C)((double)ld(dbeta[j]) + acc[1]));
    }
};

template <typename T>
void layernorm_backward_reduce(const nntile_layernorm_backward_reduce_args *a,
                               cudaStream_t s, const T *x, const T *dy,
                               const T *stats, const T *gamma, T *rowacc,
                               T *dgamma, T *dbeta)
{
    const int64_t rows = a->rows > 0 ? a->rows : 0, e = a->e > 0 ? a->e : 0;
    if (rows > 0)
        dispatch_tpr(e, [&](auto tpr) {
            constexpr int TPR = decltype(tpr)::value;
            layernorm_rowacc_k<TPR><<<row_grid(rows, TPR), kBlock, 0, s>>>(
                rows, e, a->e_total, a->eps, a->init != 0, x, dy, stats,
                gamma, rowacc);
        });
    colsum<2>(1, rows, e,
              LnColTerm<T>{x, dy, stats, e, a->e_total, a->eps},
              LnColEpi<T>{dgamma, dbeta}, s);
}

/* dx = rstd*(g - rowacc0/e_total - xhat*rowacc1/e_total) + beta*dx */
template <int TPR, typename T>
__global__ void layernorm_backward_k(int64_t rows, int64_t e, int64_t e_total,
                                     double eps, C_t<T> beta, int accumulate,
                                     const T *__restrict__ x,
                                     const T *__restrict__ dy,
                                     const T *__restrict__ stats,
                                     const T *__restrict__ gamma,
                                     const T *__restrict__ rowacc,
                                     T *__restrict__ dx)
{
    typedef C_t<T> C;
    const double inv_e = 1.0 / (double)e_total;
    NNTILE_ROW_LOOP(TPR, rows, r, tid, active) {
        if (!active)
            continue;
        const C mean = ld(stats[2 * r]);
        const C rstd = (C)ln_rstd(stats + 2 * r, e_total, eps);
        const C c0 = (C)((double)ld(rowacc[2 * r]) * inv_e);
        const C c1 = (C)((double)ld(rowacc[2 * r + 1]) * inv_e);
        const T *xr = x + r * e;
        const T *dyr = dy + r * e;
        T *dxr = dx + r * e;
        #pragma unroll 4
        for (int64_t j = tid; j < e; j += TPR) {
            const C xh = (ld(xr[j]) - mean) * rstd;
            const C g = ld(dyr[j]) * ld(gamma[j]);
            const C v = rstd * (g - c0 - xh * c1);
            dxr[j] = st<T>(accumulate ? v + beta * ld(dxr[j]) : v);
        }
    }
}

template <typename T>
void layernorm_backward(const nntile_layernorm_backward_args *a,
                        cudaStream_t s, const T *x, const T *dy,
                        const T *stats, const T *gamma, const T *rowacc,
                        T *dx)
{
    if (a->rows <= 0 || a->e <= 0)
        return;
    dispatch_tpr(a->e, [&](auto tpr) {
        constexpr int TPR = decltype(tpr)::value;
        layernorm_backward_k<TPR><<<row_grid(a->rows, TPR), kBlock, 0, s>>>(
            a->rows, a->e, a->e_total, a->eps, (C_t<T>)a->beta,
            a->beta != 0.0, x, dy, stats, gamma, rowacc, dx);
    });
}

NNTILE_CUDA_END

using namespace nntile_cuda;

#define EXPORT(A, T, S)                                                       \
extern "C" void nntile_cuda_layernorm_stats_##S(                              \
    const struct nntile_layernorm_stats_args *args, cudaStream_t stream,      \
    const A *x, A *stats)                                                     \
{ layernorm_stats<T>(args, stream, (const T *)x, (T *)stats); }               \
extern "C" void nntile_cuda_layernorm_forward_##S(                            \
    const struct nntile_layernorm_forward_args *args, cudaStream_t stream,    \
    const A *x, const A *stats, const A *gamma, const A *beta_, A *y)         \
{ layernorm_forward<T>(args, stream, (const T *)x, (const T *)stats,          \
                       (const T *)gamma, (const T *)beta_, (T *)y); }         \
extern "C" void nntile_cuda_layernorm_backward_reduce_##S(                    \
    const struct nntile_layernorm_backward_reduce_args *args,                 \
    cudaStream_t stream, const A *x, const A *dy, const A *stats,             \
    const A *gamma, A *rowacc, A *dgamma, A *dbeta)                           \
{ layernorm_backward_reduce<T>(args, stream, (const T *)x, (const T *)dy,     \
                               (const T *)stats, (const T *)gamma,            \
                               (T *)rowacc, (T *)dgamma, (T *)dbeta); }       \
extern "C" void nntile_cuda_layernorm_backward_##S(                           \
    const struct nntile_layernorm_backward_args *args, cudaStream_t stream,   \
    const A *x, const A *dy, const A *stats, const A *gamma,                  \
    const A *rowacc, A *dx)                                                   \
{ layernorm_backward<T>(args, stream, (const T *)x, (const T *)dy,            \
                        (const T *)stats, (const T *)gamma,                   \
                        (const T *)rowacc, (T *)dx); }

NNTILE_CUDA_INSTANTIATE(EXPORT)
