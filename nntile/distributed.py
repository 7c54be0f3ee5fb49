"""How MPI ranks share a run: replicas of the model, or owners of tiles.

``replicas`` (the default under mpirun) is what PyTorch's DDP is: every rank holds the
whole model and runs its own StarPU (no StarPU-MPI), computes on its share of the batch's
rows, and the gradients are summed over the ranks by collectives (NCCL on GPUs, MPI on CPU
workers) submitted as tasks, so they run beside the rest of backward (nntile.parallel). Its
traffic is one all-reduce of the gradients per step. ``replicas:zero`` shards the update
over the replicas (ZeRO-2): each parameter tile has one rank that updates it (shard_owners),
the gradients are reduced to that rank instead of all-reduced, block by block as backward
finishes them, only it keeps the tile's gradient, optimizer states and, in bf16-mixed, fp32
master, and it broadcasts the updated weights that forward reads.

The other distributions place tiles. Under StarPU-MPI every tile has one owner rank; a task runs on the rank that owns the tiles
it writes, and StarPU-MPI sends it the tiles it reads from other ranks. A distribution is
therefore all the parallelism there is: layers, loss and optimizer contain no MPI code.

Ranks form a grid of ``data`` x ``tensor`` processes (rank = d * tensor + t):

* tensors whose first axis is the batch (activations, token ids, per-row statistics) give
  their batch tiles to the ``data`` groups in turn, and within a group spread their other
  tiles over the ``tensor`` ranks;
* tensors without a batch axis (weights, their gradients and optimizer states, scalars)
  spread their tiles over all ranks in turn, so each rank updates its share (as ZeRO
  shards optimizer states).

``Distribution.data_parallel(n)`` is data x 1, ``Distribution.tensor_parallel(n)`` is 1 x n.
For other layouts, ``block_cyclic`` gives the owners of any tile grid over any process grid;
a tensor takes such a list directly (``Tensor(shape, tiles, owners=[...])``).
"""
import os
import re
import sys
import threading
import time
from contextlib import contextmanager

import numpy as np

from nntile import policy
# the rule is a declaration's (memory estimates read it too); the name stays importable here
from nntile.declare import shard_owners  # noqa: F401

CHOICES = ("replicas", "data", "tensor", "mixed")


def local_rank():
    """(rank on this node, ranks on this node) as the launcher (Open MPI, MPICH/Hydra, Slurm)
    tells it, or None outside such a launcher."""
    local = next((os.environ[v] for v in ("OMPI_COMM_WORLD_LOCAL_RANK", "MPI_LOCALRANKID",
                                          "SLURM_LOCALID") if os.environ.get(v)), None)
    nlocal = next((os.environ[v] for v in ("OMPI_COMM_WORLD_LOCAL_SIZE", "MPI_LOCALNRANKS")
                   if os.environ.get(v)), None) or slurm_tasks_on_this_node(os.environ)
    if local is None or nlocal is None:
        return None
    return int(local), int(nlocal)


def slurm_tasks_on_this_node(env):
    """The tasks srun started on this node, from SLURM_TASKS_PER_NODE ("2(x3),1": two on each
    of the first three nodes, then one) at SLURM_NODEID; None outside srun."""
    text = env.get("SLURM_TASKS_PER_NODE")
    if not text:
        return None
    counts = []
    for part in text.split(","):
        count, _, repeat = part.partition("(x")
        counts += [int(count)] * int(repeat.rstrip(")") or 1)
    return counts[int(env.get("SLURM_NODEID") or 0)]


def local_rank_gpus(ncuda=None):
    """The CUDA devices this rank takes when several ranks share a node: local rank r gets
    r*k ... r*k+k-1 for k CUDA workers per rank (``ncuda``, else STARPU_NCUDA, else 1). None
    when there is nothing to choose (one rank on the node, ncuda=0) or STARPU_WORKERS_CUDAID
    already names the devices."""
    local = local_rank()
    if os.environ.get("STARPU_WORKERS_CUDAID") or ncuda == 0 or local is None or local[1] < 2:
        return None
    per_rank = ncuda or int(os.environ.get("STARPU_NCUDA") or 1)
    return [local[0] * per_rank + j for j in range(per_rank)]


# ---- the cores of a rank, and MPI itself -------------------------------------------------

# Variables by which a user places StarPU's threads on cores: nntile then leaves placement alone.
_PLACEMENT_VARS = ("STARPU_WORKERS_CPUID", "STARPU_WORKERS_COREID", "STARPU_MPI_THREAD_CPUID",
                   "STARPU_MPI_THREAD_COREID")
