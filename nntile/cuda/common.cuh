/* Shared device helpers for the nntile CUDA kernels (internal).
 *
 * Kernels are templates over the storage type T; C_t<T> is the compute type
 * (float for fp32 and bf16, double for fp64), ld()/st<T>() convert between
 * them, as LOAD/STORE do on the CPU side.  Reductions accumulate in double
 * for every dtype, like the CPU kernels. */
#ifndef NNTILE_CUDA_COMMON_CUH
#define NNTILE_CUDA_COMMON_CUH

#include <cuda_runtime.h>
#include <cuda_bf16.h>
#include <math_constants.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <type_traits>

#include "cuda_kernels.h"
#include "scratch.h"

/* Internal symbols get hidden visibility (only the extern "C" entry points,
 * declared in cuda_kernels.h, are exported from a shared library). */
#define NNTILE_CUDA_BEGIN                                                    \
    _Pragma("GCC visibility push(hidden)") namespace nntile_cuda {
#define NNTILE_CUDA_END } _Pragma("GCC visibility pop")

NNTILE_CUDA_BEGIN

typedef __nv_bfloat16 bf16;

/* ---------------------------------------------------------------- types */

template <typename T> struct Compute;
template <> struct Compute<float> { typedef float type; };
template <> struct Compute<double> { typedef double type; };
template <> struct Compute<bf16> { typedef float type; };
template <typename T> using C_t = typename Compute<T>::type;

/* ABI pointer type (as in cuda_kernels.h) -> storage type */
template <typename A> struct Storage { typedef A type; };
template <> struct Storage<uint16_t> { typedef bf16 type; };
template <typename A> inline typename Storage<A>::type *storage(A *p)
{
    return (typename Storage<A>::type *)p;
}
template <typename A>
inline const typename Storage<A>::type *storage(const A *p)
{
    return (const typename Storage<A>::type *)p;
}

__host__ __device__ __forceinline__ float ld(float x) { return x; }
__host__ __device__ __forceinline__ double ld(double x) { return x; }
__host__ __device__ __forceinline__ float ld(bf16 x)
{
    return __bfloat162float(x);
}

template <typename T> __host__ __device__ __forceinline__ T st(C_t<T> x);
template <> __host__ __device__ __forceinline__ float st<float>(float x)
{
    return x;
}
template <> __host__ __device__ __forceinline__ double st<double>(double x)
{
    return x;
}
template <> __host__ __device__ __forceinline__ bf16 st<bf16>(float x)
{
    return __float2bfloat16_rn(x);
}

/* ---------------------------------------------------------------- math */

/* m_<fn>(x): the libm function fn of the compute type (<fn>f for float) */
#define NNTILE_CUDA_MATH(fn)                                                  \
    __device__ __forceinline__ float m_##fn(float x) { return fn##f(x); }     \
    __device__ __forceinline__ double m_##fn(double x) { return fn(x); }
NNTILE_CUDA_MATH(exp)
NNTILE_CUDA_MATH(log)
NNTILE_CUDA_MATH(erf)
NNTILE_CUDA_MATH(sqrt)
NNTILE_CUDA_MATH(cos)
NNTILE_CUDA_MATH(sin)
#undef NNTILE_CUDA_MATH

template <typename C> __device__ __forceinline__ C ninf();
template <> __device__ __forceinline__ float ninf<float>()
{
    return -CUDART_INF_F;
}
template <> __device__ __forceinline__ double ninf<double>()
{
    return -CUDART_INF;
}

/* The CPU's VEXP (common.h): exp with the same range clamps (results that
 * would be subnormal flush to 0, results near the top of the range give
 * +inf).  Full-precision expf/exp inside the range (<= 2 ulp). */
__device__ __forceinline__ float vexp(float x)
{
    const float r = expf(x);
    return x > 88.37f ? CUDART_INF_F : (x < -87.33f ? 0.0f : r);
}
__device__ __forceinline__ double vexp(double x)
{
    const double r = exp(x);
    return x > 709.43 ? CUDART_INF : (x < -708.39 ? 0.0 : r);
}

/* formulas.h's NNTILE_DIV_GE1: a / b for b >= 1 */
__device__ __forceinline__ float fdiv_ge1(float a, float b)
{
    return __fdividef(a, b);
}
__device__ __forceinline__ double fdiv_ge1(double a, double b)
{
    return a / b;
}

/* The formulas shared with the CPU kernels (gelu, exp_shift, adam, ...), as
 * templates over the compute type, with the math of that type. */
#define VEXP vexp
#define ERF m_erf
#define SQRT m_sqrt
#define COS m_cos
#define SIN m_sin
#include "../_core/kernels/formulas.h"
#undef VEXP
#undef ERF
#undef SQRT
#undef COS
#undef SIN

/* ---------------------------------------------------------------- launch */

constexpr int kBlock = 256;      /* threads per block of most kernels */
constexpr int64_t kMaxGrid = 65536; /* grid cap; kernels grid-stride */
constexpr int kWaveBlocks = 1024;  /* ~8 blocks of 256 per SM (H100) */

/* blocks of `threads` that the device runs at once (its SMs times the
 * kernel's occupancy), for kernels that grid-stride with a partial per
 * block: more would only add partials */
template <typename Kernel> int64_t resident_blocks(Kernel kernel, int threads)
{
    int dev = 0, sms = 0, per_sm = 0;
    if (cudaGetDevice(&dev) != cudaSuccess
        || cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev) != cudaSuccess
        || cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, threads, 0)
               != cudaSuccess) {
        (void)cudaGetLastError();
        return kWaveBlocks;
    }
    return (int64_t)sms * (per_sm > 0 ? per_sm : 1);
}

