#include <dlfcn.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "collective.h"
#include "codelets.h"
#if NNTILE_HAVE_MPI
#include <mpi.h>
#endif
#if NNTILE_HAVE_CUDA
#include <cuda_runtime.h>
#endif

#define TILE_PTR(buffer) ((void *)STARPU_VECTOR_GET_PTR(buffer))
#define TILE_COUNT(buffer) ((size_t)STARPU_VECTOR_GET_NX(buffer))

static starpu_data_handle_t order_token;  /* every collective writes it: one order per rank */
static int started;
static int my_rank;  /* in the communicator the collectives run on */
static unsigned long long bytes_reduced;
static char first_error[256];  /* a collective that failed inside a task, for Python to raise */

static void record_error(const char *what, const char *detail)
{
    if (!first_error[0])
        snprintf(first_error, sizeof first_error, "%s: %s", what, detail);
}

const char *nntile_collective_error(void)
{
    return first_error[0] ? first_error : NULL;
}

/* A task's argument: its kind and dtype, and the root of each tile (a reduce, a broadcast). */
struct collective_args {
    int kind;
    int dtype;
    int roots[];
};

static void start_token(void)
{
    if (!started)
        starpu_void_data_register(&order_token);
    started = 1;
}

/* A finished collective shows in the timeline (codelets.c) beside the op table's tasks. */
static void collective_done(void *arg)
{
    (void)arg;
    struct starpu_task *task = starpu_task_get_current();
    if (task != NULL && task->cl_arg != NULL)
        nntile_timeline_record(task, NNTILE_OP_COLLECTIVE,
                               ((const struct collective_args *)task->cl_arg)->dtype);
}

/* ---- MPI, on CPU workers ------------------------------------------------------------------ */

#if NNTILE_HAVE_MPI
static MPI_Comm comm = MPI_COMM_NULL;
static MPI_Op bf16_sum = MPI_OP_NULL;

static float bf16_to_float(uint16_t bits)
{
    uint32_t word = (uint32_t)bits << 16;
    float value;
    memcpy(&value, &word, sizeof value);
    return value;
}

static uint16_t float_to_bf16(float value)  /* round to nearest even, as the kernels do */
{
    uint32_t word;
    memcpy(&word, &value, sizeof word);
    return (uint16_t)((word + 0x7fff + ((word >> 16) & 1)) >> 16);
}

/* MPI has no bfloat16: bf16 tiles travel as 16-bit words and are added through fp32. */
static void add_bf16(void *in, void *inout, int *count, MPI_Datatype *type)
{
    (void)type;
    uint16_t *a = in, *b = inout;
    for (int i = 0; i < *count; ++i)
        b[i] = float_to_bf16(bf16_to_float(a[i]) + bf16_to_float(b[i]));
}

/* Tile i's collective. Blocking calls, one tile after another: Open MPI's blocking
 * collectives choose their algorithm by size, where its non-blocking ones (libnbc) follow one
 * schedule; all-reducing 256 MiB of tiles between two ranks took 0.048 s blocking against
 * 0.24 s started together and awaited (2-core machine, shared memory). MPI counts are int: a
 * tile past 2^31 elements is refused when submitted. */
static int mpi_collective(const struct collective_args *args, int i, void *buffer,
                          MPI_Datatype type, MPI_Op op)
{
    void *ptr = TILE_PTR(buffer);
    int count = (int)TILE_COUNT(buffer), root = args->roots[i];
    if (args->kind == NNTILE_REDUCE)
        return MPI_Reduce(root == my_rank ? MPI_IN_PLACE : ptr, ptr, count, type, op, root,
                          comm);
    if (args->kind == NNTILE_BROADCAST)
        return MPI_Bcast(ptr, count, type, root, comm);
    return MPI_Allreduce(MPI_IN_PLACE, ptr, count, type, op, comm);
}

static void cpu_collective(void *buffers[], void *cl_arg)
{
    const struct collective_args *args = cl_arg;
    int n = STARPU_TASK_GET_NBUFFERS(starpu_task_get_current()) - 1;  /* the last: the token */
    MPI_Datatype type = args->dtype == NNTILE_FP64 ? MPI_DOUBLE
                        : args->dtype == NNTILE_BF16 ? MPI_UINT16_T : MPI_FLOAT;
    MPI_Op op = args->dtype == NNTILE_BF16 ? bf16_sum : MPI_SUM;
    for (int i = 0; i < n; ++i)
        if (mpi_collective(args, i, buffers[i], type, op) != MPI_SUCCESS)
            record_error("MPI collective", "a tile's collective failed");
}

static struct starpu_codelet cl_mpi = {
    .cpu_funcs = {cpu_collective},
    .nbuffers = STARPU_VARIABLE_NBUFFERS,
    .name = "collective",
    .callback_func = collective_done,
};

int nntile_collective_start_mpi(intptr_t comm_handle)
{
    if (MPI_Comm_dup((MPI_Comm)comm_handle, &comm) != MPI_SUCCESS)
        return -EINVAL;
    if (bf16_sum == MPI_OP_NULL && MPI_Op_create(add_bf16, 1, &bf16_sum) != MPI_SUCCESS)
        return -EINVAL;
    MPI_Comm_rank(comm, &my_rank);
    start_token();
    return 0;
}

