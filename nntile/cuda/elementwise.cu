/* Element-wise kernels (twins of _core/kernels/elementwise.inc).  Each op is
 * an op struct that computes element i; launch_elementwise (common.cuh)
 * launches it. */
#include "common.cuh"

NNTILE_CUDA_BEGIN

template <typename T> struct FillOp {
    T v;
    __device__ void operator()(int64_t i, T *dst) const { dst[i] = v; }
};

template <typename T>
void fill(const nntile_fill_args *a, cudaStream_t s, T *dst)
{
    launch_elementwise(a->n, FillOp<T>{st<T>((C_t<T>)a->value)}, s, dst);
}

template <typename T>
void copy(const nntile_copy_args *a, cudaStream_t s, const T *src, T *dst)
{
    if (a->n > 0)
        cudaMemcpyAsync(dst, src, (size_t)a->n * sizeof(T),
                        cudaMemcpyDeviceToDevice, s);
}

/* plain dtypes (S = D) and mixed precision (a bf16 branch into the fp32
 * stream) alike */
template <typename S, typename D>
void add(const nntile_add_args *a, cudaStream_t s, const S *src, D *dst)
{
    launch_elementwise(a->n, AddOp<C_t<D>>(a->alpha, a->beta), s, src, dst);
}

/* dst = alpha*src + beta*base, dst a buffer of its own (no load waits on a
 * store); plain dtypes (S = A) and mixed precision (a bf16 branch, the fp32
 * stream) alike */
template <typename C> struct AddOutOp {
    C alpha, beta;
    template <typename S, typename A>
    __device__ void operator()(int64_t i, const S *src, const A *base,
                               A *dst) const
    {
        dst[i] = st<A>(alpha * (C)ld(src[i]) + beta * (C)ld(base[i]));
    }
};

template <typename S, typename A>
void add_out(const nntile_add_out_args *a, cudaStream_t s, const S *src,
             const A *base, A *dst)
{
    launch_elementwise(a->n, AddOutOp<C_t<A>>{(C_t<A>)a->alpha,
                                              (C_t<A>)a->beta},
                       s, src, base, dst);
}

template <typename T> struct ScalOp {
    C_t<T> alpha;
    __device__ void operator()(int64_t i, T *dst) const
    {
        dst[i] = st<T>(alpha * ld(dst[i]));
    }
};

template <typename T>
void scal(const nntile_scal_args *a, cudaStream_t s, T *dst)
{
    launch_elementwise(a->n, ScalOp<T>{(C_t<T>)a->alpha}, s, dst);
}

template <typename T> struct ProdOp {
    C_t<T> alpha;
    __device__ void operator()(int64_t i, const T *s1, const T *s2,
                               T *dst) const
    {
        dst[i] = st<T>(alpha * ld(s1[i]) * ld(s2[i]));
    }
};

template <typename T>
void prod(const nntile_prod_args *a, cudaStream_t s, const T *s1,
          const T *s2, T *dst)
{
    launch_elementwise(a->n, ProdOp<T>{(C_t<T>)a->alpha}, s, s1, s2, dst);
}

/* The activations of the op table (X_ACT): Act_<act> holds f and f' (the
 * formulas act and act_deriv); ActOp<F> stores dst = f(src) and
 * ActBackwardOp<F> dx = dy * f'(x) + beta*dx (dx not read when beta == 0). */
#define NNTILE_CUDA_ACT(X, act, columns)                                    \
    struct Act_##act {                                                      \
        template <typename C> __device__ C f(C x) const { return act(x); }  \
        template <typename C> __device__ C df(C x) const                    \
        {                                                                   \
            return act##_deriv(x);                                          \
        }                                                                   \
    };
NNTILE_OPS(NNTILE_NO_OP, NNTILE_NO_OP, NNTILE_NO_OP, NNTILE_NO_OP,
           NNTILE_CUDA_ACT)
#undef NNTILE_CUDA_ACT

template <typename F> struct ActOp {
    template <typename T>
    __device__ void operator()(int64_t i, const T *src, T *dst) const
    {
        dst[i] = st<T>(F().f(ld(src[i])));
    }
};

