# The StarPU runtime, as a checked binding: one error path (CHKERR) for every call whose
# return code matters, and the Runtime that starts StarPU with settings resolved above the core
# (nntile.Context resolves them with nntile.policy) and stops it.
import atexit
import os
import sys
import weakref

import numpy as np

from libc.errno cimport ENODEV
from libc.stdlib cimport malloc, calloc, free
from libc.string cimport memset
from libc.stdint cimport intptr_t, int64_t, uint32_t


class StarpuError(RuntimeError):
    """A StarPU call returned an error code."""

    def __init__(self, call, code):
        self.call = call
        self.code = code
        reason = os.strerror(-code) if code < 0 else f"code {code}"
        super().__init__(f"{call} failed: {reason} ({code})")


cdef int _raise_starpu_error(int ret, const char *call) except -1 with gil:
    raise StarpuError(call.decode(), ret)


cdef inline int CHKERR(int ret, const char *call) except -1 nogil:
    """Every StarPU call whose return code matters goes through here, as in mpi4py: nothing
    to do but a comparison while it succeeds, the GIL taken only to raise. The calls are
    declared warn_unused_result (starpu_checked.h, mpi_glue.h) and the core builds with
    -Werror=unused-result, so one whose code is dropped does not build."""
    if ret == 0:
        return 0
    return _raise_starpu_error(ret, call)


cdef extern from "codelets.h" nogil:
    void nntile_codelets_init()
    void nntile_blas_single_thread()
    const char *nntile_blas_config()
    const char *nntile_blas_core()
    int nntile_blas_threads()
    void nntile_cuda_start()
    void nntile_cuda_stop()
    void nntile_task_discard(starpu_task *task)
    int nntile_write_back(starpu_data_handle_t handle)
    void nntile_zero_when_dropped(starpu_data_handle_t handle)
    int nntile_tile_home(starpu_data_handle_t handle)
    void nntile_tile_set_home(starpu_data_handle_t handle, int home)
    void nntile_tile_dropped(starpu_data_handle_t handle)
    int nntile_tile_reads_zero(starpu_data_handle_t handle)
    int nntile_tile_drops_to_zero(starpu_data_handle_t handle)
    void nntile_tile_written(starpu_data_handle_t handle)
    void nntile_op_profiling(int enable)
    unsigned long long nntile_op_time(int op, int dtype, double *seconds)
    struct nntile_task_record:
        int op, dtype, worker, unused
        double submitted, pushed, popped, fetch_start, fetch_end, start, end
    void nntile_op_timeline(nntile_task_record *buffer, unsigned long long capacity)
    unsigned long long nntile_op_timeline_count()
    starpu_codelet *nntile_codelet(int op, int dtype)
    const char *nntile_op_name(int op)
    int nntile_models_calibrating()
    int NNTILE_HAVE_CUDA

cdef extern from "Python.h":
    pass

cdef extern from "mpi_glue.h" nogil:
    int nntile_mpi_available()
    int nntile_mpi_start(starpu_conf *conf, intptr_t comm_handle)
    int nntile_mpi_stop()
    int nntile_mpi_rank()
    int nntile_mpi_size()
    void nntile_mpi_register(starpu_data_handle_t handle, int64_t tag, int rank)
    int nntile_mpi_submit(starpu_task *task)
    void nntile_mpi_get_on_all(starpu_data_handle_t handle)
    void nntile_mpi_cache_flush(starpu_data_handle_t handle)
    int nntile_mpi_wait_for_all()
    int nntile_mpi_barrier()
    void nntile_mpi_stats_enable()
    int nntile_mpi_bytes_sent(size_t *per_rank)

