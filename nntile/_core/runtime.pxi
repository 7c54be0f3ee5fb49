# The StarPU runtime: one error-checking path, and the Context that starts and stops StarPU.
import atexit
import os
import sys
import weakref

from libc.errno cimport ENODEV
from libc.stdlib cimport malloc, free
from libc.string cimport memset
from libc.stdint cimport intptr_t, int64_t


class StarpuError(RuntimeError):
    """A StarPU call returned an error code."""

    def __init__(self, call, code):
        self.call = call
        self.code = code
        reason = os.strerror(-code) if code < 0 else f"code {code}"
        super().__init__(f"{call} failed: {reason} ({code})")


cdef int check(int ret, str call) except -1:
    """Every StarPU call that returns an error code goes through here."""
    if ret != 0:
        raise StarpuError(call, ret)
    return 0


cdef extern from "codelets.h" nogil:
    void nntile_codelets_init()
    void nntile_blas_single_thread()
    void nntile_cuda_start()
    void nntile_cuda_stop()
    void nntile_task_discard(starpu_task *task)
    void nntile_op_profiling(int enable)
    unsigned long long nntile_op_time(int op, int dtype, double *seconds)
    starpu_codelet *nntile_codelet(int op, int dtype)
    const char *nntile_op_name(int op)
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

HAVE_MPI = bool(nntile_mpi_available())
# (rank, size) environment variables that MPI launchers (Open MPI, MPICH/PMI, PMIx) set in
# every process they start.
_LAUNCHER_VARS = (("OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE"), ("PMI_RANK", "PMI_SIZE"),
                  ("PMIX_RANK", "PMIX_SIZE"))

# StarPU-MPI state of the running Context: whether tasks go through StarPU-MPI, this
# process's rank, the number of ranks, and the next unused MPI tag. Every rank creates the
# same tensors in the same order, so a counter gives every tile the same tag on all ranks.
cdef bint _mpi_on = False
cdef int _mpi_rank = 0
cdef int _mpi_size = 1
cdef int64_t _mpi_next_tag = 0


def _launcher():
    for rank_var, size_var in _LAUNCHER_VARS:
        rank = os.environ.get(rank_var, "")
        if rank.isdigit():
            size = os.environ.get(size_var, "")
            return int(rank), int(size) if size.isdigit() else 1
    return None


def launcher_rank():
    """(rank, number of ranks) that an MPI launcher gave this process, read from its
    environment without starting MPI; (0, 1) when no launcher started it."""
    return _launcher() or (0, 1)


def launched_by_mpirun():
    """Whether this process was started by an MPI launcher (mpirun, mpiexec, srun)."""
    return _launcher() is not None

# The running Context, and a counter that changes at each start so that a tensor can tell
# whether the runtime it was registered with is still the one running.
cdef object _running_context = None
cdef long _epoch = 0
cdef object _live_tensors = weakref.WeakSet()

HAVE_CUDA = bool(NNTILE_HAVE_CUDA)

# Each runtime setting that matters, with the StarPU environment variable it falls back to.
_SETTINGS = (
    ("ncpu", "STARPU_NCPU"),
    ("ncuda", "STARPU_NCUDA"),
    ("sched", "STARPU_SCHED"),
    ("limit_cuda_mem", "STARPU_LIMIT_CUDA_MEM"),
    ("limit_cpu_mem", "STARPU_LIMIT_CPU_MEM"),
    ("calibrate", "STARPU_CALIBRATE"),
    ("workers_per_gpu", "STARPU_NWORKER_PER_CUDA"),
)

