/* The StarPU-MPI calls nntile makes, behind one header that compiles with or without MPI.
 *
 * Built with NNTILE_HAVE_MPI=1, these call StarPU-MPI on the communicator given to
 * nntile_mpi_start. Without MPI they keep the module linkable: nntile_mpi_available() is 0
 * and the others return -ENOSYS (the Python side checks availability first). */
#ifndef NNTILE_MPI_GLUE_H
#define NNTILE_MPI_GLUE_H

#include <stddef.h>
#include <stdint.h>
#include <starpu.h>

/* A call whose return code is dropped does not build (see starpu_checked.h). */
#ifndef NNTILE_CHECKED
#define NNTILE_CHECKED __attribute__((warn_unused_result))
#endif

int nntile_mpi_available(void);
/* Start StarPU and StarPU-MPI together on an MPI communicator (an mpi4py handle value);
 * MPI itself must already be initialised (mpi4py does it). Returns starpu_init's code. */
int nntile_mpi_start(struct starpu_conf *conf, intptr_t comm_handle) NNTILE_CHECKED;
int nntile_mpi_stop(void) NNTILE_CHECKED;
int nntile_mpi_rank(void);
int nntile_mpi_size(void);
void nntile_mpi_register(starpu_data_handle_t handle, int64_t tag, int rank);
/* Owner computes: the task runs on the rank owning its written tiles; every other rank
 * only sends the tiles it owns that the task reads. Consumes the task either way. */
int nntile_mpi_submit(struct starpu_task *task) NNTILE_CHECKED;
/* Bring a tile to every rank (each rank must call it), e.g. before reading it on the host. */
void nntile_mpi_get_on_all(starpu_data_handle_t handle);
/* Forget the copies other ranks received (each rank must call it after a host write). */
void nntile_mpi_cache_flush(starpu_data_handle_t handle);
int nntile_mpi_wait_for_all(void) NNTILE_CHECKED;
int nntile_mpi_barrier(void) NNTILE_CHECKED;
/* Count the bytes sent from now on (StarPU also prints them at shutdown). */
void nntile_mpi_stats_enable(void);
/* Bytes this rank has sent to each rank since nntile_mpi_stats_enable. */
int nntile_mpi_bytes_sent(size_t *per_rank) NNTILE_CHECKED;

#endif
