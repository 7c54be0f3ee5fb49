#include <stdio.h>
#include <string.h>
#include <stdint.h>
#include "codelets.h"
#include "kernels/kernels.h"

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

#define WRAPPERS(op, nbuf) CPU_WRAPPER(op, fp32, nbuf) CPU_WRAPPER(op, fp64, nbuf)
#define WRAPPERS_OPT(op, nbuf) CPU_WRAPPER_OPT(op, fp32, nbuf) CPU_WRAPPER_OPT(op, fp64, nbuf)
NNTILE_OPS(WRAPPERS, WRAPPERS_OPT)

/* Tile copies move bytes, whatever the dtype. */
static void cpu_copy_bytes(void *buffers[], void *cl_arg)
{
    (void)cl_arg;
    size_t bytes = STARPU_VECTOR_GET_NX(buffers[0]) * STARPU_VECTOR_GET_ELEMSIZE(buffers[0]);
    memcpy(BUF(1), BUF(0), bytes);
}

static void cpu_fill_int64(void *buffers[], void *cl_arg)
{
    const struct nntile_fill_args *args = cl_arg;
    int64_t *dst = BUF(0);
    int64_t value = (int64_t)args->value;
    for (int64_t i = 0; i < args->n; ++i)
        dst[i] = value;
}

typedef void (*cpu_func)(void *[], void *);

static const char *op_names[NNTILE_OP_COUNT] = {
#define NAME(op, nbuf) #op,
    NNTILE_OPS(NAME, NAME)
#undef NAME
};

static const cpu_func cpu_funcs[NNTILE_OP_COUNT][2] = {
#define FUNCS(op, nbuf) {cpu_##op##_fp32, cpu_##op##_fp64},
    NNTILE_OPS(FUNCS, FUNCS)
#undef FUNCS
};

static const char *dtype_names[NNTILE_DTYPE_COUNT] = {"fp32", "fp64", "tf32", "int64"};

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
    for (int op = 0; op < NNTILE_OP_COUNT; ++op) {
        define_codelet(op, NNTILE_FP32, cpu_funcs[op][0]);
        define_codelet(op, NNTILE_FP64, cpu_funcs[op][1]);
        define_codelet(op, NNTILE_TF32, cpu_funcs[op][0]);
    }
    for (int dtype = 0; dtype < NNTILE_DTYPE_COUNT; ++dtype)
        define_codelet(NNTILE_OP_copy, dtype, cpu_copy_bytes);
    define_codelet(NNTILE_OP_fill, NNTILE_INT64, cpu_fill_int64);
    initialized = 1;
}

struct starpu_codelet *nntile_codelet(int op, int dtype)
{
    if (op < 0 || op >= NNTILE_OP_COUNT || dtype < 0 || dtype >= NNTILE_DTYPE_COUNT)
        return NULL;
    struct starpu_codelet *cl = &codelets[op][dtype];
    return cl->cpu_funcs[0] ? cl : NULL;
}

const char *nntile_op_name(int op)
{
    return (op >= 0 && op < NNTILE_OP_COUNT) ? op_names[op] : "?";
}

extern void openblas_set_num_threads(int);

void nntile_blas_single_thread(void)
{
    openblas_set_num_threads(1);
}