cdef extern from "collective.h" nogil:
    int NNTILE_NCCL_ID_BYTES
    int nntile_collective_start_mpi(intptr_t comm_handle)
    int nntile_nccl_open(const char *library_path, int make_id, char *id, char *error,
                         size_t error_size)
    int nntile_nccl_start(const char *id, int nranks, int rank, char *error, size_t error_size)
    void nntile_collective_stop()
    enum:
        NNTILE_ALLREDUCE
        NNTILE_REDUCE
        NNTILE_BROADCAST
    int nntile_collective_submit(int kind, starpu_data_handle_t *handles, const int *roots,
                                 int n, int dtype, int priority)
    unsigned long long nntile_collective_bytes()
    const char *nntile_collective_error()

cdef extern from "host_arena.h" nogil:
    struct nntile_host_arena_stats:
        size_t pinned, in_use, peak_in_use, served, outside, refused
        double pin_seconds, wait_seconds
    int nntile_host_arena_start(size_t target, size_t cap, size_t chunk, size_t headroom,
                                int pinned, int hooks)
    int nntile_host_arena_stop()
    int nntile_host_arena_running()
    double nntile_host_arena_pin_all()
    void nntile_host_arena_read_stats(nntile_host_arena_stats *stats)
    int nntile_host_arena_alloc(void **ptr, size_t size)
    int nntile_host_arena_free(void *ptr)
    size_t nntile_host_arena_free_blocks(size_t *largest)

HAVE_MPI = bool(nntile_mpi_available())
HAVE_CUDA = bool(NNTILE_HAVE_CUDA)
STARPU_VERSION = f"{STARPU_MAJOR_VERSION}.{STARPU_MINOR_VERSION}.{STARPU_RELEASE_VERSION}"

# StarPU-MPI state of the running runtime: whether tasks go through StarPU-MPI, this
# process's rank, the number of ranks, and the next unused MPI tag. Every rank creates the
# same tensors in the same order, so a counter gives every tile the same tag on all ranks.
cdef bint _mpi_on = False
cdef int _mpi_rank = 0
cdef int _mpi_size = 1
cdef int64_t _mpi_next_tag = 0

# The running runtime, and a counter that changes at each start so that a tensor can tell
# whether the runtime it was registered with is still the one running.
cdef object _running_context = None
cdef long _epoch = 0
cdef object _live_tensors = weakref.WeakSet()


def schedulers():
    """{name: description} of the schedulers this StarPU has (no need to start it)."""
    cdef starpu_sched_policy **policy = starpu_sched_get_predefined_policies()
    result = {}
    while policy[0] != NULL:
        result[policy[0].policy_name.decode()] = policy[0].policy_description.decode()
        policy += 1
    return result


def blas():
    """The CPU kernels' BLAS: {"config": its build (OpenBLAS's version and options), "core":
    the CPU whose kernels it runs here, "threads": its threads per call (1 once a Context has
    started: each CPU worker is one thread)}."""
    return {"config": nntile_blas_config().decode(), "core": nntile_blas_core().decode(),
            "threads": nntile_blas_threads()}


# One task of Runtime.timeline(), as codelets.h's struct nntile_task_record lays it out.
TASK_RECORD = np.dtype([("op", "i4"), ("dtype", "i4"), ("worker", "i4"), ("unused", "i4"),
                        ("submitted", "f8"), ("pushed", "f8"), ("popped", "f8"),
                        ("fetch_start", "f8"), ("fetch_end", "f8"), ("start", "f8"),
                        ("end", "f8")])
if TASK_RECORD.itemsize != sizeof(nntile_task_record):
    raise ImportError("TASK_RECORD does not match codelets.h's struct nntile_task_record")


