/* LayerNorm and RMSNorm over the last axis of a [rows, e_total] tensor whose
 * columns are split into tiles [rows, e] (twins of _core/kernels/norm.inc).
 * One design with two statistics:
 *   LayerNorm: stats[rows, 2] = (mean, M2), M2 = sum of squared deviations
 *              (biased variance M2 / e_total); xhat = (x - mean) * rstd;
 *   RMSNorm:   stats[rows] = sum of x^2; xhat = x * rstd.
 * Backward is shared: with g = dy * weight, each row sums its statistic's
 * terms into rowacc (LayerNorm: g and g*xhat; RMSNorm: g*xhat), the weights'
 * gradients are column sums (LayerNorm: dy*xhat and dy; RMSNorm: dy*xhat),
 * and dx comes from g, xhat and the row's sums.  One group of threads per
 * row. */
#include "common.cuh"

NNTILE_CUDA_BEGIN

/* LayerNorm's row r: its mean and 1/std from its stats, in the compute
 * type, and the terms of backward. */
template <typename T> struct LnRow {
    typedef C_t<T> C;
    static constexpr int kTerms = 2;
    C mean, rstd;
    __device__ LnRow(const T *stats, int64_t r, int64_t e_total, double eps)
        : mean(ld(stats[2 * r])),
          rstd(norm_rstd<C>((double)ld(stats[2 * r + 1]), e_total, eps))
    {
    }
    __device__ C xhat(T x) const { return (ld(x) - mean) * rstd; }
    /* rowacc's terms: sum g, sum g*xhat, g = dy*weight (g loaded first: the
     * order each statistic had when written apart, and its register count) */
    __device__ void row_terms(T x, T dy, T weight, double (&a)[2]) const
    {
        const C g = ld(dy) * ld(weight);
        a[0] += (double)g;
        a[1] += (double)(g * xhat(x));
    }
    /* the weights' gradient terms: dgamma, dbeta */
    __device__ static void col_terms(C d, C xh, double (&a)[2])
    {
        a[0] += (double)(d * xh);
        a[1] += (double)d;
    }
    /* dx = rstd*(g - rowacc0/e_total - xhat*rowacc1/e_total) */
    struct Dx {
        C rstd, c0, c1;
        __device__ Dx(const LnRow &nr, const T *rowacc, int64_t r,
                      int64_t e_total)
            : rstd(nr.rstd),
              c0((C)((double)ld(rowacc[2 * r]) * (1.0 / (double)e_total))),
              c1((C)((double)ld(rowacc[2 * r + 1]) * (1.0 / (double)e_total)))
        {
        }
        __device__ C operator()(C g, C xh) const
        {
            return ln_dx(rstd, g, xh, c0, c1);
        }
    };
};

/* RMSNorm's row r: its 1/rms from its stats, and the terms of backward. */
template <typename T> struct RmsRow {
    typedef C_t<T> C;
    static constexpr int kTerms = 1;
    C rstd;
    __device__ RmsRow(const T *stats, int64_t r, int64_t e_total, double eps)
        : rstd(norm_rstd<C>((double)ld(stats[r]), e_total, eps))
    {
    }
    __device__ C xhat(T x) const { return ld(x) * rstd; }
    /* rowacc's term: sum g*xhat, g = dy*weight (xhat loaded first, for the same reason) */
    __device__ void row_terms(T x, T dy, T weight, double (&a)[1]) const
    {
        const C xh = xhat(x);
        a[0] += (double)(ld(dy) * ld(weight) * xh);
    }
    /* the weight's gradient term: dweight */
    __device__ static void col_terms(C d, C xh, double (&a)[1])
    {
        a[0] += (double)(d * xh);
    }
    /* dx = rstd*(g - xhat*rowacc/e_total) */
    struct Dx {
        C rstd, c;
        __device__ Dx(const RmsRow &nr, const T *rowacc, int64_t r,
                      int64_t e_total)
            : rstd(nr.rstd), c((C)((double)ld(rowacc[r]) / (double)e_total))
        {
        }
        __device__ C operator()(C g, C xh) const
        {
            return rms_dx(rstd, g, xh, c);
        }
    };
};

/* LayerNorm: merge this tile's columns into (mean, M2) with Chan's parallel
 * update. */
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

/* RMSNorm: stats[r] (+)= sum_j x^2 */
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