inline unsigned grid_for(int64_t work, int per_block = kBlock)
{
    int64_t g = (work + per_block - 1) / per_block;
    if (g < 1)
        g = 1;
    if (g > kMaxGrid)
        g = kMaxGrid;
    return (unsigned)g;
}

inline int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

#define NNTILE_GRID_STRIDE(I, i, n)                                         \
    for (I i = (I)blockIdx.x * blockDim.x + threadIdx.x; i < (I)(n);        \
         i += (I)gridDim.x * blockDim.x)

/* Launchers.  The buffers handed to a launcher become kernel parameters of
 * their own, declared __restrict__ (the compiler then may keep loads in
 * flight across stores), and the op gets them as arguments.  Buffers that an
 * op holds itself (the reductions' terms do) carry no such promise. */

/* ---- element-wise over n items: op(i, bufs...) for every i < n.
 * A launch of many items gives each thread U = kUnroll of them, a block
 * apart (coalesced), and no grid stride; in every block but the last the
 * calls are straight-line code, so their loads may be issued together (the
 * buffers are __restrict__): one load in flight a thread leaves a two-byte
 * bf16 stream at a third of the memory's bandwidth.  A launch of fewer items
 * than kUnroll full waves keeps one a thread, so that it still fills the GPU
 * (rotary embeddings: an item per row and pair, looping over the heads). */
constexpr int kUnroll = 4;

/* An op that writes a buffer it also reads (an update in place) gives, instead
 * of op(i, bufs...), an Item type, load(i, bufs...) -> Item and store(i, item,
 * bufs...): ptxas does not move an item's load of a buffer above another
 * item's store to the same buffer, so the launcher loads every item of a
 * thread before it stores any. */
template <typename Op, typename = void> struct LoadsFirst : std::false_type {
};
template <typename Op>
struct LoadsFirst<Op, std::void_t<typename Op::Item>> : std::true_type {
};

template <typename Op, typename... B>
__device__ __forceinline__ void apply_at(const Op &op, int64_t i, B *... bufs)
{
    if constexpr (LoadsFirst<Op>::value)
        op.store(i, op.load(i, bufs...), bufs...);
    else
        op(i, bufs...);
}