class Runtime:
    """StarPU for this process, started with resolved settings: the core of nntile.Context,
    which resolves them (nntile.policy) and is what users create. Only one runs at a time."""

    workers = ()
    rank = 0
    world_size = 1
    replicated = False  # ranks that each hold the whole model (nntile.Context)
    mpi = False
    mpi_stats = False
    writes_behind = False  # nntile.optim: copy each update's tiles to host memory after it
    _epoch = -1

    @property
    def running(self):
        return _running_context is self

    def _start_starpu(self, str sched, ncpus, ncuda, dict env, comm_handle=None):
        """Start StarPU (and StarPU-MPI on the communicator ``comm_handle``, an MPI handle
        value, when given) with the scheduler ``sched``; ``ncpus``/``ncuda``: worker counts
        for StarPU's configuration (None: its environment decides); ``env``: STARPU_
        variables to set while this runtime runs (restored at shutdown, or at once when the
        start fails)."""
        global _running_context, _epoch, _mpi_on, _mpi_rank, _mpi_size, _mpi_next_tag
        if _running_context is self:
            raise RuntimeError("this Context is already running")
        if _running_context is not None:
            raise RuntimeError("another nntile.Context is already running in this process; "
                               "shut it down (ctx.shutdown() or leave its 'with' block) first")
        self._env_before = {}
        for name, value in env.items():
            self._env_before.setdefault(name, os.environ.get(name))
            os.environ[name] = str(value)
        cdef starpu_conf conf
        cdef int ret
        cdef intptr_t handle
        cdef bint mpi = comm_handle is not None
        try:
            CHKERR(starpu_conf_init(&conf), "starpu_conf_init")
            sched_name = sched.encode()
            conf.sched_policy_name = sched_name
            if ncpus is not None:
                conf.ncpus = int(ncpus)
            if ncuda is not None:
                conf.ncuda = int(ncuda)
            nntile_blas_single_thread()
            if mpi:
                handle = comm_handle
                with nogil:
                    ret = nntile_mpi_start(&conf, handle)
            else:
                with nogil:
                    ret = starpu_init(&conf)
            if ret == -ENODEV:
                raise RuntimeError("StarPU found no worker to run tasks on (ncpu=0 and no "
                                   "GPU?)")
            CHKERR(ret, "starpu_init")
        except BaseException:
            self._restore_env()
            raise
        nntile_codelets_init()
        nntile_cuda_start()
        _start_devices()
        _mpi_on = mpi
        _mpi_rank = nntile_mpi_rank() if mpi else 0
        _mpi_size = nntile_mpi_size() if mpi else 1
        _mpi_next_tag = 0
        self.rank, self.world_size = _mpi_rank, _mpi_size
        if mpi and self.mpi_stats:
            nntile_mpi_stats_enable()
        _epoch += 1
        self._epoch = _epoch
        _running_context = self
        self.workers = _worker_names()

    def _restore_env(self):
        for name, value in getattr(self, "_env_before", {}).items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value
        self._env_before = {}

    @property
    def owner_ranks(self):
        """The ranks that share the tiles through StarPU-MPI (1: this process holds all)."""
        return self.world_size

    def owners_for(self, tuple grid, bint batched):
        """Rank of each tile (C order over ``grid``), or None with one process (nntile.Context
        gives the distribution's)."""
        if self.world_size == 1:
            return None
        raise NotImplementedError("a StarPU-MPI runtime needs a distribution (nntile.Context)")

    def bytes_sent(self):
        """Bytes this rank has sent to each rank through StarPU-MPI since start (a list);
        needs Context(mpi_stats=True)."""
        self._check_running()
        if not (self.mpi and self.mpi_stats):
            raise RuntimeError("bytes_sent() needs Context(mpi=True, mpi_stats=True)")
        cdef size_t *counts = <size_t *> malloc(self.world_size * sizeof(size_t))
        if counts == NULL:
            raise MemoryError()
        try:
            memset(counts, 0, self.world_size * sizeof(size_t))
            CHKERR(nntile_mpi_bytes_sent(counts), "starpu_mpi_comm_stats_retrieve")
            return [counts[i] for i in range(self.world_size)]
        finally:
            free(counts)

    @property
    def ncpu_workers(self):
        self._check_running()
        return starpu_cpu_worker_get_count()

    @property
    def ncuda_workers(self):
        self._check_running()
        return starpu_cuda_worker_get_count()

    def _check_running(self):
        if _running_context is not self:
            raise RuntimeError("this nntile.Context is not running (it was shut down)")

    def wait(self):
        """Wait until every submitted task has run."""
        self._check_running()
        cdef int ret
        with nogil:
            ret = starpu_task_wait_for_all()
        CHKERR(ret, "starpu_task_wait_for_all")

    def profiling(self, bint enable=True):
        """Turn StarPU's per-worker and per-task time accounting on or off (see worker_stats
        and op_stats); call it with no task in flight."""
        self._check_running()
        cdef int ret = starpu_profiling_status_set(STARPU_PROFILING_ENABLE if enable
                                                   else STARPU_PROFILING_DISABLE)
        # on success it returns the previous status, 0 or 1
        CHKERR(ret if ret < 0 else 0, "starpu_profiling_status_set")
        nntile_op_profiling(enable)

    def op_stats(self):
        """Tasks and seconds of execution (StarPU's start and end of each task, summed over
        workers) per op and kernel dtype since the last call, largest first; needs
        profiling(True). A list of dicts: op, dtype, tasks, seconds."""
        self._check_running()
        cdef double seconds
        cdef unsigned long long tasks
        cdef int op, dtype
        stats = []
        for op in range(NNTILE_OP_COUNT):
            for dtype in range(NNTILE_DTYPE_COUNT):
                tasks = nntile_op_time(op, dtype, &seconds)
                if tasks:
                    stats.append(dict(op=nntile_op_name(op).decode(),
                                      dtype=_DTYPE_NAMES[dtype], tasks=tasks,
                                      seconds=seconds))
        return sorted(stats, key=lambda s: -s["seconds"])

    def models_calibrating(self):
        """How many kernels' performance models StarPU is calibrating (codelets.h): while
        it does, it measures their tasks and places them without estimates, and steps run
        slower."""
        self._check_running()
        return nntile_models_calibrating()

    def record_timeline(self, capacity=1 << 20):
        """Record each task that finishes from now on (its op, worker and StarPU's dates for
        it), at most ``capacity`` of them, until timeline() is called; needs profiling(True).
        Call it with no task in flight."""
        self._check_running()
        if capacity < 1:
            raise ValueError(f"capacity must be positive, got {capacity}")
        nntile_op_timeline(NULL, 0)
        self._timeline = np.zeros(int(capacity), dtype=TASK_RECORD)
        nntile_op_timeline(<nntile_task_record *> <intptr_t> self._timeline.ctypes.data,
                           capacity)

    def timeline(self):
        """Stop recording (record_timeline) and return what was recorded: a structured array
        of TASK_RECORD, one row per task in the order they finished, with the op and worker
        as names, and the number of tasks that finished past the capacity. Dates are in
        microseconds on the clock of clock_us(). Call it with no task in flight. StarPU leaves
        a task's pop date unset when profiling was turned on while its worker was already
        waiting to pop; such a date is given as the task's fetch start, the latest it can be."""
        self._check_running()
        records = getattr(self, "_timeline", None)
        if records is None:
            raise RuntimeError("no timeline is being recorded: call record_timeline() first")
        finished = nntile_op_timeline_count()
        nntile_op_timeline(NULL, 0)
        self._timeline = None
        kept = records[:min(finished, len(records))]
        names = {op: nntile_op_name(op).decode() for op in np.unique(kept["op"])}
        table = np.zeros(len(kept), dtype=[("op", object), ("dtype", object),
                                           ("worker", object)]
                         + [(f, "f8") for f in TASK_RECORD.names[4:]])
        table["op"] = [names[op] for op in kept["op"]]
        table["dtype"] = [_DTYPE_NAMES[d] for d in kept["dtype"]]
        workers = self.workers
        table["worker"] = [workers[w] if 0 <= w < len(workers) else str(w)
                           for w in kept["worker"]]
        for field in TASK_RECORD.names[4:]:
            table[field] = kept[field]
        unset = table["popped"] == 0
        table["popped"][unset] = table["fetch_start"][unset]
        return table, int(finished - len(kept))

    def clock_us(self):
        """Now, in microseconds, on the clock of StarPU's dates (timeline())."""
        return starpu_timing_now()

    def worker_stats(self):
        """Seconds each worker spent in total, executing tasks and sleeping since the last
        call (StarPU resets the counters on reading); needs profiling(True)."""
        self._check_running()
        cdef starpu_profiling_worker_info info
        cdef unsigned i
        stats = []
        for i in range(starpu_worker_get_count()):
            CHKERR(starpu_profiling_worker_get_info(i, &info), "starpu_profiling_worker_get_info")
            stats.append(dict(worker=self.workers[i],
                              total_s=starpu_timing_timespec_to_us(&info.total_time) * 1e-6,
                              executing_s=starpu_timing_timespec_to_us(&info.executing_time) * 1e-6,
                              sleeping_s=starpu_timing_timespec_to_us(&info.sleeping_time) * 1e-6,
                              tasks=info.executed_tasks))
        return stats

    def bus_stats(self):
        """What StarPU moved over each bus (a pair of memory nodes, e.g. NUMA 0 -> CUDA 0)
        since the last call (StarPU resets the counters on reading); needs profiling(True).
        A list of dicts: src, dst (memory node names), bytes, transfers, and bandwidth, the
        bytes/s StarPU's bus calibration measured for that pair."""
        self._check_running()
        cdef starpu_profiling_bus_info info
        cdef int bus
        names = [n["node"] for n in self.memory_nodes()]
        stats = []
        for bus in range(starpu_bus_get_count()):
            CHKERR(starpu_bus_get_profiling_info(bus, &info), "starpu_bus_get_profiling_info")
            src, dst = starpu_bus_get_src(bus), starpu_bus_get_dst(bus)
            stats.append(dict(src=names[src], dst=names[dst], bytes=info.transferred_bytes,
                              transfers=info.transfer_count,
                              bandwidth=starpu_transfer_bandwidth(src, dst) * 1e6))
        return stats

    def memory_nodes(self):
        """StarPU's accounting of each memory node (host NUMA nodes, GPUs): its name and the
        bytes StarPU may use in all (total), has handed out (used) and has left (available);
        -1 where StarPU sets no limit."""
        self._check_running()
        cdef char name[64]
        cdef unsigned node
        nodes = []
        for node in range(starpu_memory_nodes_get_count()):
            starpu_memory_node_get_name(node, name, sizeof(name))
            nodes.append(dict(node=name.decode(errors="replace"),
                              total=starpu_memory_get_total(node),
                              used=starpu_memory_get_used(node),
                              available=starpu_memory_get_available(node)))
        return nodes

    def _start_host_arena(self, target, chunk):
        """Pin up to ``target`` bytes of host memory, within StarPU's host limit, in chunks of
        ``chunk`` bytes on a thread of their own, as fast as it can from now on, and serve
        StarPU's pinned host copies of tiles from them (host_arena.c says why); call it before
        any tensor exists. Nothing starts without a CUDA worker (StarPU pins nothing then) or
        with several NUMA nodes (StarPU binds host memory to each)."""
        self._check_running()
        if not HAVE_CUDA or starpu_cuda_worker_get_count() == 0 or target <= 0:
            return
        if starpu_memory_nodes_get_numa_count() > 1:
            return
        cdef long limit = starpu_memory_get_total(STARPU_MAIN_RAM)
        if limit <= 0:
            return  # no host limit: nothing would bound what the arena pins
        target = min(target, limit)
        CHKERR(nntile_host_arena_start(target, limit, chunk, target, 1, 1),
               "nntile_host_arena_start")

    def finish_pinning(self):
        """Wait until the host memory pinned ahead (nntile.policy.pinned_host_mib) is all
        pinned, and return the seconds waited (0.0 when none is pinned ahead). Call it before
        the first step: a machine that has never touched its memory pins it more slowly than
        a step past GPU memory fills it, and the step would wait (docs/performance.md, "The
        first step on a new machine")."""
        self._check_running()
        if not nntile_host_arena_running():
            return 0.0
        cdef double waited
        with nogil:
            waited = nntile_host_arena_pin_all()
        return waited

    def host_arena_stats(self):
        """The pinned host arena's counters (host_arena.h): bytes pinned, in use and at peak,
        allocations served from it, made outside it and refused, and the seconds spent
        pinning and waiting for it; None when no arena runs."""
        return _host_arena_stats()

    def pause(self):
        """Stop the workers (they otherwise poll for tasks and keep the CPU cores busy),
        e.g. while another library computes; tasks submitted meanwhile wait for resume()."""
        self._check_running()
        with nogil:
            starpu_pause()

    def resume(self):
        self._check_running()
        with nogil:
            starpu_resume()

    def shutdown(self):
        """Wait for submitted tasks, release every tile still registered, stop StarPU. StarPU
        stops even when waiting fails; the first failure is raised afterwards."""
        global _running_context, _mpi_on
        if _running_context is not self:
            return
        cdef bint mpi = _mpi_on
        cdef int waited = 0, stopped = 0, arena = 0
        try:
            with nogil:
                waited = nntile_mpi_wait_for_all() if mpi else starpu_task_wait_for_all()
            for tensor in list(_live_tensors):
                tensor._release_at_shutdown()
        finally:
            _running_context = None
            _mpi_on = False
            _stop_devices()
            with nogil:
                nntile_cuda_stop()
                nntile_collective_stop()  # its token tile before StarPU stops
                if mpi:
                    stopped = nntile_mpi_stop()  # also stops StarPU, which StarPU-MPI started
                else:
                    starpu_shutdown()
                arena = nntile_host_arena_stop()  # StarPU has freed its tiles
                nntile_op_timeline(NULL, 0)  # the buffer belongs to this object
            self._stopped()
            self._restore_env()  # a later Context decides afresh
        CHKERR(waited, "starpu_mpi_wait_for_all" if mpi else "starpu_task_wait_for_all")
        CHKERR(stopped, "starpu_mpi_shutdown")
        CHKERR(arena, "nntile_host_arena_stop")

    def _stopped(self):
        """Called once StarPU has stopped (nntile.Context frees its MPI communicator)."""

    def __enter__(self):
        if _running_context is not self:
            self.start()
        return self

    def __exit__(self, exc_type, exc, tb):
        self.shutdown()
        return False

    def __repr__(self):
        state = "running" if self.running else "stopped"
        return f"<nntile.Context {state}, workers={self.workers}>"


