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

/* X(abi_type, suffix, ...): abi_type is what the C prototypes take; the rest
 * (the op) is handed through, so that one op is declared (or defined) for
 * every dtype. */
#define NNTILE_CUDA_FOR_EACH_DTYPE(X, ...) X(float, fp32, __VA_ARGS__) \
    X(double, fp64, __VA_ARGS__) X(uint16_t, bf16, __VA_ARGS__)

/* NNTILE_CUDA_BUFFERS_<op>(P, A): the buffers of an op, after (args, stream),
 * as on the CPU: P(type, name) each, with A the ABI element type. */
#define NNTILE_CUDA_BUFFERS_fill(P, A) P(A *, dst)
#define NNTILE_CUDA_BUFFERS_copy(P, A) P(const A *, src) P(A *, dst)
#define NNTILE_CUDA_BUFFERS_subcopy(P, A) P(const A *, src) P(A *, dst)
#define NNTILE_CUDA_BUFFERS_add(P, A) P(const A *, src) P(A *, dst)
#define NNTILE_CUDA_BUFFERS_scal(P, A) P(A *, dst)
#define NNTILE_CUDA_BUFFERS_prod(P, A) \
    P(const A *, src1) P(const A *, src2) P(A *, dst)
#define NNTILE_CUDA_BUFFERS_gelu(P, A) P(const A *, src) P(A *, dst)
#define NNTILE_CUDA_BUFFERS_gelu_backward(P, A) \
    P(const A *, x) P(const A *, dy) P(A *, dx)
#define NNTILE_CUDA_BUFFERS_gelutanh(P, A) P(const A *, src) P(A *, dst)
#define NNTILE_CUDA_BUFFERS_gelutanh_backward(P, A) \
    P(const A *, x) P(const A *, dy) P(A *, dx)
#define NNTILE_CUDA_BUFFERS_add_fiber(P, A) P(const A *, fiber) P(A *, dst)
#define NNTILE_CUDA_BUFFERS_prod_fiber(P, A) P(const A *, fiber) P(A *, dst)
#define NNTILE_CUDA_BUFFERS_sum_fiber(P, A) P(const A *, src) P(A *, fiber)
#define NNTILE_CUDA_BUFFERS_sumprod_fiber(P, A) \
    P(const A *, src1) P(const A *, src2) P(A *, fiber)
#define NNTILE_CUDA_BUFFERS_sum_slice(P, A) P(const A *, src) P(A *, dst)
#define NNTILE_CUDA_BUFFERS_sumprod_slice(P, A) \
    P(const A *, src1) P(const A *, src2) P(A *, dst)
#define NNTILE_CUDA_BUFFERS_add_slice(P, A) P(const A *, src) P(A *, dst)
#define NNTILE_CUDA_BUFFERS_prod_slice(P, A) P(const A *, src) P(A *, dst)
#define NNTILE_CUDA_BUFFERS_maxsumexp(P, A) P(const A *, src) P(A *, stats)
#define NNTILE_CUDA_BUFFERS_softmax_inplace(P, A) \
    P(const A *, stats) P(A *, dst)
#define NNTILE_CUDA_BUFFERS_softmax_backward(P, A) \
    P(const A *, p) P(const A *, sums) P(A *, dp)
#define NNTILE_CUDA_BUFFERS_mask_causal(P, A) P(A *, dst)
#define NNTILE_CUDA_BUFFERS_logsumexp(P, A) P(const A *, stats) P(A *, dst)
#define NNTILE_CUDA_BUFFERS_xent_picked(P, A) \
    P(const A *, logits) P(const int64_t *, labels) P(A *, picked)
#define NNTILE_CUDA_BUFFERS_xent_loss(P, A) \
    P(const A *, lse) P(const A *, picked) P(A *, loss)
#define NNTILE_CUDA_BUFFERS_xent_grad_inplace(P, A) \
    P(const A *, stats) P(const int64_t *, labels) P(A *, logits)
