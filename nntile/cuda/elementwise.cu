/* Element-wise kernels (twins of _core/kernels/elementwise.inc). */
#include "common.cuh"

NNTILE_CUDA_BEGIN

template <typename T>
__global__ void fill_k(int64_t n, T v, T *__restrict__ dst)
{
    NNTILE_GRID_STRIDE(int64_t, i, n)
        dst[i] = v;
}

template <typename T>
void fill(const nntile_fill_args *a, cudaStream_t s, T *dst)
{
    if (a->n <= 0)
        return;
    const T v = st<T>((C_t<T>)a->value);
    fill_k<<<grid_for(a->n), kBlock, 0, s>>>(a->n, v, dst);
}

template <typename T>
void copy(const nntile_copy_args *a, cudaStream_t s, const T *src, T *dst)
{
    if (a->n > 0)
        cudaMemcpyAsync(dst, src, (size_t)a->n * sizeof(T),
                        cudaMemcpyDeviceToDevice, s);
}

/* mode: 0 dst = alpha*src, 1 dst = alpha*src + dst, 2 general beta */
template <typename T>
__global__ void add_k(int64_t n, C_t<T> alpha, C_t<T> beta, int mode,
                      const T *__restrict__ src, T *__restrict__ dst)
{
    NNTILE_GRID_STRIDE(int64_t, i, n) {
        const C_t<T> x = alpha * ld(src[i]);
        if (mode == 0)
            dst[i] = st<T>(x);
        else if (mode == 1)
            dst[i] = st<T>(x + ld(dst[i]));
        else
            dst[i] = st<T>(x + beta * ld(dst[i]));
    }
}

template <typename T>
void add(const nntile_add_args *a, cudaStream_t s, const T *src, T *dst)
{
    if (a->n <= 0)
        return;
    const int mode = a->beta == 0.0 ? 0 : (a->beta == 1.0 ? 1 : 2);
    add_k<<<grid_for(a->n), kBlock, 0, s>>>(a->n, (C_t<T>)a->alpha,
                                            (C_t<T>)a->beta, mode, src, dst);
}

template <typename T>
__global__ void scal_k(int64_t n, C_t<T> alpha, T *__restrict__ dst)
{
    NNTILE_GRID_STRIDE(int64_t, i, n)
        dst[i] = st<T>(alpha * ld(dst[i]));
}

template <typename T>
void scal(const nntile_scal_args *a, cudaStream_t s, T *dst)
{
    if (a->n <= 0)
        return;
    scal_k<<<grid_for(a->n), kBlock, 0, s>>>(a->n, (C_t<T>)a->alpha, dst);
}

template <typename T>
__global__ void prod_k(int64_t n, C_t<T> alpha, const T *__restrict__ s1,
                       const T *__restrict__ s2, T *__restrict__ dst)
{
    NNTILE_GRID_STRIDE(int64_t, i, n)
        dst[i] = st<T>(alpha * ld(s1[i]) * ld(s2[i]));
}

template <typename T>
void prod(const nntile_prod_args *a, cudaStream_t s, const T *s1,
          const T *s2, T *dst)
{
    if (a->n <= 0)
        return;
    prod_k<<<grid_for(a->n), kBlock, 0, s>>>(a->n, (C_t<T>)a->alpha, s1, s2,
                                             dst);
}

/* GELU (exact): 0.5 x (1 + erf(x/sqrt(2))) */
template <typename T>
__global__ void gelu_k(int64_t n, const T *__restrict__ src,
                       T *__restrict__ dst)
{
    typedef C_t<T> C;
    const C inv_sqrt2 = (C)0.70710678118654752440;
    NNTILE_GRID_STRIDE(int64_t, i, n) {
        const C x = ld(src[i]);
        dst[i] = st<T>((C)0.5 * x * ((C)1 + m_erf(x * inv_sqrt2)));
    }
}

template <typename T>
void gelu(const nntile_gelu_args *a, cudaStream_t s, const T *src, T *dst)
{
    if (a->n <= 0)
        return;
    gelu_k<<<grid_for(a->n), kBlock, 0, s>>>(a->n, src, dst);
}

