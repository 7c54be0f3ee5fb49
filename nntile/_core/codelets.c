#include <stdio.h>
#include <string.h>
#include <stdint.h>
#include "codelets.h"
#include "kernels/kernels.h"
#include "kernels/blas.h"
#if NNTILE_HAVE_CUDA
#include <cuda_runtime.h>
#include <starpu_cublas_v2.h>
#include "../cuda/cuda_kernels.h"
#endif

#define BUF(i) ((void *)STARPU_VECTOR_GET_PTR(buffers[i]))

/* Argument lists of BUF(0) .. BUF(n-1), for the wrappers below. */
#define BUFS_1 BUF(0)
#define BUFS_2 BUFS_1, BUF(1)
#define BUFS_3 BUFS_2, BUF(2)
#define BUFS_4 BUFS_3, BUF(3)
#define BUFS_5 BUFS_4, BUF(4)
#define BUFS_6 BUFS_5, BUF(5)
#define BUFS_7 BUFS_6, BUF(6)
#define BUFS_8 BUFS_7, BUF(7)
#define BUFS_9 BUFS_8, BUF(8)
#define BUFS_10 BUFS_9, BUF(9)

/* A CPU wrapper unpacks the task's tile pointers and calls the kernel with the op's args. */
#define CPU_WRAPPER(op, dtype, nbuf)                                                            \
    static void cpu_##op##_##dtype(void *buffers[], void *cl_arg)                              \
    {                                                                                           \
        nntile_kernel_##op##_##dtype(cl_arg, BUFS_##nbuf);                                      \
    }
/* The last buffer (the squared gradient norm used for clipping) may be left out. */
#define CPU_WRAPPER_OPT(op, dtype, nbuf)                                                        \
    static void cpu_##op##_##dtype(void *buffers[], void *cl_arg)                              \
    {                                                                                           \
        int given = STARPU_TASK_GET_NBUFFERS(starpu_task_get_current());                       \
        nntile_kernel_##op##_##dtype(cl_arg, BUFS_##nbuf, given > nbuf ? BUF(nbuf) : NULL);    \
    }

/* The wrappers of one op, W(op, dtype, nbuf), for the dtypes of its columns (kernels.h). tf32
 * stores fp32, so its CPU kernels are the fp32 ones. */
#define CPU_WRAPPERS(W, op, nbuf, columns)                                                      \
    NNTILE_IF_PLAIN(columns, W(op, fp32, nbuf) W(op, fp64, nbuf) W(op, bf16, nbuf))             \
    NNTILE_IF_MIXED(columns, W(op, bf16_fp32, nbuf))
#define WRAPPERS(op, nbuf, columns) CPU_WRAPPERS(CPU_WRAPPER, op, nbuf, columns)
#define WRAPPERS_OPT(op, nbuf, columns) CPU_WRAPPERS(CPU_WRAPPER_OPT, op, nbuf, columns)
NNTILE_OPS(WRAPPERS, WRAPPERS_OPT, WRAPPERS, WRAPPERS, NNTILE_ACT_OPS)

/* An op's row of a table of functions indexed by dtype (NULL where the op has no kernel for
 * that dtype, and for int64): <kind>_<op>_<dtype>, and <kind>_<op>_<tf32> for tf32. */
