/*
 * nntile CUDA compute kernels: prototypes.
 *
 * Twins of the CPU kernels in ../_core/kernels (same args structs, same
 * buffers in the same order, same function):
 *   void nntile_cuda_<op>_<dtype>(const struct nntile_<op>_args *args,
 *                                 cudaStream_t stream, <buffers>);
 *   void nntile_cuda_gemm_<dtype>(const struct nntile_gemm_args *args,
 *                                 cublasHandle_t handle, A, B, C);
 * - args points to HOST memory; every buffer is a DEVICE pointer (one
 *   contiguous row-major tile; buffers of one call never alias).
 * - everything is enqueued on `stream` (gemm: on the stream already bound to
 *   `handle`); no call synchronises the host or reads device data on it.
 * - dtypes: fp32 (float), fp64 (double), bf16 (storage uint16_t holding
 *   bfloat16 bits, compute in float); gemm also has tf32 (float storage,
 *   TF32 tensor-core math with fp32 accumulation).
 */
#ifndef NNTILE_CUDA_KERNELS_H
#define NNTILE_CUDA_KERNELS_H

#include <stdint.h>
#include <cuda_runtime_api.h>

#include "../_core/kernels/kernels.h"

#ifdef __cplusplus
extern "C" {
#endif

/* The same typedef as cublas_api.h (repeating it is valid C11 and C++), so
 * this header does not need the cuBLAS headers. */
struct cublasContext;
typedef struct cublasContext *cublasHandle_t;

/* X(abi_type, suffix): abi_type is what the C prototypes take. */
#define NNTILE_CUDA_FOR_EACH_DTYPE(X) \
    X(float, fp32) X(double, fp64) X(uint16_t, bf16)
#define NNTILE_CUDA_FOR_EACH_GEMM_DTYPE(X) \
    X(float, fp32) X(float, tf32) X(double, fp64) X(uint16_t, bf16)

#define NNTILE_CUDA_PROTO_fill(T, S) \
    void nntile_cuda_fill_##S(const struct nntile_fill_args *args, \
        cudaStream_t stream, T *dst);
#define NNTILE_CUDA_PROTO_copy(T, S) \
    void nntile_cuda_copy_##S(const struct nntile_copy_args *args, \
        cudaStream_t stream, const T *src, T *dst);
#define NNTILE_CUDA_PROTO_subcopy(T, S) \
    void nntile_cuda_subcopy_##S(const struct nntile_subcopy_args *args, \
        cudaStream_t stream, const T *src, T *dst);
#define NNTILE_CUDA_PROTO_add(T, S) \
    void nntile_cuda_add_##S(const struct nntile_add_args *args, \
        cudaStream_t stream, const T *src, T *dst);
#define NNTILE_CUDA_PROTO_scal(T, S) \
    void nntile_cuda_scal_##S(const struct nntile_scal_args *args, \
        cudaStream_t stream, T *dst);
#define NNTILE_CUDA_PROTO_prod(T, S) \
    void nntile_cuda_prod_##S(const struct nntile_prod_args *args, \
        cudaStream_t stream, const T *src1, const T *src2, T *dst);
#define NNTILE_CUDA_PROTO_gelu(T, S) \
    void nntile_cuda_gelu_##S(const struct nntile_gelu_args *args, \
        cudaStream_t stream, const T *src, T *dst);
#define NNTILE_CUDA_PROTO_gelu_backward(T, S) \
    void nntile_cuda_gelu_backward_##S( \
        const struct nntile_gelu_backward_args *args, cudaStream_t stream, \
        const T *x, const T *dy, T *dx);
#define NNTILE_CUDA_PROTO_gelutanh(T, S) \
    void nntile_cuda_gelutanh_##S(const struct nntile_gelutanh_args *args, \
        cudaStream_t stream, const T *src, T *dst);
#define NNTILE_CUDA_PROTO_gelutanh_backward(T, S) \
    void nntile_cuda_gelutanh_backward_##S( \
        const struct nntile_gelutanh_backward_args *args, \
        cudaStream_t stream, const T *x, const T *dy, T *dx);
