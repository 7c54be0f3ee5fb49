/*
 * nntile CPU compute kernels: argument structs and prototypes.
 *
 * Contract (see README.md in this directory):
 *   void nntile_kernel_<op>_<dtype>(const struct nntile_<op>_args *args,
 *                                   <buffer pointers in the documented order>);
 * - dtype suffixes: fp32 (float), fp64 (double), bf16 (uint16_t holding
 *   bfloat16 bits; computed in float, stored rounded to nearest even),
 *   bf16_fp32 (bf16 data buffers, float accumulator buffers: mixed
 *   precision; each prototype says which buffers are which).
 * - every buffer is one contiguous row-major tile; buffers never alias.
 * - struct fields: int64_t for sizes/offsets/flags, double for scalars.
 * - "axis layout [m, k, n]": element (i,j,l) at (i*k + j)*n + l; k is the
 *   reduced/broadcast axis, slices are [m, n], fibers are [k].
 * - a kernel with beta never reads its destination when beta == 0.
 *
 * Plain C11, no StarPU, no Python.
 */
#ifndef NNTILE_CORE_KERNELS_H
#define NNTILE_CORE_KERNELS_H

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define NNTILE_SUBCOPY_MAX_NDIM 8

/* ---- argument structs (field order is part of the ABI) ---- */

struct nntile_fill_args { int64_t n; double value; };
struct nntile_copy_args { int64_t n; };
struct nntile_cast_args { int64_t n; };
struct nntile_subcopy_args {
    int64_t ndim;
    int64_t src_shape[NNTILE_SUBCOPY_MAX_NDIM];
    int64_t dst_shape[NNTILE_SUBCOPY_MAX_NDIM];
    int64_t copy_shape[NNTILE_SUBCOPY_MAX_NDIM];
    int64_t src_offset[NNTILE_SUBCOPY_MAX_NDIM];
    int64_t dst_offset[NNTILE_SUBCOPY_MAX_NDIM];
};
struct nntile_add_args { int64_t n; double alpha; double beta; };
struct nntile_scal_args { int64_t n; double alpha; };
struct nntile_prod_args { int64_t n; double alpha; };
struct nntile_gelu_args { int64_t n; };
struct nntile_gelu_backward_args { int64_t n; double beta; };
struct nntile_gelutanh_args { int64_t n; };
struct nntile_gelutanh_backward_args { int64_t n; double beta; };
struct nntile_add_fiber_args { int64_t m, k, n; double alpha; double beta; };
struct nntile_prod_fiber_args { int64_t m, k, n; double alpha; };
struct nntile_sum_fiber_args { int64_t m, k, n; double alpha; double beta; };
struct nntile_sumprod_fiber_args { int64_t m, k, n; double alpha; double beta; };
struct nntile_sum_slice_args { int64_t m, k, n; double alpha; double beta; };
struct nntile_sumprod_slice_args { int64_t m, k, n; double alpha; double beta; };
struct nntile_add_slice_args { int64_t m, k, n; double alpha; double beta; };
struct nntile_prod_slice_args { int64_t m, k, n; double alpha; };
struct nntile_maxsumexp_args { int64_t m, k, n; int64_t init; };
struct nntile_softmax_inplace_args { int64_t m, k, n; };
struct nntile_softmax_backward_args { int64_t m, k, n; double alpha; };
struct nntile_mask_causal_args {
    int64_t batch, tq, tk, q_offset, k_offset;
};
struct nntile_logsumexp_args { int64_t n; };
struct nntile_xent_picked_args { int64_t rows, v, v_offset; };
struct nntile_xent_loss_args { int64_t rows; double alpha; double beta; };
struct nntile_xent_grad_inplace_args {
    int64_t rows, v, v_offset; double alpha;
};
struct nntile_embedding_args { int64_t rows, e, v_offset, v; };
struct nntile_embedding_backward_args { int64_t rows, e, v_offset, v; };
struct nntile_layernorm_stats_args { int64_t rows, e, e_offset; };
struct nntile_layernorm_forward_args {
    int64_t rows, e, e_total; double eps;
};
struct nntile_layernorm_backward_reduce_args {
    int64_t rows, e, e_total; double eps; int64_t init;
};
struct nntile_layernorm_backward_args {
    int64_t rows, e, e_total; double eps; double beta;
};
struct nntile_gemm_args {
    int64_t transA, transB, M, N, K;
    double alpha, beta;
    int64_t batch1, batch2, lda, ldb, ldc;
    int64_t strideA1, strideA2, strideB1, strideB2, strideC1, strideC2;
};
struct nntile_sumsq_args { int64_t n; double beta; };
struct nntile_adam_step_args {
    int64_t n, step;
    double lr, beta1, beta2, eps, weight_decay;
    int64_t decoupled;
    double max_norm;
};
struct nntile_sgd_step_args {
    int64_t n, step;
    double lr, momentum, dampening, weight_decay;
    int64_t nesterov;
    double max_norm;
};

