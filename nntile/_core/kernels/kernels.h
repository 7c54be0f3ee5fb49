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
 * - struct fields: int64_t for sizes/offsets/flags, double for scalars, or
 *   a struct of those held by value (struct nntile_mask).
 * - "axis layout [m, k, n]": element (i,j,l) at (i*k + j)*n + l; k is the
 *   reduced/broadcast axis, slices are [m, n], fibers are [k].
 * - a kernel with beta never reads its destination when beta == 0.
 *
 * Plain C11, no StarPU, no Python.
 */
#ifndef NNTILE_CORE_KERNELS_H
#define NNTILE_CORE_KERNELS_H

#include <stddef.h>
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
struct nntile_add_out_args { int64_t n; double alpha; double beta; };
struct nntile_scal_args { int64_t n; double alpha; };
struct nntile_prod_args { int64_t n; double alpha; };
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
/* Which keys each query of attention sees: written once here, for every
 * attention kernel (C and CUDA) and every loop that skips tiles. Query i sits
 * at key position i + offset (offset > 0 when the keys are longer than the
 * queries: a prefill after `offset` cached keys; 0 in training). */
struct nntile_mask {
    int64_t causal; /* 1: a query sees no key after its own position */
    int64_t window; /* > 0 (with causal): nor keys `window` or more before it
                       (transformers' sliding_window); 0: no window */
    int64_t offset; /* the key position of query 0 */
};

#ifdef __CUDACC__
#define NNTILE_HOST_DEVICE __host__ __device__
#else
#define NNTILE_HOST_DEVICE
#endif

/* Key j is visible from query i (positions among all queries and keys). */
static inline NNTILE_HOST_DEVICE int nntile_mask_visible(struct nntile_mask m, int64_t i,
                                                         int64_t j)
{
    const int64_t at = i + m.offset;
    return (!m.causal || j <= at) && (m.window <= 0 || j > at - m.window);
}

/* The keys [lo, hi) that some query of [q0, q1) sees, among keys [0, nk):
 * the keys outside need no work at all; lo >= hi when none. */
struct nntile_range { int64_t lo, hi; };
static inline NNTILE_HOST_DEVICE struct nntile_range nntile_mask_keys(
    struct nntile_mask m, int64_t q0, int64_t q1, int64_t nk)
{
    struct nntile_range r = {0, nk};
    if (m.causal && q1 + m.offset < nk)
        r.hi = q1 + m.offset;
    if (m.window > 0 && q0 + m.offset - m.window + 1 > 0)
        r.lo = q0 + m.offset - m.window + 1;
    return r;
}

/* Every key of [k0, k1) is visible from every query of [q0, q1) (both
 * non-empty): the visible set is convex, so two corners decide. */
static inline NNTILE_HOST_DEVICE int nntile_mask_whole(struct nntile_mask m, int64_t q0,
                                                       int64_t q1, int64_t k0, int64_t k1)
{
    return nntile_mask_visible(m, q0, k1 - 1) && nntile_mask_visible(m, q1 - 1, k0);
}

/* The queries [lo, hi) among [0, nq) that see some key of [k0, k1). */
static inline NNTILE_HOST_DEVICE struct nntile_range nntile_mask_queries(
    struct nntile_mask m, int64_t k0, int64_t k1, int64_t nq)
{
    struct nntile_range r = {0, nq};
    if (m.causal && k0 - m.offset > 0)
        r.lo = k0 - m.offset < nq ? k0 - m.offset : nq;
    if (m.window > 0 && k1 - 1 - m.offset + m.window < nq)
        r.hi = k1 - 1 - m.offset + m.window;
    return r;
}

/* Why m is not a mask the functions above describe, in one line; NULL when it
 * is one. The rules of the fields live here, beside them: the core checks every
 * mask with it before any task (nntile/_core/mask.pxi, AttentionMask). */
static inline const char *nntile_mask_error(struct nntile_mask m)
{
    if (m.causal != 0 && m.causal != 1)
        return "causal must be 0 or 1 (true or false)";
    if (m.offset < 0)
        return "offset (the key position of query 0) must be >= 0";
    if (m.window < 0)
        return "window must be >= 0 (0: none)";
    if (m.window > 0 && !m.causal)
        return "a window (sliding-window attention) needs causal attention";
    return NULL;
}

