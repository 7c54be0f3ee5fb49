/* RMSNorm over the last axis of a [rows, e_total] tensor whose columns are
 * split into tiles [rows, e] (twins of _core/kernels/rmsnorm.inc).
 * stats[rows] = each row's sum of x^2.  One group of threads per row; the
 * weight gradient is a column sum.  rmsnorm_forward is a template over the
 * data type T and the accumulator type A, so that one function serves the
 * plain dtypes (A = T) and mixed precision (bf16 y, fp32 x, stats, weight). */
#include "common.cuh"

NNTILE_CUDA_BEGIN

/* stats[r] (+)= sum_j x^2 */
struct RmsStatsRow {
    int64_t e;
    int init;
    template <int TPR, typename T>
    __device__ void row(int64_t r, int tid, bool active, const T *x,
                        T *stats) const
    {
        __shared__ double sh[kBlock / 32];
        const T *xr = x + r * e;
        double s = 0.0;
        if (active)
            #pragma unroll 4
            for (int64_t j = tid; j < e; j += TPR) {
                const double v = (double)ld(xr[j]);
                s += v * v;
            }
        s = group_allreduce<TPR>(s, SumOp(), sh);
        if (active && tid == 0)
            stats[r] = st<T>((C_t<T>)(init ? s : s + (double)ld(stats[r])));
    }
};

template <typename T>
void rmsnorm_stats(const nntile_rmsnorm_stats_args *a, cudaStream_t s,
                   const T *x, T *stats)
{
    const int64_t rows = a->rows, e = a->e > 0 ? a->e : 0;
    launch_rows(rows, e, RmsStatsRow{e, a->init != 0}, s, x, stats);
}

/* y = weight * xhat, xhat = x * rstd rounded to x's type (transformers) */
struct RmsForwardRow {
    int64_t e, e_total;
    double eps;
    template <int TPR, typename A, typename T>
    __device__ void row(int64_t r, int tid, bool active, const A *x,
                        const A *stats, const A *weight, T *y) const
    {
        typedef C_t<A> C;
        if (!active)
            return;
        const C rstd = rms_rstd<C>((double)ld(stats[r]), e_total, eps);
        const A *xr = x + r * e;
        T *yr = y + r * e;
        #pragma unroll 4
        for (int64_t j = tid; j < e; j += TPR) {
            const C xhat = ld(st<A>(ld(xr[j]) * rstd));
            yr[j] = st<T>(ld(weight[j]) * xhat);
        }
    }
};

template <typename A, typename T>
void rmsnorm_forward(const nntile_rmsnorm_forward_args *a, cudaStream_t s,
                     const A *x, const A *stats, const A *weight, T *y)
{
    if (a->e > 0)
        launch_rows(a->rows, a->e, RmsForwardRow{a->e, a->e_total, a->eps}, s,
                    x, stats, weight, y);
}

/* rowacc[r] (+)= sum_j g*xhat, g = dy*weight */
struct RmsRowAccRow {
    int64_t e, e_total;
    double eps;
    int init;
    template <int TPR, typename T>
    __device__ void row(int64_t r, int tid, bool active, const T *x,
                        const T *dy, const T *stats, const T *weight,
                        T *rowacc) const
    {
        typedef C_t<T> C;
        __shared__ double sh[kBlock / 32];
        double acc = 0.0;
        if (active) {
            const C rstd = rms_rstd<C>((double)ld(stats[r]), e_total, eps);
            const T *xr = x + r * e;
            const T *dyr = dy + r * e;
            #pragma unroll 4
            for (int64_t j = tid; j < e; j += TPR) {
                const C xhat = ld(xr[j]) * rstd;
                acc += (double)(ld(dyr[j]) * ld(weight[j]) * xhat);
            }
        }
        acc = group_allreduce<TPR>(acc, SumOp(), sh);
        if (active && tid == 0) {
            if (!init)
                acc += (double)ld(rowacc[r]);
            rowacc[r] = st<T>((C)acc);
        }
    }
};