# The names StarPU gives its threads: CPU and CUDA workers, and StarPU-MPI's progress thread.
_STARPU_THREAD = re.compile(r"(CPU|CUDA) \d+|MPI")


def rank_cores():
    """The cores this process may run on, sorted: the launcher's binding, or every core of the
    node when nothing bound it."""
    return sorted(os.sched_getaffinity(0))


def one_core_rank():
    """Whether this rank has a single core: its StarPU worker(s) and StarPU-MPI's progress
    thread must then share it, as there is no core to reserve for the latter."""
    return len(rank_cores()) == 1


def placement_chosen():
    """Whether the user placed StarPU's threads (or told StarPU to ignore bindings)."""
    return (any(os.environ.get(v) for v in _PLACEMENT_VARS)
            or os.environ.get("STARPU_WORKERS_NOBIND", "0") != "0"
            or os.environ.get("STARPU_WORKERS_GETBIND", "1") == "0")


def share_node_cores():
    """StarPU takes the process's CPU binding as the cores it may use. A launcher that binds
    nothing (mpirun --bind-to none) leaves every rank of a node with all its cores, and each
    StarPU then pins its workers and its MPI thread to the same first cores, where they take
    turns. Give local rank r its own contiguous share of the cores instead (one core each, in
    turn, when there are more ranks than cores), unless the launcher bound the process or the
    user chose the placement."""
    local = local_rank()
    if local is None or local[1] < 2 or placement_chosen():
        return
    cores = rank_cores()
    if len(cores) != os.cpu_count():  # bound by the launcher
        return
    os.sched_setaffinity(0, policy.rank_core_share(cores, *local))


def mpi():
    """mpi4py's MPI module. Importing it starts MPI (MPI_Init), whose own threads keep the
    cores they start on, so this rank's cores are settled first (share_node_cores).

    On a rank left with one core, StarPU-MPI's progress thread polls MPI while messages are
    pending and takes half the core from the worker beside it; Open MPI's mpi_yield_when_idle
    makes it give the core up after each poll that finds nothing (set here unless the user
    set it; Open MPI only). Measured with 2 ranks of one core each on a loaded 2-core machine,
    the README's lines with and without: data parallel 1820-2378 vs 1955-2015 tokens/s,
    tensor parallel 550-774 vs 407-408. With tiny tiles (8 KiB, hundreds of messages a step)
    it costs: 3.2-4.7 vs 0.50-0.57 s a step, as the worker, which StarPU keeps spinning while
    it waits for data, then holds the core while messages wait for the yielding thread."""
    share_node_cores()
    yield_when_idle = policy.mpi_yield_when_idle(one_core_rank())
    if yield_when_idle is not None:
        os.environ.setdefault("OMPI_MCA_mpi_yield_when_idle", yield_when_idle)
    from mpi4py import MPI
    return MPI


def agree_refusal(refusal):
    """Under mpirun, a rank that fits learns the first other rank's refusal (a rank that does
    not fit keeps its own), so that all stop or all go on: a lone refusal would leave the
    other ranks waiting in StarPU-MPI's start for it."""
    _, size = policy.launcher_rank()
    if size < 2:
        return refusal
    refusals = mpi().COMM_WORLD.allgather(refusal)
    if refusal is not None:
        return refusal
    return next((f"rank {rank} cannot fit its share: {text}"
                 for rank, text in enumerate(refusals) if text is not None), None)


def most_over_ranks(n):
    """Under mpirun, the largest ``n`` of any rank (every rank calls it); else ``n``."""
    if policy.launcher_rank()[1] < 2:
        return n
    return max(mpi().COMM_WORLD.allgather(n))


def thread_cores():
    """{name: cores} of StarPU's threads in this process (workers and StarPU-MPI's progress
    thread) as the kernel has them bound; {} where the kernel does not say (not Linux)."""
    cores = {}
    try:
        tids = os.listdir("/proc/self/task")
    except OSError:
        return cores
    for tid in tids:
        try:
            with open(f"/proc/self/task/{tid}/comm") as f:
                name = f.read().strip()
            if _STARPU_THREAD.fullmatch(name):
                cores.setdefault(name, set()).update(os.sched_getaffinity(int(tid)))
        except OSError:  # the thread ended meanwhile
            continue
    return {name: sorted(cores[name]) for name in sorted(cores, key=_thread_order)}


def _thread_order(name):
    """CPU 2 before CPU 10."""
    kind, _, number = name.partition(" ")
    return kind, int(number or 0)


