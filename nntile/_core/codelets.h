/* StarPU codelets of every nntile op: one table indexed by op and dtype.
 *
 * The ops are those of the op table in kernels/kernels.h (NNTILE_OPS): its name, how many
 * tile buffers its kernel takes and for which dtypes it has kernels. codelets.c turns each
 * entry into a CPU wrapper (and a CUDA one when built with CUDA), a history-based performance
 * model and a codelet per dtype. The access mode of each buffer of a task follows from the
 * op's buffers in kernels.h (submit in ops.pxi). */
#ifndef NNTILE_CODELETS_H
#define NNTILE_CODELETS_H

#include <starpu.h>
#include "kernels/kernels.h"

#define NNTILE_OP_ENUM(op, nbuf, columns) NNTILE_OP_##op,
enum nntile_op {
    NNTILE_OPS(NNTILE_OP_ENUM, NNTILE_OP_ENUM, NNTILE_OP_ENUM, NNTILE_OP_ENUM, NNTILE_ACT_OPS)
    NNTILE_OP_COUNT
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

/* How many codelets' performance models StarPU is calibrating: it measures every task of
 * such a codelet, where a model had too few measurements for a task's size (the dm
 * schedulers then force calibration) or STARPU_CALIBRATE asks for it. */
int nntile_models_calibrating(void);

/* Copies a tile to host memory once the tasks submitted before have run, without waiting:
 * its GPU copy becomes clean, and evicting it later frees it at once instead of copying it
 * out first (which StarPU does inside the GPU's driver thread, holding its workers). */
int nntile_write_back(starpu_data_handle_t handle);

/* Frees a task that was never submitted: StarPU refuses to destroy a task that would destroy
 * itself (destroy = 1, what starpu_task_create makes). */
void nntile_task_discard(struct starpu_task *task);

/* Per-op time: while on (and StarPU's profiling is on), every task adds its execution time
 * (StarPU's profiling info of the task) to its op and dtype column. nntile_op_time takes
 * the sums of one column since the last call and resets them; returns the task count. */
void nntile_op_profiling(int enable);
unsigned long long nntile_op_time(int op, int dtype, double *seconds);

/* One finished task, while the timeline is on: its op, kernel dtype and worker, and StarPU's
 * dates for it in microseconds (starpu_timing_now's clock): submitted, handed to the
 * scheduler once its dependencies were met (pushed), taken by its worker (popped), its input
 * fetched (fetch_start to fetch_end), and run (start to end). */
struct nntile_task_record {
    int op, dtype, worker, unused;
    double submitted, pushed, popped, fetch_start, fetch_end, start, end;
};

/* Records every finished task into buffer (capacity records) from the start again, while op
 * profiling is on; NULL stops. Call it with no task in flight. nntile_op_timeline_count is
 * the number of tasks finished since: past the capacity, the ones not recorded. */
void nntile_op_timeline(struct nntile_task_record *buffer, unsigned long long capacity);
/* Tasks outside the op table record themselves from their callback: the collectives
 * (collective.c) as op NNTILE_OP_COLLECTIVE, whose name is "collective". */
#define NNTILE_OP_COLLECTIVE NNTILE_OP_COUNT
void nntile_timeline_record(const struct starpu_task *task, int op, int dtype);
unsigned long long nntile_op_timeline_count(void);

/* Set OpenBLAS to one thread: each StarPU CPU worker is already one thread. */
void nntile_blas_single_thread(void);

/* What the CPU kernels' OpenBLAS says of itself: its build (version and options), the CPU
 * core whose kernels it picked for this machine, and its threads per call. */
const char *nntile_blas_config(void);
const char *nntile_blas_core(void);
int nntile_blas_threads(void);

/* From now on, a task that reads the tile while it holds no valid contents (never written,
 * or invalidated) finds it zero, allocated only then. */
void nntile_zero_when_dropped(starpu_data_handle_t handle);

/* What nntile keeps of each tile in its StarPU user data. home: the CUDA device its tasks
 * run on where the submitter chose none, or -1. dropped: nntile_tile_dropped marks a tile
 * marked nntile_zero_when_dropped as invalidated; until a task writes it again
 * (nntile_tile_written, from every path that submits a write), it is known to read as
 * zeros, so its next writer may overwrite it instead of adding to it (a GEMM's beta 0):
 * no zeros are written and none read. */
int nntile_tile_home(starpu_data_handle_t handle);
void nntile_tile_set_home(starpu_data_handle_t handle, int home);
void nntile_tile_dropped(starpu_data_handle_t handle);
int nntile_tile_reads_zero(starpu_data_handle_t handle);
int nntile_tile_drops_to_zero(starpu_data_handle_t handle);
void nntile_tile_written(starpu_data_handle_t handle);

/* cuBLAS handles of the CUDA workers: after starpu_init, before starpu_shutdown. */
void nntile_cuda_start(void);
void nntile_cuda_stop(void);

#endif