/* column sums over rows: dweight += sum_r dy*xhat */
template <typename T> struct RmsColTerm {
    const T *x, *dy, *stats;
    int64_t e, e_total;
    double eps;
    __device__ void operator()(int64_t, int64_t r, int64_t j,
                               double (&acc)[1]) const
    {
        typedef C_t<T> C;
        const C rstd = rms_rstd<C>((double)ld(stats[r]), e_total, eps);
        acc[0] += (double)(ld(dy[r * e + j]) * (ld(x[r * e + j]) * rstd));
    }
};
template <typename T> struct RmsColEpi {
    T *dweight;
    __device__ void operator()(int64_t, int64_t j,
                               const double (&acc)[1]) const
    {
        dweight[j] = st<T>((C_t<T>)((double)ld(dweight[j]) + acc[0]));
    }
};

template <typename T>
void rmsnorm_backward_reduce(const nntile_rmsnorm_backward_reduce_args *a,
                             cudaStream_t s, const T *x, const T *dy,
                             const T *stats, const T *weight, T *rowacc,
                             T *dweight)
{
    const int64_t rows = a->rows > 0 ? a->rows : 0, e = a->e > 0 ? a->e : 0;
    launch_rows(rows, e, RmsRowAccRow{e, a->e_total, a->eps, a->init != 0}, s,
                x, dy, stats, weight, rowacc);
    colsum<1>(1, rows, e, RmsColTerm<T>{x, dy, stats, e, a->e_total, a->eps},
              RmsColEpi<T>{dweight}, s);
}

/* dx = rstd*(g - xhat*rowacc/e_total) + beta*dx */
template <typename T> struct RmsBackwardRow {
    int64_t e, e_total;
    double eps;
    C_t<T> beta;
    int accumulate;
    template <int TPR>
    __device__ void row(int64_t r, int tid, bool active, const T *x,
                        const T *dy, const T *stats, const T *weight,
                        const T *rowacc, T *dx) const
    {
        typedef C_t<T> C;
        if (!active)
            return;
        const C rstd = rms_rstd<C>((double)ld(stats[r]), e_total, eps);
        const C c = (C)((double)ld(rowacc[r]) / (double)e_total);
        const T *xr = x + r * e;
        const T *dyr = dy + r * e;
        T *dxr = dx + r * e;
        #pragma unroll 4
        for (int64_t j = tid; j < e; j += TPR) {
            const C v = rms_dx(rstd, ld(dyr[j]) * ld(weight[j]),
                               ld(xr[j]) * rstd, c);
            dxr[j] = st<T>(accumulate ? v + beta * ld(dxr[j]) : v);
        }
    }
};

template <typename T>
void rmsnorm_backward(const nntile_rmsnorm_backward_args *a, cudaStream_t s,
                      const T *x, const T *dy, const T *stats,
                      const T *weight, const T *rowacc, T *dx)
{
    if (a->e > 0)
        launch_rows(a->rows, a->e,
                    RmsBackwardRow<T>{a->e, a->e_total, a->eps,
                                      (C_t<T>)a->beta, a->beta != 0.0},
                    s, x, dy, stats, weight, rowacc, dx);
}

NNTILE_CUDA_END

NNTILE_CUDA_EXPORT(rmsnorm_stats)
NNTILE_CUDA_EXPORT(rmsnorm_forward)
NNTILE_CUDA_EXPORT(rmsnorm_backward_reduce)
NNTILE_CUDA_EXPORT(rmsnorm_backward)

/* mixed precision: fp32 x, stats and weight, bf16 y */
extern "C" void nntile_cuda_rmsnorm_forward_bf16_fp32(
    const struct nntile_rmsnorm_forward_args *args, cudaStream_t stream,
    const float *x, const float *stats, const float *weight, uint16_t *y)
{
    nntile_cuda::rmsnorm_forward(args, stream, x, stats, weight,
                                 nntile_cuda::storage(y));
}
