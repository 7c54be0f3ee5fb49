# StarPU-MPI declarations (starpu_mpi.h), kept apart from starpu.pxd because including
# starpu_mpi.h needs mpi.h, which a build without MPI does not have.
from nntile._core.starpu cimport starpu_conf, starpu_data_handle_t

cdef extern from "mpi.h" nogil:
    ctypedef struct _mpi_comm_opaque
    ctypedef _mpi_comm_opaque *MPI_Comm

cdef extern from "starpu_mpi.h" nogil:
    int starpu_mpi_init_conf(int *argc, char ***argv, int initialize_mpi,
                             MPI_Comm comm, starpu_conf *conf)
    int starpu_mpi_shutdown()
    int starpu_mpi_world_rank()
    int starpu_mpi_world_size()
    void starpu_mpi_data_register(starpu_data_handle_t handle, long tag, int rank)
    long starpu_mpi_tags_allocate(long nbtags)
    void starpu_mpi_tags_free(long tag)
    int starpu_mpi_wait_for_all(MPI_Comm comm)
    int starpu_mpi_barrier(MPI_Comm comm)