def core_list(cores):
    """Sorted core numbers as ranges: [0, 1, 2, 5] -> '0-2,5'."""
    runs = []
    for core in cores:
        if runs and core == runs[-1][1] + 1:
            runs[-1][1] = core
        else:
            runs.append([core, core])
    return ",".join(f"{a}-{b}" if b > a else f"{a}" for a, b in runs)


# ---- a rank that stops making progress ------------------------------------------------------

def watchdog_timeout(value=None):
    """Seconds a rank may go without progress before a Watchdog ends the run: ``value``, else
    NNTILE_MPI_TIMEOUT, else 300; 0 turns the watchdog off."""
    name = "NNTILE_MPI_TIMEOUT"
    if value is None:
        value = os.environ.get(name) or 300
    else:
        name = "mpi_timeout"
    try:
        seconds = float(value)
    except (TypeError, ValueError):
        seconds = -1.0
    if not 0 <= seconds < float("inf"):
        raise ValueError(f"{name}={value!r} must be a number of seconds >= 0 (0: no watchdog)")
    return seconds


class Watchdog:
    """Ends every rank of an MPI run once this rank stops making progress.

    A rank that dies mid-step leaves the others waiting for its messages. Open MPI's mpirun
    then ends the job by itself; other launchers (srun, mpirun --enable-recovery) may leave
    them waiting for ever. The program calls beat() after each step; when no beat comes for
    max(timeout, 10 x the longest step so far), this rank says so on stderr and calls
    MPI_Abort, which ends every rank. Without a communicator of several ranks, or with a
    timeout of 0, it does nothing."""

    def __init__(self, comm, prog, timeout):
        self.timeout = watchdog_timeout(timeout) if comm is not None else 0.0
        self.comm = comm if comm is not None and comm.Get_size() > 1 and self.timeout else None
        self.label = f"{prog} [rank {comm.Get_rank()}]" if self.comm is not None else prog
        self.longest = 0.0
        self._last = time.monotonic()
        self._paused = 0
        self._done = threading.Event()
        self._thread = None
        if self.comm is not None:
            self._thread = threading.Thread(target=self._watch, name="nntile-watchdog",
                                            daemon=True)
            self._thread.start()

    @property
    def limit(self):
        return max(self.timeout, 10 * self.longest)

    def beat(self):
        now = time.monotonic()
        self.longest = max(self.longest, now - self._last)
        self._last = now

    @contextmanager
    def paused(self):
        """Not watched inside: a checkpoint write may take far longer than a step."""
        self._paused += 1
        try:
            yield
        finally:
            self._paused -= 1
            self._last = time.monotonic()

    def stop(self):
        self._done.set()
        if self._thread is not None:
            self._thread.join()

    def _watch(self):
        while not self._done.wait(min(1.0, self.timeout / 10)):
            idle = time.monotonic() - self._last
            if self._paused or idle <= self.limit:
                continue
            print(f"{self.label}: error: no step finished in {idle:.0f} s: another rank has "
                  "probably died, or the run hangs; ending every rank (NNTILE_MPI_TIMEOUT "
                  "sets the limit)", file=sys.stderr, flush=True)
            threading.Timer(10.0, os._exit, (1,)).start()  # in case MPI_Abort hangs too
            self.comm.Abort(1)
            os._exit(1)


def block_cyclic(grid, process_grid, axes=None):
    """Owner of each tile (C order over ``grid``) when tile coordinate ``c[axes[k]]`` goes
    to process-grid coordinate ``c[axes[k]] % process_grid[k]``; the rank is the C-order
    index in ``process_grid``. ``axes`` defaults to the first len(process_grid) axes."""
    grid = tuple(int(g) for g in grid)
    process_grid = tuple(int(p) for p in process_grid)
    if any(p < 1 for p in process_grid):
        raise ValueError(f"process grid {process_grid} must have positive sizes")
    axes = tuple(range(len(process_grid))) if axes is None else tuple(axes)
    if len(axes) != len(process_grid):
        raise ValueError(f"block_cyclic: {len(axes)} axes for a process grid of "
                         f"{len(process_grid)} dimensions")
    for a in axes:
        if not 0 <= a < len(grid):
            raise ValueError(f"block_cyclic: axis {a} is outside a tile grid of {len(grid)} axes")
    coords = np.indices(grid).reshape(len(grid), -1) if grid else np.zeros((0, 1), int)
    rank = np.zeros(coords.shape[1], dtype=np.int64)
    for a, p in zip(axes, process_grid):
        rank = rank * p + coords[a] % p
    return rank.astype(np.int32).tolist()


