/* Kernels of mixed precision: bf16 data buffers, float accumulator buffers
 * (column NNTILE_BF16_FP32 of the op table).  Twins of the bf16_fp32
 * instantiation of the CPU kernels (../_core/kernels/kernels.h names the
 * accumulator buffers of each op); gemm_bf16_fp32 is in gemm.cu,
 * adam_step_refresh_bf16_fp32 in optim.cu, the cross entropy's in xent.cu,
 * and add's and add_out's (one template for every dtype) in elementwise.cu.
 *
 * What is fused, and why.  Every kernel here reads and writes its two dtypes
 * directly, so no op of mixed precision needs a separate conversion pass over
 * an activation:
 *   - layernorm_forward reads the fp32 residual stream and writes the bf16
 *     input of the next GEMM (the cast is the norm's store);
 *   - add adds a bf16 branch into the fp32 stream (no fp32 copy of the branch);
 *   - maxsumexp and softmax_inplace keep the row statistics in fp32 while the
 *     scores stay bf16, the largest activation of all;
 *   - the bias add reads the fp32 master bias, the bias gradient sums bf16
 *     rows into fp32 (no bf16 copy of a bias);
 *   - adam_step_refresh writes the bf16 copy from the register that holds the
 *     new fp32 weight (no second pass over the masters).
 * The one standalone conversion, cast, turns the fp32 gradient of the residual
 * stream into the bf16 operand of a GEMM, once per Linear in backward. */
#include "common.cuh"

NNTILE_CUDA_BEGIN

struct CastOp {
    __device__ void operator()(int64_t i, const float *src, bf16 *dst) const
    {
        dst[i] = st<bf16>(src[i]);
    }
};

/* ---- element-wise over [m, k, n] with a float fiber or slice (mkn) */

struct AddFiber {
    const float *fiber;
    bf16 *dst;
    float alpha, beta;
    int accumulate;
    __device__ void operator()(int64_t idx, int64_t j, int64_t) const
    {
        const float v = alpha * fiber[j];
        dst[idx] = st<bf16>(accumulate ? v + beta * ld(dst[idx]) : v);
    }
};

struct SoftmaxInplace {
    const float *stats;
    bf16 *dst;
    __device__ void operator()(int64_t idx, int64_t, int64_t sl) const
    {
        const float sh = exp_shift(stats[2 * sl]);
        const float inv = inv_sum(stats[2 * sl + 1]);
        dst[idx] = st<bf16>(vexp(ld(dst[idx]) - sh) * inv);
    }
};

struct SoftmaxBackward {
    const bf16 *p;
    const float *sums;
    bf16 *dp;
    float alpha;
    __device__ void operator()(int64_t idx, int64_t, int64_t sl) const
    {
        dp[idx] = st<bf16>(alpha * ld(p[idx]) * (ld(dp[idx]) - sums[sl]));
    }
};

/* ---- reductions of bf16 data into float accumulators */

/* fiber[j] = alpha * sum over i, l of src[i, j, l] + beta*fiber[j] for n > 1:
 * one block per j (n == 1 is a column sum) */
__global__ void sum_fiber_k(int64_t m, int64_t k, int64_t n, double alpha,
                            double beta, const bf16 *__restrict__ src,
                            float *__restrict__ fiber)
{
    for (int64_t j = blockIdx.x; j < k; j += gridDim.x) {
        double acc[1] = {0.0};
        for (int64_t t = threadIdx.x; t < m * n; t += blockDim.x) {
            const int64_t i = t / n, l = t - i * n;
            acc[0] += (double)ld(src[(i * k + j) * n + l]);
        }
        block_sum<1>(acc);
        if (threadIdx.x == 0)
            AxpbyEpi<float>{fiber, alpha, beta, 0}.store(j, acc[0]);
    }
}

/* Merge a tile's (m1, s1) into the running stats st_[0..1], as the CPU. */
__device__ void merge_stats(float *st_, float m1, double s1, int init)
{
    float max = m1;
    double sum = s1;
    if (!init) {
        max = st_[0];
        sum = st_[1];
        merge_maxsumexp(&max, &sum, m1, s1);
    }
    st_[0] = max;
    st_[1] = (float)sum;
}

/* W bf16 of a row from its element j*W, as floats: one two-byte load, or
 * (W == 8, the row 16-byte aligned) one 16-byte load */