/* LayerNorm: y = (x - mean)*rstd*gamma + beta_ */
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
        const LnRow<T> nr(stats, r, e_total, eps);
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

/* RMSNorm: y = weight * xhat, xhat = x * rstd rounded to x's type
 * (transformers).  A template over the data type T and the accumulator
 * type A: the plain dtypes (A = T) and mixed precision (bf16 y, fp32 x,
 * stats, weight). */
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
        const C rstd = RmsRow<A>(stats, r, e_total, eps).rstd;
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

/* a = the row's sums of Row's terms, g = dy*weight, in every thread of the
 * row's group (each row's statistics kept where there is scratch for them) */
template <int TPR, template <typename> class Row, typename T>
__device__ void norm_row_sums(int64_t r, int tid, bool active, int64_t e, int64_t e_total,
                              double eps, const T *x, const T *dy, const T *stats,
                              const T *weight, Row<T> *kept,
                              double (&a)[Row<T>::kTerms])
{
    constexpr int K = Row<T>::kTerms;
    __shared__ double sh[K][kBlock / 32];
    #pragma unroll
    for (int k = 0; k < K; ++k)
        a[k] = 0.0;
    if (active) {
        const Row<T> nr(stats, r, e_total, eps);
        if (kept != nullptr && tid == 0)
            kept[r] = nr;
        const T *xr = x + r * e;
        const T *dyr = dy + r * e;
        #pragma unroll 4
        for (int64_t j = tid; j < e; j += TPR)
            nr.row_terms(xr[j], dyr[j], weight[j], a);
    }
    #pragma unroll
    for (int k = 0; k < K; ++k)
        a[k] = group_allreduce<TPR>(a[k], SumOp(), sh[k]);
}

/* a dx element: v, + beta*dx where accumulating */
template <typename T>
__device__ __forceinline__ void store_dx(T *out, C_t<T> v, C_t<T> beta, int accumulate)
{
    *out = st<T>(accumulate ? v + beta * ld(*out) : v);
}

/* Row's dx coefficients of a row in one tile from its sums a, rounded to T as
 * rowacc would hold them: the two ops' arithmetic */
template <template <typename> class Row, typename T>
__device__ __forceinline__ typename Row<T>::Dx whole_row_dx(const Row<T> &nr,
                                                            const double (&a)[Row<T>::kTerms],
                                                            int64_t e)
{
    T sums[Row<T>::kTerms];
    #pragma unroll
    for (int k = 0; k < Row<T>::kTerms; ++k)
        sums[k] = st<T>((C_t<T>)a[k]);
    return typename Row<T>::Dx(nr, sums, 0, e);
}

/* row r of dx = Row's dx from g, xhat and the row's coefficients (dx_of),
 * + beta*dx where accumulating */
template <int TPR, template <typename> class Row, typename T>
__device__ void norm_row_dx(int64_t r, int tid, int64_t e, const Row<T> &nr,
                            const typename Row<T>::Dx &dx_of, const T *x, const T *dy,
                            const T *weight, C_t<T> beta, int accumulate, T *dx)
{
    typedef C_t<T> C;
    const T *xr = x + r * e;
    const T *dyr = dy + r * e;
    T *dxr = dx + r * e;
    #pragma unroll 4
    for (int64_t j = tid; j < e; j += TPR) {
        /* xh before g: the other order costs LayerNorm's fp64 kernel 6-8
         * registers (nvcc 13, sm_90) */
        const C xh = nr.xhat(xr[j]);
        const C g = ld(dyr[j]) * ld(weight[j]);
        store_dx(dxr + j, dx_of(g, xh), beta, accumulate);
    }
}

/* rowacc[r] (+)= the row's sums of Row's terms */
template <template <typename> class Row> struct NormRowAccRow {
    int64_t e, e_total;
    double eps;
    int init;
    template <int TPR, typename T>
    __device__ void row(int64_t r, int tid, bool active, const T *x,
                        const T *dy, const T *stats, const T *weight,
                        T *rowacc, Row<T> *kept) const
    {
        typedef C_t<T> C;
        constexpr int K = Row<T>::kTerms;
        double a[K];
        norm_row_sums<TPR>(r, tid, active, e, e_total, eps, x, dy, stats, weight, kept, a);
        if (active && tid == 0) {
            if (!init)
                #pragma unroll
                for (int k = 0; k < K; ++k)
                    a[k] += (double)ld(rowacc[K * r + k]);
            #pragma unroll
            for (int k = 0; k < K; ++k)
                rowacc[K * r + k] = st<T>((C)a[k]);
        }
    }
};