/* ---- prototypes ----
 * Each NNTILE_PROTO_<op>(T, ACC, S) declares nntile_kernel_<op>_<S> for data
 * type T and accumulator type ACC (the type of the buffers that hold
 * statistics, reductions, accumulating GEMM outputs, optimizer masters);
 * NNTILE_FOR_EACH_DTYPE instantiates it for every supported dtype. ACC is T
 * except for bf16_fp32, the kernels of mixed precision: bf16 data, fp32
 * accumulators. */
#define NNTILE_FOR_EACH_DTYPE(X) X(float, float, fp32) X(double, double, fp64) \
    X(uint16_t, uint16_t, bf16) X(uint16_t, float, bf16_fp32)

#define NNTILE_PROTO_fill(T, ACC, S) \
    void nntile_kernel_fill_##S(const struct nntile_fill_args *args, T *dst);
#define NNTILE_PROTO_copy(T, ACC, S) \
    void nntile_kernel_copy_##S(const struct nntile_copy_args *args, \
        const T *src, T *dst);
#define NNTILE_PROTO_subcopy(T, ACC, S) \
    void nntile_kernel_subcopy_##S(const struct nntile_subcopy_args *args, \
        const T *src, T *dst);
#define NNTILE_PROTO_add(T, ACC, S) \
    void nntile_kernel_add_##S(const struct nntile_add_args *args, \
        const T *src, ACC *dst);
#define NNTILE_PROTO_cast(T, ACC, S) \
    void nntile_kernel_cast_##S(const struct nntile_cast_args *args, \
        const ACC *src, T *dst);
#define NNTILE_PROTO_scal(T, ACC, S) \
    void nntile_kernel_scal_##S(const struct nntile_scal_args *args, T *dst);
#define NNTILE_PROTO_prod(T, ACC, S) \
    void nntile_kernel_prod_##S(const struct nntile_prod_args *args, \
        const T *src1, const T *src2, T *dst);
#define NNTILE_PROTO_gelu(T, ACC, S) \
    void nntile_kernel_gelu_##S(const struct nntile_gelu_args *args, \
        const T *src, T *dst);
#define NNTILE_PROTO_gelu_backward(T, ACC, S) \
    void nntile_kernel_gelu_backward_##S( \
        const struct nntile_gelu_backward_args *args, \
        const T *x, const T *dy, T *dx);
#define NNTILE_PROTO_gelutanh(T, ACC, S) \
    void nntile_kernel_gelutanh_##S(const struct nntile_gelutanh_args *args, \
        const T *src, T *dst);
#define NNTILE_PROTO_gelutanh_backward(T, ACC, S) \
    void nntile_kernel_gelutanh_backward_##S( \
        const struct nntile_gelutanh_backward_args *args, \
        const T *x, const T *dy, T *dx);
#define NNTILE_PROTO_add_fiber(T, ACC, S) \
    void nntile_kernel_add_fiber_##S(const struct nntile_add_fiber_args *args, \
        const ACC *fiber, T *dst);
#define NNTILE_PROTO_prod_fiber(T, ACC, S) \
    void nntile_kernel_prod_fiber_##S( \
        const struct nntile_prod_fiber_args *args, const ACC *fiber, T *dst);
#define NNTILE_PROTO_sum_fiber(T, ACC, S) \
    void nntile_kernel_sum_fiber_##S(const struct nntile_sum_fiber_args *args, \
        const T *src, ACC *fiber);