template <int W>
__device__ __forceinline__ void load_bf16(const bf16 *row, int64_t j, float (&f)[W])
{
    if constexpr (W == 1) {
        f[0] = ld(row[j]);
    } else {
        static_assert(W == 8, "one bf16 or eight");
        const uint4 u = ((const uint4 *)row)[j];
        const uint32_t w[4] = {u.x, u.y, u.z, u.w};
#pragma unroll
        for (int i = 0; i < 4; ++i) { /* a bf16 is a float's upper half */
            f[2 * i] = __uint_as_float(w[i] << 16);
            f[2 * i + 1] = __uint_as_float(w[i] & 0xffff0000u);
        }
    }
}

/* n == 1 (scores, logits): a group of TPR threads per contiguous row, two
 * passes (max, then sum of exp(x - max)), each unrolled so that a thread has
 * several loads in flight, of W bf16 each */
template <int TPR, int W>
__global__ void maxsumexp_rows_k(int64_t m, int64_t k, int init,
                                 const bf16 *__restrict__ src,
                                 float *__restrict__ stats)
{
    __shared__ float shc[kBlock / 32];
    __shared__ double shd[kBlock / 32];
    const int64_t loads = k / W;
    NNTILE_ROW_LOOP(TPR, m, r, tid, active) {
        const bf16 *row = src + r * k;
        float mt = ninf<float>();
        if (active)
#pragma unroll 4
            for (int64_t j = tid; j < loads; j += TPR) {
                float f[W];
                load_bf16<W>(row, j, f);
#pragma unroll
                for (int i = 0; i < W; ++i)
                    mt = fmaxf(mt, f[i]);
            }
        const float mx = group_allreduce<TPR>(mt, MaxOp(), shc);
        const float sh = exp_shift(mx);
        double s = 0.0;
        if (active)
#pragma unroll 4
            for (int64_t j = tid; j < loads; j += TPR) {
                float f[W];
                load_bf16<W>(row, j, f);
#pragma unroll
                for (int i = 0; i < W; ++i)
                    s += (double)vexp(f[i] - sh);
            }
        s = group_allreduce<TPR>(s, SumOp(), shd);
        if (active && tid == 0)
            merge_stats(stats + 2 * r, mx, s, init);
    }
}

/* n > 1: a thread per (i, l), coalesced along l */
__global__ void maxsumexp_cols_k(int64_t m, int64_t k, int64_t n, int init,
                                 const bf16 *__restrict__ src,
                                 float *__restrict__ stats)
{
    NNTILE_GRID_STRIDE(int64_t, c, m * n) {
        const int64_t i = c / n, l = c - i * n;
        const bf16 *base = src + i * k * n + l;
        float mx = ninf<float>();
        for (int64_t j = 0; j < k; ++j)
            mx = fmaxf(mx, ld(base[j * n]));
        const float sh = exp_shift(mx);
        double s = 0.0;
        for (int64_t j = 0; j < k; ++j)
            s += (double)vexp(ld(base[j * n]) - sh);
        merge_stats(stats + 2 * c, s == 0.0 ? ninf<float>() : sh, s, init);
    }
}

/* ---- layer norm */

__global__ void layernorm_forward_k(int64_t rows, int64_t e, int64_t e_total,
                                    double eps, const float *__restrict__ x,
                                    const float *__restrict__ stats,
                                    const float *__restrict__ gamma,
                                    const float *__restrict__ beta_,
                                    bf16 *__restrict__ y)
{
    NNTILE_GRID_STRIDE(int64_t, idx, rows * e) {
        const int64_t r = idx / e, j = idx - r * e;
        const float rstd = norm_rstd<float>(stats[2 * r + 1], e_total, eps);
        y[idx] = st<bf16>(ln_y(x[idx], stats[2 * r], rstd, gamma[j], beta_[j]));
    }
}

NNTILE_CUDA_END

using namespace nntile_cuda;

extern "C" void nntile_cuda_cast_bf16_fp32(const struct nntile_cast_args *a,
                                           cudaStream_t s, const float *src,
                                           uint16_t *dst)
{
    launch_elementwise(a->n, CastOp(), s, src, (bf16 *)dst);
}