/* the weights' gradients, column sums over rows of Row's terms.  A row's
 * statistics come from ``kept`` (NormRowAccRow's, once per row) where there
 * was scratch for them: made again for each element, their square root and
 * division in double cost the sums four times their memory time. */
template <template <typename> class Row, typename T> struct NormColTerm {
    static constexpr int K = Row<T>::kTerms;
    const T *x, *dy, *stats;
    const Row<T> *kept;
    int64_t e, e_total;
    double eps;
    __device__ void operator()(int64_t, int64_t r, int64_t j,
                               double (&acc)[K]) const
    {
        const Row<T> nr = kept ? kept[r] : Row<T>(stats, r, e_total, eps);
        const C_t<T> d = ld(dy[r * e + j]);
        Row<T>::col_terms(d, nr.xhat(x[r * e + j]), acc);
    }
};
template <typename T, int K> struct NormColEpi {
    T *dweight[K];
    __device__ void operator()(int64_t, int64_t j,
                               const double (&acc)[K]) const
    {
        #pragma unroll
        for (int k = 0; k < K; ++k)
            dweight[k][j] =
                st<T>((C_t<T>)((double)ld(dweight[k][j]) + acc[k]));
    }
};

/* A row pass (row_op over x, dy, stats, weight and out, keeping each row's
 * statistics where there is scratch for them), then the weights' gradients,
 * column sums of Row's terms (epi adds them) */
template <template <typename> class Row, typename T, typename RowOp>
void norm_rows_then_columns(RowOp row_op, int64_t rows, int64_t e, int64_t e_total,
                            double eps, cudaStream_t s, const T *x, const T *dy,
                            const T *stats, const T *weight, T *out,
                            NormColEpi<T, Row<T>::kTerms> epi)
{
    Scratch rows_kept((size_t)rows * sizeof(Row<T>), s);
    Row<T> *kept = (Row<T> *)rows_kept.ptr;
    launch_rows(rows, e, row_op, s, x, dy, stats, weight, out, kept);
    colsum<Row<T>::kTerms>(1, rows, e,
                           NormColTerm<Row, T>{x, dy, stats, kept, e, e_total, eps}, epi, s);
}

/* LayerNorm: dweights = (dgamma, dbeta); RMSNorm: (dweight) */
template <template <typename> class Row, typename T, typename... D>
void norm_backward_reduce(const nntile_norm_backward_reduce_args *a, cudaStream_t s, const T *x,
                          const T *dy, const T *stats, const T *weight,
                          T *rowacc, D *...dweights)
{
    constexpr int K = Row<T>::kTerms;
    static_assert(sizeof...(D) == K, "one weight gradient per term");
    const int64_t rows = a->rows > 0 ? a->rows : 0, e = a->e > 0 ? a->e : 0;
    norm_rows_then_columns<Row>(NormRowAccRow<Row>{e, a->e_total, a->eps, a->init != 0}, rows,
                                e, a->e_total, a->eps, s, x, dy, stats, weight, rowacc,
                                NormColEpi<T, K>{{dweights...}});
}

/* dx = Row's dx from g, xhat and rowacc, + beta*dx */
template <template <typename> class Row, typename T> struct NormBackwardRow {
    int64_t e, e_total;
    double eps;
    C_t<T> beta;
    int accumulate;
    template <int TPR>
    __device__ void row(int64_t r, int tid, bool active, const T *x,
                        const T *dy, const T *stats, const T *weight,
                        const T *rowacc, T *dx) const
    {
        if (!active)
            return;
        const Row<T> nr(stats, r, e_total, eps);
        const typename Row<T>::Dx dx_of(nr, rowacc, r, e_total);
        norm_row_dx<TPR>(r, tid, e, nr, dx_of, x, dy, weight, beta, accumulate, dx);
    }
};

template <template <typename> class Row, typename T>
void norm_backward(const nntile_norm_backward_args *a, cudaStream_t s, const T *x, const T *dy,
                   const T *stats, const T *weight, const T *rowacc, T *dx)
{
    if (a->e > 0)
        launch_rows(a->rows, a->e,
                    NormBackwardRow<Row, T>{a->e, a->e_total, a->eps,
                                            (C_t<T>)a->beta, a->beta != 0.0},
                    s, x, dy, stats, weight, rowacc, dx);
}