#define NNTILE_PROTO_sumprod_fiber(T, ACC, S) \
    void nntile_kernel_sumprod_fiber_##S( \
        const struct nntile_sumprod_fiber_args *args, \
        const T *src1, const T *src2, ACC *fiber);
#define NNTILE_PROTO_sum_slice(T, ACC, S) \
    void nntile_kernel_sum_slice_##S(const struct nntile_sum_slice_args *args, \
        const T *src, ACC *dst);
#define NNTILE_PROTO_sumprod_slice(T, ACC, S) \
    void nntile_kernel_sumprod_slice_##S( \
        const struct nntile_sumprod_slice_args *args, \
        const T *src1, const T *src2, ACC *dst);
#define NNTILE_PROTO_add_slice(T, ACC, S) \
    void nntile_kernel_add_slice_##S(const struct nntile_add_slice_args *args, \
        const ACC *src, T *dst);
#define NNTILE_PROTO_prod_slice(T, ACC, S) \
    void nntile_kernel_prod_slice_##S( \
        const struct nntile_prod_slice_args *args, const ACC *src, T *dst);
#define NNTILE_PROTO_maxsumexp(T, ACC, S) \
    void nntile_kernel_maxsumexp_##S(const struct nntile_maxsumexp_args *args, \
        const T *src, ACC *stats);
#define NNTILE_PROTO_softmax_inplace(T, ACC, S) \
    void nntile_kernel_softmax_inplace_##S( \
        const struct nntile_softmax_inplace_args *args, \
        const ACC *stats, T *dst);
#define NNTILE_PROTO_softmax_backward(T, ACC, S) \
    void nntile_kernel_softmax_backward_##S( \
        const struct nntile_softmax_backward_args *args, \
        const T *p, const ACC *sums, T *dp);
#define NNTILE_PROTO_mask_causal(T, ACC, S) \
    void nntile_kernel_mask_causal_##S( \
        const struct nntile_mask_causal_args *args, T *dst);
#define NNTILE_PROTO_logsumexp(T, ACC, S) \
    void nntile_kernel_logsumexp_##S(const struct nntile_logsumexp_args *args, \
        const T *stats, T *dst);
#define NNTILE_PROTO_xent_picked(T, ACC, S) \
    void nntile_kernel_xent_picked_##S( \
        const struct nntile_xent_picked_args *args, \
        const T *logits, const int64_t *labels, ACC *picked);
#define NNTILE_PROTO_xent_loss(T, ACC, S) \
    void nntile_kernel_xent_loss_##S(const struct nntile_xent_loss_args *args, \
        const T *lse, const T *picked, T *loss);
#define NNTILE_PROTO_xent_grad_inplace(T, ACC, S) \
    void nntile_kernel_xent_grad_inplace_##S( \
        const struct nntile_xent_grad_inplace_args *args, \
        const ACC *stats, const int64_t *labels, T *logits);
#define NNTILE_PROTO_embedding(T, ACC, S) \
    void nntile_kernel_embedding_##S(const struct nntile_embedding_args *args, \
        const int64_t *ids, const T *table, T *dst);
#define NNTILE_PROTO_embedding_backward(T, ACC, S) \
    void nntile_kernel_embedding_backward_##S( \
        const struct nntile_embedding_backward_args *args, \
        const int64_t *ids, const T *dy, T *dtable);
#define NNTILE_PROTO_layernorm_stats(T, ACC, S) \
    void nntile_kernel_layernorm_stats_##S( \
        const struct nntile_layernorm_stats_args *args, \
        const T *x, T *stats);
#define NNTILE_PROTO_layernorm_forward(T, ACC, S) \
    void nntile_kernel_layernorm_forward_##S( \
        const struct nntile_layernorm_forward_args *args, \
        const ACC *x, const ACC *stats, const ACC *gamma, const ACC *beta_, \
        T *y);
#define NNTILE_PROTO_layernorm_backward_reduce(T, ACC, S) \
    void nntile_kernel_layernorm_backward_reduce_##S( \
        const struct nntile_layernorm_backward_reduce_args *args, \
        const T *x, const T *dy, const T *stats, const T *gamma, \
        T *rowacc, T *dgamma, T *dbeta);