static void stop_mpi(void)
{
    if (comm != MPI_COMM_NULL)
        MPI_Comm_free(&comm);
}
#else
static struct starpu_codelet cl_mpi = {.nbuffers = STARPU_VARIABLE_NBUFFERS, .name = "collective"};

int nntile_collective_start_mpi(intptr_t comm_handle)
{
    (void)comm_handle;
    return -ENOSYS;
}

static void stop_mpi(void) {}
#endif

/* ---- NCCL, on a CUDA worker --------------------------------------------------------------- */

/* NCCL's C API, as far as nntile calls it (nccl.h: ncclResult_t is an int-sized enum). */
typedef struct nccl_comm *nccl_comm_t;
typedef struct { char internal[NNTILE_NCCL_ID_BYTES]; } nccl_id_t;
enum { NCCL_FLOAT32 = 7, NCCL_FLOAT64 = 8, NCCL_BFLOAT16 = 9, NCCL_SUM = 0 };
static struct {
    void *library;
    int (*get_unique_id)(nccl_id_t *);
    int (*comm_init_rank)(nccl_comm_t *, int, nccl_id_t, int);
    int (*all_reduce)(const void *, void *, size_t, int, int, nccl_comm_t, void *);
    int (*reduce)(const void *, void *, size_t, int, int, int, nccl_comm_t, void *);
    int (*broadcast)(const void *, void *, size_t, int, int, nccl_comm_t, void *);
    int (*group_start)(void);
    int (*group_end)(void);
    int (*comm_destroy)(nccl_comm_t);
    const char *(*error_string)(int);
} nccl;
static nccl_comm_t nccl_comm;
static int nccl_worker = -1;

static void say(char *error, size_t size, const char *what, const char *detail)
{
    snprintf(error, size, "%s: %s", what, detail ? detail : "unknown error");
}

int nntile_nccl_open(const char *library_path, int make_id, char *id, char *error,
                     size_t error_size)
{
    if (nccl.library == NULL) {
        void *lib = dlopen(library_path, RTLD_NOW | RTLD_LOCAL);
        if (lib == NULL) {
            say(error, error_size, library_path, dlerror());
            return -ENOENT;
        }
#define NCCL_SYMBOL(field, name)                                                               \
        if ((*(void **)&nccl.field = dlsym(lib, name)) == NULL) {                               \
            say(error, error_size, name, "not in the NCCL library");                           \
            dlclose(lib);                                                                       \
            return -ENOENT;                                                                     \
        }
        NCCL_SYMBOL(get_unique_id, "ncclGetUniqueId")
        NCCL_SYMBOL(comm_init_rank, "ncclCommInitRank")
        NCCL_SYMBOL(all_reduce, "ncclAllReduce")
        NCCL_SYMBOL(reduce, "ncclReduce")
        NCCL_SYMBOL(broadcast, "ncclBroadcast")
        NCCL_SYMBOL(group_start, "ncclGroupStart")
        NCCL_SYMBOL(group_end, "ncclGroupEnd")
        NCCL_SYMBOL(comm_destroy, "ncclCommDestroy")
        NCCL_SYMBOL(error_string, "ncclGetErrorString")
#undef NCCL_SYMBOL
        nccl.library = lib;
    }
    if (make_id) {
        nccl_id_t unique;
        int ret = nccl.get_unique_id(&unique);
        if (ret != 0) {
            say(error, error_size, "ncclGetUniqueId", nccl.error_string(ret));
            return -EIO;
        }
        memcpy(id, unique.internal, sizeof unique.internal);
    }
    return 0;
}

#if NNTILE_HAVE_CUDA
/* Tile i's collective, in place (NCCL allows it for all three), on the worker's stream. */
static int nccl_one(const struct collective_args *args, int i, void *buffer, int type,
                    void *stream)
{
    void *ptr = TILE_PTR(buffer);
    size_t count = TILE_COUNT(buffer);
    if (args->kind == NNTILE_REDUCE)
        return nccl.reduce(ptr, ptr, count, type, NCCL_SUM, args->roots[i], nccl_comm, stream);
    if (args->kind == NNTILE_BROADCAST)
        return nccl.broadcast(ptr, ptr, count, type, args->roots[i], nccl_comm, stream);
    return nccl.all_reduce(ptr, ptr, count, type, NCCL_SUM, nccl_comm, stream);
}

static void cuda_collective(void *buffers[], void *cl_arg)
{
    const struct collective_args *args = cl_arg;
    int n = STARPU_TASK_GET_NBUFFERS(starpu_task_get_current()) - 1;
    int type = args->dtype == NNTILE_FP64 ? NCCL_FLOAT64
               : args->dtype == NNTILE_BF16 ? NCCL_BFLOAT16 : NCCL_FLOAT32;
    void *stream = starpu_cuda_get_local_stream();
    int ret = nccl.group_start();  /* one launch for the whole bucket */
    for (int i = 0; i < n && ret == 0; ++i)
        ret = nccl_one(args, i, buffers[i], type, stream);
    int end = nccl.group_end();
    if (ret != 0 || end != 0)
        record_error("NCCL collective", nccl.error_string(ret ? ret : end));
}

