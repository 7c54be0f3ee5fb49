"""nntile.Context: StarPU for this process, with every setting resolved before it starts.

An argument wins, then StarPU's environment variable, then nntile's rule for the situation
(nntile.policy); the core (nntile._core.core.Runtime) starts StarPU with the resolved values.
"""
import os
import sys

from nntile import policy
from nntile._core.core import (HAVE_CUDA, HAVE_MPI, STARPU_VERSION, Runtime, blas,
                               cuda_devices, current_context, group_cpu_workers, schedulers,
                               set_task_workers)
from nntile.precision import precision_dtypes


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


def _on_off_or_none(name, value):
    """A setting that is on or off: None (the default decides), or 1 or 0."""
    if value not in (None, True, False, 0, 1):
        raise ValueError(f"Context({name}={value!r}) must be True or False")
    return None if value is None else int(value)


def _handle_of(comm):
    """An mpi4py communicator's C handle, as a number (older mpi4py: MPI._handleof)."""
    handle = getattr(comm, "handle", None)
    if handle is None:
        from mpi4py import MPI
        handle = MPI._handleof(comm)
    return handle


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


class Context(Runtime):
    """Starts StarPU for this process; use as ``with nntile.Context(...) as ctx:``.

    Arguments left as None fall back to StarPU's environment variables (STARPU_NCPU,
    STARPU_NCUDA, STARPU_SCHED, STARPU_LIMIT_CUDA_MEM, STARPU_LIMIT_CPU_MEM in MiB,
    STARPU_CALIBRATE, STARPU_NWORKER_PER_CUDA, STARPU_CALIBRATE_MINIMUM,
    STARPU_HISTORY_MAX_ERROR) and then to nntile's defaults, which depend on the machine and
    the run (nntile.policy): on GPUs, GPU workers only, two per GPU (four where a process alone
    on one GPU cannot hold ``run_bytes``, the bytes the run registers as nntile.memory
    estimates them), and the scheduler measured fastest for that number of GPUs.
    ``pinned_host_mem`` (NNTILE_PINNED_HOST_MEM, MiB) is host memory pinned ahead of StarPU's
    need on a thread of its own, by default the run's size where the GPUs cannot hold it (0:
    StarPU pins as it goes); there too, by default, ``write_behind`` (NNTILE_WRITE_BEHIND)
    copies each optimizer update's tiles to host memory right after it. ``cuda_pool``
    (NNTILE_CUDA_POOL) takes StarPU's GPU buffers from a memory pool of each device, by
    default on. ``cpu_update`` (NNTILE_CPU_UPDATE) is the share of the parameters, from the
    model's end, whose optimizer update runs on CPU workers while
    every other task runs on the GPUs: by default half, on every spare core, where a process
    alone on one GPU cannot hold a training run without compute copies (``training``: the
    run's precision name, nntile.precision; None when not training). Under MPI, a rank
    bound to one core runs one CPU worker there beside StarPU-MPI's progress thread, and
    ``mpi_timeout`` (NNTILE_MPI_TIMEOUT, seconds, default 300) is how long a rank may go
    without progress before the programs' watchdog ends the run. A scheduler StarPU does not
    have, and a STARPU_ variable StarPU would abort on, are refused before it starts.
    ``describe()`` says which defaults were taken and why, the tiles of a model built with
    no tiling (``tiles``), whether the programs' model recomputes activations
    (``recompute``, a Choice of nntile.fit.preflight), and which cores StarPU's threads
    use. Only one Context runs at a time.
    """

    cpu_update_share = 0.0  # nntile.optim: the share of the update on CPU workers

    def __init__(self, ncpu=None, ncuda=None, sched=None, limit_cuda_mem=None,
                 limit_cpu_mem=None, calibrate=None, verbose=False, start=True, mpi=None,
                 distribution=None, mpi_stats=False, workers_per_gpu=None, mpi_timeout=None,
                 run_bytes=None, pinned_host_mem=None, history_max_error=None,
                 write_behind=None, cuda_pool=None, cpu_update=None, training=None,
                 device_replicas=None, run_breakdown=None, run_batch=None):
        self._take_workers(ncpu, ncuda, workers_per_gpu, sched)
        self._take_memory(limit_cuda_mem, limit_cpu_mem, calibrate, history_max_error,
                          pinned_host_mem, write_behind, cuda_pool)
        self._take_run(run_bytes, run_breakdown, run_batch, device_replicas, cpu_update,
                       training)
        self.verbose = verbose
        self.tiles = None  # {key: Choice} of the program's model's tiles (describe)
        self.recompute = None  # Choice: whether the program's model recomputes (describe)
        self._take_communication(mpi, distribution, mpi_stats, mpi_timeout)
        self._machine = None
        self._env_from_defaults = set()  # variables start() set from nntile's defaults
        if self.ncuda and not HAVE_CUDA:
            raise RuntimeError(f"Context(ncuda={self.ncuda}) asked for GPUs, but this nntile "
                               "was built without CUDA")
        from nntile.machine import check_ncuda
        check_ncuda(self.ncuda)
        if start:
            self.start()

    def _take_workers(self, ncpu, ncuda, workers_per_gpu, sched):
        self.ncpu = _positive_int_or_none("ncpu", ncpu, allow_zero=True)
        self.ncuda = _positive_int_or_none("ncuda", ncuda, allow_zero=True)
        self.workers_per_gpu = _positive_int_or_none("workers_per_gpu", workers_per_gpu, False)
        if sched is not None and (not isinstance(sched, str) or not sched.strip()):
            raise ValueError(f"Context(sched={sched!r}) must be a scheduler name such as 'lws'")
        if sched is not None:
            policy.check_scheduler(sched, schedulers())
        self.sched = sched

    def _take_memory(self, limit_cuda_mem, limit_cpu_mem, calibrate, history_max_error,
                     pinned_host_mem, write_behind, cuda_pool):
        self.limit_cuda_mem = _positive_int_or_none("limit_cuda_mem", limit_cuda_mem, False)
        self.limit_cpu_mem = _positive_int_or_none("limit_cpu_mem", limit_cpu_mem, False)
        self.calibrate = _positive_int_or_none("calibrate", calibrate, allow_zero=True)
        if self.calibrate is not None and self.calibrate > 2:
            raise ValueError(f"Context(calibrate={self.calibrate}) must be 0, 1 or 2")
        self.calibrate_minimum = None
        self.history_max_error = _positive_int_or_none("history_max_error", history_max_error,
                                                       allow_zero=True)
        self.pinned_host_mem = _positive_int_or_none("pinned_host_mem", pinned_host_mem,
                                                     allow_zero=True)
        self.write_behind = _on_off_or_none("write_behind", write_behind)
        self.cuda_pool = _on_off_or_none("cuda_pool", cuda_pool)

    def _take_run(self, run_bytes, run_breakdown, run_batch, device_replicas, cpu_update,
                  training):
        """What the run is, for the rules that depend on it (nntile.policy)."""
        self.run_bytes = _positive_int_or_none("run_bytes", run_bytes, allow_zero=True)
        if device_replicas is not None and (
                not isinstance(device_replicas, (bool, int)) or device_replicas < 0):
            raise ValueError(f"Context(device_replicas={device_replicas!r}) must be True, "
                             "False or a number of CPU worker groups")
        self.given_device_replicas = device_replicas
        # the run's bytes by category (nntile.memory.Estimate.breakdown), for the rule that
        # keeps a replica per GPU where one fits (nntile.policy.device_replicas)
        self.run_breakdown = run_breakdown
        self.run_batch = _positive_int_or_none("run_batch", run_batch, False)  # its rows
        self.device_replicas = 1  # replicas of a model on this process's GPUs, once started
        if cpu_update is not None and (isinstance(cpu_update, bool)
                                       or policy.share(cpu_update) is None):
            raise ValueError(f"Context(cpu_update={cpu_update!r}) must be a share of the "
                             "parameters from 0 to 1")
        self.cpu_update = cpu_update
        # (master, compute) dtypes of a training run's precision, for the rules that depend
        # on it (nntile.policy.cpu_update)
        self.training = None if training is None else precision_dtypes(training)

    def _take_communication(self, mpi, distribution, mpi_stats, mpi_timeout):
        if mpi not in (None, True, False):
            raise TypeError(f"Context(mpi={mpi!r}) must be True, False or None (automatic)")
        # StarPU-MPI is used when asked, or by default when an MPI launcher started us.
        self.mpi = policy.launched_by_mpirun() if mpi is None else mpi
        if self.mpi and not HAVE_MPI:
            launched = policy.launcher_rank()[1]
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
        self.comm = None
        self._starpu_comm = None

    def machine(self):
        """What this process may use (nntile.policy.Machine), read once."""
        if self._machine is None:
            from nntile.machine import probe
            self._machine = probe(self.mpi)
        return self._machine

    def settings(self):
        """The effective value of each runtime setting, and where it came from:
        {name: (value, origin)}."""
        given = {name: getattr(self, name) for name, _ in policy.SETTINGS}
        env = {var: value for var, value in os.environ.items()
               if var.startswith(("STARPU_", "NNTILE_")) and var not in self._env_from_defaults}
        return policy.runtime_settings(self.machine(), given, env, self.run_bytes,
                                       self.training)

    def start(self):
        self._ready_to_start()
        settings = self.settings()
        sched = str(settings["sched"].value)
        policy.check_scheduler(sched, schedulers())
        env, defaults = self._starpu_env(settings)
        share = self._cpu_update_share(settings)
        # nntile's own count goes to StarPU as a number: StarPU-MPI then reserves no core
        ncpus = settings["ncpu"].value if settings["ncpu"].reason in (
            policy.GPU_ONLY, policy.SHARED_CORE, policy.CPU_UPDATE_WORKERS) else None
        ncuda = 0 if not HAVE_CUDA else None
        comm_handle = self._start_communication(env)
        self._env_from_defaults = defaults
        try:
            self._start_starpu(sched, ncpus, ncuda, env, comm_handle)
        except BaseException:
            self._env_from_defaults = set()
            self._free_comm()
            raise
        try:
            self._start_on_starpu(settings, share)
        except BaseException:
            self.shutdown()
            raise
        if self.verbose:
            print(self.describe(), file=sys.stderr)
        return self

    def _ready_to_start(self):
        """Errors StarPU would abort on, or a Context already running; under MPI, this rank's
        share of the node's cores, on which the settings depend."""
        from nntile.machine import check_disk_swap_env
        policy.check_starpu_env(os.environ)  # StarPU would abort on what it cannot read
        check_disk_swap_env()  # StarPU would abort on a disk swap it cannot take
        if self.running:
            raise RuntimeError("this Context is already running")
        if current_context() is not None:
            raise RuntimeError("another nntile.Context is already running in this process; "
                               "shut it down (ctx.shutdown() or leave its 'with' block) first")
        if self.mpi:
            _check_mpi_env()
            from nntile.distributed import share_node_cores
            share_node_cores()
            self._machine = None

    def _starpu_env(self, settings):
        """(the variables StarPU reads at start-up, those of them set from nntile's defaults)"""
        env, defaults = {}, set()
        for name, var in policy.SETTINGS:
            value, origin = settings[name]
            if getattr(self, name) is not None:
                env[var] = value  # an argument wins over an inherited variable
            elif name in policy.DEFAULTS_IN_ENV and origin.startswith("nntile default"):
                env[var] = value
                defaults.add(var)
        return env, defaults

    def _start_communication(self, env):
        """MPI where asked (adding to ``env`` what the ranks' StarPU needs); the communicator
        handle StarPU-MPI is started with, or None (no MPI, or replicas: each rank its own
        StarPU, without StarPU-MPI)."""
        comm_handle = None
        try:
            if self.mpi:
                env.update(self._gpus_of_local_rank())
                comm_handle = self._start_mpi()
                self._check_distribution(self.comm.Get_size())
                if self.replicated:
                    self._free_comm()
                    comm_handle = None
                else:
                    env.update(self._mpi_thread_on_one_core())
            else:
                self._check_distribution(1)
        except BaseException:
            self._free_comm()
            raise
        return comm_handle

    def _start_on_starpu(self, settings, share):
        """What runs on the started StarPU: the ranks' collectives, the device replicas, the
        update's placement and the host memory pinned ahead."""
        if self.replicated:
            self.rank, self.world_size = self.comm.Get_rank(), self.comm.Get_size()
            self._start_collectives()
        self.device_replicas = self._start_device_replicas()
        # nntile.optim reads it: each update's tiles copied to host memory after it
        self.writes_behind = str(settings["write_behind"].value).strip() == "1"
        # nntile.optim updates this share of the parameters on the CPU workers, which are
        # there for it alone: every other task goes to the GPUs
        self.cpu_update_share = share
        if share:
            set_task_workers("cuda")
        pinned_mib = int(settings["pinned_host_mem"].value or 0)
        if pinned_mib:
            self._start_host_arena(pinned_mib * policy.MiB, policy.PIN_CHUNK)

    def _start_device_replicas(self):
        """How many replicas of a model this process trains (nntile.policy.device_replicas);
        a number given where there is no GPU groups the CPU workers into that many devices."""
        given = self.given_device_replicas
        groups = int(given) if given is not None and not isinstance(given, bool) else 0
        if groups > 1 and not cuda_devices():
            group_cpu_workers(groups)
        elif groups > 1 and groups != cuda_devices():
            raise ValueError(f"Context(device_replicas={groups}): the process drives "
                             f"{cuda_devices()} GPUs, one replica each (give True)")
        devices = cuda_devices()
        # what StarPU may use of each GPU (its share, not the GPU's whole memory)
        gpus = [node["total"] for node in self.memory_nodes()
                if node["node"].startswith("CUDA") and node["total"] > 0]
        need = (policy.device_replica_bytes(self.run_breakdown, devices)
                if self.run_breakdown and devices > 1 else None)
        rows = self.run_batch
        if rows is not None and self.replicated:
            rows //= self.world_size
        choice = policy.device_replicas(None if given is None else bool(given), devices,
                                        self.owner_ranks, need, min(gpus) if gpus else None,
                                        rows)
        if rows is not None and rows % choice.value:
            raise ValueError(f"Context(device_replicas={given!r}): a batch of {rows} rows "
                             f"does not share equally over {choice.value} replicas")
        self.device_replicas_choice = choice
        return choice.value

    def _gpus_of_local_rank(self):
        """Several ranks on one node would all take GPU 0: give each local rank its own
        (nntile.distributed.local_rank_gpus), unless STARPU_WORKERS_CUDAID already says
        which."""
        if not HAVE_CUDA:
            return {}
        from nntile.distributed import local_rank_gpus
        gpus = local_rank_gpus(self.ncuda)
        if gpus is None:
            return {}
        return {"STARPU_WORKERS_CUDAID": ",".join(str(g) for g in gpus),
                "STARPU_NCUDA": len(gpus)}

    def _mpi_thread_on_one_core(self):
        """On a rank with one core, StarPU-MPI's progress thread would be pinned onto the core
        a worker holds (with a warning); leave it unpinned instead (nntile.policy)."""
        from nntile.distributed import one_core_rank, placement_chosen
        if (policy.mpi_progress_thread_unbound(one_core_rank(), placement_chosen())
                and not os.environ.get("STARPU_MPI_NOBIND")):
            return {"STARPU_MPI_NOBIND": 1}
        return {}

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
        return _handle_of(self._starpu_comm)

    @property
    def replicated(self):
        """Whether the ranks are replicas of the model (Distribution.replicated): each runs
        its own StarPU, and gradients are summed by collectives (nntile.parallel)."""
        return self.mpi and bool(getattr(self.distribution, "replicas", False))

    @property
    def owner_ranks(self):
        """The ranks that share the tiles through StarPU-MPI: the world, or 1 where each
        process holds all its tiles (one process, or replicas)."""
        return 1 if self.replicated else self.world_size

    def _start_collectives(self):
        """The replicas' gradient all-reduce: NCCL on this rank's GPU where StarPU drives
        one (NNTILE_COLLECTIVES=mpi: MPI even then), else MPI on the CPU workers. Every rank
        learns rank 0's NCCL id or its error, so that all stop alike."""
        from nntile._core.core import collective_start_mpi, nccl_open, nccl_start
        choice = policy.collectives(self.ncuda_workers, self.ncpu_workers, os.environ)
        if choice == "mpi":
            collective_start_mpi(_handle_of(self.comm))
        else:
            from nntile.cuda.find_nccl import nccl_library
            os.environ.setdefault("NCCL_NVLS_ENABLE", "0")  # NVLink multicast: never
            unique, error = None, None
            try:
                unique = nccl_open(nccl_library(), self.rank == 0)
            except (RuntimeError, FileNotFoundError) as exc:
                error = str(exc)
            unique, error = self.comm.bcast((unique, error), root=0)
            if error is not None:
                raise RuntimeError(error)
            nccl_start(unique, self.world_size, self.rank)
        self.collectives = choice

    def _free_comm(self):
        if self._starpu_comm is not None:
            self._starpu_comm.Free()
            self._starpu_comm = None

    def _cpu_update_share(self, settings):
        """The share of the update on CPU workers, refused before StarPU starts where there
        would be no CPU worker or no GPU to share the step with."""
        value, origin = settings["cpu_update"]
        share = policy.share(value)  # checked by __init__ (argument), start (variable)
        ncpu, ncuda = settings["ncpu"].value, settings["ncuda"].value
        gpus = policy.gpu_workers(self.machine(), ncuda)
        if share and (not gpus or (ncpu is not None and int(ncpu) == 0)):
            raise ValueError(f"cpu_update {value} ({origin}) runs part of the update on CPU "
                             "workers beside GPUs, but this run has "
                             + ("no GPU" if not gpus else "no CPU worker (ncpu 0)"))
        return share

    def _stopped(self):
        set_task_workers(None)
        self.cpu_update_share = 0.0
        self._free_comm()
        self._env_from_defaults = set()

    def _check_distribution(self, world_size):
        """Every rank checks the same thing and raises the same error, before StarPU starts."""
        if self.distribution is None:
            return
        check = getattr(self.distribution, "check", None)
        if check is None:
            raise TypeError("Context(distribution=...) needs an nntile.distributed.Distribution,"
                            f" got {type(self.distribution).__name__}")
        check(world_size)

    def owners_for(self, grid, batched):
        """Rank of each tile (C order over ``grid``) under this Context's distribution, or
        None where this process holds every tile."""
        if self.owner_ranks == 1:
            return None
        if self.distribution is None:
            from nntile.distributed import Distribution
            self.distribution = Distribution(tensor=self.world_size)
        return self.distribution.owners(grid, batched)

    def barrier(self):
        """Wait here until every rank gets here (no-op with one process)."""
        self._check_running()
        if self.mpi:
            self.comm.Barrier()

    def describe(self, verbose=True):
        """What runs: StarPU's workers, the cores of its threads, every setting with where it
        came from, the CPU kernels' BLAS and the tiles chosen; ``verbose=False``: one line, the workers by kind and
        the scheduler."""
        if not verbose:
            kinds = {}
            for name in self.workers:  # "CPU 0", "CUDA 0.1", ...
                kinds[name.split()[0]] = kinds.get(name.split()[0], 0) + 1
            settings = self.settings()
            line = (f"nntile: StarPU {STARPU_VERSION}, " + ", ".join(
                f"{n} {kind} worker{'s' if n > 1 else ''}" for kind, n in kinds.items())
                + f", scheduler {settings['sched'].value}")
            if self.running and self.host_arena_stats() is not None:
                line += (f", host memory pinned ahead (up to "
                         f"{int(settings['pinned_host_mem'].value) / 1024:.1f} GiB)")
            if self.recompute is not None and self.recompute.value:
                blocks = self.recompute.value
                line += (", activations recomputed in backward" + (
                    "" if blocks is True else
                    " (the first block)" if blocks == 1 else f" (the first {blocks} blocks)"))
            return line + (f", MPI rank {self.rank} of {self.world_size}" if self.mpi else "")
        lines = [f"nntile: StarPU {STARPU_VERSION}, {len(self.workers)} workers: "
                 + ", ".join(self.workers)]
        from nntile.distributed import core_list, rank_cores, thread_cores
        if self.mpi:
            allowed = rank_cores()
            kind = (f"MPI rank {self.rank} of {self.world_size} (a replica; all-reduce "
                    f"through {self.collectives})" if self.replicated else
                    f"StarPU-MPI rank {self.rank} of {self.world_size}")
            lines.append(f"  {kind}, on {len(allowed)} core{'s' if len(allowed) > 1 else ''} "
                         f"({core_list(allowed)})")
        threads = thread_cores() if self.running else {}
        if threads:
            lines.append("  cores: " + ", ".join(f"{name} thread on {core_list(cores)}"
                                                 for name, cores in threads.items()))
        for name, (value, origin) in self.settings().items():
            lines.append(f"  {name} = {value} ({origin})")
        lib = blas()
        lines.append(f"  CPU BLAS: {lib['config']}; {lib['core']} kernels, {lib['threads']} "
                     f"thread{'s' if lib['threads'] > 1 else ''} per call")
        if self.tiles:
            lines.append(f"  tiles: {policy.describe_tiles(self.tiles)}")
        if self.recompute is not None:
            lines.append(f"  recompute = {self.recompute.value} ({self.recompute.reason})")
        return "\n".join(lines)