class Distribution:
    """A data x tensor process grid of tile owners, or (``replicas``) data ranks that each
    hold the whole model, with (``zero``) the update sharded over them; see the module's
    documentation."""

    def __init__(self, data=1, tensor=1, replicas=False, zero=False):
        for name, value in (("data", data), ("tensor", tensor)):
            if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
                raise ValueError(f"Distribution({name}={value!r}) must be a positive integer")
        self.data, self.tensor = int(data), int(tensor)
        if replicas and self.tensor != 1:
            raise ValueError("replicas hold whole models: Distribution(replicas=True) takes "
                             "no tensor ranks")
        self.replicas = bool(replicas)
        if zero and not replicas:
            raise ValueError("Distribution(zero=True) shards the update of replicas: it needs "
                             "replicas=True (tile owners hold their own shares already)")
        self.zero = bool(zero)

    @property
    def nranks(self):
        return self.data * self.tensor

    @classmethod
    def data_parallel(cls, nranks):
        return cls(data=nranks)

    @classmethod
    def replicated(cls, nranks, zero=False):
        return cls(data=nranks, replicas=True, zero=zero)

    @classmethod
    def tensor_parallel(cls, nranks):
        return cls(tensor=nranks)

    @classmethod
    def parse(cls, text, nranks):
        """From a --distribution value: replicas[:zero], data, tensor, or mixed[:DxT] (mixed
        alone picks two data groups when the rank count is even)."""
        text = str(text)
        kind, _, shape = text.partition(":")
        if kind == "replicas" and shape in ("", "zero"):
            return cls.replicated(nranks, zero=shape == "zero")
        if kind == "data" and not shape:
            return cls.data_parallel(nranks)
        if kind == "tensor" and not shape:
            return cls.tensor_parallel(nranks)
        if kind == "mixed":
            if not shape:
                if nranks % 2:
                    raise ValueError(f"--distribution mixed needs an even number of ranks "
                                     f"(got {nranks}); give the grid as mixed:DxT")
                return cls(data=2, tensor=nranks // 2)
            try:
                d, t = (int(x) for x in shape.lower().split("x"))
            except ValueError:
                raise ValueError(f"--distribution {text!r}: write the grid as mixed:DxT, "
                                 "e.g. mixed:2x2") from None
            return cls(data=d, tensor=t)
        raise ValueError(f"--distribution {text!r}: use one of replicas[:zero], data, tensor, "
                         "mixed[:DxT]")

    def check(self, world_size):
        """Raise (identically on every rank) unless the grid matches the ranks there are."""
        if self.nranks != world_size:
            raise ValueError(f"the distribution needs {self.nranks} ranks ({self.data} data x "
                             f"{self.tensor} tensor) but the run has {world_size}; a "
                             f"distribution cannot name a rank that does not exist")

    def check_batch(self, batch_size, nbatch_tiles):
        """Replicas take equal shares of the batch's rows; tile owners share batch tiles, one
        at least for each data group."""
        if self.replicas:
            if batch_size % self.data:
                raise ValueError(f"{self.data} replicas share the batch's rows equally, but "
                                 f"the batch has {batch_size}: use a multiple of "
                                 f"{self.data}")
            return
        if nbatch_tiles < self.data:
            raise ValueError(f"{self.data} data-parallel groups but the batch has only "
                             f"{nbatch_tiles} tile(s) to share: use a batch of at least "
                             f"{self.data} x the batch tile, a smaller batch tile, or fewer "
                             "ranks")

    def owners(self, grid, batched):
        grid = tuple(int(g) for g in grid)
        ntiles = int(np.prod(grid, dtype=np.int64)) if grid else 1
        linear = np.arange(ntiles, dtype=np.int64)
        if not batched or not grid:
            return (linear % self.nranks).astype(np.int32).tolist()
        rest = ntiles // grid[0]
        group = (linear // rest) % self.data
        return (group * self.tensor + (linear % rest) % self.tensor).astype(np.int32).tolist()

    def describe(self):
        if self.replicas and self.zero:
            return (f"{self.data} replicas (gradients reduced to the rank that updates each "
                    "tile; gradients, optimizer states and bf16-mixed masters sharded)")
        if self.replicas:
            return f"{self.data} replicas (gradients all-reduced)"
        return f"{self.data} data x {self.tensor} tensor"

    def __repr__(self):
        if self.replicas:
            zero = ", zero=True" if self.zero else ""
            return f"Distribution(data={self.data}, replicas=True{zero})"
        return f"Distribution(data={self.data}, tensor={self.tensor})"
