/*
 * nntile compute kernels: argument structs, the op table, each op's buffers
 * and the CPU prototypes (the CUDA ones are in ../../cuda/cuda_kernels.h).
 *
 * Contract (see README.md in this directory):
 *   void nntile_kernel_<op>_<dtype>(const struct nntile_<op>_args *args,
 *                                   <buffers of NNTILE_BUFFERS_<op>>);
 * - dtype suffixes: fp32 (float), fp64 (double), bf16 (uint16_t holding
 *   bfloat16 bits; computed in float, stored rounded to nearest even),
 *   bf16_fp32 (bf16 data buffers, float accumulator buffers: mixed
 *   precision; NNTILE_BUFFERS_<op> says which buffers are which).
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
/* adam_step_refresh (adam_step that also writes the bf16 copy of the
 * parameter) takes adam_step's args. */
#define nntile_adam_step_refresh_args nntile_adam_step_args
/* Fused attention (flash attention) of one tile of queries against one tile
 * of keys, for one (batch tile, head tile, query tile, key tile); only the
 * output and each row's log-sum-exp are kept, backward recomputes the
 * probabilities. Activations are [batch, seq, heads, head_dim] tiles with the
 * head dimension whole; k and v have hkv heads, query head h reading kv head
 * h / (hq / hkv) (grouped-query attention, K/V never repeated). lse is
 * [batch, tq, hq] in the accumulator dtype: the natural log of the sum of
 * exp of the row's scaled, masked scores. A row whose keys are all masked in
 * a tile gets nothing from it: in a first tile its lse is -inf and o is 0. */
struct nntile_flash_args {
    int64_t batch, tq, tk, hq, hkv, d; /* tile extents: q, o, dq [batch, tq, hq, d];
                                          k, v, dk, dv [batch, tk, hkv, d]; lse [batch, tq, hq] */
    int64_t q_offset, k_offset;        /* sequence positions of the tiles' first rows */
    int64_t causal;                    /* 1: key position > query position is masked */
    int64_t accumulate;                /* forward: 0 = the first key tile of these queries
                                          (o and lse are written), 1 = merge this key tile's
                                          result into o and lse (online-softmax merge, o kept
                                          normalised);
                                          backward: bit 0 set = dq accumulates (+=), else is
                                          written; bit 1 set = dk and dv accumulate */
    double scale;                      /* the scores are scale * q.k */
};
#define nntile_flash_forward_args nntile_flash_args
#define nntile_flash_backward_args nntile_flash_args

/* ---- the op table ----
 * One line per op: X(op, nbuf, columns), with X_OPT for an op whose last
 * buffer is optional (a task may leave it out; the kernel then gets NULL) and
 * X_BLAS for an op whose CUDA kernel takes a cuBLAS handle, not a stream.
 *   nbuf     the buffers a task of the op takes (X_OPT: without the optional one)
 *   columns  the dtypes the codelet table has kernels of the op for:
 *            PLAIN       fp32, fp64, tf32 (fp32 storage) and bf16;
 *            MIXED       those and bf16_fp32 (mixed precision);
 *            MIXED_ONLY  bf16_fp32 only.
 * The CPU and CUDA prototypes, the codelets, the op enum (codelets.h) and its
 * Cython copy (generated by setup.py) all come from this list.
 * A line may end with a comment "unary: <docstring>": the op is element-wise
 * from one tensor to another, with args { int64_t n; } and buffers
 * P(const T *, src) P(T *, dst), and its tensor op, def <op>(src, dst), one
 * task per tile, is generated by setup.py (unary_ops.pxi) with that
 * docstring. */
#define NNTILE_OPS(X, X_OPT, X_BLAS) \
    X(fill, 1, PLAIN) X(copy, 2, PLAIN) X(subcopy, 2, PLAIN) X(add, 2, MIXED) \
    X(scal, 1, PLAIN) X(prod, 3, PLAIN) \
    X(gelu, 2, PLAIN) /* unary: dst = GELU(src) (exact, erf form). */ \
    X(gelu_backward, 3, PLAIN) \
    X(gelutanh, 2, PLAIN) /* unary: dst = GELU(src), tanh approximation. */ \
    X(gelutanh_backward, 3, PLAIN) X(add_fiber, 2, MIXED) \
    X(prod_fiber, 2, PLAIN) X(sum_fiber, 2, MIXED) X(sumprod_fiber, 3, PLAIN) \
    X(sum_slice, 2, PLAIN) X(sumprod_slice, 3, MIXED) X(add_slice, 2, PLAIN) \
    X(prod_slice, 2, PLAIN) X(maxsumexp, 2, MIXED) \
    X(softmax_inplace, 2, MIXED) X(softmax_backward, 3, MIXED) \
    X(mask_causal, 1, PLAIN) X(logsumexp, 2, PLAIN) X(xent_picked, 3, MIXED) \
    X(xent_loss, 3, PLAIN) X(xent_grad_inplace, 3, MIXED) \
    X(embedding, 3, PLAIN) X(embedding_backward, 3, PLAIN) \
    X(layernorm_stats, 2, PLAIN) X(layernorm_forward, 5, MIXED) \
    X(layernorm_backward_reduce, 7, PLAIN) X(layernorm_backward, 6, PLAIN) \
    X_BLAS(gemm, 3, MIXED) X(sumsq, 2, PLAIN) X_OPT(adam_step, 4, PLAIN) \
    X_OPT(sgd_step, 3, PLAIN) X(cast, 2, MIXED_ONLY) \
    X_OPT(adam_step_refresh, 5, MIXED_ONLY) X(flash_forward, 5, MIXED) \
    X(flash_backward, 9, MIXED)