template <typename F, typename T> struct ActBackwardOp {
    C_t<T> beta;
    int accumulate;
    __device__ void operator()(int64_t i, const T *x, const T *dy,
                               T *dx) const
    {
        const C_t<T> d = F().df(ld(x[i]));
        const C_t<T> g = ld(dy[i]) * d;
        dx[i] = st<T>(accumulate ? g + beta * ld(dx[i]) : g);
    }
};

template <typename F, typename Args, typename T>
void act_backward(const Args *a, cudaStream_t s, const T *x, const T *dy,
                  T *dx)
{
    launch_elementwise(a->n,
                       ActBackwardOp<F, T>{(C_t<T>)a->beta, a->beta != 0.0},
                       s, x, dy, dx);
}

/* h = silu(gate) * up, silu(gate) rounded to the data type first (as the
 * CPU and transformers) */
struct SwiGluOp {
    template <typename T>
    __device__ void operator()(int64_t i, const T *gate, const T *up,
                               T *h) const
    {
        h[i] = st<T>(ld(st<T>(silu(ld(gate[i])))) * ld(up[i]));
    }
};

/* dgate = dh * up * silu'(gate), dup = dh * silu(gate) */
struct SwiGluBackwardOp {
    template <typename T>
    __device__ void operator()(int64_t i, const T *gate, const T *up,
                               const T *dh, T *dgate, T *dup) const
    {
        C_t<T> dg, du;
        swiglu_grad(ld(gate[i]), ld(up[i]), ld(dh[i]), &dg, &du);
        dgate[i] = st<T>(dg);
        dup[i] = st<T>(du);
    }
};

/* dst[0] = sum src^2 + beta*dst[0] */
template <typename T> struct SumsqTerm {
    const T *src;
    __device__ void operator()(int64_t i, double (&acc)[1]) const
    {
        const double x = (double)ld(src[i]);
        acc[0] += x * x;
    }
};
template <typename T> struct SumsqEpi {
    T *dst;
    double beta;
    __device__ void operator()(const double (&acc)[1]) const
    {
        double s = acc[0];
        if (beta != 0.0)
            s += beta * (double)ld(dst[0]);
        dst[0] = st<T>((C_t<T>)s);
    }
};

template <typename T>
void sumsq(const nntile_sumsq_args *a, cudaStream_t s, const T *src, T *dst)
{
    flat_reduce<1>(a->n > 0 ? a->n : 0, SumsqTerm<T>{src},
                   SumsqEpi<T>{dst, a->beta}, s);
}

NNTILE_CUDA_END

NNTILE_CUDA_EXPORT(fill)
NNTILE_CUDA_EXPORT(copy)
NNTILE_CUDA_EXPORT(add)
NNTILE_CUDA_EXPORT_MIXED(add)
NNTILE_CUDA_EXPORT(add_out)
NNTILE_CUDA_EXPORT_MIXED(add_out)
NNTILE_CUDA_EXPORT(scal)
NNTILE_CUDA_EXPORT(prod)
#define NNTILE_CUDA_EXPORT_ACT(X, act, columns)                             \
    NNTILE_CUDA_EXPORT_BUFFERS(                                             \
        act, nntile_cuda::over_n<nntile_cuda::ActOp<nntile_cuda::Act_##act>>, \
        NNTILE_ACT_BUFFERS)                                                 \
    NNTILE_CUDA_EXPORT_BUFFERS(                                             \
        act##_backward, nntile_cuda::act_backward<nntile_cuda::Act_##act>,  \
        NNTILE_ACT_BACKWARD_BUFFERS)
NNTILE_OPS(NNTILE_NO_OP, NNTILE_NO_OP, NNTILE_NO_OP, NNTILE_NO_OP,
           NNTILE_CUDA_EXPORT_ACT)
NNTILE_CUDA_EXPORT_AS(swiglu_forward,
                      nntile_cuda::over_n<nntile_cuda::SwiGluOp>)
NNTILE_CUDA_EXPORT_AS(swiglu_backward,
                      nntile_cuda::over_n<nntile_cuda::SwiGluBackwardOp>)
NNTILE_CUDA_EXPORT(sumsq)