template <int U, typename I, typename Op, typename... B>
__global__ void elementwise_k(I n, Op op, B *__restrict__... bufs)
{
    const I start = (I)blockIdx.x * (kBlock * U);
    const I first = start + threadIdx.x;
    if (n - start >= (I)(kBlock * U)) { /* straight-line: no guards */
        if constexpr (LoadsFirst<Op>::value) {
            typename Op::Item item[U];
#pragma unroll
            for (int u = 0; u < U; ++u)
                item[u] = op.load((int64_t)(first + (I)u * kBlock), bufs...);
#pragma unroll
            for (int u = 0; u < U; ++u)
                op.store((int64_t)(first + (I)u * kBlock), item[u], bufs...);
        } else {
#pragma unroll
            for (int u = 0; u < U; ++u)
                op((int64_t)(first + (I)u * kBlock), bufs...);
        }
        return;
    }
#pragma unroll
    for (int u = 0; u < U; ++u) {
        const I i = first + (I)u * kBlock;
        if (i < n)
            apply_at(op, (int64_t)i, bufs...);
    }
}

template <typename Op, typename... B>
void launch_elementwise(int64_t n, Op op, cudaStream_t stream, B *... bufs)
{
    if (n <= 0)
        return;
    if (n >= ((int64_t)1 << 31)) {
        elementwise_k<1, int64_t><<<(unsigned)ceil_div(n, kBlock), kBlock, 0,
                                    stream>>>(n, op, bufs...);
        return;
    }
    const bool unroll = n >= (int64_t)kUnroll * kBlock * kWaveBlocks;
    const unsigned grid = (unsigned)ceil_div(n, kBlock * (unroll ? kUnroll : 1));
    if (unroll)
        elementwise_k<kUnroll, uint32_t><<<grid, kBlock, 0, stream>>>(
            (uint32_t)n, op, bufs...);
    else
        elementwise_k<1, uint32_t><<<grid, kBlock, 0, stream>>>(
            (uint32_t)n, op, bufs...);
}

/* dst = alpha*src + beta*dst, src and dst of any two storage types; mode 0:
 * beta == 0 (dst not read), 1: beta == 1, 2: general beta.  dst is read and
 * written, so a thread loads all its items first (LoadsFirst). */
template <typename C> struct AddOp {
    C alpha, beta;
    int mode;
    AddOp(double a, double b)
        : alpha((C)a), beta((C)b), mode(b == 0.0 ? 0 : (b == 1.0 ? 1 : 2))
    {
    }
    struct Item {
        C src, dst;
    };
    template <typename S, typename D>
    __device__ Item load(int64_t i, const S *src, D *dst) const
    {
        return {(C)ld(src[i]), mode == 0 ? (C)0 : (C)ld(dst[i])};
    }
    template <typename S, typename D>
    __device__ void store(int64_t i, Item it, const S *, D *dst) const
    {
        const C x = alpha * it.src;
        if (mode == 0)
            dst[i] = st<D>(x);
        else if (mode == 1)
            dst[i] = st<D>(x + it.dst);
        else
            dst[i] = st<D>(x + beta * it.dst);
    }
};

/* An op over args->n elements that has no scalars, exported as
 * NNTILE_CUDA_EXPORT_AS(op, nntile_cuda::over_n<Op>). */
template <typename Op, typename Args, typename... B>
void over_n(const Args *a, cudaStream_t stream, B *... bufs)
{
    launch_elementwise(a->n, Op(), stream, bufs...);
}

/* ---------------------------------------------------------------- reductions */

struct SumOp {
    template <typename V> __device__ V operator()(V a, V b) const
    {
        return a + b;
    }
};
struct MaxOp {
    template <typename V> __device__ V operator()(V a, V b) const
    {
        return b > a ? b : a;
    }
};