/* NNTILE_IF_PLAIN(columns, ...) is what follows columns where the op has the
 * plain dtypes' kernels, and nothing otherwise; NNTILE_IF_MIXED the same for
 * the bf16_fp32 kernels. */
#define NNTILE_IF_PLAIN(columns, ...) NNTILE_IF_PLAIN_##columns(__VA_ARGS__)
#define NNTILE_IF_PLAIN_PLAIN(...) __VA_ARGS__
#define NNTILE_IF_PLAIN_MIXED(...) __VA_ARGS__
#define NNTILE_IF_PLAIN_MIXED_ONLY(...)
#define NNTILE_IF_MIXED(columns, ...) NNTILE_IF_MIXED_##columns(__VA_ARGS__)
#define NNTILE_IF_MIXED_PLAIN(...)
#define NNTILE_IF_MIXED_MIXED(...) __VA_ARGS__
#define NNTILE_IF_MIXED_MIXED_ONLY(...) __VA_ARGS__

/* ---- buffers ----
 * NNTILE_BUFFERS_<op>(P, T, ACC): the op's buffers in order, P(type, name)
 * each, for data type T and accumulator type ACC (the type of the buffers
 * that hold statistics, reductions, accumulating GEMM outputs, optimizer
 * masters). The CPU kernels follow them, and so do their CUDA twins
 * (cuda/cuda_kernels.h). */
#define NNTILE_BUFFERS_fill(P, T, ACC) P(T *, dst)
#define NNTILE_BUFFERS_copy(P, T, ACC) P(const T *, src) P(T *, dst)
#define NNTILE_BUFFERS_subcopy(P, T, ACC) P(const T *, src) P(T *, dst)
#define NNTILE_BUFFERS_add(P, T, ACC) P(const T *, src) P(ACC *, dst)
#define NNTILE_BUFFERS_cast(P, T, ACC) P(const ACC *, src) P(T *, dst)
#define NNTILE_BUFFERS_scal(P, T, ACC) P(T *, dst)
#define NNTILE_BUFFERS_prod(P, T, ACC) \
    P(const T *, src1) P(const T *, src2) P(T *, dst)
#define NNTILE_BUFFERS_gelu(P, T, ACC) P(const T *, src) P(T *, dst)
#define NNTILE_BUFFERS_gelu_backward(P, T, ACC) \
    P(const T *, x) P(const T *, dy) P(T *, dx)
#define NNTILE_BUFFERS_gelutanh(P, T, ACC) P(const T *, src) P(T *, dst)
#define NNTILE_BUFFERS_gelutanh_backward(P, T, ACC) \
    P(const T *, x) P(const T *, dy) P(T *, dx)
#define NNTILE_BUFFERS_add_fiber(P, T, ACC) P(const ACC *, fiber) P(T *, dst)
#define NNTILE_BUFFERS_prod_fiber(P, T, ACC) P(const ACC *, fiber) P(T *, dst)
#define NNTILE_BUFFERS_sum_fiber(P, T, ACC) P(const T *, src) P(ACC *, fiber)
#define NNTILE_BUFFERS_sumprod_fiber(P, T, ACC) \
    P(const T *, src1) P(const T *, src2) P(ACC *, fiber)
#define NNTILE_BUFFERS_sum_slice(P, T, ACC) P(const T *, src) P(ACC *, dst)
#define NNTILE_BUFFERS_sumprod_slice(P, T, ACC) \
    P(const T *, src1) P(const T *, src2) P(ACC *, dst)
#define NNTILE_BUFFERS_add_slice(P, T, ACC) P(const ACC *, src) P(T *, dst)
#define NNTILE_BUFFERS_prod_slice(P, T, ACC) P(const ACC *, src) P(T *, dst)
#define NNTILE_BUFFERS_maxsumexp(P, T, ACC) P(const T *, src) P(ACC *, stats)
#define NNTILE_BUFFERS_softmax_inplace(P, T, ACC) \
    P(const ACC *, stats) P(T *, dst)
#define NNTILE_BUFFERS_softmax_backward(P, T, ACC) \
    P(const T *, p) P(const ACC *, sums) P(T *, dp)
