#include <errno.h>
#include "mpi_glue.h"
#include "codelets.h"

#if NNTILE_HAVE_MPI
#include <starpu_mpi.h>

static MPI_Comm nntile_comm;
static int nntile_mpi_running = 0;

int nntile_mpi_available(void) { return 1; }

int nntile_mpi_start(struct starpu_conf *conf, intptr_t comm_handle)
{
    /* mpi4py hands out the C handle's value; MPI_Comm is a pointer in Open MPI and an int
     * in MPICH, and this cast restores either. */
    nntile_comm = (MPI_Comm) comm_handle;
    int ret = starpu_mpi_init_conf(NULL, NULL, 0, nntile_comm, conf);
    if (ret == 0)
        nntile_mpi_running = 1;
    return ret;
}

int nntile_mpi_stop(void)
{
    if (!nntile_mpi_running)
        return 0;
    nntile_mpi_running = 0;
    return starpu_mpi_shutdown_comm(nntile_comm);
}

int nntile_mpi_rank(void)
{
    int rank = 0;
    starpu_mpi_comm_rank(nntile_comm, &rank);
    return rank;
}

int nntile_mpi_size(void)
{
    int size = 1;
    starpu_mpi_comm_size(nntile_comm, &size);
    return size;
}

void nntile_mpi_register(starpu_data_handle_t handle, int64_t tag, int rank)
{
    starpu_mpi_data_register_comm(handle, tag, rank, nntile_comm);
}

int nntile_mpi_submit(struct starpu_task *task)
{
    struct starpu_data_descr descrs[STARPU_NMAXBUFS];
    struct starpu_mpi_task_exchange_params params;
    unsigned nbuf = STARPU_TASK_GET_NBUFFERS(task);
    int ret = starpu_mpi_task_exchange_data_before_execution(nntile_comm, task, descrs, &params);
    if (ret != 0)
    {
        nntile_task_discard(task);
        return ret;
    }
    if (params.do_execute)
    {
        ret = starpu_task_submit(task);
        if (ret != 0)
            nntile_task_discard(task);
    }
    else
        nntile_task_discard(task);
    int post = starpu_mpi_task_exchange_data_after_execution(nntile_comm, descrs, nbuf, params);
    return ret != 0 ? ret : post;
}

void nntile_mpi_get_on_all(starpu_data_handle_t handle)
{
    starpu_mpi_get_data_on_all_nodes_detached(nntile_comm, handle);
}

void nntile_mpi_cache_flush(starpu_data_handle_t handle)
{
    starpu_mpi_cache_flush(nntile_comm, handle);
}

int nntile_mpi_wait_for_all(void) { return starpu_mpi_wait_for_all(nntile_comm); }

int nntile_mpi_barrier(void) { return starpu_mpi_barrier(nntile_comm); }

void nntile_mpi_stats_enable(void)
{
    /* after starpu_mpi_init_conf: before it, StarPU has no communicator to count on */
    starpu_mpi_comm_stats_enable();
}

int nntile_mpi_bytes_sent(size_t *per_rank)
{
    starpu_mpi_comm_stats_retrieve(per_rank);
    return 0;
}

#else /* built without StarPU-MPI */

int nntile_mpi_available(void) { return 0; }
int nntile_mpi_start(struct starpu_conf *conf, intptr_t comm_handle)
{
    (void) conf; (void) comm_handle;
    return -ENOSYS;
}
int nntile_mpi_stop(void) { return 0; }
int nntile_mpi_rank(void) { return 0; }
int nntile_mpi_size(void) { return 1; }
void nntile_mpi_register(starpu_data_handle_t handle, int64_t tag, int rank)
{
    (void) handle; (void) tag; (void) rank;
}
int nntile_mpi_submit(struct starpu_task *task)
{
    nntile_task_discard(task);
    return -ENOSYS;
}
void nntile_mpi_get_on_all(starpu_data_handle_t handle) { (void) handle; }
void nntile_mpi_cache_flush(starpu_data_handle_t handle) { (void) handle; }
int nntile_mpi_wait_for_all(void) { return -ENOSYS; }
int nntile_mpi_barrier(void) { return -ENOSYS; }
void nntile_mpi_stats_enable(void) {}
int nntile_mpi_bytes_sent(size_t *per_rank) { (void) per_rank; return -ENOSYS; }

#endif