# where Context.settings() says limit_cuda_mem came from when nntile chose it
_CUDA_LIMIT_DEFAULT = "nntile default: GPU memory less max(3 GiB, 3%)"
# ... and ncpu, on a machine with GPUs: a CPU worker that takes a matrix product the GPU would
# run 100x faster holds up every task after it (docs/performance.md, "Defaults at scale")
_GPU_ONLY_DEFAULT = "nntile default with GPUs: GPU workers only; give ncpu to add CPU workers"
# ... and workers_per_gpu: two workers (each with its own CUDA stream) per GPU, so that one
# waits for its tiles or launches while the other's kernels run. On an H100 (tf32, wide 4-layer
# GPT-2, n_embd 8192): 0.53 -> 0.47 s per step in memory, 3.39 -> 2.37-2.63 s at 1.23x its
# memory; GPT-2 124M 0.90 -> 0.95x PyTorch (docs/performance.md, "Two workers per GPU")
_TWO_PER_GPU_DEFAULT = "nntile default with GPUs: two workers per GPU overlap transfers and kernels"
# ... and on one GPU that cannot hold the run (run_bytes): four, so that more tasks wait for
# their tiles while others compute. H100, 6.07B at batch 16 (174.9 GiB): 9.1-10.7 s per step
# against 10.6-12.3 s with two, same call; in memory four are no faster and vary more (GPT-2
# 124M 0.94-1.12x PyTorch against 1.10-1.12x) (docs/performance.md, "Activations dropped
# after backward")
_FOUR_PAST_MEMORY_DEFAULT = ("nntile default on one GPU that cannot hold the run: four workers "
                             "keep more transfers in flight")
# ... and ncpu, on an MPI rank bound to one core: StarPU-MPI would reserve that core for its
# progress thread and leave no worker (docs: README, "Several processes")
_SHARED_CORE_DEFAULT = ("nntile default on an MPI rank with one core: one CPU worker, sharing "
                        "it with the MPI thread")
# the environment variables nntile sets from its own defaults while a Context runs
_DEFAULTS_IN_ENV = {_CUDA_LIMIT_DEFAULT: "limit_cuda_mem", _TWO_PER_GPU_DEFAULT: "workers_per_gpu",
                    _FOUR_PAST_MEMORY_DEFAULT: "workers_per_gpu"}


def _default_workers_per_gpu(int gpus, run_bytes, gpu_bytes):
    """CUDA workers per GPU when none is given, and why: (number, reason). ``run_bytes``: what
    the run registers (None: not known); ``gpu_bytes``: what StarPU may use of each GPU."""
    if gpus == 1 and run_bytes is not None and gpu_bytes is not None and run_bytes > gpu_bytes:
        return 4, _FOUR_PAST_MEMORY_DEFAULT
    return 2, _TWO_PER_GPU_DEFAULT


def _default_sched(int gpus, bint cpus):
    """The scheduler nntile picks when none is given, and why: (name, reason). The
    measurements behind each branch: docs/performance.md, "Defaults at scale"."""
    if not gpus:
        return "lws", "nntile default without GPUs: locality work stealing"
    if cpus:
        # lws lets CPU workers steal matrix products from the GPUs and collapses (1,132 vs
        # 52,645 tokens/s with 8 CPU workers beside one H100); dmdas places each task where
        # its performance model says it ends first
        return "dmdas", "nntile default for GPU and CPU workers together"
    if gpus > 1:
        # once tiles fill the GPUs, dmdas's history models keep being flushed ("Too big
        # deviation") and its placements turn to noise: lws was 2.35x faster at 14.5B on 2
        # H200s and 10x on 4; dmdas leads by 3-10% only where a model leaves GPUs half empty
        return "lws", f"nntile default for {gpus} GPUs"
    # one GPU: a tie in memory; past it lws fetches a task's tiles only when the task starts,
    # while dmdas prefetches as it places (1.27x faster at twice the GPU's memory, 3.8x at
    # its limit, on an H100)
    return "dmdas", "nntile default for one GPU"


def _check_mpi_env():
    """StarPU-MPI settings that cannot work, refused before MPI or StarPU starts."""
    frequency = os.environ.get("STARPU_MPI_DRIVER_CALL_FREQUENCY", "").strip()
    if frequency.isdigit() and int(frequency) > 0:
        # measured: a 2-rank run and a 1-rank run, each waiting for ever on its first task
        raise RuntimeError(
            f"STARPU_MPI_DRIVER_CALL_FREQUENCY={frequency} has StarPU-MPI's progress thread "
            "run CPU worker 0 itself, but in StarPU 1.4 that thread sleeps while no message "
            "is pending, and the worker's tasks wait for ever; unset it (on a rank with one "
            "core, nntile shares the core between a worker and the MPI thread by itself)")


def _positive_int_or_none(name, value, allow_zero):
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, str)):
        raise TypeError(f"Context({name}=...) must be an integer, got {value!r}")
    try:
        number = int(value)
    except ValueError:
        raise ValueError(f"Context({name}={value!r}) is not an integer") from None
    if number < 0 or (number == 0 and not allow_zero):
        raise ValueError(f"Context({name}={number}) must be {'>= 0' if allow_zero else '> 0'}")
    return number