def current_context():
    """The running Context, or None."""
    return _running_context


cdef list _worker_names():
    cdef char name[128]
    cdef unsigned i
    names = []
    for i in range(starpu_worker_get_count()):
        starpu_worker_get_name(i, name, sizeof(name))
        names.append(name.decode(errors="replace"))
    return names


@atexit.register
def _shutdown_at_exit():
    if _running_context is not None:
        _running_context.shutdown()


cdef object _host_arena_stats():
    if not nntile_host_arena_running():
        return None
    cdef nntile_host_arena_stats st
    nntile_host_arena_read_stats(&st)
    return dict(pinned=st.pinned, in_use=st.in_use, peak_in_use=st.peak_in_use,
                served=st.served, outside=st.outside, refused=st.refused,
                pin_s=st.pin_seconds, wait_s=st.wait_seconds)


def _host_arena_for_tests(str call, size_t value=0):
    """The arena's allocator without StarPU or CUDA (plain memory, no hooks), for tests:
    ``start`` (chunks of ``value`` bytes, one ahead at a time, up to 64), ``alloc`` (returns
    the address), ``free`` (returns whether the address was the arena's), ``free_blocks``
    ((count, largest)), ``pin_all`` (returns the seconds waited), ``stats``, ``stop``."""
    cdef void *ptr = NULL
    cdef size_t largest = 0
    if call == "start":
        CHKERR(nntile_host_arena_start(64 * value, 64 * value, value, value, 0, 0),
               "nntile_host_arena_start")
    elif call == "pin_all":
        return nntile_host_arena_pin_all()
    elif call == "alloc":
        ret = nntile_host_arena_alloc(&ptr, value)
        return None if ret != 0 else <size_t> ptr
    elif call == "free":
        return bool(nntile_host_arena_free(<void *> value))
    elif call == "free_blocks":
        count = nntile_host_arena_free_blocks(&largest)
        return count, largest
    elif call == "stats":
        return _host_arena_stats()
    elif call == "stop":
        CHKERR(nntile_host_arena_stop(), "nntile_host_arena_stop")
    else:
        raise ValueError(call)


