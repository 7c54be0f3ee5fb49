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

/* X(T, ACC, suffix, ...) for the plain dtypes (ACC = T): T is the type the C
 * prototypes take, bf16 bits as uint16_t; the rest (the op) is handed
 * through, so that one op is declared (or defined) for every dtype. */
#define NNTILE_CUDA_FOR_EACH_DTYPE(X, ...) X(float, float, fp32, __VA_ARGS__) \
    X(double, double, fp64, __VA_ARGS__) \
    X(uint16_t, uint16_t, bf16, __VA_ARGS__)

/* void nntile_cuda_<op>_<suffix>(const struct nntile_<op>_args *args,
 *                                cudaStream_t stream, <buffers>)
 * for every op of kernels.h's table but gemm: the buffers of
 * NNTILE_BUFFERS_<op>, for the plain dtypes and, where the op's columns say
 * so, for bf16_fp32 (mixed precision: bf16 data, float accumulators). */
#define NNTILE_CUDA_SIGNATURE(op, T, ACC, S, BUFFERS) \
    void nntile_cuda_##op##_##S(const struct nntile_##op##_args *args, \
        cudaStream_t stream BUFFERS(NNTILE_PARAM, NNTILE_PARAM, T, ACC))
#define NNTILE_CUDA_DECLARE_ONE(T, ACC, S, op, BUFFERS) \
    NNTILE_CUDA_SIGNATURE(op, T, ACC, S, BUFFERS);
#define NNTILE_CUDA_DECLARE(op, nbuf, columns) \
    NNTILE_CUDA_DECLARE_EACH(NNTILE_CUDA_DECLARE_ONE, op, columns, \
                             NNTILE_BUFFERS_##op)
#define NNTILE_CUDA_DECLARE_EACH(ONE, op, columns, BUFFERS) \
    NNTILE_IF_PLAIN(columns, NNTILE_CUDA_FOR_EACH_DTYPE(ONE, op, BUFFERS)) \
    NNTILE_IF_MIXED(columns, ONE(uint16_t, float, bf16_fp32, op, BUFFERS))
/* an activation's two ops (X_ACT), with the activations' buffers */
#define NNTILE_CUDA_DECLARE_ACT(X, act, columns) \
    NNTILE_CUDA_DECLARE_EACH(NNTILE_CUDA_DECLARE_ONE, act, columns, \
                             NNTILE_ACT_BUFFERS) \
    NNTILE_CUDA_DECLARE_EACH(NNTILE_CUDA_DECLARE_ONE, act##_backward, columns, \
                             NNTILE_ACT_BACKWARD_BUFFERS)
/* an X_TF32 op has tf32 kernels too (float storage), taking a stream */
#define NNTILE_CUDA_DECLARE_TF32(op, nbuf, columns) \
    NNTILE_CUDA_DECLARE(op, nbuf, columns) \
    NNTILE_CUDA_DECLARE_ONE(float, float, tf32, op, NNTILE_BUFFERS_##op)

/* gemm (X_BLAS) takes a cuBLAS handle instead of a stream, and has tf32 too
 * (float storage, TF32 tensor-core math); gemm.cu defines them by hand. */
#define NNTILE_CUDA_DECLARE_BLAS_ONE(T, ACC, S, op, BUFFERS) \
    void nntile_cuda_##op##_##S(const struct nntile_##op##_args *args, \
        cublasHandle_t handle BUFFERS(NNTILE_PARAM, NNTILE_PARAM, T, ACC));
#define NNTILE_CUDA_DECLARE_BLAS(op, nbuf, columns) \
    NNTILE_CUDA_DECLARE_EACH(NNTILE_CUDA_DECLARE_BLAS_ONE, op, columns, \
                             NNTILE_BUFFERS_##op) \
    NNTILE_CUDA_DECLARE_BLAS_ONE(float, float, tf32, op, NNTILE_BUFFERS_##op)

NNTILE_OPS(NNTILE_CUDA_DECLARE, NNTILE_CUDA_DECLARE, NNTILE_CUDA_DECLARE_BLAS,
           NNTILE_CUDA_DECLARE_TF32, NNTILE_CUDA_DECLARE_ACT)

#ifdef __cplusplus
}
#endif

#endif /* NNTILE_CUDA_KERNELS_H */