/* Rows in one tile (e == e_total), for norm_backward_whole where its
 * one-pass kernel does not run: NormRowAccRow's sums, rounded to T as
 * rowacc would hold them, then NormBackwardRow's dx, in one pass over each
 * row (its second read of x and dy comes from cache); the weights'
 * gradients are backward_reduce's column sums: the two ops' arithmetic. */
template <template <typename> class Row, typename T> struct NormWholeRow {
    int64_t e;
    double eps;
    C_t<T> beta;
    int accumulate;
    template <int TPR>
    __device__ void row(int64_t r, int tid, bool active, const T *x,
                        const T *dy, const T *stats, const T *weight, T *dx,
                        Row<T> *kept) const
    {
        double a[Row<T>::kTerms];
        norm_row_sums<TPR>(r, tid, active, e, e, eps, x, dy, stats, weight, kept, a);
        if (!active)
            return;
        const Row<T> nr(stats, r, e, eps);
        norm_row_dx<TPR>(r, tid, e, nr, whole_row_dx(nr, a, e), x, dy, weight, beta,
                         accumulate, dx);
    }
};

/* Rows in one tile (e == e_total), one row at a time over a whole block,
 * held in registers (V elements a thread, columns tid + v*kBlock): the row's
 * sums of Row's terms, rounded to T as rowacc would hold them, then
 * NormBackwardRow's dx from the same registers, and the weights' gradient
 * terms added into the thread's own columns.  Each block writes its column
 * sums as colsum_k's partials and colsum_finish_k adds them: x and dy are
 * read once, where the row pass and column sums read them twice.  As many
 * blocks as run at once, so as few partials as keep every SM busy. */
template <template <typename> class Row, typename T, int V>
__global__ void __launch_bounds__(kBlock)
    norm_whole_k(int64_t rows, int64_t e, double eps, C_t<T> beta, int accumulate, const T *x,
                 const T *dy, const T *stats, const T *weight, T *dx, double *partial)
{
    typedef C_t<T> C;
    constexpr int K = Row<T>::kTerms;
    __shared__ double sh[K][kBlock / 32];
    const int tid = threadIdx.x;
    T w[V];
    double cols[V][K];
    #pragma unroll
    for (int v = 0; v < V; ++v) {
        const int64_t j = tid + (int64_t)v * kBlock;
        w[v] = j < e ? weight[j] : T();
        #pragma unroll
        for (int k = 0; k < K; ++k)
            cols[v][k] = 0.0;
    }
    for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
        T xs[V], ds[V];
        #pragma unroll
        for (int v = 0; v < V; ++v) {
            const int64_t j = tid + (int64_t)v * kBlock;
            xs[v] = j < e ? x[r * e + j] : T();
            ds[v] = j < e ? dy[r * e + j] : T();
        }
        const Row<T> nr(stats, r, e, eps);
        double a[K] = {};
        #pragma unroll
        for (int v = 0; v < V; ++v)
            if (tid + (int64_t)v * kBlock < e)
                nr.row_terms(xs[v], ds[v], w[v], a);
        #pragma unroll
        for (int k = 0; k < K; ++k)
            a[k] = group_allreduce<kBlock>(a[k], SumOp(), sh[k]);
        const typename Row<T>::Dx dx_of = whole_row_dx(nr, a, e);
        #pragma unroll
        for (int v = 0; v < V; ++v) {
            const int64_t j = tid + (int64_t)v * kBlock;
            if (j >= e)
                continue;
            const C xh = nr.xhat(xs[v]);
            const C d = ld(ds[v]);
            store_dx(dx + r * e + j, dx_of(d * ld(w[v]), xh), beta, accumulate);
            Row<T>::col_terms(d, xh, cols[v]);
        }
    }
    #pragma unroll
    for (int v = 0; v < V; ++v) {
        const int64_t j = tid + (int64_t)v * kBlock;
        if (j < e)
            #pragma unroll
            for (int k = 0; k < K; ++k)
                partial[((int64_t)blockIdx.x * K + k) * e + j] = cols[v][k];
    }
}