/* dst[b, i, j] = -inf where key k_offset + j is not visible from query
 * q_offset + i: the scores of unfused attention. */
struct nntile_mask_scores_args {
    int64_t batch, tq, tk, q_offset, k_offset;
    struct nntile_mask mask;
};
struct nntile_logsumexp_args { int64_t n; };
struct nntile_xent_picked_args { int64_t rows, v, v_offset; };
struct nntile_xent_loss_args { int64_t rows; double alpha; double beta; };
struct nntile_xent_grad_inplace_args {
    int64_t rows, v, v_offset; double alpha;
};
struct nntile_embedding_args { int64_t rows, e, v_offset, v; };
struct nntile_embedding_backward_args { int64_t rows, e, v_offset, v; };
/* LayerNorm and RMSNorm over the last axis, tiled over columns: one design
 * with two statistics (norm.inc).  Each statistic has its own stats args
 * (LayerNorm's (mean, M2) merges a tile at its columns' offset; RMSNorm's sum
 * of squares adds a tile unless init); the rest are shared.  rowacc holds each
 * row's sums of backward: LayerNorm's g and g * xhat, RMSNorm's g * xhat. */
struct nntile_layernorm_stats_args { int64_t rows, e, e_offset; };
struct nntile_rmsnorm_stats_args { int64_t rows, e; int64_t init; };
struct nntile_norm_forward_args { int64_t rows, e, e_total; double eps; };
struct nntile_norm_backward_reduce_args {
    int64_t rows, e, e_total; double eps; int64_t init;
};
struct nntile_norm_backward_args {
    int64_t rows, e, e_total; double eps; double beta;
};
#define nntile_layernorm_forward_args nntile_norm_forward_args
#define nntile_layernorm_backward_reduce_args nntile_norm_backward_reduce_args
#define nntile_layernorm_backward_args nntile_norm_backward_args
#define nntile_rmsnorm_forward_args nntile_norm_forward_args
#define nntile_rmsnorm_backward_reduce_args nntile_norm_backward_reduce_args
#define nntile_rmsnorm_backward_args nntile_norm_backward_args
/* a row in one tile: backward_reduce's sums and backward's dx in one pass */
#define nntile_layernorm_backward_whole_args nntile_norm_backward_args
#define nntile_rmsnorm_backward_whole_args nntile_norm_backward_args
/* rotary positions, in place on rows of heads vectors of head_dim elements */
struct nntile_rope_forward_args {
    int64_t rows, heads, head_dim; double scale;
};
struct nntile_rope_backward_args {
    int64_t rows, heads, head_dim; double scale;
};
struct nntile_swiglu_forward_args { int64_t n; };
struct nntile_swiglu_backward_args { int64_t n; };
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
    int64_t q_offset, k_offset;        /* positions of the tiles' first rows among all the
                                          queries and all the keys */
    struct nntile_mask mask;           /* which keys each query sees */
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
 * buffer is optional (a task may leave it out; the kernel then gets NULL),
 * X_BLAS for an op whose CUDA kernel takes a cuBLAS handle, not a stream, and
 * X_TF32 for an op whose tf32 column has CUDA kernels of its own
 * (nntile_cuda_<op>_tf32, taking a stream; on the CPU, tf32 runs the fp32
 * kernel as for every op):
 *   nbuf     the buffers a task of the op takes (X_OPT: without the optional one)
 *   columns  the dtypes the codelet table has kernels of the op for:
 *            PLAIN       fp32, fp64, tf32 (fp32 storage) and bf16;
 *            MIXED       those and bf16_fp32 (mixed precision);
 *            MIXED_ONLY  bf16_fp32 only.
 * X_ACT(X, act, columns), followed by a comment "activation: <docstring>",
 * declares a trainable activation: the ops act (dst = f(src)) and
 * act_backward (dx = dy * f'(x) + beta*dx), their args structs and buffers
 * (NNTILE_ACT_*), CPU and CUDA kernels from f and f' in formulas.h (act,
 * act_deriv), and their tensor ops act(src, dst) and act_backward(x, dy,
 * beta, dx), generated by setup.py (activations.pxi) with that docstring. A
 * consumer of the table that sees every op alike passes NNTILE_ACT_OPS for
 * X_ACT.
 * The CPU and CUDA prototypes, the codelets, the op enum (codelets.h) and its
 * Cython copy (generated by setup.py) all come from this list. */