static struct starpu_codelet cl_nccl = {
    .cuda_funcs = {cuda_collective},
    .cuda_flags = {STARPU_CUDA_ASYNC},
    .nbuffers = STARPU_VARIABLE_NBUFFERS,
    .name = "collective",
    .callback_func = collective_done,
};

int nntile_nccl_start(const char *id, int nranks, int rank, char *error, size_t error_size)
{
    int workers[1];
    if (nccl.library == NULL) {
        say(error, error_size, "NCCL", "not opened");
        return -EINVAL;
    }
    if (starpu_worker_get_ids_by_type(STARPU_CUDA_WORKER, workers, 1) < 1) {
        say(error, error_size, "NCCL", "this process has no CUDA worker");
        return -ENODEV;
    }
    cudaError_t cuda = cudaSetDevice(starpu_worker_get_devid(workers[0]));
    if (cuda != cudaSuccess) {
        say(error, error_size, "cudaSetDevice", cudaGetErrorString(cuda));
        return -EIO;
    }
    nccl_id_t unique;
    memcpy(unique.internal, id, sizeof unique.internal);
    int ret = nccl.comm_init_rank(&nccl_comm, nranks, unique, rank);
    if (ret != 0) {
        say(error, error_size, "ncclCommInitRank", nccl.error_string(ret));
        nccl_comm = NULL;
        return -EIO;
    }
    nccl_worker = workers[0];
    my_rank = rank;
    start_token();
    return 0;
}
#else
int nntile_nccl_start(const char *id, int nranks, int rank, char *error, size_t error_size)
{
    (void)id, (void)nranks, (void)rank;
    say(error, error_size, "NCCL", "this nntile was built without CUDA");
    return -ENOSYS;
}
#endif

static void stop_nccl(void)
{
    if (nccl_comm != NULL)
        nccl.comm_destroy(nccl_comm);
    nccl_comm = NULL;
    nccl_worker = -1;
}

void nntile_collective_stop(void)
{
    stop_nccl();
    stop_mpi();
    if (started)
        starpu_data_unregister(order_token);
    started = 0;
    bytes_reduced = 0;
    first_error[0] = 0;
}

/* ---- submission --------------------------------------------------------------------------- */

/* How the task uses a tile: a reduce only reads the tiles of ranks other than the root,
 * a broadcast only writes them (StarPU then neither keeps nor fetches their contents). */
static enum starpu_data_access_mode tile_mode(int kind, int root)
{
    if (kind == NNTILE_REDUCE)
        return root == my_rank ? STARPU_RW : STARPU_R;
    if (kind == NNTILE_BROADCAST)
        return root == my_rank ? STARPU_R : STARPU_W;
    return STARPU_RW;
}

int nntile_collective_submit(int kind, starpu_data_handle_t *handles, const int *roots, int n,
                             int dtype, int priority)
{
    if (!started || n < 1 || (kind != NNTILE_ALLREDUCE && roots == NULL))
        return -EINVAL;
    struct starpu_data_descr *descrs = malloc(sizeof *descrs * (size_t)(n + 1));
    size_t arg_size = sizeof(struct collective_args) + sizeof(int) * (size_t)n;
    struct collective_args *arg = malloc(arg_size);  /* the task frees it */
    if (descrs == NULL || arg == NULL) {
        free(descrs);
        free(arg);
        return -ENOMEM;
    }
    arg->kind = kind;
    arg->dtype = dtype;
    for (int i = 0; i < n; ++i) {
        arg->roots[i] = roots != NULL ? roots[i] : 0;
        descrs[i].handle = handles[i];
        descrs[i].mode = tile_mode(kind, arg->roots[i]);
        if (descrs[i].mode != STARPU_R)
            nntile_tile_written(handles[i]);
        bytes_reduced += starpu_data_get_size(handles[i]);
    }
    descrs[n].handle = order_token;
    descrs[n].mode = STARPU_RW;
    struct starpu_codelet *cl = &cl_mpi;
    int on_worker = 0;
#if NNTILE_HAVE_CUDA
    if (nccl_worker >= 0)
        cl = &cl_nccl, on_worker = 1;
#endif
    int ret = on_worker
        ? starpu_task_insert(cl, STARPU_DATA_MODE_ARRAY, descrs, n + 1, STARPU_CL_ARGS, arg,
                             arg_size, STARPU_PRIORITY, priority, STARPU_EXECUTE_ON_WORKER,
                             nccl_worker, 0)
        : starpu_task_insert(cl, STARPU_DATA_MODE_ARRAY, descrs, n + 1, STARPU_CL_ARGS, arg,
                             arg_size, STARPU_PRIORITY, priority, 0);
    free(descrs);
    return ret;
}

unsigned long long nntile_collective_bytes(void)
{
    return bytes_reduced;
}