#define NNTILE_CUDA_BUFFERS_embedding(P, A) \
    P(const int64_t *, ids) P(const A *, table) P(A *, dst)
#define NNTILE_CUDA_BUFFERS_embedding_backward(P, A) \
    P(const int64_t *, ids) P(const A *, dy) P(A *, dtable)
#define NNTILE_CUDA_BUFFERS_layernorm_stats(P, A) P(const A *, x) P(A *, stats)
#define NNTILE_CUDA_BUFFERS_layernorm_forward(P, A) \
    P(const A *, x) P(const A *, stats) P(const A *, gamma) \
    P(const A *, beta_) P(A *, y)
#define NNTILE_CUDA_BUFFERS_layernorm_backward_reduce(P, A) \
    P(const A *, x) P(const A *, dy) P(const A *, stats) P(const A *, gamma) \
    P(A *, rowacc) P(A *, dgamma) P(A *, dbeta)
#define NNTILE_CUDA_BUFFERS_layernorm_backward(P, A) \
    P(const A *, x) P(const A *, dy) P(const A *, stats) P(const A *, gamma) \
    P(const A *, rowacc) P(A *, dx)
#define NNTILE_CUDA_BUFFERS_sumsq(P, A) P(const A *, src) P(A *, dst)
#define NNTILE_CUDA_BUFFERS_adam_step(P, A) \
    P(A *, p) P(const A *, g) P(A *, m) P(A *, v) P(const A *, normsq)
#define NNTILE_CUDA_BUFFERS_sgd_step(P, A) \
    P(A *, p) P(const A *, g) P(A *, buf) P(const A *, normsq)

/* Every op but gemm. */
#define NNTILE_CUDA_OPS(X) \
    X(fill) X(copy) X(subcopy) X(add) X(scal) X(prod) X(gelu) \
    X(gelu_backward) X(gelutanh) X(gelutanh_backward) X(add_fiber) \
    X(prod_fiber) X(sum_fiber) X(sumprod_fiber) X(sum_slice) \
    X(sumprod_slice) X(add_slice) X(prod_slice) X(maxsumexp) \
    X(softmax_inplace) X(softmax_backward) X(mask_causal) X(logsumexp) \
    X(xent_picked) X(xent_loss) X(xent_grad_inplace) X(embedding) \
    X(embedding_backward) X(layernorm_stats) X(layernorm_forward) \
    X(layernorm_backward_reduce) X(layernorm_backward) X(sumsq) \
    X(adam_step) X(sgd_step)

/* void nntile_cuda_<op>_<suffix>(const struct nntile_<op>_args *args,
 *                                cudaStream_t stream, <buffers>) */
#define NNTILE_CUDA_PARAM(type, name) , type name
#define NNTILE_CUDA_SIGNATURE(op, A, S) \
    void nntile_cuda_##op##_##S(const struct nntile_##op##_args *args, \
        cudaStream_t stream NNTILE_CUDA_BUFFERS_##op(NNTILE_CUDA_PARAM, A))
#define NNTILE_CUDA_DECLARE_ONE(A, S, op) NNTILE_CUDA_SIGNATURE(op, A, S);
#define NNTILE_CUDA_DECLARE(op) \
    NNTILE_CUDA_FOR_EACH_DTYPE(NNTILE_CUDA_DECLARE_ONE, op)
NNTILE_CUDA_OPS(NNTILE_CUDA_DECLARE)

/* gemm takes a cuBLAS handle instead of a stream, and has tf32 too. */
#define NNTILE_CUDA_FOR_EACH_GEMM_DTYPE(X) \
    X(float, fp32) X(float, tf32) X(double, fp64) X(uint16_t, bf16)
#define NNTILE_CUDA_PROTO_gemm(T, S) \
    void nntile_cuda_gemm_##S(const struct nntile_gemm_args *args, \
        cublasHandle_t handle, const T *A, const T *B, T *C);
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