#define NNTILE_BUFFERS_mask_causal(P, T, ACC) P(T *, dst)
#define NNTILE_BUFFERS_logsumexp(P, T, ACC) P(const T *, stats) P(T *, dst)
#define NNTILE_BUFFERS_xent_picked(P, T, ACC) \
    P(const T *, logits) P(const int64_t *, labels) P(ACC *, picked)
#define NNTILE_BUFFERS_xent_loss(P, T, ACC) \
    P(const T *, lse) P(const T *, picked) P(T *, loss)
#define NNTILE_BUFFERS_xent_grad_inplace(P, T, ACC) \
    P(const ACC *, stats) P(const int64_t *, labels) P(T *, logits)
#define NNTILE_BUFFERS_embedding(P, T, ACC) \
    P(const int64_t *, ids) P(const T *, table) P(T *, dst)
#define NNTILE_BUFFERS_embedding_backward(P, T, ACC) \
    P(const int64_t *, ids) P(const T *, dy) P(T *, dtable)
#define NNTILE_BUFFERS_layernorm_stats(P, T, ACC) P(const T *, x) P(T *, stats)
#define NNTILE_BUFFERS_layernorm_forward(P, T, ACC) \
    P(const ACC *, x) P(const ACC *, stats) P(const ACC *, gamma) \
    P(const ACC *, beta_) P(T *, y)
#define NNTILE_BUFFERS_layernorm_backward_reduce(P, T, ACC) \
    P(const T *, x) P(const T *, dy) P(const T *, stats) P(const T *, gamma) \
    P(T *, rowacc) P(T *, dgamma) P(T *, dbeta)
#define NNTILE_BUFFERS_layernorm_backward(P, T, ACC) \
    P(const T *, x) P(const T *, dy) P(const T *, stats) P(const T *, gamma) \
    P(const T *, rowacc) P(T *, dx)
#define NNTILE_BUFFERS_gemm(P, T, ACC) P(const T *, A) P(const T *, B) P(ACC *, C)
#define NNTILE_BUFFERS_sumsq(P, T, ACC) P(const T *, src) P(T *, dst)
#define NNTILE_BUFFERS_adam_step(P, T, ACC) \
    P(ACC *, p) P(const ACC *, g) P(ACC *, m) P(ACC *, v) P(const ACC *, normsq)
#define NNTILE_BUFFERS_adam_step_refresh(P, T, ACC) \
    P(ACC *, p) P(const ACC *, g) P(ACC *, m) P(ACC *, v) P(T *, copy) \
    P(const ACC *, normsq)
#define NNTILE_BUFFERS_sgd_step(P, T, ACC) \
    P(ACC *, p) P(const ACC *, g) P(ACC *, buf) P(const ACC *, normsq)
#define NNTILE_BUFFERS_flash_forward(P, T, ACC) \
    P(const T *, q) P(const T *, k) P(const T *, v) P(T *, o) P(ACC *, lse)
/* delta = rowsum(dout * o) is computed by the kernel; lse is forward's. */
#define NNTILE_BUFFERS_flash_backward(P, T, ACC) \
    P(const T *, q) P(const T *, k) P(const T *, v) P(const T *, o) \
    P(const T *, dout) P(const ACC *, lse) P(T *, dq) P(T *, dk) P(T *, dv)

/* ---- prototypes ----
 * void nntile_kernel_<op>_<S>(const struct nntile_<op>_args *args, <buffers>)
 * for every op and dtype. X(T, ACC, S, ...) of NNTILE_FOR_EACH_DTYPE gets the
 * data type, the accumulator type and the suffix of each dtype, and the rest
 * of its arguments handed through. ACC is T except for bf16_fp32, the kernels
 * of mixed precision: bf16 data, fp32 accumulators. */
#define NNTILE_FOR_EACH_DTYPE(X, ...) X(float, float, fp32, __VA_ARGS__) \
    X(double, double, fp64, __VA_ARGS__) \
    X(uint16_t, uint16_t, bf16, __VA_ARGS__) \
    X(uint16_t, float, bf16_fp32, __VA_ARGS__)

#define NNTILE_PARAM(type, name) , type name
#define NNTILE_KERNEL_PROTO(T, ACC, S, op) \
    void nntile_kernel_##op##_##S(const struct nntile_##op##_args *args \
        NNTILE_BUFFERS_##op(NNTILE_PARAM, T, ACC));
#define NNTILE_KERNEL_PROTOS(op, nbuf, columns) \
    NNTILE_FOR_EACH_DTYPE(NNTILE_KERNEL_PROTO, op)
NNTILE_OPS(NNTILE_KERNEL_PROTOS, NNTILE_KERNEL_PROTOS, NNTILE_KERNEL_PROTOS)

#ifdef __cplusplus
}
#endif

#endif /* NNTILE_CORE_KERNELS_H */