/* Rows of 1025 to 4096 elements (8 or 16 a thread) take the one-pass kernel
 * where the partials' scratch was had.  Shorter rows keep its blocks waiting
 * on each row's sums (LayerNorm at 8192 x 768: 98 us against 91 us for
 * backward_reduce and backward), so they, longer rows and a failed scratch
 * take a row pass (the same row helpers through launch_rows), then colsum's
 * column sums. */
template <template <typename> class Row, typename T, int V>
bool norm_backward_one_pass(const nntile_norm_backward_args *a, cudaStream_t s,
                            const T *x, const T *dy, const T *stats, const T *weight,
                            NormColEpi<T, Row<T>::kTerms> dweights, T *dx)
{
    constexpr int K = Row<T>::kTerms;
    const int64_t rows = a->rows, e = a->e;
    const int64_t blocks =
        std::min<int64_t>(rows, resident_blocks(norm_whole_k<Row, T, V>, kBlock));
    Scratch part((size_t)blocks * K * e * sizeof(double), s);
    if (!part.ptr)
        return false;
    norm_whole_k<Row, T, V><<<(unsigned)blocks, kBlock, 0, s>>>(
        rows, e, a->eps, (C_t<T>)a->beta, a->beta != 0.0, x, dy, stats, weight, dx,
        (double *)part.ptr);
    colsum_finish_k<K><<<grid_for(e), kBlock, 0, s>>>(1, e, (int)blocks, (double *)part.ptr,
                                                      dweights);
    return true;
}

template <template <typename> class Row, typename T>
void norm_backward_whole(const nntile_norm_backward_args *a, cudaStream_t s, const T *x,
                         const T *dy, const T *stats, const T *weight,
                         NormColEpi<T, Row<T>::kTerms> dweights, T *dx)
{
    const int64_t rows = a->rows > 0 ? a->rows : 0, e = a->e > 0 ? a->e : 0;
    if (rows == 0 || e == 0)
        return;
    if (e > 4 * kBlock && e <= 16 * kBlock
        && (e <= 8 * kBlock
                ? norm_backward_one_pass<Row, T, 8>(a, s, x, dy, stats, weight, dweights, dx)
                : norm_backward_one_pass<Row, T, 16>(a, s, x, dy, stats, weight, dweights, dx)))
        return;
    norm_rows_then_columns<Row>(
        NormWholeRow<Row, T>{e, a->eps, (C_t<T>)a->beta, a->beta != 0.0}, rows, e, e, a->eps,
        s, x, dy, stats, weight, dx, dweights);
}

template <typename T>
void layernorm_backward_whole(const nntile_norm_backward_args *a, cudaStream_t s,
                              const T *x, const T *dy, const T *stats, const T *gamma,
                              T *dgamma, T *dbeta, T *dx)
{
    norm_backward_whole<LnRow>(a, s, x, dy, stats, gamma, {{dgamma, dbeta}}, dx);
}

template <typename T>
void rmsnorm_backward_whole(const nntile_norm_backward_args *a, cudaStream_t s,
                            const T *x, const T *dy, const T *stats, const T *weight,
                            T *dweight, T *dx)
{
    norm_backward_whole<RmsRow>(a, s, x, dy, stats, weight, {{dweight}}, dx);
}

NNTILE_CUDA_END

/* a norm's four ops: its statistics and forward, and the shared backward */
#define NNTILE_NORM_EXPORT(norm, Row)                                         \
    NNTILE_CUDA_EXPORT(norm##_stats)                                          \
    NNTILE_CUDA_EXPORT(norm##_forward)                                        \
    NNTILE_CUDA_EXPORT_AS(norm##_backward_reduce,                             \
                          nntile_cuda::norm_backward_reduce<nntile_cuda::Row>) \
    NNTILE_CUDA_EXPORT_AS(norm##_backward,                                    \
                          nntile_cuda::norm_backward<nntile_cuda::Row>)
NNTILE_NORM_EXPORT(layernorm, LnRow)
NNTILE_NORM_EXPORT(rmsnorm, RmsRow)
NNTILE_CUDA_EXPORT(layernorm_backward_whole)
NNTILE_CUDA_EXPORT(rmsnorm_backward_whole)

/* mixed precision: fp32 x, stats and weight, bf16 y */
NNTILE_CUDA_EXPORT_MIXED(rmsnorm_forward)