#define NNTILE_CUDA_PROTO_add_fiber(T, S) \
    void nntile_cuda_add_fiber_##S(const struct nntile_add_fiber_args *args, \
        cudaStream_t stream, const T *fiber, T *dst);
#define NNTILE_CUDA_PROTO_prod_fiber(T, S) \
    void nntile_cuda_prod_fiber_##S( \
        const struct nntile_prod_fiber_args *args, cudaStream_t stream, \
        const T *fiber, T *dst);
#define NNTILE_CUDA_PROTO_sum_fiber(T, S) \
    void nntile_cuda_sum_fiber_##S(const struct nntile_sum_fiber_args *args, \
        cudaStream_t stream, const T *src, T *fiber);
#define NNTILE_CUDA_PROTO_sumprod_fiber(T, S) \
    void nntile_cuda_sumprod_fiber_##S( \
        const struct nntile_sumprod_fiber_args *args, cudaStream_t stream, \
        const T *src1, const T *src2, T *fiber);
#define NNTILE_CUDA_PROTO_sum_slice(T, S) \
    void nntile_cuda_sum_slice_##S(const struct nntile_sum_slice_args *args, \
        cudaStream_t stream, const T *src, T *dst);
#define NNTILE_CUDA_PROTO_sumprod_slice(T, S) \
    void nntile_cuda_sumprod_slice_##S( \
        const struct nntile_sumprod_slice_args *args, cudaStream_t stream, \
        const T *src1, const T *src2, T *dst);
#define NNTILE_CUDA_PROTO_add_slice(T, S) \
    void nntile_cuda_add_slice_##S(const struct nntile_add_slice_args *args, \
        cudaStream_t stream, const T *src, T *dst);
#define NNTILE_CUDA_PROTO_prod_slice(T, S) \
    void nntile_cuda_prod_slice_##S( \
        const struct nntile_prod_slice_args *args, cudaStream_t stream, \
        const T *src, T *dst);
#define NNTILE_CUDA_PROTO_maxsumexp(T, S) \
    void nntile_cuda_maxsumexp_##S(const struct nntile_maxsumexp_args *args, \
        cudaStream_t stream, const T *src, T *stats);
#define NNTILE_CUDA_PROTO_softmax_inplace(T, S) \
    void nntile_cuda_softmax_inplace_##S( \
        const struct nntile_softmax_inplace_args *args, cudaStream_t stream, \
        const T *stats, T *dst);
#define NNTILE_CUDA_PROTO_softmax_backward(T, S) \
    void nntile_cuda_softmax_backward_##S( \
        const struct nntile_softmax_backward_args *args, cudaStream_t stream, \
        const T *p, const T *sums, T *dp);
#define NNTILE_CUDA_PROTO_mask_causal(T, S) \
    void nntile_cuda_mask_causal_##S( \
        const struct nntile_mask_causal_args *args, cudaStream_t stream, \
        T *dst);
#define NNTILE_CUDA_PROTO_logsumexp(T, S) \
    void nntile_cuda_logsumexp_##S(const struct nntile_logsumexp_args *args, \
        cudaStream_t stream, const T *stats, T *dst);
#define NNTILE_CUDA_PROTO_xent_picked(T, S) \
    void nntile_cuda_xent_picked_##S( \
        const struct nntile_xent_picked_args *args, cudaStream_t stream, \
        const T *logits, const int64_t *labels, T *picked);
#define NNTILE_CUDA_PROTO_xent_loss(T, S) \
    void nntile_cuda_xent_loss_##S(const struct nntile_xent_loss_args *args, \
        cudaStream_t stream, const T *lse, const T *picked, T *loss);
#define NNTILE_CUDA_PROTO_xent_grad_inplace(T, S) \
    void nntile_cuda_xent_grad_inplace_##S( \
        const struct nntile_xent_grad_inplace_args *args, \
        cudaStream_t stream, const T *stats, const int64_t *labels, \
        T *logits);
#define NNTILE_CUDA_PROTO_embedding(T, S) \
    void nntile_cuda_embedding_##S(const struct nntile_embedding_args *args, \
        cudaStream_t stream, const int64_t *ids, const T *table, T *dst);