#define NNTILE_OPS(X, X_OPT, X_BLAS, X_TF32, X_ACT) \
    X(fill, 1, PLAIN) X(copy, 2, PLAIN) X(subcopy, 2, PLAIN) X(add, 2, MIXED) \
    X(add_out, 3, MIXED) X(scal, 1, PLAIN) X(prod, 3, PLAIN) \
    X_ACT(X, gelu, PLAIN) /* activation: GELU(x), exact (erf form). */ \
    X_ACT(X, gelutanh, PLAIN) /* activation: GELU(x), tanh approximation. */ \
    X_ACT(X, silu, PLAIN) /* activation: SiLU(x) = x * sigmoid(x). */ \
    X(add_fiber, 2, MIXED) \
    X(prod_fiber, 2, PLAIN) X(sum_fiber, 2, MIXED) X(sumprod_fiber, 3, PLAIN) \
    X(sum_slice, 2, PLAIN) X(sumprod_slice, 3, MIXED) X(add_slice, 2, PLAIN) \
    X(prod_slice, 2, PLAIN) X(maxsumexp, 2, MIXED) \
    X(softmax_inplace, 2, MIXED) X(softmax_backward, 3, MIXED) \
    X(mask_scores, 1, PLAIN) X(logsumexp, 2, PLAIN) X(xent_picked, 3, MIXED) \
    X(xent_loss, 3, PLAIN) X(xent_grad_inplace, 3, MIXED) \
    X(embedding, 3, PLAIN) X(embedding_backward, 3, PLAIN) \
    X(layernorm_stats, 2, PLAIN) X(layernorm_forward, 5, MIXED) \
    X(layernorm_backward_reduce, 7, PLAIN) X(layernorm_backward, 6, PLAIN) \
    X(layernorm_backward_whole, 7, PLAIN) \
    X(rmsnorm_stats, 2, PLAIN) X(rmsnorm_forward, 4, MIXED) \
    X(rmsnorm_backward_reduce, 6, PLAIN) X(rmsnorm_backward, 6, PLAIN) \
    X(rmsnorm_backward_whole, 6, PLAIN) \
    X(rope_forward, 3, MIXED) X(rope_backward, 3, MIXED) \
    X(swiglu_forward, 3, PLAIN) X(swiglu_backward, 5, PLAIN) \
    X_BLAS(gemm, 3, MIXED) X(sumsq, 2, PLAIN) X_OPT(adam_step, 4, PLAIN) \
    X_OPT(sgd_step, 3, PLAIN) X(cast, 2, MIXED_ONLY) \
    X_OPT(adam_step_refresh, 5, MIXED_ONLY) X_TF32(flash_forward, 5, MIXED) \
    X_TF32(flash_backward, 9, MIXED)

