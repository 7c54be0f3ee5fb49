/* LayerNorm over the last axis of a [rows, e_total] tensor whose columns are
 * split into tiles [rows, e] (twins of _core/kernels/layernorm.inc).
 * stats[rows, 2] = (mean, M2), M2 = sum of squared deviations; variance is
 * biased (M2 / e_total).  One group of threads per row. */
#include "common.cuh"

NNTILE_CUDA_BEGIN

/* Row r's mean and 1/std from its stats, in the compute type. */
template <typename T> struct LnNorm {
    C_t<T> mean, rstd;
    __device__ LnNorm(const T *stats, int64_t r, int64_t e_total, double eps)
        : mean(ld(stats[2 * r])),
          rstd(ln_rstd<C_t<T>>((double)ld(stats[2 * r + 1]), e_total, eps))
    {
    }
    __device__ C_t<T> xhat(T x) const { return (ld(x) - mean) * rstd; }
};

/* Merge this tile's columns into (mean, M2) with Chan's parallel update. */
struct LnStatsRow {
    int64_t e, e_offset;
    template <int TPR, typename T>
    __device__ void row(int64_t r, int tid, bool active, const T *x,
                        T *stats) const
    {
        typedef C_t<T> C;
        __shared__ double sh[kBlock / 32];
        const double na = (double)e_offset, nb = (double)e;
        const double inv_nb = 1.0 / nb;
        const double nab = na + nb;
        const double wb = nb / nab, wab = na * nb / nab;
        const T *xr = x + r * e;
        double s = 0.0;
        if (active)
            #pragma unroll 4
            for (int64_t j = tid; j < e; j += TPR)
                s += (double)ld(xr[j]);
        const double mean_b = group_allreduce<TPR>(s, SumOp(), sh) * inv_nb;
        double q = 0.0;
        if (active)
            #pragma unroll 4
            for (int64_t j = tid; j < e; j += TPR) {
                const double d = (double)ld(xr[j]) - mean_b;
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
};

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
    launch_rows(rows, e, LnStatsRow{e, a->e_offset}, s, x, stats);
}

/* y = (x - mean)*rstd*gamma + beta_ */
struct LnForwardRow {
    int64_t e, e_total;
    double eps;
    template <int TPR, typename T>
    __device__ void row(int64_t r, int tid, bool active, const T *x,
                        const T *stats, const T *gamma, const T *beta_,
                        T *y) const
    {
        if (!active)
            return;
        const LnNorm<T> nr(stats, r, e_total, eps);
        const T *xr = x + r * e;
        T *yr = y + r * e;
        #pragma unroll 4
        for (int64_t j = tid; j < e; j += TPR)
            yr[j] = st<T>(ln_y(ld(xr[j]), nr.mean, nr.rstd, ld(gamma[j]),
                               ld(beta_[j])));
    }
};

template <typename T>
void layernorm_forward(const nntile_layernorm_forward_args *a, cudaStream_t s,
                       const T *x, const T *stats, const T *gamma,
                       const T *beta_, T *y)
{
    if (a->e > 0)
        launch_rows(a->rows, a->e, LnForwardRow{a->e, a->e_total, a->eps}, s,
                    x, stats, gamma, beta_, y);
}

/* rowacc[r] (+)= (sum_j g, sum_j g*xhat), g = dy*gamma */
struct LnRowAccRow {
    int64_t e, e_total;
    double eps;
    int init;
    template <int TPR, typename T>
    __device__ void row(int64_t r, int tid, bool active, const T *x,
                        const T *dy, const T *stats, const T *gamma,
                        T *rowacc) const
    {
        typedef C_t<T> C;
        __shared__ double sh[2][kBlock / 32];
        double a0 = 0.0, a1 = 0.0;
        if (active) {
            const LnNorm<T> nr(stats, r, e_total, eps);
            const T *xr = x + r * e;
            const T *dyr = dy + r * e;
            #pragma unroll 4
            for (int64_t j = tid; j < e; j += TPR) {
                const C g = ld(dyr[j]) * ld(gamma[j]);
                a0 += (double)g;
                a1 += (double)(g * nr.xhat(xr[j]));
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
};

/* column sums over rows: dgamma += sum_r dy*xhat, dbeta += sum_r dy */
template <typename T> struct LnColTerm {
    const T *x, *dy, *stats;
    int64_t e, e_total;
    double eps;
    __device__ void operator()(int64_t, int64_t r, int64_t j,
                               double (&acc)[2]) const
    {
        typedef C_t<T> C;
        const LnNorm<T> nr(stats, r, e_total, eps);
        const C d = ld(dy[r * e + j]);
        acc[0] += (double)(d * nr.xhat(x[r * e + j]));
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
    launch_rows(rows, e, LnRowAccRow{e, a->e_total, a->eps, a->init != 0}, s,
                x, dy, stats, gamma, rowacc);
    colsum<2>(1, rows, e,
              LnColTerm<T>{x, dy, stats, e, a->e_total, a->eps},
              LnColEpi<T>{dgamma, dbeta}, s);
}

/* dx = rstd*(g - rowacc0/e_total - xhat*rowacc1/e_total) + beta*dx */
template <typename T> struct LnBackwardRow {
    int64_t e, e_total;
    double eps;
    C_t<T> beta;
    int accumulate;
    template <int TPR>
    __device__ void row(int64_t r, int tid, bool active, const T *x,
                        const T *dy, const T *stats, const T *gamma,
                        const T *rowacc, T *dx) const
    {
        typedef C_t<T> C;
        const double inv_e = 1.0 / (double)e_total;
        if (!active)
            return;
        const LnNorm<T> nr(stats, r, e_total, eps);
        const C c0 = (C)((double)ld(rowacc[2 * r]) * inv_e);
        const C c1 = (C)((double)ld(rowacc[2 * r + 1]) * inv_e);
        const T *xr = x + r * e;
        const T *dyr = dy + r * e;
        T *dxr = dx + r * e;
        #pragma unroll 4
        for (int64_t j = tid; j < e; j += TPR) {
            /* xh before g: the other order costs the fp64 kernel 6-8
             * registers (nvcc 13, sm_90) */
            const C xh = nr.xhat(xr[j]);
            const C g = ld(dyr[j]) * ld(gamma[j]);
            const C v = ln_dx(nr.rstd, g, xh, c0, c1);
            dxr[j] = st<T>(accumulate ? v + beta * ld(dxr[j]) : v);
        }
    }
};

template <typename T>
void layernorm_backward(const nntile_layernorm_backward_args *a,
                        cudaStream_t s, const T *x, const T *dy,
                        const T *stats, const T *gamma, const T *rowacc,
                        T *dx)
{
    if (a->e > 0)
        launch_rows(a->rows, a->e,
                    LnBackwardRow<T>{a->e, a->e_total, a->eps,
                                     (C_t<T>)a->beta, a->beta != 0.0},
                    s, x, dy, stats, gamma, rowacc, dx);
}

NNTILE_CUDA_END

NNTILE_CUDA_EXPORT(layernorm_stats)
NNTILE_CUDA_EXPORT(layernorm_forward)
NNTILE_CUDA_EXPORT(layernorm_backward_reduce)
NNTILE_CUDA_EXPORT(layernorm_backward)
