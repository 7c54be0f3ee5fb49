/* Collectives of tiles across processes, as StarPU tasks: the gradient all-reduce of
 * data-parallel ranks that each run their own StarPU (no StarPU-MPI), or, with sharded
 * updates, the gradient reduce to each tile's owner and the broadcast of updated weights.
 *
 * One task runs one kind of collective on a bucket of tiles in place: on a CUDA worker through NCCL on the
 * worker's stream (the tiles stay on the GPU), else on a CPU worker through MPI. Every rank
 * must start the same collectives in the same order, whatever order its scheduler runs tasks
 * in: each task also writes one token handle, so a rank's collectives run one after another
 * in the order they were submitted, which is the same on every rank.
 *
 * NCCL is opened at run time (dlopen of the library path given), so the module builds and
 * links without it; without MPI the functions return -ENOSYS. */
#ifndef NNTILE_COLLECTIVE_H
#define NNTILE_COLLECTIVE_H

#include <stddef.h>
#include <stdint.h>
#include <starpu.h>

#ifndef NNTILE_CHECKED
#define NNTILE_CHECKED __attribute__((warn_unused_result))
#endif

/* The size of an ncclUniqueId: what rank 0 makes and every rank needs to join. */
#define NNTILE_NCCL_ID_BYTES 128

/* MPI on the communicator (an mpi4py handle value) for CPU workers' collectives. */
int nntile_collective_start_mpi(intptr_t comm_handle) NNTILE_CHECKED;
/* Open NCCL from library_path; on rank 0, write a new unique id into id. */
int nntile_nccl_open(const char *library_path, int make_id, char *id, char *error,
                     size_t error_size) NNTILE_CHECKED;
/* Join the NCCL communicator of id on the GPU of the first CUDA worker (StarPU running):
 * from then on the collectives run on CUDA workers. */
int nntile_nccl_start(const char *id, int nranks, int rank, char *error,
                      size_t error_size) NNTILE_CHECKED;
/* Stop both; each rank calls it with no collective in flight. */
void nntile_collective_stop(void);

/* What a collective task does to each of its tiles. */
enum nntile_collective_kind {
    NNTILE_ALLREDUCE,  /* every rank gets the sum over ranks */
    NNTILE_REDUCE,     /* the tile's root rank gets the sum; the others' tiles are only read */
    NNTILE_BROADCAST,  /* every rank gets the root's tile; the others' are only written */
};

/* Submit one collective of ``kind`` on n tiles of one storage dtype (nntile_dtype: fp32,
 * fp64, bf16), in place, as one task; roots[i]: the root rank of tile i (NULL for an
 * all-reduce); priority as for any task. */
int nntile_collective_submit(int kind, starpu_data_handle_t *handles, const int *roots, int n,
                             int dtype, int priority) NNTILE_CHECKED;
/* The first failure of a collective inside a task ("call: reason"), or NULL. */
const char *nntile_collective_error(void);
/* Bytes handed to the collectives since start (each tile counted once per collective). */
unsigned long long nntile_collective_bytes(void);

#endif