/* An activation's two ops, as entries of the table. */
#define NNTILE_ACT_OPS(X, act, columns) \
    X(act, 2, columns) X(act##_backward, 3, columns)
/* An activation's args structs and buffers. */
#define NNTILE_ACT_ARGS(X, act, columns) \
    struct nntile_##act##_args { int64_t n; }; \
    struct nntile_##act##_backward_args { int64_t n; double beta; };
#define NNTILE_ACT_BUFFERS(P, W, T, ACC) P(const T *, src) W(T *, dst)
#define NNTILE_ACT_BACKWARD_BUFFERS(P, W, T, ACC) \
    P(const T *, x) P(const T *, dy) W(T *, dx)
/* A table entry that a consumer leaves out. */
#define NNTILE_NO_OP(...)
NNTILE_OPS(NNTILE_NO_OP, NNTILE_NO_OP, NNTILE_NO_OP, NNTILE_NO_OP,
           NNTILE_ACT_ARGS)

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
 * NNTILE_BUFFERS_<op>(P, W, T, ACC): the op's buffers in order, one
 * P(type, name) or W(type, name) each, for data type T and accumulator type
 * ACC (the type of the buffers that hold statistics, reductions,
 * accumulating GEMM outputs, optimizer masters). The CPU kernels follow
 * them, and so do their CUDA twins (cuda/cuda_kernels.h). A task's access
 * mode of each buffer follows from them too (submit in ../ops.pxi):
 *   P(const ...)  read;
 *   P(...)        read and written (the kernel updates what is there);
 *   W(...)        written: the kernel overwrites it, so StarPU need not
 *                 fetch the tile, unless the task accumulates into it (a
 *                 kernel with beta != 0, a later tile of a reduction), when
 *                 it is read too. */
#define NNTILE_BUFFERS_fill(P, W, T, ACC) W(T *, dst)
#define NNTILE_BUFFERS_copy(P, W, T, ACC) P(const T *, src) W(T *, dst)
#define NNTILE_BUFFERS_subcopy(P, W, T, ACC) P(const T *, src) W(T *, dst)
#define NNTILE_BUFFERS_add(P, W, T, ACC) P(const T *, src) W(ACC *, dst)
#define NNTILE_BUFFERS_add_out(P, W, T, ACC) \
    P(const T *, src) P(const ACC *, base) W(ACC *, dst)
#define NNTILE_BUFFERS_cast(P, W, T, ACC) P(const ACC *, src) W(T *, dst)
#define NNTILE_BUFFERS_scal(P, W, T, ACC) P(T *, dst)
#define NNTILE_BUFFERS_prod(P, W, T, ACC) \
    P(const T *, src1) P(const T *, src2) W(T *, dst)
#define NNTILE_BUFFERS_add_fiber(P, W, T, ACC) P(const ACC *, fiber) W(T *, dst)
#define NNTILE_BUFFERS_prod_fiber(P, W, T, ACC) P(const ACC *, fiber) P(T *, dst)
#define NNTILE_BUFFERS_sum_fiber(P, W, T, ACC) P(const T *, src) W(ACC *, fiber)
#define NNTILE_BUFFERS_sumprod_fiber(P, W, T, ACC) \
    P(const T *, src1) P(const T *, src2) W(ACC *, fiber)
#define NNTILE_BUFFERS_sum_slice(P, W, T, ACC) P(const T *, src) W(ACC *, dst)
#define NNTILE_BUFFERS_sumprod_slice(P, W, T, ACC) \
    P(const T *, src1) P(const T *, src2) W(ACC *, dst)
#define NNTILE_BUFFERS_add_slice(P, W, T, ACC) P(const ACC *, src) W(T *, dst)
#define NNTILE_BUFFERS_prod_slice(P, W, T, ACC) P(const ACC *, src) P(T *, dst)
#define NNTILE_BUFFERS_maxsumexp(P, W, T, ACC) \
    P(const T *, src) W(ACC *, stats)
#define NNTILE_BUFFERS_softmax_inplace(P, W, T, ACC) \
    P(const ACC *, stats) P(T *, dst)
#define NNTILE_BUFFERS_softmax_backward(P, W, T, ACC) \
    P(const T *, p) P(const ACC *, sums) P(T *, dp)
#define NNTILE_BUFFERS_mask_scores(P, W, T, ACC) P(T *, dst)
#define NNTILE_BUFFERS_logsumexp(P, W, T, ACC) \
    P(const T *, stats) W(T *, dst)
#define NNTILE_BUFFERS_xent_picked(P, W, T, ACC) \
    P(const T *, logits) P(const int64_t *, labels) W(ACC *, picked)
#define NNTILE_BUFFERS_xent_loss(P, W, T, ACC) \
    P(const T *, lse) P(const T *, picked) W(T *, loss)
#define NNTILE_BUFFERS_xent_grad_inplace(P, W, T, ACC) \
    P(const ACC *, stats) P(const int64_t *, labels) P(T *, logits)
#define NNTILE_BUFFERS_embedding(P, W, T, ACC) \
    P(const int64_t *, ids) P(const T *, table) P(T *, dst)
#define NNTILE_BUFFERS_embedding_backward(P, W, T, ACC) \
    P(const int64_t *, ids) P(const T *, dy) P(T *, dtable)
/* LayerNorm and RMSNorm (one design, norm.inc) share the buffers of their
 * statistics and of dx; each has the buffers of its own weights. */
#define NNTILE_NORM_STATS_BUFFERS(P, W, T, ACC) P(const T *, x) W(T *, stats)
#define NNTILE_NORM_BACKWARD_BUFFERS(P, W, T, ACC) \
    P(const T *, x) P(const T *, dy) P(const T *, stats) P(const T *, weight) \
    P(const T *, rowacc) W(T *, dx)
#define NNTILE_BUFFERS_layernorm_stats NNTILE_NORM_STATS_BUFFERS
#define NNTILE_BUFFERS_layernorm_forward(P, W, T, ACC) \
    P(const ACC *, x) P(const ACC *, stats) P(const ACC *, gamma) \
    P(const ACC *, beta_) W(T *, y)
#define NNTILE_BUFFERS_layernorm_backward_reduce(P, W, T, ACC) \
    P(const T *, x) P(const T *, dy) P(const T *, stats) P(const T *, gamma) \
    W(T *, rowacc) P(T *, dgamma) P(T *, dbeta)
#define NNTILE_BUFFERS_layernorm_backward NNTILE_NORM_BACKWARD_BUFFERS
#define NNTILE_BUFFERS_layernorm_backward_whole(P, W, T, ACC) \
    P(const T *, x) P(const T *, dy) P(const T *, stats) P(const T *, gamma) \
    P(T *, dgamma) P(T *, dbeta) W(T *, dx)
#define NNTILE_BUFFERS_rmsnorm_stats NNTILE_NORM_STATS_BUFFERS
#define NNTILE_BUFFERS_rmsnorm_forward(P, W, T, ACC) \
    P(const ACC *, x) P(const ACC *, stats) P(const ACC *, weight) W(T *, y)
#define NNTILE_BUFFERS_rmsnorm_backward_reduce(P, W, T, ACC) \
    P(const T *, x) P(const T *, dy) P(const T *, stats) P(const T *, weight) \
    W(T *, rowacc) P(T *, dweight)
#define NNTILE_BUFFERS_rmsnorm_backward NNTILE_NORM_BACKWARD_BUFFERS
#define NNTILE_BUFFERS_rmsnorm_backward_whole(P, W, T, ACC) \
    P(const T *, x) P(const T *, dy) P(const T *, stats) P(const T *, weight) \
    P(T *, dweight) W(T *, dx)
/* rotary positions turn x forward and dx backward, in place */
#define NNTILE_ROPE_BUFFERS(P, W, T, ACC) \
    P(const int64_t *, pos) P(const ACC *, inv_freq) P(T *, x)
#define NNTILE_BUFFERS_rope_forward NNTILE_ROPE_BUFFERS
#define NNTILE_BUFFERS_rope_backward NNTILE_ROPE_BUFFERS
#define NNTILE_BUFFERS_swiglu_forward(P, W, T, ACC) \
    P(const T *, gate) P(const T *, up) W(T *, h)
#define NNTILE_BUFFERS_swiglu_backward(P, W, T, ACC) \
    P(const T *, gate) P(const T *, up) P(const T *, dh) W(T *, dgate) \
    W(T *, dup)
#define NNTILE_BUFFERS_gemm(P, W, T, ACC) \
    P(const T *, A) P(const T *, B) W(ACC *, C)
#define NNTILE_BUFFERS_sumsq(P, W, T, ACC) P(const T *, src) W(T *, dst)
#define NNTILE_BUFFERS_adam_step(P, W, T, ACC) \
    P(ACC *, p) P(const ACC *, g) P(ACC *, m) P(ACC *, v) P(const ACC *, normsq)
#define NNTILE_BUFFERS_adam_step_refresh(P, W, T, ACC) \
    P(ACC *, p) P(const ACC *, g) P(ACC *, m) P(ACC *, v) W(T *, copy) \
    P(const ACC *, normsq)
#define NNTILE_BUFFERS_sgd_step(P, W, T, ACC) \
    P(ACC *, p) P(const ACC *, g) W(ACC *, buf) P(const ACC *, normsq)
/* o and lse are written by a query tile's first key tile, merged into after it */
#define NNTILE_BUFFERS_flash_forward(P, W, T, ACC) \
    P(const T *, q) P(const T *, k) P(const T *, v) W(T *, o) W(ACC *, lse)
/* delta = rowsum(dout * o) is computed by the kernel; lse is forward's. dq is written by
 * its queries' first key tile, dk and dv by their keys' first query tile (args.accumulate). */
#define NNTILE_BUFFERS_flash_backward(P, W, T, ACC) \
    P(const T *, q) P(const T *, k) P(const T *, v) P(const T *, o) \
    P(const T *, dout) P(const ACC *, lse) W(T *, dq) W(T *, dk) W(T *, dv)

/* ---- accumulation ----
 * NNTILE_ACCUMULATES(X): X(op, buffer, when), one for each W buffer that a
 * task of op may add into (or keep part of) instead of writing over: the task
 * reads it too where the C condition `when` holds of the task's args `a`
 * (const struct nntile_<op>_args *), or of `caller`, a flag the tensor op
 * passes where the args cannot tell (subcopy: a piece of a destination tile
 * that an earlier piece wrote too, or that leaves part of the tile as it
 * was). Every other W buffer is always written over. act_backward stands for
 * the backward op of every activation (X_ACT). setup.py writes from this
 * list the mask of the W buffers that submit (../ops.pxi) opens for reading
 * too (op_enum.pxi). */
#define NNTILE_ACCUMULATES(X) \
    X(subcopy, dst, caller) X(add, dst, a->beta != 0) \
    X(act_backward, dx, a->beta != 0) \
    X(add_fiber, dst, a->beta != 0) X(sum_fiber, fiber, a->beta != 0) \
    X(sumprod_fiber, fiber, a->beta != 0) X(sum_slice, dst, a->beta != 0) \
    X(sumprod_slice, dst, a->beta != 0) X(add_slice, dst, a->beta != 0) \
    X(maxsumexp, stats, !a->init) X(xent_picked, picked, a->v_offset != 0) \
    X(xent_loss, loss, a->beta != 0) \
    X(layernorm_stats, stats, a->e_offset != 0) \
    X(layernorm_backward_reduce, rowacc, !a->init) \
    X(layernorm_backward, dx, a->beta != 0) \
    X(layernorm_backward_whole, dx, a->beta != 0) X(rmsnorm_stats, stats, !a->init) \
    X(rmsnorm_backward_reduce, rowacc, !a->init) \
    X(rmsnorm_backward, dx, a->beta != 0) \
    X(rmsnorm_backward_whole, dx, a->beta != 0) X(gemm, C, a->beta != 0) \
    X(sumsq, dst, a->beta != 0) \
    X(sgd_step, buf, a->momentum != 0 && a->step > 1) \
    X(flash_forward, o, a->accumulate) X(flash_forward, lse, a->accumulate) \
    X(flash_backward, dq, a->accumulate & 1) \
    X(flash_backward, dk, a->accumulate & 2) \
    X(flash_backward, dv, a->accumulate & 2)

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
/* void nntile_kernel_<op>_<S>(args, buffers of BUFFERS) */
#define NNTILE_KERNEL_PROTO_OF(T, ACC, S, op, BUFFERS) \
    void nntile_kernel_##op##_##S(const struct nntile_##op##_args *args \
        BUFFERS(NNTILE_PARAM, NNTILE_PARAM, T, ACC));
#define NNTILE_KERNEL_PROTOS(op, nbuf, columns) \
    NNTILE_FOR_EACH_DTYPE(NNTILE_KERNEL_PROTO_OF, op, NNTILE_BUFFERS_##op)
#define NNTILE_KERNEL_ACT_PROTOS(X, act, columns) \
    NNTILE_FOR_EACH_DTYPE(NNTILE_KERNEL_PROTO_OF, act, NNTILE_ACT_BUFFERS) \
    NNTILE_FOR_EACH_DTYPE(NNTILE_KERNEL_PROTO_OF, act##_backward, \
                          NNTILE_ACT_BACKWARD_BUFFERS)
NNTILE_OPS(NNTILE_KERNEL_PROTOS, NNTILE_KERNEL_PROTOS, NNTILE_KERNEL_PROTOS,
           NNTILE_KERNEL_PROTOS, NNTILE_KERNEL_ACT_PROTOS)

#ifdef __cplusplus
}
#endif

#endif /* NNTILE_CORE_KERNELS_H */