extern "C" void nntile_cuda_add_fiber_bf16_fp32(
    const struct nntile_add_fiber_args *a, cudaStream_t s, const float *fiber,
    uint16_t *dst)
{
    mkn(a->m, a->k, a->n,
        AddFiber{fiber, (bf16 *)dst, (float)a->alpha, (float)a->beta,
                 a->beta != 0.0},
        s);
}

extern "C" void nntile_cuda_sum_fiber_bf16_fp32(
    const struct nntile_sum_fiber_args *a, cudaStream_t s, const uint16_t *src,
    float *fiber)
{
    const int64_t m = a->m > 0 ? a->m : 0, k = a->k, n = a->n > 0 ? a->n : 0;
    if (k <= 0)
        return;
    const bf16 *x = (const bf16 *)src;
    if (n == 1)  /* [m, k]: columns j, coalesced */
        colsum<1>(1, m, k, SumTerm<bf16, false>{x, nullptr, m, k},
                  AxpbyEpi<float>{fiber, a->alpha, a->beta, 0}, s);
    else
        sum_fiber_k<<<grid_for(k, 1), kBlock, 0, s>>>(m, k, n, a->alpha,
                                                      a->beta, x, fiber);
}

extern "C" void nntile_cuda_sumprod_slice_bf16_fp32(
    const struct nntile_sumprod_slice_args *a, cudaStream_t s,
    const uint16_t *src1, const uint16_t *src2, float *dst)
{
    const int64_t m = a->m, k = a->k > 0 ? a->k : 0, n = a->n;
    const SumTerm<bf16, true> term{(const bf16 *)src1, (const bf16 *)src2, k, n};
    const AxpbyEpi<float> epi{dst, a->alpha, a->beta, n};
    if (n == 1)
        rowsum<1>(m, k, term, epi, s);
    else
        colsum<1>(m, k, n, term, epi, s);
}

extern "C" void nntile_cuda_maxsumexp_bf16_fp32(
    const struct nntile_maxsumexp_args *a, cudaStream_t s, const uint16_t *src,
    float *stats)
{
    const int64_t m = a->m, k = a->k < 0 ? 0 : a->k, n = a->n;
    if (m <= 0 || n <= 0)
        return;
    const bf16 *x = (const bf16 *)src;
    /* rows of whole 16-byte words: eight bf16 a load */
    const bool by16 = k % 8 == 0 && (uintptr_t)x % 16 == 0;
    if (n == 1)
        dispatch_tpr(by16 ? k / 8 : k, [&](auto tpr) {
            constexpr int TPR = decltype(tpr)::value;
            if (by16)
                maxsumexp_rows_k<TPR, 8><<<row_grid(m, TPR), kBlock, 0, s>>>(
                    m, k, a->init != 0, x, stats);
            else
                maxsumexp_rows_k<TPR, 1><<<row_grid(m, TPR), kBlock, 0, s>>>(
                    m, k, a->init != 0, x, stats);
        });
    else
        maxsumexp_cols_k<<<grid_for(m * n), kBlock, 0, s>>>(m, k, n,
                                                             a->init != 0, x,
                                                             stats);
}

extern "C" void nntile_cuda_softmax_inplace_bf16_fp32(
    const struct nntile_softmax_inplace_args *a, cudaStream_t s,
    const float *stats, uint16_t *dst)
{
    mkn(a->m, a->k, a->n, SoftmaxInplace{stats, (bf16 *)dst}, s);
}

extern "C" void nntile_cuda_softmax_backward_bf16_fp32(
    const struct nntile_softmax_backward_args *a, cudaStream_t s,
    const uint16_t *p, const float *sums, uint16_t *dp)
{
    mkn(a->m, a->k, a->n,
        SoftmaxBackward{(const bf16 *)p, sums, (bf16 *)dp, (float)a->alpha}, s);
}

extern "C" void nntile_cuda_layernorm_forward_bf16_fp32(
    const struct nntile_layernorm_forward_args *a, cudaStream_t s,
    const float *x, const float *stats, const float *gamma, const float *beta_,
    uint16_t *y)
{
    if (a->rows > 0 && a->e > 0)
        layernorm_forward_k<<<grid_for(a->rows * a->e), kBlock, 0, s>>>(
            a->rows, a->e, a->e_total, a->eps, x, stats, gamma, beta_,
            (bf16 *)y);
}