#define NNTILE_PROTO_layernorm_backward(T, ACC, S) \
    void nntile_kernel_layernorm_backward_##S( \
        const struct nntile_layernorm_backward_args *args, \
        const T *x, const T *dy, const T *stats, const T *gamma, \
        const T *rowacc, T *dx);
#define NNTILE_PROTO_gemm(T, ACC, S) \
    void nntile_kernel_gemm_##S(const struct nntile_gemm_args *args, \
        const T *A, const T *B, ACC *C);
#define NNTILE_PROTO_sumsq(T, ACC, S) \
    void nntile_kernel_sumsq_##S(const struct nntile_sumsq_args *args, \
        const T *src, T *dst);
#define NNTILE_PROTO_adam_step(T, ACC, S) \
    void nntile_kernel_adam_step_##S(const struct nntile_adam_step_args *args, \
        ACC *p, const ACC *g, ACC *m, ACC *v, const ACC *normsq);
#define NNTILE_PROTO_adam_step_refresh(T, ACC, S) \
    void nntile_kernel_adam_step_refresh_##S( \
        const struct nntile_adam_step_args *args, \
        ACC *p, const ACC *g, ACC *m, ACC *v, T *copy, const ACC *normsq);
#define NNTILE_PROTO_sgd_step(T, ACC, S) \
    void nntile_kernel_sgd_step_##S(const struct nntile_sgd_step_args *args, \
        ACC *p, const ACC *g, ACC *buf, const ACC *normsq);

#define NNTILE_PROTO_ALL(T, ACC, S) \
    NNTILE_PROTO_fill(T, ACC, S) NNTILE_PROTO_copy(T, ACC, S) \
    NNTILE_PROTO_subcopy(T, ACC, S) NNTILE_PROTO_add(T, ACC, S) \
    NNTILE_PROTO_scal(T, ACC, S) NNTILE_PROTO_prod(T, ACC, S) \
    NNTILE_PROTO_gelu(T, ACC, S) NNTILE_PROTO_gelu_backward(T, ACC, S) \
    NNTILE_PROTO_gelutanh(T, ACC, S) NNTILE_PROTO_gelutanh_backward(T, ACC, S) \
    NNTILE_PROTO_add_fiber(T, ACC, S) NNTILE_PROTO_prod_fiber(T, ACC, S) \
    NNTILE_PROTO_sum_fiber(T, ACC, S) NNTILE_PROTO_sumprod_fiber(T, ACC, S) \
    NNTILE_PROTO_sum_slice(T, ACC, S) NNTILE_PROTO_sumprod_slice(T, ACC, S) \
    NNTILE_PROTO_add_slice(T, ACC, S) NNTILE_PROTO_prod_slice(T, ACC, S) \
    NNTILE_PROTO_maxsumexp(T, ACC, S) NNTILE_PROTO_softmax_inplace(T, ACC, S) \
    NNTILE_PROTO_softmax_backward(T, ACC, S) NNTILE_PROTO_mask_causal(T, ACC, S) \
    NNTILE_PROTO_logsumexp(T, ACC, S) NNTILE_PROTO_xent_picked(T, ACC, S) \
    NNTILE_PROTO_xent_loss(T, ACC, S) NNTILE_PROTO_xent_grad_inplace(T, ACC, S) \
    NNTILE_PROTO_embedding(T, ACC, S) NNTILE_PROTO_embedding_backward(T, ACC, S) \
    NNTILE_PROTO_layernorm_stats(T, ACC, S) NNTILE_PROTO_layernorm_forward(T, ACC, S) \
    NNTILE_PROTO_layernorm_backward_reduce(T, ACC, S) \
    NNTILE_PROTO_layernorm_backward(T, ACC, S) NNTILE_PROTO_gemm(T, ACC, S) \
    NNTILE_PROTO_sumsq(T, ACC, S) NNTILE_PROTO_adam_step(T, ACC, S) \
    NNTILE_PROTO_sgd_step(T, ACC, S) NNTILE_PROTO_cast(T, ACC, S) \
    NNTILE_PROTO_adam_step_refresh(T, ACC, S)

NNTILE_FOR_EACH_DTYPE(NNTILE_PROTO_ALL)

#ifdef __cplusplus
}
#endif

#endif /* NNTILE_CORE_KERNELS_H */
