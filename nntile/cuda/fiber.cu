/* Fiber kernels on axis layout [m, k, n] (twins of _core/kernels/fiber.inc);
 * a fiber has k elements. */
#include "common.cuh"

NNTILE_CUDA_BEGIN

/* fiber[j] = alpha * sum_{i,l} f(i,j,l) for n > 1: one block per j (and per
 * chunk of i when the reduction is split). */
template <typename T, bool PROD, typename Epi>
__global__ void fibersum_k(int64_t m, int64_t k, int64_t n, int64_t chunk,
                           const T *__restrict__ s1, const T *__restrict__ s2,
                           Epi epi, double *partial)
{
    const SumTerm<T, PROD> term{s1, s2, 0, 0};
    const int64_t i0 = (int64_t)blockIdx.y * chunk;
    const int64_t i1 = i0 + chunk < m ? i0 + chunk : m;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int nwarps = blockDim.x >> 5;
    for (int64_t j = blockIdx.x; j < k; j += gridDim.x) {
        double acc[1] = {0.0};
        if (n >= 32) {
            /* warps over i, lanes along the contiguous l */
            for (int64_t i = i0 + warp; i < i1; i += nwarps) {
                const int64_t base = (i * k + j) * n;
                for (int64_t l = lane; l < n; l += 32)
                    term.at(base + l, acc);
            }
        } else if (i1 > i0) {
            const int64_t cnt = (i1 - i0) * n;
            for (int64_t t = threadIdx.x; t < cnt; t += blockDim.x) {
                const int64_t di = t / n;
                const int64_t l = t - di * n;
                term.at(((i0 + di) * k + j) * n + l, acc);
            }
        }
        block_sum<1>(acc);
        if (threadIdx.x == 0) {
            if (partial == nullptr)
                epi(0, j, acc);
            else
                partial[(int64_t)blockIdx.y * k + j] = acc[0];
        }
    }
}

/* sum_fiber and sumprod_fiber (sum_of in common.cuh) */
struct FiberSum {
    template <bool PROD, typename Args, typename T>
    static void run(const Args *a, cudaStream_t s, const T *s1, const T *s2,
                    T *fiber)
    {
        int64_t m = a->m, k = a->k, n = a->n;
        if (k <= 0)
            return;
        const AxpbyEpi<T> epi{fiber, a->alpha, a->beta, 0};
        if (m <= 0 || n <= 0)
            n = 1, m = 0;
        if (n == 1) {
            /* [m, k]: column sums, coalesced along k */
            colsum<1>(1, m, k, SumTerm<T, PROD>{s1, s2, m, k}, epi, s);
            return;
        }
        const unsigned gx = (unsigned)(k < kMaxGrid ? k : kMaxGrid);
        int split = split_for(gx, m, ceil_div(4096, n));
        if (split > 1) {
            const int64_t chunk = ceil_div(m, split);
            split = (int)ceil_div(m, chunk);
            Scratch sc((size_t)split * k * sizeof(double), s);
            if (sc.ptr) {
                double *part = (double *)sc.ptr;
                fibersum_k<T, PROD><<<dim3(gx, split), kBlock, 0, s>>>(
                    m, k, n, chunk, s1, s2, epi, part);
                colsum_finish_k<1><<<grid_for(k), kBlock, 0, s>>>(
                    1, k, split, part, epi);
                return;
            }
        }
        fibersum_k<T, PROD><<<dim3(gx, 1), kBlock, 0, s>>>(
            m, k, n, m, s1, s2, epi, nullptr);
    }
};

NNTILE_CUDA_END

/* dst[i,j,l] = alpha*fiber[j] + beta*dst[i,j,l] */
NNTILE_CUDA_EXPORT_AS(add_fiber, nntile_cuda::add_bcast<true>)
/* dst[i,j,l] *= alpha*fiber[j] */
NNTILE_CUDA_EXPORT_AS(prod_fiber, nntile_cuda::prod_bcast<true>)
NNTILE_CUDA_EXPORT_AS(sum_fiber, nntile_cuda::sum_of<nntile_cuda::FiberSum>)
NNTILE_CUDA_EXPORT_AS(sumprod_fiber,
                      nntile_cuda::sum_of<nntile_cuda::FiberSum>)