template <typename T>
__global__ void gelu_backward_k(int64_t n, C_t<T> beta, int accumulate,
                                const T *__restrict__ x_,
                                const T *__restrict__ dy, T *__restrict__ dx)
{
    typedef C_t<T> C;
    const C inv_sqrt2 = (C)0.70710678118654752440;
    const C inv_sqrt2pi = (C)0.39894228040143267794;
    NNTILE_GRID_STRIDE(int64_t, i, n) {
        const C x = ld(x_[i]);
        const C d = (C)0.5 * ((C)1 + m_erf(x * inv_sqrt2))
                  + x * inv_sqrt2pi * vexp((C)-0.5 * x * x);
        const C g = ld(dy[i]) * d;
        dx[i] = st<T>(accumulate ? g + beta * ld(dx[i]) : g);
    }
}

template <typename T>
void gelu_backward(const nntile_gelu_backward_args *a, cudaStream_t s,
                   const T *x, const T *dy, T *dx)
{
    if (a->n <= 0)
        return;
    gelu_backward_k<<<grid_for(a->n), kBlock, 0, s>>>(
        a->n, (C_t<T>)a->beta, a->beta != 0.0, x, dy, dx);
}

/* x * sigmoid(2u), u = sqrt(2/pi) (x + 0.044715 x^3) */
template <typename T>
__global__ void gelutanh_k(int64_t n, const T *__restrict__ src,
                           T *__restrict__ dst)
{
    typedef C_t<T> C;
    const C k2 = (C)(-2 * 0.79788456080286535588);
    const C k1 = (C)0.044715;
    NNTILE_GRID_STRIDE(int64_t, i, n) {
        const C x = ld(src[i]);
        const C e = vexp(k2 * (x + k1 * x * x * x));
        dst[i] = st<T>(x / ((C)1 + e));
    }
}

template <typename T>
void gelutanh(const nntile_gelutanh_args *a, cudaStream_t s, const T *src,
              T *dst)
{
    if (a->n <= 0)
        return;
    gelutanh_k<<<grid_for(a->n), kBlock, 0, s>>>(a->n, src, dst);
}

template <typename T>
__global__ void gelutanh_backward_k(int64_t n, C_t<T> beta, int accumulate,
                                    const T *__restrict__ x_,
                                    const T *__restrict__ dy,
                                    T *__restrict__ dx)
{
    typedef C_t<T> C;
    const C k0 = (C)0.79788456080286535588;
    const C k2 = (C)(-2 * 0.79788456080286535588);
    const C k1 = (C)0.044715;
    const C k3 = (C)(3 * 0.044715);
    NNTILE_GRID_STRIDE(int64_t, i, n) {
        const C x = ld(x_[i]);
        const C x2 = x * x;
        const C sg = (C)1 / ((C)1 + vexp(k2 * (x + k1 * x2 * x)));
        const C d = sg + (C)2 * x * sg * ((C)1 - sg) * k0 * ((C)1 + k3 * x2);
        const C g = ld(dy[i]) * d;
        dx[i] = st<T>(accumulate ? g + beta * ld(dx[i]) : g);
    }
}

template <typename T>
void gelutanh_backward(const nntile_gelutanh_backward_args *a, cudaStream_t s,
                       const T *x, const T *dy, T *dx)
{
    if (a->n <= 0)
        return;
    gelutanh_backward_k<<<grid_for(a->n), kBlock, 0, s>>>(
        a->n, (C_t<T>)a->beta, a->beta != 0.0, x, dy, dx);
}

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
NNTILE_CUDA_EXPORT(scal)
NNTILE_CUDA_EXPORT(prod)
NNTILE_CUDA_EXPORT(gelu)
NNTILE_CUDA_EXPORT(gelu_backward)
NNTILE_CUDA_EXPORT(gelutanh)
NNTILE_CUDA_EXPORT(gelutanh_backward)
NNTILE_CUDA_EXPORT(sumsq)
