/* Batched row-major GEMM through cuBLAS (twin of _core/kernels/gemm.inc).
 * For b1 < batch1, b2 < batch2:
 *   C_b = alpha*op(A_b)*op(B_b) + beta*C_b,  X_b = X + b1*strideX1 + b2*strideX2
 * with op(A) M x K, op(B) K x N, row-major with leading dimensions lda, ldb,
 * ldc.  Row-major C = op(A)op(B) is column-major C^T = op(B)^T op(A)^T, so
 * the operands are swapped.  One cublasGemmStridedBatchedEx over batch2 per
 * b1 (one call in all when the batch1 strides continue the batch2 ones).
 * The handle must already be bound to the caller's stream; its pointer mode
 * is set to host for the call and restored.  Under the fp32 compute type,
 * cuBLAS may still use TF32 if the caller set CUBLAS_TF32_TENSOR_OP_MATH on
 * the handle (or NVIDIA_TF32_OVERRIDE): leave the default math mode for
 * full fp32. */
#include <cublas_v2.h>

#include "common.cuh"

NNTILE_CUDA_BEGIN

/* empty product (K == 0): C = beta*C, C not read when beta == 0 */
template <typename T>
__global__ void gemm_scale_k(int64_t total, int64_t M, int64_t N,
                             int64_t batch2, int64_t ldc, int64_t sC1,
                             int64_t sC2, C_t<T> beta, int read, T *Cm)
{
    NNTILE_GRID_STRIDE(int64_t, e, total) {
        int64_t q = e / N;
        const int64_t j = e - q * N;
        const int64_t i = q % M;
        q /= M;
        const int64_t b2 = q % batch2, b1 = q / batch2;
        T *c = Cm + b1 * sC1 + b2 * sC2 + i * ldc + j;
        *c = read ? st<T>(beta * ld(*c)) : st<T>((C_t<T>)0);
    }
}

/* T: the storage type of A and B (dt), TC: that of C (dt_c), an accumulator
 * that may be wider (bf16 operands, float C: mixed precision). */
template <typename T, typename TC>
void gemm(const nntile_gemm_args *a, cublasHandle_t h, const T *A,
          const T *B, TC *Cm, cudaDataType_t dt, cudaDataType_t dt_c,
          cublasComputeType_t ct)
{
    typedef C_t<TC> C;
    const int64_t M = a->M, N = a->N, K = a->K;
    const int64_t b1n = a->batch1, b2n = a->batch2;
    if (M <= 0 || N <= 0 || b1n <= 0 || b2n <= 0)
        return;
    if (K <= 0) {
        cudaStream_t s = nullptr;
        cublasGetStream(h, &s);
        const int64_t total = b1n * b2n * M * N;
        gemm_scale_k<<<grid_for(total), kBlock, 0, s>>>(
            total, M, N, b2n, a->ldc, a->strideC1, a->strideC2, (C)a->beta,
            a->beta != 0.0, Cm);
        return;
    }
    const C alpha = (C)a->alpha, beta = (C)a->beta;
    /* column-major view: C^T (N x M) = op(B)^T (N x K) * op(A)^T (K x M) */
    const cublasOperation_t opB = a->transB ? CUBLAS_OP_T : CUBLAS_OP_N;
    const cublasOperation_t opA = a->transA ? CUBLAS_OP_T : CUBLAS_OP_N;
    int64_t outer = b1n, inner = b2n;
    int64_t sA = a->strideA2, sB = a->strideB2, sC = a->strideC2;
    if (b2n == 1) {
        /* one batch axis: batch1 with its own strides */
        inner = b1n;
        outer = 1;
        sA = a->strideA1;
        sB = a->strideB1;
        sC = a->strideC1;
    } else if (b1n > 1 && a->strideA1 == b2n * a->strideA2
               && a->strideB1 == b2n * a->strideB2
               && a->strideC1 == b2n * a->strideC2) {
        inner = b1n * b2n;
        outer = 1;
    }
    cublasPointerMode_t pm;
    const bool restore = cublasGetPointerMode(h, &pm) == CUBLAS_STATUS_SUCCESS
                         && pm != CUBLAS_POINTER_MODE_HOST;
    if (restore)
        cublasSetPointerMode(h, CUBLAS_POINTER_MODE_HOST);
    for (int64_t b1 = 0; b1 < outer; ++b1) {
        const T *pa = A + b1 * a->strideA1;
        const T *pb = B + b1 * a->strideB1;
        TC *pc = Cm + b1 * a->strideC1;
        const cublasStatus_t st_ = cublasGemmStridedBatchedEx(
            h, opB, opA, (int)N, (int)M, (int)K, &alpha, pb, dt, (int)a->ldb,
            (long long)sB, pa, dt, (int)a->lda, (long long)sA, &beta, pc, dt_c,
            (int)a->ldc, (long long)sC, (int)inner, ct, CUBLAS_GEMM_DEFAULT);
        if (st_ != CUBLAS_STATUS_SUCCESS) {
            fprintf(stderr, "nntile cuda gemm: cuBLAS status %d\n", (int)st_);
            break;
        }
    }
    if (restore)
        cublasSetPointerMode(h, pm);
}

NNTILE_CUDA_END

using namespace nntile_cuda;

extern "C" void nntile_cuda_gemm_fp32(const struct nntile_gemm_args *args,
                                      cublasHandle_t handle, const float *A,
                                      const float *B, float *C)
{
    gemm(args, handle, A, B, C, CUDA_R_32F, CUDA_R_32F, CUBLAS_COMPUTE_32F);
}

extern "C" void nntile_cuda_gemm_tf32(const struct nntile_gemm_args *args,
                                      cublasHandle_t handle, const float *A,
                                      const float *B, float *C)
{
    gemm(args, handle, A, B, C, CUDA_R_32F, CUDA_R_32F,
         CUBLAS_COMPUTE_32F_FAST_TF32);
}

extern "C" void nntile_cuda_gemm_fp64(const struct nntile_gemm_args *args,
                                      cublasHandle_t handle, const double *A,
                                      const double *B, double *C)
{
    gemm(args, handle, A, B, C, CUDA_R_64F, CUDA_R_64F, CUBLAS_COMPUTE_64F);
}

extern "C" void nntile_cuda_gemm_bf16(const struct nntile_gemm_args *args,
                                      cublasHandle_t handle,
                                      const uint16_t *A, const uint16_t *B,
                                      uint16_t *C)
{
    gemm(args, handle, (const bf16 *)A, (const bf16 *)B, (bf16 *)C,
         CUDA_R_16BF, CUDA_R_16BF, CUBLAS_COMPUTE_32F);
}

/* Mixed precision: bf16 operands on the tensor cores, fp32 accumulation into an
 * fp32 C (weight gradients, the gradient of the fp32 residual stream). */
extern "C" void nntile_cuda_gemm_bf16_fp32(const struct nntile_gemm_args *args,
                                           cublasHandle_t handle,
                                           const uint16_t *A, const uint16_t *B,
                                           float *C)
{
    gemm(args, handle, (const bf16 *)A, (const bf16 *)B, C, CUDA_R_16BF,
         CUDA_R_32F, CUBLAS_COMPUTE_32F);
}