#define FUNC_ROW(kind, op, tf32, columns)                                                       \
    [NNTILE_OP_##op] = {                                                                        \
        NNTILE_IF_PLAIN(columns, [NNTILE_FP32] = kind##_##op##_fp32,                            \
                        [NNTILE_FP64] = kind##_##op##_fp64,                                     \
                        [NNTILE_TF32] = kind##_##op##_##tf32,                                   \
                        [NNTILE_BF16] = kind##_##op##_bf16, )                                   \
        NNTILE_IF_MIXED(columns, [NNTILE_BF16_FP32] = kind##_##op##_bf16_fp32, )},

#if NNTILE_HAVE_CUDA
/* CUDA twins run asynchronously on the worker's stream (STARPU_CUDA_ASYNC codelets). */
#define CUDA_WRAPPER(op, dtype, kdtype, nbuf)                                                   \
    static void cuda_##op##_##dtype(void *buffers[], void *cl_arg)                             \
    {                                                                                           \
        nntile_cuda_##op##_##kdtype(cl_arg, starpu_cuda_get_local_stream(), BUFS_##nbuf);      \
    }
#define CUDA_WRAPPER_OPT(op, dtype, kdtype, nbuf)                                               \
    static void cuda_##op##_##dtype(void *buffers[], void *cl_arg)                             \
    {                                                                                           \
        int given = STARPU_TASK_GET_NBUFFERS(starpu_task_get_current());                       \
        nntile_cuda_##op##_##kdtype(cl_arg, starpu_cuda_get_local_stream(), BUFS_##nbuf,        \
                                    given > nbuf ? BUF(nbuf) : NULL);                           \
    }
#define CUDA_WRAPPER_BLAS(op, dtype, kdtype, nbuf)                                              \
    static void cuda_##op##_##dtype(void *buffers[], void *cl_arg)                             \
    {                                                                                           \
        nntile_cuda_##op##_##kdtype(cl_arg, starpu_cublas_get_local_handle(), BUFS_##nbuf);    \
    }
/* tf32 stores fp32: only its GEMM (TF32 tensor cores) and the X_TF32 ops have tf32 kernels of
 * their own, so the other ops' tf32 wrappers call the fp32 kernels. bf16 has its own kernels
 * (bf16 storage, fp32 compute; GEMM with fp32 accumulation). */
#define CUDA_WRAPPERS(W, op, nbuf, columns, tf32_kernel)                                        \
    NNTILE_IF_PLAIN(columns, W(op, fp32, fp32, nbuf) W(op, fp64, fp64, nbuf)                    \
                    W(op, tf32, tf32_kernel, nbuf) W(op, bf16, bf16, nbuf))                     \
    NNTILE_IF_MIXED(columns, W(op, bf16_fp32, bf16_fp32, nbuf))
#define CUDA_OP(op, nbuf, columns) CUDA_WRAPPERS(CUDA_WRAPPER, op, nbuf, columns, fp32)
#define CUDA_OP_OPT(op, nbuf, columns) CUDA_WRAPPERS(CUDA_WRAPPER_OPT, op, nbuf, columns, fp32)
#define CUDA_OP_BLAS(op, nbuf, columns) CUDA_WRAPPERS(CUDA_WRAPPER_BLAS, op, nbuf, columns, tf32)
#define CUDA_OP_TF32(op, nbuf, columns) CUDA_WRAPPERS(CUDA_WRAPPER, op, nbuf, columns, tf32)
NNTILE_OPS(CUDA_OP, CUDA_OP_OPT, CUDA_OP_BLAS, CUDA_OP_TF32, NNTILE_ACT_OPS)

static void cuda_copy_bytes(void *buffers[], void *cl_arg)
{
    (void)cl_arg;
    size_t bytes = STARPU_VECTOR_GET_NX(buffers[0]) * STARPU_VECTOR_GET_ELEMSIZE(buffers[0]);
    cudaMemcpyAsync(BUF(1), BUF(0), bytes, cudaMemcpyDeviceToDevice,
                    starpu_cuda_get_local_stream());
}

typedef void (*cuda_func)(void *[], void *);
static const cuda_func cuda_funcs[NNTILE_OP_COUNT][NNTILE_DTYPE_COUNT] = {
#define CUDA_FUNCS(op, nbuf, columns) FUNC_ROW(cuda, op, tf32, columns)
    NNTILE_OPS(CUDA_FUNCS, CUDA_FUNCS, CUDA_FUNCS, CUDA_FUNCS, NNTILE_ACT_OPS)
#undef CUDA_FUNCS
};
#endif

/* Tile copies move bytes, whatever the dtype. */
static void cpu_copy_bytes(void *buffers[], void *cl_arg)
{
    (void)cl_arg;
    size_t bytes = STARPU_VECTOR_GET_NX(buffers[0]) * STARPU_VECTOR_GET_ELEMSIZE(buffers[0]);
    memcpy(BUF(1), BUF(0), bytes);
}

typedef void (*cpu_func)(void *[], void *);

static const char *op_names[NNTILE_OP_COUNT] = {
#define NAME(op, nbuf, columns) #op,
    NNTILE_OPS(NAME, NAME, NAME, NAME, NNTILE_ACT_OPS)
#undef NAME
};

static const cpu_func cpu_funcs[NNTILE_OP_COUNT][NNTILE_DTYPE_COUNT] = {
#define FUNCS(op, nbuf, columns) FUNC_ROW(cpu, op, fp32, columns)
    NNTILE_OPS(FUNCS, FUNCS, FUNCS, FUNCS, NNTILE_ACT_OPS)
#undef FUNCS
};

static const char *dtype_names[NNTILE_DTYPE_COUNT] = {
    [NNTILE_FP32] = "fp32", [NNTILE_FP64] = "fp64", [NNTILE_TF32] = "tf32",
    [NNTILE_INT64] = "int64", [NNTILE_BF16] = "bf16", [NNTILE_BF16_FP32] = "bf16_fp32"};

static struct starpu_codelet codelets[NNTILE_OP_COUNT][NNTILE_DTYPE_COUNT];
static struct starpu_perfmodel models[NNTILE_OP_COUNT][NNTILE_DTYPE_COUNT];
static char model_symbols[NNTILE_OP_COUNT][NNTILE_DTYPE_COUNT][64];
static int initialized = 0;

static void define_codelet(int op, int dtype, cpu_func func)
{
    struct starpu_codelet *cl = &codelets[op][dtype];
    struct starpu_perfmodel *model = &models[op][dtype];
    memset(cl, 0, sizeof(*cl));
    memset(model, 0, sizeof(*model));
    snprintf(model_symbols[op][dtype], sizeof(model_symbols[op][dtype]), "nntile_%s_%s",
             op_names[op], dtype_names[dtype]);
    model->type = STARPU_HISTORY_BASED;
    model->symbol = model_symbols[op][dtype];
    cl->where = STARPU_CPU;
    cl->cpu_funcs[0] = func;
    cl->cpu_funcs_name[0] = model_symbols[op][dtype];
    cl->nbuffers = STARPU_VARIABLE_NBUFFERS;
    cl->model = model;
    cl->name = model_symbols[op][dtype];
}

void nntile_codelets_init(void)
{
    if (initialized)
        return;
    for (int op = 0; op < NNTILE_OP_COUNT; ++op)
        for (int dtype = 0; dtype < NNTILE_DTYPE_COUNT; ++dtype)
            if (cpu_funcs[op][dtype])
                define_codelet(op, dtype, cpu_funcs[op][dtype]);
    for (int dtype = 0; dtype < NNTILE_DTYPE_COUNT; ++dtype)
        define_codelet(NNTILE_OP_copy, dtype, cpu_copy_bytes);
#if NNTILE_HAVE_CUDA
    for (int op = 0; op < NNTILE_OP_COUNT; ++op)
        for (int dtype = 0; dtype < NNTILE_DTYPE_COUNT; ++dtype) {
            if (!cuda_funcs[op][dtype])
                continue;
            struct starpu_codelet *cl = &codelets[op][dtype];
            cl->where |= STARPU_CUDA;
            cl->cuda_funcs[0] = cuda_funcs[op][dtype];
            cl->cuda_flags[0] = STARPU_CUDA_ASYNC;
        }
    for (int dtype = 0; dtype < NNTILE_DTYPE_COUNT; ++dtype) {
        struct starpu_codelet *cl = &codelets[NNTILE_OP_copy][dtype];
        cl->where |= STARPU_CUDA;
        cl->cuda_funcs[0] = cuda_copy_bytes;
        cl->cuda_flags[0] = STARPU_CUDA_ASYNC;
    }
#endif
    initialized = 1;
}

struct starpu_codelet *nntile_codelet(int op, int dtype)
{
    if (op < 0 || op >= NNTILE_OP_COUNT || dtype < 0 || dtype >= NNTILE_DTYPE_COUNT)
        return NULL;
    struct starpu_codelet *cl = &codelets[op][dtype];
    return cl->cpu_funcs[0] ? cl : NULL;
}

/* Nanoseconds and tasks per codelet: atomics, since workers finish tasks side by side. */
static unsigned long long op_ns[NNTILE_OP_COUNT][NNTILE_DTYPE_COUNT];
static unsigned long long op_tasks[NNTILE_OP_COUNT][NNTILE_DTYPE_COUNT];

/* The timeline: a buffer the caller owns, and the index of the next record (past the
 * capacity, the records that did not fit). */
static struct nntile_task_record *timeline;
static unsigned long long timeline_capacity;
static unsigned long long timeline_next;

static void record_task(const struct starpu_task *task, int op, int dtype)
{
    const unsigned long long slot = __atomic_fetch_add(&timeline_next, 1ULL, __ATOMIC_RELAXED);
    if (slot >= timeline_capacity)
        return;
    const struct starpu_profiling_task_info *info = task->profiling_info;
    struct nntile_task_record *r = &timeline[slot];
    r->op = op;
    r->dtype = dtype;
    r->worker = info->workerid;
    r->submitted = starpu_timing_timespec_to_us((struct timespec *)&info->submit_time);
    r->pushed = starpu_timing_timespec_to_us((struct timespec *)&info->push_end_time);
    r->popped = starpu_timing_timespec_to_us((struct timespec *)&info->pop_end_time);
    r->fetch_start =
        starpu_timing_timespec_to_us((struct timespec *)&info->acquire_data_start_time);
    r->fetch_end = starpu_timing_timespec_to_us((struct timespec *)&info->acquire_data_end_time);
    r->start = starpu_timing_timespec_to_us((struct timespec *)&info->start_time);
    r->end = starpu_timing_timespec_to_us((struct timespec *)&info->end_time);
}

/* A codelet's callback: StarPU runs it once the task has finished, with the task current. */
static void op_profile_callback(void *arg)
{
    (void)arg;
    struct starpu_task *task = starpu_task_get_current();
    if (task == NULL || task->profiling_info == NULL)
        return;
    const size_t index = (size_t)(task->cl - &codelets[0][0]);
    const double us = starpu_timing_timespec_delay_us(&task->profiling_info->start_time,
                                                      &task->profiling_info->end_time);
    __atomic_fetch_add(&op_ns[0][0] + index, (unsigned long long)(us * 1e3), __ATOMIC_RELAXED);
    __atomic_fetch_add(&op_tasks[0][0] + index, 1ULL, __ATOMIC_RELAXED);
    if (timeline)
        record_task(task, (int)(index / NNTILE_DTYPE_COUNT), (int)(index % NNTILE_DTYPE_COUNT));
}

void nntile_timeline_record(const struct starpu_task *task, int op, int dtype)
{
    if (task != NULL && task->profiling_info != NULL
            && __atomic_load_n(&timeline, __ATOMIC_ACQUIRE) != NULL)
        record_task(task, op, dtype);
}

void nntile_op_timeline(struct nntile_task_record *buffer, unsigned long long capacity)
{
    timeline = NULL;
    timeline_capacity = buffer ? capacity : 0;
    __atomic_store_n(&timeline_next, 0ULL, __ATOMIC_RELAXED);
    __atomic_store_n(&timeline, buffer, __ATOMIC_RELEASE);
}

unsigned long long nntile_op_timeline_count(void)
{
    return __atomic_load_n(&timeline_next, __ATOMIC_RELAXED);
}

void nntile_op_profiling(int enable)
{
    for (int op = 0; op < NNTILE_OP_COUNT; ++op)
        for (int dtype = 0; dtype < NNTILE_DTYPE_COUNT; ++dtype)
            codelets[op][dtype].callback_func = enable ? op_profile_callback : NULL;
}

unsigned long long nntile_op_time(int op, int dtype, double *seconds)
{
    *seconds = 1e-9 * (double)__atomic_exchange_n(&op_ns[op][dtype], 0ULL, __ATOMIC_RELAXED);
    return __atomic_exchange_n(&op_tasks[op][dtype], 0ULL, __ATOMIC_RELAXED);
}

int nntile_models_calibrating(void)
{
    int count = 0;
    for (int op = 0; op < NNTILE_OP_COUNT; ++op)
        for (int dtype = 0; dtype < NNTILE_DTYPE_COUNT; ++dtype)
            /* StarPU's scheduler sets it from its own threads, at any time */
            count += __atomic_load_n(&models[op][dtype].benchmarking, __ATOMIC_RELAXED) != 0;
    return count;
}

const char *nntile_op_name(int op)
{
    if (op == NNTILE_OP_COLLECTIVE)
        return "collective";
    return (op >= 0 && op < NNTILE_OP_COUNT) ? op_names[op] : "?";
}

void nntile_cuda_start(void)
{
#if NNTILE_HAVE_CUDA
    starpu_cublas_init();
#endif
}

void nntile_cuda_stop(void)
{
#if NNTILE_HAVE_CUDA
    starpu_cublas_shutdown();
#endif
}

void nntile_blas_single_thread(void)
{
    NNTILE_BLAS(openblas_set_num_threads)(1);
}

const char *nntile_blas_config(void)
{
    return NNTILE_BLAS(openblas_get_config)();
}

const char *nntile_blas_core(void)
{
    return NNTILE_BLAS(openblas_get_corename)();
}

int nntile_blas_threads(void)
{
    return NNTILE_BLAS(openblas_get_num_threads)();
}

/* The release half of nntile_write_back: StarPU calls it once the host copy is valid. */
static void release_host_copy(void *handle)
{
    starpu_data_release_on_node((starpu_data_handle_t)handle, STARPU_MAIN_RAM);
}

int nntile_write_back(starpu_data_handle_t handle)
{
    return starpu_data_acquire_on_node_cb_sequential_consistency(
        handle, STARPU_MAIN_RAM, STARPU_R, release_host_copy, handle, 1);
}

void nntile_task_discard(struct starpu_task *task)
{
    task->destroy = 0;
    starpu_task_destroy(task);
}

/* ---- tiles that read as zeros once dropped -------------------------------------------------- */

/* StarPU runs a handle's initialisation codelet (starpu_data_set_reduction_methods) on the
 * worker of the first task that reads the handle while no copy of it is valid, after
 * allocating the buffer there: a gradient tile dropped (invalidated) between steps takes no
 * memory until backward first accumulates into it, and then starts from zero. Zero bits are
 * 0.0 in every float dtype. */
static void cpu_zero(void *buffers[], void *cl_arg)
{
    (void)cl_arg;
    memset(BUF(0), 0, STARPU_VECTOR_GET_NX(buffers[0]) * STARPU_VECTOR_GET_ELEMSIZE(buffers[0]));
}

#if NNTILE_HAVE_CUDA
static void cuda_zero(void *buffers[], void *cl_arg)
{
    (void)cl_arg;
    cudaMemsetAsync(BUF(0), 0,
                    STARPU_VECTOR_GET_NX(buffers[0]) * STARPU_VECTOR_GET_ELEMSIZE(buffers[0]),
                    starpu_cuda_get_local_stream());
}
#endif

static struct starpu_codelet cl_zero = {
    .cpu_funcs = {cpu_zero},
#if NNTILE_HAVE_CUDA
    .cuda_funcs = {cuda_zero},
    .cuda_flags = {STARPU_CUDA_ASYNC},
#endif
    .nbuffers = 1,
    .modes = {STARPU_W},
    .name = "zero_when_dropped",
};

/* The user data is an integer: home + 1 below TILE_DROPS_TO_ZERO (0: no home), and two
 * flags above it. */
#define TILE_DROPS_TO_ZERO ((intptr_t)1 << 24)
#define TILE_READS_ZERO ((intptr_t)1 << 25)

static intptr_t tile_data(starpu_data_handle_t handle)
{
    return (intptr_t)starpu_data_get_user_data(handle);
}

static void set_tile_data(starpu_data_handle_t handle, intptr_t data)
{
    starpu_data_set_user_data(handle, (void *)data);
}

void nntile_zero_when_dropped(starpu_data_handle_t handle)
{
    starpu_data_set_reduction_methods(handle, NULL, &cl_zero);
    set_tile_data(handle, tile_data(handle) | TILE_DROPS_TO_ZERO);
}

int nntile_tile_home(starpu_data_handle_t handle)
{
    return (int)(tile_data(handle) & (TILE_DROPS_TO_ZERO - 1)) - 1;
}

void nntile_tile_set_home(starpu_data_handle_t handle, int home)
{
    set_tile_data(handle, (tile_data(handle) & ~(TILE_DROPS_TO_ZERO - 1)) | (home + 1));
}

void nntile_tile_dropped(starpu_data_handle_t handle)
{
    if (tile_data(handle) & TILE_DROPS_TO_ZERO)
        set_tile_data(handle, tile_data(handle) | TILE_READS_ZERO);
}

int nntile_tile_reads_zero(starpu_data_handle_t handle)
{
    return (tile_data(handle) & TILE_READS_ZERO) != 0;
}

int nntile_tile_drops_to_zero(starpu_data_handle_t handle)
{
    return (tile_data(handle) & TILE_DROPS_TO_ZERO) != 0;
}

void nntile_tile_written(starpu_data_handle_t handle)
{
    if (tile_data(handle) & TILE_READS_ZERO)
        set_tile_data(handle, tile_data(handle) & ~TILE_READS_ZERO);
}