#define NNTILE_CUDA_PROTO_embedding_backward(T, S) \
    void nntile_cuda_embedding_backward_##S( \
        const struct nntile_embedding_backward_args *args, \
        cudaStream_t stream, const int64_t *ids, const T *dy, T *dtable);
#define NNTILE_CUDA_PROTO_layernorm_stats(T, S) \
    void nntile_cuda_layernorm_stats_##S( \
        const struct nntile_layernorm_stats_args *args, cudaStream_t stream, \
        const T *x, T *stats);
#define NNTILE_CUDA_PROTO_layernorm_forward(T, S) \
    void nntile_cuda_layernorm_forward_##S( \
        const struct nntile_layernorm_forward_args *args, \
        cudaStream_t stream, const T *x, const T *stats, const T *gamma, \
        const T *beta_, T *y);
#define NNTILE_CUDA_PROTO_layernorm_backward_reduce(T, S) \
    void nntile_cuda_layernorm_backward_reduce_##S( \
        const struct nntile_layernorm_backward_reduce_args *args, \
        cudaStream_t stream, const T *x, const T *dy, const T *stats, \
        const T *gamma, T *rowacc, T *dgamma, T *dbeta);
#define NNTILE_CUDA_PROTO_layernorm_backward(T, S) \
    void nntile_cuda_layernorm_backward_##S( \
        const struct nntile_layernorm_backward_args *args, \
        cudaStream_t stream, const T *x, const T *dy, const T *stats, \
        const T *gamma, const T *rowacc, T *dx);
#define NNTILE_CUDA_PROTO_sumsq(T, S) \
    void nntile_cuda_sumsq_##S(const struct nntile_sumsq_args *args, \
        cudaStream_t stream, const T *src, T *dst);
#define NNTILE_CUDA_PROTO_adam_step(T, S) \
    void nntile_cuda_adam_step_##S(const struct nntile_adam_step_args *args, \
        cudaStream_t stream, T *p, const T *g, T *m, T *v, const T *normsq);
#define NNTILE_CUDA_PROTO_sgd_step(T, S) \
    void nntile_cuda_sgd_step_##S(const struct nntile_sgd_step_args *args, \
        cudaStream_t stream, T *p, const T *g, T *buf, const T *normsq);
#define NNTILE_CUDA_PROTO_gemm(T, S) \
    void nntile_cuda_gemm_##S(const struct nntile_gemm_args *args, \
        cublasHandle_t handle, const T *A, const T *B, T *C);

#define NNTILE_CUDA_PROTO_ALL(T, S) \
    NNTILE_CUDA_PROTO_fill(T, S) NNTILE_CUDA_PROTO_copy(T, S) \
    NNTILE_CUDA_PROTO_subcopy(T, S) NNTILE_CUDA_PROTO_add(T, S) \
    NNTILE_CUDA_PROTO_scal(T, S) NNTILE_CUDA_PROTO_prod(T, S) \
    NNTILE_CUDA_PROTO_gelu(T, S) NNTILE_CUDA_PROTO_gelu_backward(T, S) \
    NNTILE_CUDA_PROTO_gelutanh(T, S) \
    NNTILE_CUDA_PROTO_gelutanh_backward(T, S) \
    NNTILE_CUDA_PROTO_add_fiber(T, S) NNTILE_CUDA_PROTO_prod_fiber(T, S) \
    NNTILE_CUDA_PROTO_sum_fiber(T, S) NNTILE_CUDA_PROTO_sumprod_fiber(T, S) \
    NNTILE_CUDA_PROTO_sum_slice(T, S) NNTILE_CUDA_PROTO_sumprod_slice(T, S) \
    NNTILE_CUDA_PROTO_add_slice(T, S) NNTILE_CUDA_PROTO_prod_slice(T, S) \
    NNTILE_CUDA_PROTO_maxsumexp(T, S) \
    NNTILE_CUDA_PROTO_softmax_inplace(T, S) \
    NNTILE_CUDA_PROTO_softmax_backward(T, S) \
    NNTILE_CUDA_PROTO_mask_causal(T, S) NNTILE_CUDA_PROTO_logsumexp(T, S) \
    NNTILE_CUDA_PROTO_xent_picked(T, S) NNTILE_CUDA_PROTO_xent_loss(T, S) \
    NNTILE_CUDA_PROTO_xent_grad_inplace(T, S) \
    NNTILE_CUDA_PROTO_embedding(T, S) \
    NNTILE_CUDA_PROTO_embedding_backward(T, S) \
    NNTILE_CUDA_PROTO_layernorm_stats(T, S) \
    NNTILE_CUDA_PROTO_layernorm_forward(T, S) \
    NNTILE_CUDA_PROTO_layernorm_backward_reduce(T, S) \
    NNTILE_CUDA_PROTO_layernorm_backward(T, S) \
    NNTILE_CUDA_PROTO_sumsq(T, S) NNTILE_CUDA_PROTO_adam_step(T, S) \
    NNTILE_CUDA_PROTO_sgd_step(T, S)