template <typename V, typename Op>
__device__ __forceinline__ V warp_allreduce(V v, Op op)
{
#pragma unroll
    for (int o = 16; o > 0; o >>= 1)
        v = op(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}

/* All-reduce inside groups of TPR consecutive threads (TPR a multiple of 32
 * dividing blockDim.x).  Every thread of the block must call it (it
 * synchronises the block when TPR > 32).  sh: blockDim.x/32 entries. */
template <int TPR, typename V, typename Op>
__device__ __forceinline__ V group_allreduce(V v, Op op, V *sh)
{
    v = warp_allreduce(v, op);
    if constexpr (TPR > 32) {
        constexpr int W = TPR / 32;
        const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
        __syncthreads();
        if (lane == 0)
            sh[warp] = v;
        __syncthreads();
        const int g0 = warp / W * W;
        v = sh[g0];
#pragma unroll
        for (int w = 1; w < W; ++w)
            v = op(v, sh[g0 + w]);
    }
    return v;
}

/* Sum of NA doubles over a 1-D block (blockDim.x a multiple of 32, at most
 * 1024); the result is valid in thread 0.  Every thread must call it; it
 * synchronises first, so it may be called repeatedly. */
template <int NA>
__device__ __forceinline__ void block_sum(double (&acc)[NA])
{
    __shared__ double sh[NA][32];
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int nw = blockDim.x >> 5;
#pragma unroll
    for (int a = 0; a < NA; ++a)
        acc[a] = warp_allreduce(acc[a], SumOp());
    __syncthreads();
    if (lane == 0)
#pragma unroll
        for (int a = 0; a < NA; ++a)
            sh[a][warp] = acc[a];
    __syncthreads();
    if (warp == 0)
#pragma unroll
        for (int a = 0; a < NA; ++a)
            acc[a] = warp_allreduce(lane < nw ? sh[a][lane] : 0.0, SumOp());
}

/* Threads per row for row-wise kernels (block of kBlock threads holds
 * kBlock/TPR rows). */
template <typename F> void dispatch_tpr(int64_t len, F &&f)
{
    if (len <= 32)
        f(std::integral_constant<int, 32>());
    else if (len <= 128)
        f(std::integral_constant<int, 64>());
    else if (len <= 512)
        f(std::integral_constant<int, 128>());
    else
        f(std::integral_constant<int, 256>());
}

inline unsigned row_grid(int64_t rows, int tpr)
{
    return grid_for(rows, kBlock / tpr);
}

/* Row loop for kernels that launch themselves (mixed.cu's; the others use
 * launch_rows): a group of TPR threads per row, groups stride over rows.  The
 * bounds are uniform per block, so group_allreduce may be used inside when
 * inactive groups (r >= rows) still take part. */
#define NNTILE_ROW_LOOP(TPR, rows, r, tid, active)                          \
    constexpr int RPB_ = kBlock / (TPR);                                     \
    const int grp_ = threadIdx.x / (TPR);                                    \
    const int tid = threadIdx.x % (TPR);                                     \
    for (int64_t r0_ = (int64_t)blockIdx.x * RPB_; r0_ < (rows);             \
         r0_ += (int64_t)gridDim.x * RPB_)                                   \
        for (int64_t r = r0_ + grp_, once_ = 0; once_ < 1; ++once_)          \
            for (bool active = r < (rows), o2_ = true; o2_; o2_ = false)

/* A thread's elements j = tid, tid + TPR, ... < len of a row, kRowBatch at a
 * time: every load(j) of a batch is issued before any use(j, value), which a
 * loop of load-then-use with a branch or a store in it would not allow (one
 * two-byte load in flight a thread). */
constexpr int kRowBatch = 8;

template <int TPR, typename C, typename Load, typename Use>
__device__ __forceinline__ void row_in_batches(int64_t len, int tid, Load load,
                                               Use use)
{
    for (int64_t j0 = tid; j0 < len; j0 += TPR * kRowBatch) {
        C v[kRowBatch];
#pragma unroll
        for (int u = 0; u < kRowBatch; ++u) {
            const int64_t j = j0 + u * TPR;
            v[u] = j < len ? load(j) : C();
        }
#pragma unroll
        for (int u = 0; u < kRowBatch; ++u) {
            const int64_t j = j0 + u * TPR;
            if (j < len)
                use(j, v[u]);
        }
    }
}

/* ---- row-wise over rows of len elements: a group of TPR threads per row
 * (TPR from len), groups stride over rows; every thread calls
 *   op.template row<TPR>(r, tid, active, bufs...)
 * with tid its rank in the group.  The loop bounds are uniform per block and
 * groups past the last row call it too with active false, so that op may use
 * group_allreduce (an op without it returns when !active). */
template <int TPR, typename Op, typename... B>
__global__ void rows_k(int64_t rows, Op op, B *__restrict__... bufs)
{
    constexpr int kRows = kBlock / TPR; /* rows per block and step */
    const int group = threadIdx.x / TPR;
    const int tid = threadIdx.x % TPR;
    for (int64_t r0 = (int64_t)blockIdx.x * kRows; r0 < rows;
         r0 += (int64_t)gridDim.x * kRows) {
        const int64_t r = r0 + group;
        op.template row<TPR>(r, tid, r < rows, bufs...);
    }
}

template <typename Op, typename... B>
void launch_rows(int64_t rows, int64_t len, Op op, cudaStream_t stream,
                 B *... bufs)
{
    if (rows <= 0)
        return;
    dispatch_tpr(len, [&](auto tpr) {
        constexpr int TPR = decltype(tpr)::value;
        rows_k<TPR><<<row_grid(rows, TPR), kBlock, 0, stream>>>(rows, op,
                                                                bufs...);
    });
}

/* ---- full reduction of n terms to NA doubles:
 *   term(i, acc) adds term i into acc[0..NA); epi(acc) stores the result. */
template <int NA, typename Term, typename Epi>
__global__ void flat_reduce_k(int64_t n, Term term, Epi epi, double *partial)
{
    double acc[NA];
#pragma unroll
    for (int a = 0; a < NA; ++a)
        acc[a] = 0.0;
#pragma unroll 4
    NNTILE_GRID_STRIDE(int64_t, i, n)
        term(i, acc);
    block_sum<NA>(acc);
    if (threadIdx.x == 0) {
        if (partial == nullptr)
            epi(acc);
        else
            for (int a = 0; a < NA; ++a)
                partial[(int64_t)a * gridDim.x + blockIdx.x] = acc[a];
    }
}

template <int NA, typename Epi>
__global__ void flat_finish_k(int nparts, const double *partial, Epi epi)
{
    double acc[NA];
#pragma unroll
    for (int a = 0; a < NA; ++a) {
        acc[a] = 0.0;
        for (int i = threadIdx.x; i < nparts; i += blockDim.x)
            acc[a] += partial[(int64_t)a * nparts + i];
    }
    block_sum<NA>(acc);
    if (threadIdx.x == 0)
        epi(acc);
}

template <int NA, typename Term, typename Epi>
void flat_reduce(int64_t n, Term term, Epi epi, cudaStream_t stream)
{
    int64_t nb = ceil_div(n, (int64_t)kBlock * 16); /* >= 16 terms/thread */
    if (nb > 1024)
        nb = 1024;
    if (nb > 1) {
        Scratch sc((size_t)NA * nb * sizeof(double), stream);
        if (sc.ptr) {
            double *part = (double *)sc.ptr;
            flat_reduce_k<NA><<<(unsigned)nb, kBlock, 0, stream>>>(n, term,
                                                                   epi, part);
            flat_finish_k<NA><<<1, kBlock, 0, stream>>>((int)nb, part, epi);
            return;
        }
    }
    flat_reduce_k<NA><<<1, 1024, 0, stream>>>(n, term, epi, nullptr);
}

/* ---- column reduction on [outer, red, inner] over the middle axis:
 *   term(o, j, l, acc) adds element (o, j, l); epi(o, l, acc) stores.
 * Block 32x8: x runs along the contiguous inner axis (coalesced), y over
 * red.  When there are few blocks the red axis is split over gridDim.z with
 * double partials in stream-ordered scratch and a finishing kernel. */
template <int NA, typename Term, typename Epi>
__global__ void colsum_k(int64_t outer, int64_t red, int64_t inner,
                         int64_t chunk, Term term, Epi epi, double *partial)
{
    __shared__ double sh[NA][8][33];
    const int tx = threadIdx.x, ty = threadIdx.y;
    const int64_t l = (int64_t)blockIdx.x * 32 + tx;
    const int64_t j0 = (int64_t)blockIdx.z * chunk;
    const int64_t j1 = j0 + chunk < red ? j0 + chunk : red;
    for (int64_t o = blockIdx.y; o < outer; o += gridDim.y) {
        double acc[NA];
#pragma unroll
        for (int a = 0; a < NA; ++a)
            acc[a] = 0.0;
        if (l < inner) {
#pragma unroll 4
            for (int64_t j = j0 + ty; j < j1; j += 8)
                term(o, j, l, acc);
        }
        __syncthreads();
#pragma unroll
        for (int a = 0; a < NA; ++a)
            sh[a][ty][tx] = acc[a];
        __syncthreads();
        if (ty == 0 && l < inner) {
#pragma unroll
            for (int a = 0; a < NA; ++a) {
                double s = sh[a][0][tx];
#pragma unroll
                for (int t = 1; t < 8; ++t)
                    s += sh[a][t][tx];
                acc[a] = s;
            }
            if (partial == nullptr)
                epi(o, l, acc);
            else
                for (int a = 0; a < NA; ++a)
                    partial[(((int64_t)blockIdx.z * NA + a) * outer + o) * inner
                            + l] = acc[a];
        }
    }
}

template <int NA, typename Epi>
__global__ void colsum_finish_k(int64_t outer, int64_t inner, int split,
                                const double *partial, Epi epi)
{
    NNTILE_GRID_STRIDE(int64_t, idx, outer * inner) {
        double acc[NA];
        for (int a = 0; a < NA; ++a) {
            double s = 0.0;
            for (int z = 0; z < split; ++z)
                s += partial[((int64_t)z * NA + a) * outer * inner + idx];
            acc[a] = s;
        }
        epi(idx / inner, idx % inner, acc);
    }
}

/* number of splits of a reduction axis of length red when nblocks blocks
 * cover the outputs (1 = no split) */
inline int split_for(int64_t nblocks, int64_t red, int64_t min_chunk)
{
    if (nblocks >= kWaveBlocks)
        return 1;
    int64_t s = ceil_div(kWaveBlocks, nblocks);
    const int64_t by_len = red / min_chunk;
    if (s > by_len)
        s = by_len;
    if (s > 64)
        s = 64;
    return s < 1 ? 1 : (int)s;
}

template <int NA, typename Term, typename Epi>
void colsum(int64_t outer, int64_t red, int64_t inner, Term term, Epi epi,
            cudaStream_t stream)
{
    if (outer <= 0 || inner <= 0)
        return;
    const dim3 block(32, 8);
    const int64_t gx = ceil_div(inner, 32);
    const int64_t gy = outer < 65535 ? outer : 65535;
    int split = split_for(gx * gy, red, 256);
    if (split > 1) {
        const int64_t chunk = ceil_div(red, split);
        split = (int)ceil_div(red, chunk);
        Scratch sc((size_t)split * NA * outer * inner * sizeof(double),
                   stream);
        if (sc.ptr) {
            double *part = (double *)sc.ptr;
            colsum_k<NA><<<dim3((unsigned)gx, (unsigned)gy, split), block, 0,
                           stream>>>(outer, red, inner, chunk, term, epi,
                                     part);
            colsum_finish_k<NA><<<grid_for(outer * inner), kBlock, 0,
                                  stream>>>(outer, inner, split, part, epi);
            return;
        }
    }
    colsum_k<NA><<<dim3((unsigned)gx, (unsigned)gy, 1), block, 0, stream>>>(
        outer, red, inner, red > 0 ? red : 1, term, epi, nullptr);
}

/* ---- row reduction on [rows, len] (contiguous rows):
 *   term(r, j, acc), epi(r, acc) */
template <int NA, typename Term, typename Epi> struct RowSumOp {
    int64_t len;
    Term term;
    Epi epi;
    template <int TPR>
    __device__ void row(int64_t r, int tid, bool active) const
    {
        __shared__ double sh[NA][kBlock / 32];
        double acc[NA];
#pragma unroll
        for (int a = 0; a < NA; ++a)
            acc[a] = 0.0;
        if (active) {
#pragma unroll 4
            for (int64_t j = tid; j < len; j += TPR)
                term(r, j, acc);
        }
#pragma unroll
        for (int a = 0; a < NA; ++a)
            acc[a] = group_allreduce<TPR>(acc[a], SumOp(), sh[a]);
        if (active && tid == 0)
            epi(r, acc);
    }
};

template <int NA, typename Term, typename Epi>
void rowsum(int64_t rows, int64_t len, Term term, Epi epi,
            cudaStream_t stream)
{
    launch_rows(rows, len, RowSumOp<NA, Term, Epi>{len, term, epi}, stream);
}

/* ---------------------------------------------------------------- epilogues */

/* out[idx] = alpha*acc + beta*out[idx] (out not read when beta == 0);
 * idx = 0 (flat), r (rows) or o*ostride + l (columns) */
template <typename T> struct AxpbyEpi {
    T *out;
    double alpha, beta;
    int64_t ostride;
    __device__ void store(int64_t idx, double acc) const
    {
        double s = alpha * acc;
        if (beta != 0.0)
            s += beta * (double)ld(out[idx]);
        out[idx] = st<T>((C_t<T>)s);
    }
    __device__ void operator()(const double (&acc)[1]) const
    {
        store(0, acc[0]);
    }
    __device__ void operator()(int64_t r, const double (&acc)[1]) const
    {
        store(r, acc[0]);
    }
    __device__ void operator()(int64_t o, int64_t l,
                               const double (&acc)[1]) const
    {
        store(o * ostride + l, acc[0]);
    }
};

/* sum of src1 (PROD false) or src1*src2 (products in double) at element
 * (o*red + j)*inner + l of a [outer, red, inner] array */
template <typename T, bool PROD> struct SumTerm {
    const T *s1, *s2;
    int64_t red, inner;
    __device__ void at(int64_t idx, double (&acc)[1]) const
    {
        if (PROD)
            acc[0] += (double)ld(s1[idx]) * (double)ld(s2[idx]);
        else
            acc[0] += (double)ld(s1[idx]);
    }
    __device__ void operator()(int64_t i, double (&acc)[1]) const
    {
        at(i, acc);
    }
    __device__ void operator()(int64_t r, int64_t j, double (&acc)[1]) const
    {
        at(r * red + j, acc);
    }
    __device__ void operator()(int64_t o, int64_t j, int64_t l,
                               double (&acc)[1]) const
    {
        at((o * red + j) * inner + l, acc);
    }
};

/* ---- element-wise over [m, k, n] with broadcast:
 *   op(idx, j, s) with j the fiber index and s = i*n + l the slice index.
 * 32-bit index math when the tile has fewer than 2^31 elements. */
template <bool N1, typename I, typename Op>
__global__ void mkn_k(I total, I k, I n, Op op)
{
    NNTILE_GRID_STRIDE(I, idx, total) {
        I j, sl;
        if (N1) {
            const I i = idx / k;
            j = idx - i * k;
            sl = i;
        } else {
            const I q = idx / n;
            const I l = idx - q * n;
            const I i = q / k;
            j = q - i * k;
            sl = i * n + l;
        }
        op((int64_t)idx, (int64_t)j, (int64_t)sl);
    }
}

template <typename I, typename Op>
void mkn_launch(int64_t total, int64_t k, int64_t n, Op op,
                cudaStream_t stream)
{
    const unsigned g = grid_for(total);
    if (n == 1)
        mkn_k<true, I><<<g, kBlock, 0, stream>>>((I)total, (I)k, (I)1, op);
    else
        mkn_k<false, I><<<g, kBlock, 0, stream>>>((I)total, (I)k, (I)n, op);
}

template <typename Op>
void mkn(int64_t m, int64_t k, int64_t n, Op op, cudaStream_t stream)
{
    if (m <= 0 || k <= 0 || n <= 0)
        return;
    const int64_t total = m * k * n;
    if (total < ((int64_t)1 << 31))
        mkn_launch<uint32_t>(total, k, n, op, stream);
    else
        mkn_launch<uint64_t>(total, k, n, op, stream);
}

/* Broadcast ops for mkn: the source is a fiber [k] (FIBER, indexed by j) or
 * a slice [m, n] (indexed by s = i*n + l). */
/* dst = alpha*src + beta*dst (dst not read when beta == 0) */
template <typename T, bool FIBER> struct AddBcastOp {
    const T *src;
    T *dst;
    C_t<T> alpha, beta;
    int accumulate;
    __device__ void operator()(int64_t idx, int64_t j, int64_t sl) const
    {
        const C_t<T> a = alpha * ld(src[FIBER ? j : sl]);
        dst[idx] = st<T>(accumulate ? a + beta * ld(dst[idx]) : a);
    }
};

/* dst *= alpha*src */
template <typename T, bool FIBER> struct ProdBcastOp {
    const T *src;
    T *dst;
    C_t<T> alpha;
    __device__ void operator()(int64_t idx, int64_t j, int64_t sl) const
    {
        dst[idx] = st<T>(alpha * ld(src[FIBER ? j : sl]) * ld(dst[idx]));
    }
};

template <bool FIBER, typename Args, typename T>
void add_bcast(const Args *a, cudaStream_t s, const T *src, T *dst)
{
    mkn(a->m, a->k, a->n,
        AddBcastOp<T, FIBER>{src, dst, (C_t<T>)a->alpha, (C_t<T>)a->beta,
                             a->beta != 0.0}, s);
}

template <bool FIBER, typename Args, typename T>
void prod_bcast(const Args *a, cudaStream_t s, const T *src, T *dst)
{
    mkn(a->m, a->k, a->n, ProdBcastOp<T, FIBER>{src, dst, (C_t<T>)a->alpha},
        s);
}

/* sum_<shape>(src, out) and sumprod_<shape>(src1, src2, out) are one
 * reduction R::run<PROD>(args, stream, s1, s2, out): the sum of s1 (s2 NULL),
 * or with PROD of the products s1*s2.  The two overloads take the buffers of
 * either op (NNTILE_CUDA_EXPORT_AS(sum_fiber, nntile_cuda::sum_of<Fiber>)). */
template <typename R, typename Args, typename T>
void sum_of(const Args *a, cudaStream_t s, const T *src, T *out)
{
    R::template run<false>(a, s, src, (const T *)nullptr, out);
}

template <typename R, typename Args, typename T>
void sum_of(const Args *a, cudaStream_t s, const T *s1, const T *s2, T *out)
{
    R::template run<true>(a, s, s1, s2, out);
}

NNTILE_CUDA_END

/* ---------------------------------------------------------------- exports
 * NNTILE_CUDA_EXPORT(op) defines nntile_cuda_<op>_<suffix> (cuda_kernels.h)
 * for every dtype as the call nntile_cuda::op(args, stream, buffers...), the
 * storage type deduced from the buffers (bf16 bits become nntile_cuda::bf16
 * pointers).  NNTILE_CUDA_EXPORT_AS(op, fn) calls fn instead: an op that is
 * another template with a parameter of its own
 * (nntile_cuda::add_bcast<true>, nntile_cuda::map<nntile_cuda::Gelu>). */
#define NNTILE_CUDA_PASS(type, name) , nntile_cuda::storage(name)
#define NNTILE_CUDA_DEFINE(T, ACC, S, op, fn, BUFFERS)                       \
    extern "C" NNTILE_CUDA_SIGNATURE(op, T, ACC, S, BUFFERS)                 \
    {                                                                        \
        fn(args, stream BUFFERS(NNTILE_CUDA_PASS, NNTILE_CUDA_PASS, T, ACC)); \
    }
/* NNTILE_CUDA_EXPORT_AS with the buffers of the list BUFFERS (an
 * activation's: NNTILE_ACT_BUFFERS) */
#define NNTILE_CUDA_EXPORT_BUFFERS(op, fn, BUFFERS)                          \
    NNTILE_CUDA_FOR_EACH_DTYPE(NNTILE_CUDA_DEFINE, op, fn, BUFFERS)
#define NNTILE_CUDA_EXPORT_AS(op, fn)                                        \
    NNTILE_CUDA_EXPORT_BUFFERS(op, fn, NNTILE_BUFFERS_##op)
#define NNTILE_CUDA_EXPORT(op) NNTILE_CUDA_EXPORT_AS(op, nntile_cuda::op)
/* nntile_cuda_<op>_bf16_fp32 (mixed precision) where the same template
 * serves bf16 data with float accumulator buffers */
#define NNTILE_CUDA_EXPORT_MIXED(op)                                         \
    NNTILE_CUDA_DEFINE(uint16_t, float, bf16_fp32, op, nntile_cuda::op,      \
                       NNTILE_BUFFERS_##op)

#endif /* NNTILE_CUDA_COMMON_CUH */
