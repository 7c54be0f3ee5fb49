/* StarPU codelets of every nntile op: one table indexed by op and dtype.
 *
 * The op list below is the single place where an op is declared at this level: its name
 * and how many tile buffers its kernel takes. codelets.c turns each entry into a CPU
 * wrapper (and a CUDA one when built with CUDA), a history-based performance model and a
 * codelet per dtype. Access modes are chosen per task by the tensor op that submits it. */
#ifndef NNTILE_CODELETS_H
#define NNTILE_CODELETS_H

#include <starpu.h>

/* X(op, number of buffers). X_OPT(op, n): n buffers and one optional last buffer.
 * X_BLAS(op, n): like X, but its CUDA kernel takes the worker's cuBLAS handle, not a stream. */
#define NNTILE_OPS(X, X_OPT, X_BLAS)                                                                   \
    X(fill, 1) X(copy, 2) X(subcopy, 2) X(add, 2) X(scal, 1) X(prod, 3)                         \
    X(gelu, 2) X(gelu_backward, 3) X(gelutanh, 2) X(gelutanh_backward, 3)                       \
    X(add_fiber, 2) X(prod_fiber, 2) X(sum_fiber, 2) X(sumprod_fiber, 3)                        \
    X(sum_slice, 2) X(sumprod_slice, 3) X(add_slice, 2) X(prod_slice, 2)                        \
    X(maxsumexp, 2) X(softmax_inplace, 2) X(softmax_backward, 3) X(mask_causal, 1)              \
    X(logsumexp, 2) X(xent_picked, 3) X(xent_loss, 3) X(xent_grad_inplace, 3)                   \
    X(embedding, 3) X(embedding_backward, 3)                                                    \
    X(layernorm_stats, 2) X(layernorm_forward, 5) X(layernorm_backward_reduce, 7)               \
    X(layernorm_backward, 6) X_BLAS(gemm, 3) X(sumsq, 2)                                             \
    X_OPT(adam_step, 4) X_OPT(sgd_step, 3)

/* Ops only mixed precision has: cast (fp32 -> bf16) and adam_step_refresh (adam_step that
 * also writes the parameter's bf16 copy; the optional last buffer is adam_step's). */
#define NNTILE_MIXED_ONLY_OPS(X, X_OPT) X(cast, 2) X_OPT(adam_step_refresh, 5)

/* The ops of column NNTILE_BF16_FP32 (bf16 data, fp32 accumulators: kernels/kernels.h says
 * which buffer is which): the ops whose accumulators mixed precision keeps in fp32, and the
 * mixed-only ones. Every other op runs in one dtype, bf16 or fp32, under mixed precision. */
#define NNTILE_MIXED_OPS(X, X_OPT, X_BLAS)                                                      \
    X(add, 2) X(add_fiber, 2) X(sum_fiber, 2) X(sumprod_slice, 3) X(maxsumexp, 2)               \
    X(softmax_inplace, 2) X(softmax_backward, 3) X(xent_picked, 3) X(xent_grad_inplace, 3)      \
    X(layernorm_forward, 5) X_BLAS(gemm, 3) NNTILE_MIXED_ONLY_OPS(X, X_OPT)

#define NNTILE_OP_ENUM(op, nbuf) NNTILE_OP_##op,
enum nntile_op {
    NNTILE_OPS(NNTILE_OP_ENUM, NNTILE_OP_ENUM, NNTILE_OP_ENUM)
    NNTILE_MIXED_ONLY_OPS(NNTILE_OP_ENUM, NNTILE_OP_ENUM) NNTILE_OP_COUNT
};
#undef NNTILE_OP_ENUM

/* Storage types of tiles, and the columns of the op table. tf32 stores fp32 and differs only
 * in the GEMM compute mode. bf16 stores bfloat16 bits (uint16_t) and computes in fp32.
 * NNTILE_BF16_FP32 is a column, not a tile dtype: the kernels of an op whose data tiles are
 * bf16 and whose accumulator tiles are fp32 (mixed precision). */
enum nntile_dtype {
    NNTILE_FP32 = 0,
    NNTILE_FP64 = 1,
    NNTILE_TF32 = 2,
    NNTILE_INT64 = 3,
    NNTILE_BF16 = 4,
    NNTILE_BF16_FP32 = 5,
    NNTILE_DTYPE_COUNT
};

/* Fills the table; safe to call more than once. */
#ifndef NNTILE_HAVE_CUDA
#define NNTILE_HAVE_CUDA 0
#endif

void nntile_codelets_init(void);

/* The codelet of an op for a dtype, or NULL when the op has no kernel for that dtype. */
struct starpu_codelet *nntile_codelet(int op, int dtype);

const char *nntile_op_name(int op);

/* Frees a task that was never submitted: StarPU refuses to destroy a task that would destroy
 * itself (destroy = 1, what starpu_task_create makes). */
void nntile_task_discard(struct starpu_task *task);

/* Per-op time: while on (and StarPU's profiling is on), every task adds its execution time
 * (StarPU's profiling info of the task) to its op and dtype column. nntile_op_time takes
 * the sums of one column since the last call and resets them; returns the task count. */
void nntile_op_profiling(int enable);
unsigned long long nntile_op_time(int op, int dtype, double *seconds);

/* Set OpenBLAS to one thread: each StarPU CPU worker is already one thread. */
void nntile_blas_single_thread(void);

/* cuBLAS handles of the CUDA workers: after starpu_init, before starpu_shutdown. */
void nntile_cuda_start(void);
void nntile_cuda_stop(void);

#endif