NNTILE_CUDA_FOR_EACH_DTYPE(NNTILE_CUDA_PROTO_ALL)
NNTILE_CUDA_FOR_EACH_GEMM_DTYPE(NNTILE_CUDA_PROTO_gemm)

/* Mixed precision (column NNTILE_BF16_FP32): bf16 data (uint16_t bits), float
 * accumulators, the buffers of kernels.h's NNTILE_PROTO_<op>(uint16_t, float,
 * bf16_fp32).  mixed.cu, gemm.cu (gemm) and optim.cu (adam_step_refresh). */
void nntile_cuda_add_bf16_fp32(const struct nntile_add_args *args,
    cudaStream_t stream, const uint16_t *src, float *dst);
void nntile_cuda_cast_bf16_fp32(const struct nntile_cast_args *args,
    cudaStream_t stream, const float *src, uint16_t *dst);
void nntile_cuda_add_fiber_bf16_fp32(const struct nntile_add_fiber_args *args,
    cudaStream_t stream, const float *fiber, uint16_t *dst);
void nntile_cuda_sum_fiber_bf16_fp32(const struct nntile_sum_fiber_args *args,
    cudaStream_t stream, const uint16_t *src, float *fiber);
void nntile_cuda_sumprod_slice_bf16_fp32(
    const struct nntile_sumprod_slice_args *args, cudaStream_t stream,
    const uint16_t *src1, const uint16_t *src2, float *dst);
void nntile_cuda_maxsumexp_bf16_fp32(const struct nntile_maxsumexp_args *args,
    cudaStream_t stream, const uint16_t *src, float *stats);
void nntile_cuda_softmax_inplace_bf16_fp32(
    const struct nntile_softmax_inplace_args *args, cudaStream_t stream,
    const float *stats, uint16_t *dst);
void nntile_cuda_softmax_backward_bf16_fp32(
    const struct nntile_softmax_backward_args *args, cudaStream_t stream,
    const uint16_t *p, const float *sums, uint16_t *dp);
void nntile_cuda_xent_picked_bf16_fp32(
    const struct nntile_xent_picked_args *args, cudaStream_t stream,
    const uint16_t *logits, const int64_t *labels, float *picked);
void nntile_cuda_xent_grad_inplace_bf16_fp32(
    const struct nntile_xent_grad_inplace_args *args, cudaStream_t stream,
    const float *stats, const int64_t *labels, uint16_t *logits);
void nntile_cuda_layernorm_forward_bf16_fp32(
    const struct nntile_layernorm_forward_args *args, cudaStream_t stream,
    const float *x, const float *stats, const float *gamma, const float *beta_,
    uint16_t *y);
void nntile_cuda_gemm_bf16_fp32(const struct nntile_gemm_args *args,
    cublasHandle_t handle, const uint16_t *A, const uint16_t *B, float *C);
void nntile_cuda_adam_step_refresh_bf16_fp32(
    const struct nntile_adam_step_args *args, cudaStream_t stream, float *p,
    const float *g, float *m, float *v, uint16_t *copy, const float *normsq);

#ifdef __cplusplus
}
#endif

#endif /* NNTILE_CUDA_KERNELS_H */
