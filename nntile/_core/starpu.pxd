# Declarations of the parts of StarPU's C API that nntile uses, C names kept so that
# each can be looked up in StarPU's documentation (starpu.h and the headers it includes).
# A function whose return code matters is also declared in starpu_checked.h with
# warn_unused_result: the core builds with -Werror=unused-result, so each call goes through
# CHKERR (runtime.pxi) or does not build (tests/test_policy.py checks the two lists agree).
from libc.stdint cimport uint32_t, uint64_t, uintptr_t, int32_t

cdef extern from "starpu_checked.h":
    pass

cdef extern from "starpu.h" nogil:
    ctypedef struct _starpu_data_state
    ctypedef _starpu_data_state *starpu_data_handle_t

    enum starpu_data_access_mode:
        STARPU_NONE
        STARPU_R
        STARPU_W
        STARPU_RW
        STARPU_SCRATCH
        STARPU_REDUX
        STARPU_COMMUTE

    enum starpu_worker_archtype:
        STARPU_CPU_WORKER
        STARPU_CUDA_WORKER

    int STARPU_NMAXBUFS
    int STARPU_VARIABLE_NBUFFERS
    int STARPU_MAIN_RAM
    int STARPU_NMAXIMPLEMENTATIONS
    int STARPU_CPU
    int STARPU_CUDA
    int STARPU_CUDA_ASYNC
    int STARPU_MAJOR_VERSION
    int STARPU_MINOR_VERSION
    int STARPU_RELEASE_VERSION

    struct starpu_conf:
        const char *sched_policy_name
        int ncpus
        int ncuda
        int nopencl
        int calibrate
        int bus_calibrate

    struct starpu_sched_policy:
        const char *policy_name
        const char *policy_description
    starpu_sched_policy **starpu_sched_get_predefined_policies()

    int starpu_conf_init(starpu_conf *conf)
    int starpu_init(starpu_conf *conf)
    int starpu_is_initialized()
    void starpu_shutdown()
    void starpu_pause()
    void starpu_resume()

    # workers
    unsigned starpu_worker_get_count()
    unsigned starpu_cpu_worker_get_count()
    unsigned starpu_cuda_worker_get_count()
    starpu_worker_archtype starpu_worker_get_type(int id)
    void starpu_worker_get_name(int id, char *dst, size_t maxlen)
    unsigned starpu_memory_nodes_get_count()
    unsigned starpu_memory_nodes_get_numa_count()
    int starpu_memory_node_get_name(unsigned node, char *name, size_t size)
    long starpu_memory_get_total(unsigned node)
    long starpu_memory_get_available(unsigned node)
    size_t starpu_memory_get_used(unsigned node)
    int starpu_worker_get_id()
    int starpu_worker_get_devid(int id)

    # performance models
    enum starpu_perfmodel_type:
        STARPU_PERFMODEL_INVALID
        STARPU_PER_WORKER
        STARPU_PER_ARCH
        STARPU_COMMON
        STARPU_HISTORY_BASED
        STARPU_REGRESSION_BASED
        STARPU_NL_REGRESSION_BASED
        STARPU_MULTIPLE_REGRESSION_BASED

    struct starpu_task
    struct starpu_perfmodel_arch
    struct starpu_perfmodel:
        starpu_perfmodel_type type
        const char *symbol
        uint32_t (*footprint)(starpu_task *task)

    ctypedef void (*starpu_cpu_func_t)(void **, void *)
    ctypedef void (*starpu_cuda_func_t)(void **, void *)

    struct starpu_codelet:
        uint32_t where
        starpu_cpu_func_t cpu_funcs[4]
        starpu_cuda_func_t cuda_funcs[4]
        char cuda_flags[4]
        int nbuffers
        starpu_perfmodel *model
        const char *name
        int flags

    struct starpu_task:
        const char *name
        starpu_codelet *cl
        int32_t where
        int nbuffers
        # STARPU_NMAXBUFS entries (scripts/install_starpu.sh configures 16)
        starpu_data_handle_t handles[16]
        starpu_data_access_mode modes[16]
        void *cl_arg
        size_t cl_arg_size
        unsigned cl_arg_free
        int priority
        unsigned synchronous
        unsigned detach
        int execute_on_a_specific_worker
        unsigned workerid
        uint32_t *workerids
        unsigned workerids_len

    starpu_task *starpu_task_create()
    int starpu_task_submit(starpu_task *task)
    int starpu_task_wait_for_all()
    void starpu_task_destroy(starpu_task *task)
    starpu_task *starpu_task_get_current()
    uint32_t starpu_task_footprint(starpu_perfmodel *model, starpu_task *task,
                                   starpu_perfmodel_arch *arch, unsigned nimpl)
    uint32_t starpu_hash_crc32c_be_n(const void *input, size_t n, uint32_t inputcrc)
    double starpu_transfer_bandwidth(unsigned src_node, unsigned dst_node)
    int STARPU_MIN_PRIO
    int STARPU_MAX_PRIO
    int STARPU_DEFAULT_PRIO

    # data
    void starpu_vector_data_register(starpu_data_handle_t *handle, int home_node,
                                     uintptr_t ptr, uint32_t nx, size_t elemsize)
    uintptr_t starpu_vector_get_local_ptr(starpu_data_handle_t handle)
    size_t starpu_data_get_size(starpu_data_handle_t handle)
    void starpu_data_unregister(starpu_data_handle_t handle)
    void starpu_data_unregister_submit(starpu_data_handle_t handle)
    void starpu_data_invalidate_submit(starpu_data_handle_t handle)
    size_t starpu_data_get_size(starpu_data_handle_t handle)
    void starpu_data_wont_use(starpu_data_handle_t handle)
    void starpu_data_set_user_data(starpu_data_handle_t handle, void *user_data)
    void *starpu_data_get_user_data(starpu_data_handle_t handle)
    void starpu_data_query_status(starpu_data_handle_t handle, int memory_node,
                                  int *is_allocated, int *is_valid, int *is_requested)
    int starpu_data_acquire(starpu_data_handle_t handle, starpu_data_access_mode mode)
    void starpu_data_release(starpu_data_handle_t handle)
    void starpu_data_set_name(starpu_data_handle_t handle, const char *name)
    void starpu_data_prefetch_on_node(starpu_data_handle_t handle, unsigned node,
                                      unsigned async)

    # memory
    long starpu_memory_get_total(unsigned node)
    long starpu_memory_get_available(unsigned node)


cdef extern from "starpu.h" nogil:
    int STARPU_CL_ARGS
    int starpu_task_insert(starpu_codelet *cl, ...)

cdef extern from "starpu_profiling.h" nogil:
    struct timespec:
        long tv_sec
        long tv_nsec
    struct starpu_profiling_worker_info:
        timespec start_time
        timespec total_time
        timespec executing_time
        timespec sleeping_time
        timespec waiting_time
        int executed_tasks
    int STARPU_PROFILING_ENABLE
    int STARPU_PROFILING_DISABLE
    int starpu_profiling_status_set(int status)
    int starpu_profiling_worker_get_info(int workerid, starpu_profiling_worker_info *info)
    struct starpu_profiling_bus_info:
        timespec start_time
        timespec total_time
        long long transferred_bytes
        int transfer_count
    int starpu_bus_get_count()
    int starpu_bus_get_src(int busid)
    int starpu_bus_get_dst(int busid)
    int starpu_bus_get_profiling_info(int busid, starpu_profiling_bus_info *bus_info)
    double starpu_timing_timespec_to_us(timespec *ts)
    double starpu_timing_now()