class Context:
    """Starts StarPU for this process; use as ``with nntile.Context(...) as ctx:``.

    Arguments left as None fall back to StarPU's environment variables (STARPU_NCPU,
    STARPU_NCUDA, STARPU_SCHED, STARPU_LIMIT_CUDA_MEM, STARPU_LIMIT_CPU_MEM in MiB,
    STARPU_CALIBRATE, STARPU_NWORKER_PER_CUDA) and then to nntile's defaults, which depend on
    the machine and the run: on GPUs, GPU workers only, two per GPU (four where a process
    alone on one GPU cannot hold ``run_bytes``, the bytes the run registers as nntile.memory
    estimates them), and the scheduler measured fastest for that number of GPUs. Under MPI, a
    rank bound to one core runs one CPU worker there beside StarPU-MPI's progress thread, and
    ``mpi_timeout`` (NNTILE_MPI_TIMEOUT, seconds, default 300) is how long a rank may go
    without progress before the programs' watchdog ends the run.
    ``describe()`` says which defaults were taken and why, and which cores StarPU's threads
    use. Only one Context runs at a time.
    """

    def __init__(self, ncpu=None, ncuda=None, sched=None, limit_cuda_mem=None,
                 limit_cpu_mem=None, calibrate=None, verbose=False, start=True, mpi=None,
                 distribution=None, mpi_stats=False, workers_per_gpu=None, mpi_timeout=None,
                 run_bytes=None):
        self.ncpu = _positive_int_or_none("ncpu", ncpu, allow_zero=True)
        self.ncuda = _positive_int_or_none("ncuda", ncuda, allow_zero=True)
        self.limit_cuda_mem = _positive_int_or_none("limit_cuda_mem", limit_cuda_mem, False)
        self.limit_cpu_mem = _positive_int_or_none("limit_cpu_mem", limit_cpu_mem, False)
        self.calibrate = _positive_int_or_none("calibrate", calibrate, allow_zero=True)
        self.workers_per_gpu = _positive_int_or_none("workers_per_gpu", workers_per_gpu, False)
        self.run_bytes = _positive_int_or_none("run_bytes", run_bytes, allow_zero=True)
        if sched is not None and (not isinstance(sched, str) or not sched.strip()):
            raise ValueError(f"Context(sched={sched!r}) must be a scheduler name such as 'lws'")
        self.sched = sched
        self.verbose = verbose
        self.workers = []
        if mpi not in (None, True, False):
            raise TypeError(f"Context(mpi={mpi!r}) must be True, False or None (automatic)")
        # StarPU-MPI is used when asked, or by default when an MPI launcher started us.
        self.mpi = launched_by_mpirun() if mpi is None else mpi
        if self.mpi and not HAVE_MPI:
            launched = launcher_rank()[1]
            if mpi or launched > 1:
                raise RuntimeError(
                    (f"started by an MPI launcher with {launched} ranks" if mpi is None else
                     "Context(mpi=True)") + ", but this nntile was built without StarPU-MPI, "
                    "so each rank would train alone (rebuild StarPU with MPI, then nntile)")
            self.mpi = False
        self.mpi_stats = bool(mpi_stats)
        # how long a rank may go without progress before the programs' watchdog ends the run
        from nntile.distributed import watchdog_timeout
        self.mpi_timeout = watchdog_timeout(mpi_timeout) if self.mpi else None
        self.distribution = distribution
        self.rank = 0
        self.world_size = 1
        self.comm = None
        self._cuda_limit = None
        self._ngpu = None
        self._env_from_defaults = set()  # variables start() set from nntile's defaults
        # what each variable start() sets held before, restored at shutdown: an argument or
        # default of this Context must not become a later Context's or a child process's
        self._env_before = {}
        self._starpu_comm = None
        self._epoch = -1
        if self.ncuda and not HAVE_CUDA:
            raise RuntimeError(f"Context(ncuda={self.ncuda}) asked for GPUs, but this nntile "
                               "was built without CUDA")
        if start:
            self.start()

    @property
    def running(self):
        return _running_context is self

    def settings(self):
        """The effective value of each runtime setting, and where it came from."""
        result = {}
        for name, env in _SETTINGS:
            value = getattr(self, name)
            if value is not None:
                result[name] = (value, "argument")
            elif os.environ.get(env) and env not in self._env_from_defaults:
                result[name] = (os.environ[env], f"${env}")
            else:
                result[name] = (None, "StarPU default")
        if result["ncuda"][0] is None and not HAVE_CUDA:
            result["ncuda"] = (0, "built without CUDA")
        if result["limit_cuda_mem"][0] is None and HAVE_CUDA and str(result["ncuda"][0]) != "0":
            limit = self._default_cuda_limit()
            if limit is not None:
                result["limit_cuda_mem"] = (limit, _CUDA_LIMIT_DEFAULT)
        gpus = self._gpu_workers(result["ncuda"][0])
        if result["ncpu"][0] is None and gpus:
            result["ncpu"] = (0, _GPU_ONLY_DEFAULT)
        elif result["ncpu"][0] is None and self.mpi:
            from nntile.distributed import one_core_rank
            if one_core_rank():
                result["ncpu"] = (1, _SHARED_CORE_DEFAULT)
        if result["sched"][0] is None:
            cpus = result["ncpu"][0]
            result["sched"] = _default_sched(gpus, cpus is None or int(cpus) > 0)
        if result["workers_per_gpu"][0] is None and gpus:
            limit = result["limit_cuda_mem"][0]
            gpu_bytes = int(limit) * 2**20 if limit is not None else None
            # under MPI other processes share the node's GPUs and host memory: not measured
            run_bytes = None if self.mpi else self.run_bytes
            result["workers_per_gpu"] = _default_workers_per_gpu(gpus, run_bytes, gpu_bytes)
        return result

    def _gpu_workers(self, ncuda):
        """How many CUDA workers StarPU will start: ncuda when given, else every visible GPU."""
        if not HAVE_CUDA:
            return 0
        if ncuda is not None:
            return int(ncuda)
        if self._ngpu is None:
            from nntile import memory
            self._ngpu = len(memory.gpu_memory())
        return self._ngpu

    def _default_cuda_limit(self):
        """StarPU keeps 10% of every GPU free; far more than needed on a large one (see
        nntile.memory.default_cuda_limit_mib). MiB for the smallest visible GPU, or None."""
        if self._cuda_limit is None:
            from nntile import memory
            sizes = memory.gpu_memory()
            self._cuda_limit = memory.default_cuda_limit_mib(min(sizes)) if sizes else 0
        return self._cuda_limit or None

    def start(self):
        global _running_context, _epoch
        from nntile.memory import check_disk_swap_env
        check_disk_swap_env()  # StarPU would abort on a disk swap it cannot take
        if _running_context is self:
            raise RuntimeError("this Context is already running")
        if _running_context is not None:
            raise RuntimeError("another nntile.Context is already running in this process; "
                               "shut it down (ctx.shutdown() or leave its 'with' block) first")
        if self.mpi:
            _check_mpi_env()
            from nntile.distributed import share_node_cores
            share_node_cores()  # before settings(), which depend on the rank's cores
        settings = self.settings()
        try:
            self._start_starpu(settings)
        except BaseException:
            self._restore_env()
            raise

    def _setenv(self, name, value, default=False):
        """Set a variable StarPU reads at start-up, remembering what it was; ``default``: the
        value is nntile's default, not the user's."""
        self._env_before.setdefault(name, os.environ.get(name))
        os.environ[name] = str(value)
        if default:
            self._env_from_defaults.add(name)

    def _restore_env(self):
        for name, value in self._env_before.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value
        self._env_before.clear()
        self._env_from_defaults.clear()

    def _start_starpu(self, settings):
        global _running_context, _epoch
        # StarPU reads these at start-up; an argument wins over an inherited variable.
        for name, env in _SETTINGS:
            value = getattr(self, name)
            if value is not None:
                self._setenv(env, value)
        envs = dict(_SETTINGS)
        for name, (value, origin) in settings.items():
            if _DEFAULTS_IN_ENV.get(origin) == name:
                self._setenv(envs[name], value, default=True)
        cdef starpu_conf conf
        check(starpu_conf_init(&conf), "starpu_conf_init")
        sched_name = str(settings["sched"][0]).encode()
        conf.sched_policy_name = sched_name
        if not HAVE_CUDA:
            conf.ncuda = 0
        if settings["ncpu"][1] == _GPU_ONLY_DEFAULT:
            conf.ncpus = 0
        elif settings["ncpu"][1] == _SHARED_CORE_DEFAULT:
            conf.ncpus = 1  # an explicit count: StarPU-MPI then reserves no core
        nntile_blas_single_thread()
        cdef int ret
        cdef intptr_t comm_handle
        if self.mpi:
            self._bind_gpus_to_local_rank()
            self._share_one_core_with_mpi_thread()
            comm_handle = self._start_mpi()
            self._check_distribution(self.comm.Get_size())
            with nogil:
                ret = nntile_mpi_start(&conf, comm_handle)
        else:
            self._check_distribution(1)
            with nogil:
                ret = starpu_init(&conf)
        if ret == -ENODEV:
            raise RuntimeError("StarPU found no worker to run tasks on (ncpu=0 and no GPU?)")
        check(ret, "starpu_init")
        nntile_codelets_init()
        nntile_cuda_start()
        global _mpi_on, _mpi_rank, _mpi_size, _mpi_next_tag
        _mpi_on = self.mpi
        _mpi_rank = nntile_mpi_rank() if self.mpi else 0
        _mpi_size = nntile_mpi_size() if self.mpi else 1
        _mpi_next_tag = 0
        self.rank, self.world_size = _mpi_rank, _mpi_size
        if self.mpi and self.mpi_stats:
            nntile_mpi_stats_enable()
        _epoch += 1
        self._epoch = _epoch
        _running_context = self
        self.workers = _worker_names()
        if self.verbose:
            print(self.describe(), file=sys.stderr)
        return self

    def _bind_gpus_to_local_rank(self):
        """Several ranks on one node would all take GPU 0: give each local rank its own
        (nntile.distributed.local_rank_gpus), unless STARPU_WORKERS_CUDAID already says which."""
        if not HAVE_CUDA:
            return
        from nntile.distributed import local_rank_gpus
        gpus = local_rank_gpus(self.ncuda)
        if gpus is not None:
            self._setenv("STARPU_WORKERS_CUDAID", ",".join(str(g) for g in gpus))
            self._setenv("STARPU_NCUDA", len(gpus))

    def _share_one_core_with_mpi_thread(self):
        """On a rank with one core, StarPU-MPI's progress thread would be pinned onto the core
        a worker holds (with a warning); leave it unpinned instead, on the rank's one core
        all the same, where MPI yields it while idle (nntile.distributed.mpi)."""
        from nntile.distributed import one_core_rank, placement_chosen
        if one_core_rank() and not placement_chosen() and not os.environ.get("STARPU_MPI_NOBIND"):
            self._setenv("STARPU_MPI_NOBIND", 1, default=True)

    def _start_mpi(self):
        """Initialise MPI through mpi4py; returns the handle of the communicator that
        StarPU-MPI gets (a duplicate of COMM_WORLD, so that its messages never meet the
        ones nntile's Python code exchanges on COMM_WORLD)."""
        from nntile.distributed import mpi
        try:
            MPI = mpi()
        except ImportError:
            raise RuntimeError("StarPU-MPI needs mpi4py (pip install mpi4py)") from None
        if MPI.Query_thread() < MPI.THREAD_SERIALIZED:
            raise RuntimeError("MPI was initialised with a thread level below "
                               "MPI_THREAD_SERIALIZED, which StarPU-MPI needs; let mpi4py "
                               "initialise it (mpi4py.rc.thread_level = 'multiple')")
        self.comm = MPI.COMM_WORLD
        self._starpu_comm = MPI.COMM_WORLD.Dup()
        handle = getattr(self._starpu_comm, "handle", None)
        return MPI._handleof(self._starpu_comm) if handle is None else handle

    def _check_distribution(self, world_size):
        """Every rank checks the same thing and raises the same error, before StarPU starts."""
        if self.distribution is None:
            return
        check = getattr(self.distribution, "check", None)
        if check is None:
            raise TypeError("Context(distribution=...) needs an nntile.distributed.Distribution,"
                            f" got {type(self.distribution).__name__}")
        check(world_size)

    def owners_for(self, tuple grid, bint batched):
        """Rank of each tile (C order over ``grid``) under this Context's distribution, or
        None when there is one process."""
        if self.world_size == 1:
            return None
        if self.distribution is None:
            from nntile.distributed import Distribution
            self.distribution = Distribution(tensor=self.world_size)
        return self.distribution.owners(grid, batched)

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
            nntile_mpi_bytes_sent(counts)
            return [counts[i] for i in range(self.world_size)]
        finally:
            free(counts)

    def barrier(self):
        """Wait here until every rank gets here (no-op with one process)."""
        self._check_running()
        if self.mpi:
            self.comm.Barrier()

    def describe(self, verbose=True):
        """What runs: StarPU's workers, the cores of its threads, and every setting with where
        it came from; ``verbose=False``: one line, the workers by kind and the scheduler."""
        version = f"{STARPU_MAJOR_VERSION}.{STARPU_MINOR_VERSION}.{STARPU_RELEASE_VERSION}"
        if not verbose:
            kinds = {}
            for name in self.workers:  # "CPU 0", "CUDA 1", ...
                kinds[name.split()[0]] = kinds.get(name.split()[0], 0) + 1
            line = (f"nntile: StarPU {version}, " + ", ".join(f"{n} {kind} worker"
                    f"{'s' if n > 1 else ''}" for kind, n in kinds.items())
                    + f", scheduler {self.settings()['sched'][0]}")
            return line + (f", MPI rank {self.rank} of {self.world_size}" if self.mpi else "")
        lines = [f"nntile: StarPU {version}, {len(self.workers)} workers: "
                 + ", ".join(self.workers)]
        from nntile.distributed import core_list, rank_cores, thread_cores
        if self.mpi:
            allowed = rank_cores()
            lines.append(f"  StarPU-MPI rank {self.rank} of {self.world_size}, on "
                         f"{len(allowed)} core{'s' if len(allowed) > 1 else ''} "
                         f"({core_list(allowed)})")
        threads = thread_cores() if self.running else {}
        if threads:
            lines.append("  cores: " + ", ".join(f"{name} thread on {core_list(cores)}"
                                                 for name, cores in threads.items()))
        for name, (value, origin) in self.settings().items():
            lines.append(f"  {name} = {value} ({origin})")
        return "\n".join(lines)

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
        check(ret, "starpu_task_wait_for_all")

    def profiling(self, bint enable=True):
        """Turn StarPU's per-worker and per-task time accounting on or off (see worker_stats
        and op_stats); call it with no task in flight."""
        self._check_running()
        cdef int ret = starpu_profiling_status_set(STARPU_PROFILING_ENABLE if enable
                                                   else STARPU_PROFILING_DISABLE)
        if ret < 0:  # on success it returns the previous status, 0 or 1
            check(ret, "starpu_profiling_status_set")
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

    def worker_stats(self):
        """Seconds each worker spent in total, executing tasks and sleeping since the last
        call (StarPU resets the counters on reading); needs profiling(True)."""
        self._check_running()
        cdef starpu_profiling_worker_info info
        cdef unsigned i
        stats = []
        for i in range(starpu_worker_get_count()):
            check(starpu_profiling_worker_get_info(i, &info), "starpu_profiling_worker_get_info")
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
            check(starpu_bus_get_profiling_info(bus, &info), "starpu_bus_get_profiling_info")
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
        """Wait for submitted tasks, release every tile still registered, stop StarPU."""
        global _running_context
        if _running_context is not self:
            return
        global _mpi_on
        cdef bint mpi = _mpi_on
        try:
            with nogil:
                if mpi:
                    nntile_mpi_wait_for_all()
                else:
                    starpu_task_wait_for_all()
            for tensor in list(_live_tensors):
                tensor._release_at_shutdown()
        finally:
            _running_context = None
            _mpi_on = False
            with nogil:
                nntile_cuda_stop()
                if mpi:
                    nntile_mpi_stop()  # also stops StarPU, which StarPU-MPI started
                else:
                    starpu_shutdown()
            if self._starpu_comm is not None:
                self._starpu_comm.Free()
                self._starpu_comm = None
            self._restore_env()  # a later Context decides afresh

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


def live_tensor_count():
    """How many tensors hold registered tiles right now (for leak checks)."""
    return len(_live_tensors)