def live_tensor_count():
    """How many tensors hold registered tiles right now (for leak checks)."""
    return len(_live_tensors)


# GPU replicas in one process (nntile.parallel.DataParallel): the CUDA device the tasks
# submitted from now on run on (-1: none chosen), and, per device, the bitmap of its CUDA
# workers (starpu_task.workerids; StarPU reads it but does not own it). A task submitted
# with no device chosen runs on the device that is home to its first tile that has one
# (Tensor.set_homes): owner computes, as StarPU-MPI does between ranks, so an update runs
# where its parameter tile, gradient and states live.
cdef int _task_device = -1
cdef int _device_count = 0
cdef unsigned _mask_words = 0
cdef uint32_t *_device_masks = NULL


cdef int _start_devices() except -1:
    """The workers of each CUDA device of the runtime that just started. Devices are
    numbered in the order of their CUDA ids among those the runtime drives: a rank that
    drives CUDA device 1 alone (one GPU per rank) drives one device, its device 0."""
    global _device_count, _mask_words, _device_masks, _task_device
    _stop_devices()
    cdef int w, nworkers = starpu_worker_get_count()
    cuda_ids = sorted({starpu_worker_get_devid(w) for w in range(nworkers)
                       if starpu_worker_get_type(w) == STARPU_CUDA_WORKER})
    if not cuda_ids:
        return 0
    _mask_words = (nworkers + 31) // 32
    _device_masks = <uint32_t *> calloc(len(cuda_ids) * _mask_words, sizeof(uint32_t))
    if _device_masks == NULL:
        raise MemoryError()
    cdef int device
    for w in range(nworkers):
        if starpu_worker_get_type(w) == STARPU_CUDA_WORKER:
            device = cuda_ids.index(starpu_worker_get_devid(w))
            _device_masks[device * _mask_words + w // 32] |= 1u << (w % 32)
    _device_count = len(cuda_ids)
    return 0


cdef void _stop_devices() noexcept:
    global _device_count, _mask_words, _device_masks, _task_device
    free(_device_masks)
    _device_masks = NULL
    _device_count = 0
    _mask_words = 0
    _task_device = -1


def cuda_devices():
    """How many devices tasks can be sent to (ops.set_task_device): the CUDA devices of the
    running runtime, or the groups of ``group_cpu_workers`` (0: none)."""
    return _device_count


def group_cpu_workers(int groups):
    """On a runtime without CUDA devices, make ``groups`` devices of its CPU workers (equal
    runs of them, in worker order), e.g. one per socket, to pin replicas to (ops.
    set_task_device); returns their number."""
    global _device_count, _mask_words, _device_masks
    cdef int w, nworkers = starpu_worker_get_count(), ncpu = starpu_cpu_worker_get_count()
    if _device_count and _mask_words and starpu_cuda_worker_get_count():
        raise RuntimeError("group_cpu_workers: the runtime has CUDA devices")
    if not 1 <= groups <= ncpu:
        raise ValueError(f"group_cpu_workers({groups}): the runtime has {ncpu} CPU workers")
    _stop_devices()
    _mask_words = (nworkers + 31) // 32
    _device_masks = <uint32_t *> calloc(groups * _mask_words, sizeof(uint32_t))
    if _device_masks == NULL:
        raise MemoryError()
    cdef int seen = 0
    for w in range(nworkers):
        if starpu_worker_get_type(w) == STARPU_CPU_WORKER:
            _device_masks[(seen * groups // ncpu) * _mask_words + w // 32] |= 1u << (w % 32)
            seen += 1
    _device_count = groups
    return groups
