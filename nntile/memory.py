"""How much memory a run needs, what the machine offers, and whether it fits.

``estimate`` sums the tensors a run registers for a config, a tiling and a [batch, seq]
shape, as the family's model (nntile.models), its layers and the optimizer declare them (nntile.declare: this
module holds no list of its own), with the tile shapes StarPU will allocate. ``available``
reads the GPU and host memory of this machine, and ``check_fits`` compares the two the way
StarPU 1.4 spends memory:

* StarPU's memory node sizes are 90% of the device (``STARPU_LIMIT_CUDA_MEM`` overrides) and 90%
  of the machine's RAM (``STARPU_LIMIT_CPU_MEM`` overrides); see src/drivers/cuda/driver_cuda.c
  ``_starpu_cuda_limit_gpu_mem_if_needed`` and src/core/topology.c
  ``_starpu_cpu_get_global_mem_size``. On a large GPU 10% is far more than the CUDA context and
  cuBLAS need (8 GiB of an 80 GB H100), so ``Context`` sets STARPU_LIMIT_CUDA_MEM to
  ``default_cuda_limit_mib`` unless told otherwise.
* A tile evicted from the GPU is written back into a host buffer. Unpatched StarPU keeps that
  buffer until the tile is unregistered, even once the host copy is stale (main RAM evicts only
  to a disk node: src/datawizard/memalloc.c ``choose_target``), so host memory had to hold
  every tile. nntile's StarPU (scripts/starpu-patches/host-drops-stale-copies.patch) drops host
  copies that are stale or also valid on a GPU when a GPU needs room, so GPU and host memory
  together hold the run. What moves between them needs free room as it goes: the run plus
  ``SWAP_SLACK_TILES`` of its largest tiles must fit (with less, StarPU prints "Not enough
  memory left on node NUMA 0" and spins, memalloc.c ``_starpu_memory_reclaim_generic``).
  With ``STARPU_DISK_SWAP``, the disk may hold it instead, host memory caching it: where both
  are full, making room on each waits for the other (below).
* Writing weights from numpy allocates every parameter tile in host memory first (plus the
  numpy array of the parameter being written).

Byte counts are exact sums of tile sizes; ``alloc_bytes`` adds StarPU's rounding of tiles up to
4 MiB to its 16 KiB sub-allocation blocks (src/datawizard/malloc.h, malloc.c
``starpu_malloc_on_node_flags``), which applies on GPUs and to pinned host memory.
"""
import contextlib
import math
import os
import re
import shutil
import subprocess
from collections import Counter
from dataclasses import dataclass

import numpy as np

# the declarations are nntile.declare's; DTYPE_BYTES and TensorSpec stay importable from here
from nntile.declare import CATEGORIES, DTYPE_BYTES, TensorSpec
from nntile.errors import CLIError
from nntile.policy import STARPU_MARGIN, Choice, launcher_rank
from nntile.policy import recompute as recompute_rule
# the rule lives in nntile.policy; the name stays importable from here
from nntile.policy import cuda_limit_mib as default_cuda_limit_mib

SUBALLOC_MAX = 4 << 20             # CHUNK_ALLOC_MAX = 32 MiB / 8 (src/datawizard/malloc.h)
SUBALLOC_BLOCK = 16 << 10          # CHUNK_ALLOC_MIN
PAGE = 4096                        # unistd_o_direct reads and writes whole pages only
TASK_TILES = 3                     # a GEMM task holds three tiles on the GPU at once
# Memory nodes that hold the run between them must hold every tile and then some: a tile
# moving between them has a copy on both for a while. Measured with StarPU 1.4.10: host and
# disk (CPU workers, a GPT-2 of 39.2 MiB with tiles of 0.25 to 1 MiB) livelock once both are
# full with a slack of up to 4.8 of the largest tiles, not with 5.6 to 7.2 (docs/performance.md,
# "Disk swap needs slack"); GPU and host (H100, 6.07B, 174.9 GiB in tiles of up to 256 MiB)
# trained with 12 ("Host memory drops its stale copies"). 12 it is. Host and disk both full
# hung even with 31 tiles to spare (one run in about a hundred, two CPU workers under load):
# a worker evicting host tiles to the disk waited for a copy that itself waited for the disk
# to evict to host memory ("The disk swap holds the whole run"), so the disk alone must hold
# the run.
SWAP_SLACK_TILES = 12
# GPU and host memory full but for 12 tiles is not enough near the edge: 12.09B (tf32, batch 1,
# one H100, 185.5 GiB in 188.6) stalled in step 1 for minutes with and without write-behind;
# 11.70B (179.6 GiB) and 10.04B (178.4) trained (docs/performance.md, "The edge of
# memory"). 4% of GPU and host memory together lies between.
GPU_SWAP_SLACK_SHARE = 0.04
DISK_SWAP_MIN = 16 << 20           # StarPU asserts (aborts) on a smaller disk (core/disk.c)
NUMPY_INIT_BYTES = 8               # float64 (or two float32) temporaries per written element
GiB = 1 << 30
MiB = 1 << 20


class MemoryBudgetError(MemoryError):
    """The run cannot fit in the memory StarPU may use; the message says by how much and what
    to change. ``estimate`` and ``budget`` hold the numbers."""

    def __init__(self, message, estimate=None, budget=None):
        super().__init__(message)
        self.estimate = estimate
        self.budget = budget


def fmt_bytes(n):
    """1.5 GiB, 12.0 MiB, 16 KiB or 12 B."""
    n = float(n)
    for unit, size in (("TiB", 1 << 40), ("GiB", GiB), ("MiB", MiB), ("KiB", 1 << 10)):
        if abs(n) >= size:
            return f"{n / size:.1f} {unit}"
    return f"{int(n)} B"


def alloc_sizes(tile_bytes):
    """What StarPU allocates for tiles of these sizes (an array of bytes): a tile of up to
    4 MiB rounds up to its 16 KiB sub-allocation blocks."""
    rounded = -(-np.maximum(tile_bytes, 1) // SUBALLOC_BLOCK) * SUBALLOC_BLOCK
    return np.where(tile_bytes <= SUBALLOC_MAX, rounded, tile_bytes)


def alloc_bytes(spec):
    """Bytes StarPU allocates on a GPU (or in pinned host memory) for all the tiles."""
    return int(alloc_sizes(spec.tile_bytes()).sum())


def unaligned_tiles(spec):
    """Tiles whose size is not a whole number of pages (unistd_o_direct cannot swap them)."""
    return int(np.count_nonzero(spec.tile_bytes() % PAGE))


def tensor_specs(config, batch, seq, tiling=None, dtype="fp32", optimizer="adamw",
                 grad_clip=True, training=True, nranks=1, model=None, recompute=False):
    """Every tensor a run of ``model`` (the config's family's model class, or a subclass)
    registers, as the model and the optimizer declare them: the model's, the optimizer's,
    then the first step's.

    ``training``: forward, loss and backward have run once for [batch, seq] (forward only
    creates the forward buffers). ``optimizer``: "adamw" (two states per parameter), "sgd"
    (one buffer per parameter) or None; ``grad_clip``: the optimizer's one-element norm tensor
    (and under StarPU-MPI, with ``nranks`` > 1, one partial norm per rank). ``dtype`` is a
    precision: under bf16-mixed, tensors are fp32 or bf16 as the layers make them, and every
    GEMM weight has a bf16 copy ("compute_copies"). ``recompute``: the model recomputes
    activations (CausalLM), its blocks then sharing one set of inner buffers.
    """
    from nntile.models import model_class
    from nntile.optim import BY_NAME
    if optimizer is not None and optimizer not in BY_NAME:
        raise ValueError(f"optimizer {optimizer!r}: use 'adamw', 'sgd' or None")
    declared = (model or model_class(config.model_type))(
        config, {k: v for k, v in (tiling or {}).items() if v is not None}, dtype, create=False,
        recompute=recompute)
    specs = declared.tensor_specs()
    if optimizer is not None:
        specs += BY_NAME[optimizer].tensor_specs(declared.named_parameters(), grad_clip, nranks)
    return specs + declared.tensor_specs(batch, seq, training)


class Estimate:
    """Bytes a run needs, by category (``est["activations"]``), with the tensors behind them."""

    def __init__(self, specs, args, init="full"):
        self.specs = specs
        self.args = args
        self.init = init
        self.breakdown = {c: sum(s.nbytes for s in specs if s.category == c) for c in CATEGORIES}
        self.recompute = None  # preflight's Choice of activation recomputation

    def __getitem__(self, category):
        return self.breakdown[category]

    def with_args(self, args):
        """The same estimate for other tensor_specs arguments (a smaller batch, ...)."""
        return Estimate(tensor_specs(**args), args, self.init)

    @property
    def whole(self):
        """The estimate of the whole model (under StarPU-MPI, of all ranks together)."""
        return self

    def keys(self):
        return self.breakdown.keys()

    def as_dict(self):
        return dict(self.breakdown, total=self.total, alloc=self.alloc_bytes,
                    init_host_peak=self.init_host_peak, largest_tile=self.largest_tile)

    @property
    def total(self):
        return sum(self.breakdown.values())

    @property
    def alloc_bytes(self):
        """The total with StarPU's 16 KiB rounding of small tiles (GPU, pinned host memory)."""
        return sum(alloc_bytes(s) for s in self.specs)

    @property
    def ntensors(self):
        return len(self.specs)

    @property
    def ntiles(self):
        return sum(s.ntiles for s in self.specs)

    @property
    def largest_tile(self):
        return max(s.largest_tile for s in self.specs)

    @property
    def unaligned_tiles(self):
        return sum(unaligned_tiles(s) for s in self.specs)

    @property
    def init_numpy_bytes(self):
        """The numpy temporaries of initialisation: the largest parameter written from a
        full float64 array (``init="full"``), one tile at a time (``"tiles"``), or none."""
        params = [s for s in self.specs if s.category == "parameters"]
        if self.init == "full":
            return max(math.prod(s.shape) for s in params) * NUMPY_INIT_BYTES
        if self.init == "tiles":
            return max(math.prod(s.basetile) for s in params) * NUMPY_INIT_BYTES
        return 0

    @property
    def init_host_peak(self):
        """Host bytes while weights are written from numpy: every parameter tile is allocated
        in host memory by the write, plus the numpy array being written."""
        return self["parameters"] + self["compute_copies"] + self.init_numpy_bytes

    def summary(self):
        parts = ", ".join(f"{c.replace('_', ' ')} {fmt_bytes(self[c])}" for c in CATEGORIES)
        return (f"{fmt_bytes(self.total)} in {self.ntensors} tensors of {self.ntiles} tiles "
                f"({parts}; largest tile {fmt_bytes(self.largest_tile)}; host peak while "
                f"writing weights {fmt_bytes(self.init_host_peak)})")

    def __repr__(self):
        return f"<Estimate {self.summary()}>"


# Under StarPU-MPI a task runs on the rank that owns the tiles it writes and receives the
# tiles it reads from their owners. Gradients and optimizer states are only ever read by
# tasks of their own rank (the optimizer step, the partial gradient norm); tiles of these
# categories may be read by other ranks' tasks, which then hold a received copy.
READ_BY_OTHER_RANKS = ("parameters", "compute_copies", "activations", "workspaces", "logits")


class ShareEstimate(Estimate):
    """What one rank holds of a run whose ``whole`` estimate is given; a subclass fills the
    breakdown from the tiles the rank holds."""

    def __init__(self, whole, distribution, rank):
        super().__init__(whole.specs, whole.args, whole.init)
        self._whole, self.distribution, self.rank = whole, distribution, rank

    def with_args(self, args):
        return type(self)(super().with_args(args), self.distribution, self.rank)

    @property
    def whole(self):
        return self._whole


class RankEstimate(ShareEstimate):
    """What one rank of a StarPU-MPI run holds: the tiles it owns (exact), plus room for a
    received copy of every tile of other ranks that tasks may read (parameters, activations,
    workspaces, logits; not gradients or optimizer states, which stay with their owner).
    StarPU-MPI keeps a received copy until the owner writes the tile, so the room is an upper
    bound; measured on loopback, the copies alive at once were well under it.

    The categories (``est["parameters"]`` ...) and ``total`` are owned + room; ``owned`` and
    ``received`` give the two parts."""

    def __init__(self, whole, distribution, rank):
        if not 0 <= rank < distribution.nranks:
            raise ValueError(f"rank {rank} does not exist in a run of {distribution.nranks}")
        super().__init__(whole, distribution, rank)
        self.owned = dict.fromkeys(CATEGORIES, 0)
        self.received = dict.fromkeys(CATEGORIES, 0)
        self._alloc = 0
        for spec in self.specs:
            sizes = spec.tile_bytes()
            mine = spec.tile_owners(distribution) == rank
            held = mine if spec.category not in READ_BY_OTHER_RANKS else np.ones_like(mine)
            self.owned[spec.category] += int(sizes[mine].sum())
            self.received[spec.category] += int(sizes[held & ~mine].sum())
            self._alloc += int(alloc_sizes(sizes[held]).sum())
        self.breakdown = {c: self.owned[c] + self.received[c] for c in CATEGORIES}

    @property
    def alloc_bytes(self):
        return self._alloc

    @property
    def owned_total(self):
        return sum(self.owned.values())

    @property
    def init_host_peak(self):
        """Each rank writes only the parameter tiles it owns."""
        return self.owned["parameters"] + self.init_numpy_bytes

    def summary(self):
        return (f"rank {self.rank} of {self.distribution.nranks} "
                f"({self.distribution.describe()}): {fmt_bytes(self.total)} = "
                f"{fmt_bytes(self.owned_total)} of tiles it owns + up to "
                f"{fmt_bytes(sum(self.received.values()))} of other ranks' tiles it reads; "
                f"the whole model: {self.whole.summary()}")


def sharded_tiles(specs, nranks, rank):
    """{spec name: mask of the tiles ``rank`` holds} of the tensors that replicas sharding
    the update (nntile.parallel.Sharding) hold in part: each parameter's optimizer states.
    Gradients are not among them: backward writes every gradient tile on every rank before
    the reduce frees the others'."""
    from nntile.distributed import shard_owners
    owners = shard_owners({s.name: s.tile_bytes() for s in specs
                           if s.category == "parameters"}, nranks)
    masks = {name: np.asarray(ranks) == rank for name, ranks in owners.items()}
    held = {}
    for spec in specs:
        if spec.category == "optimizer_states" and spec.name.rpartition("/")[0] in masks:
            held[spec.name] = masks[spec.name.rpartition("/")[0]]
    return held


class ShardedEstimate(ShareEstimate):
    """What one replica holds where replicas shard the update (Distribution ``zero``): the
    whole model on its share of the rows (``whole``), but of the tensors sharded_tiles names,
    only the tiles it updates."""

    def __init__(self, whole, distribution, rank):
        super().__init__(whole, distribution, rank)
        self._held = sharded_tiles(whole.specs, distribution.data, rank)
        self.breakdown = dict.fromkeys(CATEGORIES, 0)
        for spec in self.specs:
            self.breakdown[spec.category] += int(self._tile_bytes(spec).sum())

    def _tile_bytes(self, spec):
        sizes = spec.tile_bytes()
        held = self._held.get(spec.name)
        return sizes if held is None else sizes[held]

    @property
    def alloc_bytes(self):
        return sum(int(alloc_sizes(self._tile_bytes(s)).sum()) for s in self.specs)

    @property
    def init_host_peak(self):
        """Every rank writes every master at initialisation."""
        return self._whole.init_host_peak

    def summary(self):
        return (f"rank {self.rank} of {self.distribution.nranks} "
                f"({self.distribution.describe()}): {super().summary()}")


def estimate(config, batch, seq, tiling=None, dtype="fp32", optimizer="adamw", grad_clip=True,
             training=True, init="full", distribution=None, rank=None, model=None,
             recompute=False):
    """Bytes a run of ``config``'s model registers for a [batch, seq] input: parameters,
    gradients, optimizer states, activations kept for backward, workspaces (inputs, backward
    buffers, gradient ping-pong) and logits. ``init``: how weights are written from numpy
    ("full" arrays, per "tiles", or None when they come from GPU tasks).

    With a ``distribution`` of several ranks (nntile.distributed), what ``rank`` holds: a
    RankEstimate; of replicas, the whole model on batch / replicas rows, or, where they shard
    the update, a ShardedEstimate. ``model``: a subclass of the family's model class to estimate instead.
    ``recompute``: with activation recomputation, whose activations are every block's input
    and output and one block's inner activations (CausalLM)."""
    if init not in ("full", "tiles", None):
        raise ValueError(f"init {init!r}: use 'full', 'tiles' or None")
    nranks = distribution.nranks if distribution is not None else 1
    if nranks > 1 and rank is None:
        raise ValueError("estimate(distribution=...) needs the rank whose share to estimate")
    if distribution is not None and distribution.replicas:
        whole = estimate(config, batch // distribution.data, seq, tiling, dtype, optimizer,
                         grad_clip, training, init, model=model, recompute=recompute)
        return ShardedEstimate(whole, distribution, rank) if distribution.zero else whole
    args = dict(config=config, batch=batch, seq=seq, tiling=dict(tiling or {}), dtype=dtype,
                optimizer=optimizer, grad_clip=grad_clip, training=training, nranks=nranks,
                model=model, recompute=recompute)
    whole = Estimate(tensor_specs(**args), args, init)
    return whole if nranks == 1 else RankEstimate(whole, distribution, rank)


# ---- what the machine offers --------------------------------------------------------------

def _visible(entries):
    """Indices or UUIDs in CUDA_VISIBLE_DEVICES (None: all devices)."""
    value = os.environ.get("CUDA_VISIBLE_DEVICES")
    if value is None:
        return entries
    chosen = []
    for item in (x.strip() for x in value.split(",")):
        if not item:
            continue
        match = [g for g in entries if g[0] == item or (item.startswith("GPU-")
                                                          and g[1].startswith(item))]
        if not match:
            break  # CUDA stops at the first invalid entry
        chosen += match
    return chosen


def gpu_memory():
    """Total memory in bytes of each GPU this process may use: the described machine's
    (``described``), else nvidia-smi (no CUDA context in this process), else CuPy; [] when
    neither answers."""
    if _described is not None:
        return list(_described.gpus)
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=index,uuid,memory.total",
                              "--format=csv,noheader,nounits"], capture_output=True,
                             text=True, timeout=20)
        entries = []
        for line in out.stdout.splitlines():
            fields = [f.strip() for f in line.split(",")]
            if len(fields) == 3 and fields[2].isdigit():
                entries.append((fields[0], fields[1], int(fields[2]) * MiB))
        if out.returncode == 0 and entries:
            return [g[2] for g in _visible(entries)]
    except (OSError, subprocess.SubprocessError):
        pass
    try:
        import cupy
        runtime = cupy.cuda.runtime
        return [runtime.getDeviceProperties(d)["totalGlobalMem"]
                for d in range(runtime.getDeviceCount())]
    except Exception:  # no CuPy, no driver, no device
        return []


def _meminfo(key):
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith(key + ":"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


def _cgroup_free():
    """Bytes left under this process's cgroup memory limit (None when unlimited)."""
    for limit_path, usage_path in (("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory.current"),
                                   ("/sys/fs/cgroup/memory/memory.limit_in_bytes",
                                    "/sys/fs/cgroup/memory/memory.usage_in_bytes")):
        try:
            with open(limit_path) as f:
                limit = f.read().strip()
            with open(usage_path) as f:
                usage = int(f.read().strip())
        except (OSError, ValueError):
            continue
        if limit.isdigit() and int(limit) < (1 << 60):
            return max(0, int(limit) - usage)
    return None


def host_memory():
    """Host bytes this process can still use: the described machine's, else MemAvailable,
    capped by a cgroup limit."""
    if _described is not None:
        return _described.host
    free = _meminfo("MemAvailable") or _meminfo("MemTotal") or 0
    cgroup = _cgroup_free()
    return min(free, cgroup) if cgroup is not None else free


def machine(mpi=False):
    """What this process may use, as nntile.policy's rules read it: its cores, the memory of
    each visible GPU (none in a build without CUDA), whether it is an MPI rank of one core."""
    from nntile.distributed import one_core_rank, rank_cores
    from nntile.policy import Machine
    cuda = _cuda_built()
    cores = _described.cores if _described is not None and _described.cores else None
    return Machine(cores=cores or len(rank_cores()), gpus=tuple(gpu_memory()) if cuda else (),
                   mpi=mpi, one_core=mpi and (cores == 1 if cores else one_core_rank()),
                   cuda_built=cuda)


# ---- a described machine: plans for another machine than this one ------------------------

@dataclass(frozen=True)
class Described:
    """A machine to plan for instead of this one: bytes of each GPU, host bytes available,
    cores (None: this machine's). nntile.plan sets it; gpu_memory, host_memory and machine
    then answer with it, so every rule reads it where it reads this machine."""
    gpus: tuple = ()
    host: int = 0
    cores: int = None


_described = None
_UNITS = {"": 1, "b": 1, "kib": 1 << 10, "mib": MiB, "gib": GiB, "tib": 1 << 40,
          "kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12}


def parse_bytes(text):
    """Bytes of "80GiB", "81559 MiB", "80GB" or a number of bytes; ValueError otherwise."""
    match = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([kmgt]i?b|b)?\s*", str(text), re.I)
    if not match:
        raise ValueError(f"{text!r} is not a size (e.g. 80GiB, 81559MiB, 128GB)")
    return int(float(match[1]) * _UNITS[(match[2] or "").lower()])


def _gpu_list(text):
    """(bytes, ...) of "1x80GiB", "2x80GiB+1x40GiB", "none" or a JSON list of sizes."""
    if isinstance(text, (list, tuple)):
        return tuple(parse_bytes(g) for g in text)
    if str(text).strip().lower() in ("0", "none", ""):
        return ()
    gpus = []
    for part in str(text).split("+"):
        count, _, size = part.rpartition("x")
        if not count.strip().isdigit():
            raise ValueError(f"gpus {part!r}: write COUNTxSIZE, e.g. 1x80GiB")
        gpus += [parse_bytes(size)] * int(count)
    return tuple(gpus)


def parse_machine(text):
    """A Described machine of "gpus=1x80GiB,host=128GiB[,cores=16]" or of the same keys as
    JSON ({"gpus": "1x80GiB", "host": "128GiB"}; sizes may be numbers of bytes). Left out:
    gpus none, host this machine's available memory. ValueError names what is wrong."""
    import json
    text = text.strip()
    if text.startswith("{"):
        try:
            fields = json.loads(text)
        except ValueError as exc:
            raise ValueError(f"--machine: not JSON: {exc}") from None
    else:
        pairs = [p.partition("=") for p in text.split(",") if p.strip()]
        fields = {key.strip(): value for key, eq, value in pairs if eq}
        if len(fields) != len(pairs):
            raise ValueError(f"--machine {text!r}: write KEY=VALUE pairs, e.g. "
                             "gpus=1x80GiB,host=128GiB")
    unknown = set(fields) - {"gpus", "host", "cores"}
    if unknown:
        raise ValueError(f"--machine: unknown key(s) {', '.join(sorted(unknown))}: use gpus, "
                         "host and cores")
    cores = fields.get("cores")
    if cores is not None and not (str(cores).isdigit() and int(cores) > 0):
        raise ValueError(f"--machine: cores {cores!r} should be a whole number (1 or more)")
    host = parse_bytes(fields["host"]) if "host" in fields else host_memory()
    return Described(_gpu_list(fields.get("gpus", ())), host, int(cores) if cores else None)


@contextlib.contextmanager
def described(machine):
    """Within it, this process plans for ``machine`` (a Described; None: this machine)."""
    global _described
    before, _described = _described, machine
    try:
        yield machine
    finally:
        _described = before


def _cuda_built():
    """Whether StarPU would drive GPUs: a described machine with GPUs, else this build."""
    if _described is not None:
        return bool(_described.gpus)
    from nntile import HAVE_CUDA
    return HAVE_CUDA


def available(ncuda=None):
    """(GPU bytes, host bytes): the total memory of the GPUs StarPU would use (the first
    ``ncuda`` visible ones; 0 without GPUs) and the host memory available now."""
    gpus = gpu_memory()
    if ncuda is not None:
        gpus = gpus[:ncuda]
    return sum(gpus), host_memory()


# ---- the check --------------------------------------------------------------------------

class Budget(dict):
    """What StarPU may use, and what the run needs of it (bytes)."""

    def summary(self):
        parts = []
        if self["gpu"]:
            parts.append(f"GPU {fmt_bytes(self['gpu'])} ({self['gpu_origin']})")
        parts.append(f"host {fmt_bytes(self['host'])} ({self['host_origin']})")
        if self["disk"]:
            parts.append(f"disk swap {fmt_bytes(self['disk'])}")
        return ", ".join(parts)


def budget(gpu_bytes, host_bytes, limit_cuda_mem=None, limit_cpu_mem=None, disk_bytes=0,
           ngpu=None):
    """The bytes StarPU's memory nodes may hold: ``default_cuda_limit_mib`` of each GPU (or
    STARPU_LIMIT_CUDA_MEM MiB per GPU) and 90% of the available host memory (or
    STARPU_LIMIT_CPU_MEM MiB, at most what is available)."""
    ngpu = (1 if gpu_bytes else 0) if ngpu is None else ngpu
    if gpu_bytes and ngpu:
        per = gpu_bytes / ngpu
        if limit_cuda_mem is not None:
            gpu = min(int(limit_cuda_mem) * MiB, per) * ngpu
            gpu_origin = f"STARPU_LIMIT_CUDA_MEM {int(limit_cuda_mem)} MiB x {ngpu}"
        else:
            gpu = default_cuda_limit_mib(per) * MiB * ngpu
            gpu_origin = f"nntile's default, {fmt_bytes(gpu)} of {fmt_bytes(gpu_bytes)}"
    else:
        gpu, gpu_origin = 0, "no GPU"
    if limit_cpu_mem is not None:
        host = min(int(limit_cpu_mem) * MiB, host_bytes)
        host_origin = f"STARPU_LIMIT_CPU_MEM {int(limit_cpu_mem)} MiB"
    else:
        host = STARPU_MARGIN * host_bytes
        host_origin = f"90% of {fmt_bytes(host_bytes)} available"
    return Budget(gpu=int(gpu), host=int(host), disk=int(disk_bytes or 0),
                  gpu_origin=gpu_origin, host_origin=host_origin)


def _needs(est, b):
    """The bytes the run takes of the budget: StarPU's rounding of tiles applies where there
    are GPUs (pinned host memory and GPU memory), not in plain host memory."""
    return est.alloc_bytes if b["gpu"] else est.total


def _fits(est, b):
    """The first reason the estimate does not fit the budget, or None."""
    total = _needs(est, b)
    if est.init_host_peak > b["host"]:
        return (f"writing the weights from numpy needs {fmt_bytes(est.init_host_peak)} of host "
                f"memory (every parameter tile plus the largest numpy array)")
    if not b["gpu"] and not b["disk"]:
        if total > b["host"]:
            return "without a GPU or a disk swap everything lives in host memory"
        return None
    # the run lives in GPU and host memory together, or on the disk swap, which host memory
    # (and the GPU) then cache: whichever holds more
    tiles = SWAP_SLACK_TILES * est.largest_tile
    gpu_room = b["host"] + b["gpu"] if b["gpu"] else 0
    if not _disk_holds(b):
        where, room, verb = "GPU and host memory together", gpu_room, "hold"
        slack = max(tiles, GPU_SWAP_SLACK_SHARE * room)
        between = "between them: when both are full StarPU livelocks"
        # measured: 12.09B on one H100 with 54.7 GiB of disk swap filled host memory and the
        # disk while initialising, then stalled (docs/performance.md, "12B with the disk")
        unused_disk = ("; a disk swap smaller than they are adds nothing to them (with host "
                       "memory and the disk both full StarPU stalls)" if b["disk"] else "")
    else:
        where, room, verb, slack = "the disk swap", b["disk"], "holds", tiles
        between = ("between it and host memory: where host memory and the disk must make room "
                   "for each other, StarPU livelocks")
        unused_disk = ""
    if total > room:
        return f"{where} {verb} less than that{unused_disk}"
    if total + slack > room:
        why = (f"{SWAP_SLACK_TILES} of the largest tiles" if slack == tiles else
               f"{GPU_SWAP_SLACK_SHARE:.0%} of them")
        return (f"{where} must hold that plus {fmt_bytes(slack)} ({why}) for tiles on their "
                f"way {between}{unused_disk}")
    if b["gpu"] and TASK_TILES * est.largest_tile > b["gpu"]:
        return (f"one task needs {TASK_TILES} tiles of up to {fmt_bytes(est.largest_tile)} on "
                "the GPU at once; use smaller tiles")
    return None


def _disk_holds(b):
    """Whether the disk swap holds the run (host memory caching it) rather than GPU and host
    memory together: where it is larger than they are (_fits says why not both)."""
    return b["disk"] > (b["host"] + b["gpu"] if b["gpu"] else 0)


def by_place(est, b):
    """{"gpu", "host", "disk"}: bytes of the run each memory node holds at most, as _fits
    lays it out: the GPUs fill first and host memory takes the rest, or the disk holds it all
    with host memory and the GPUs caching what they can."""
    need = _needs(est, b)
    gpu = min(need, b["gpu"])
    if _disk_holds(b):
        return {"gpu": gpu, "host": min(need, b["host"]), "disk": need}
    return {"gpu": gpu, "host": need - gpu, "disk": 0}


def fits_where(est, b):
    """Where the run fits the budget, as nntile.policy.FITS names it: "gpu" where the GPUs
    alone hold it, "host" where the check accepts it otherwise, None where it refuses it."""
    if _fits(est, b) is not None:
        return None
    return "gpu" if b["gpu"] and _needs(est, b) <= b["gpu"] else "host"


def _largest(fits, below):
    """The largest n in [1, below) with fits(n), for fits true up to some n (None if none)."""
    lo, hi = 0, below  # fits(lo) holds (or lo == 0), fits(hi) does not
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if fits(mid) else (lo, mid)
    return lo or None


def _suggestions(est, b):
    """What would fit: fewer layers, a smaller batch, disk swap."""
    args = est.args

    def fits(**change):
        new = dict(args, **change)
        tiling = dict(new["tiling"])
        if tiling.get("batch"):
            tiling["batch"] = min(tiling["batch"], new["batch"])
        new["tiling"] = tiling
        try:
            return _fits(est.with_args(new), b) is None
        except ValueError:
            return False

    config = args["config"]
    out = []
    if not args["recompute"] and fits(recompute=True):
        out.append("activation recomputation (--recompute)")
    layers = _largest(lambda n: fits(config=config.replace(num_hidden_layers=n)),
                      config.num_hidden_layers)
    if layers:
        out.append(f"{config.field_name('num_hidden_layers')} <= {layers}")
    batch = _largest(lambda n: fits(batch=n), args["batch"])
    if batch:
        out.append(f"batch <= {batch}")
    out.append(f"a smaller {config.field_name('hidden_size')}")
    if isinstance(est, RankEstimate):
        out.append("more ranks (each then owns a smaller share of the gradients and "
                   "optimizer states)")
    # the disk then holds the run, with the slack of tiles on their way (_fits)
    disk = max(_needs(est, b) + SWAP_SLACK_TILES * est.largest_tile,
               b["host"] + b["gpu"] + MiB)
    step = GiB // 10 if disk >= GiB else MiB // 10  # rounded up to what fmt_bytes shows
    disk = -(-disk // step) * step
    if disk > b["disk"]:
        out.append(f"a disk swap (STARPU_DISK_SWAP) of at least {fmt_bytes(disk)}, which "
                   "holds the run while host memory caches it")
    return out


def check_fits(estimate, gpu_bytes, host_bytes, limit_cuda_mem=None, limit_cpu_mem=None,
               disk_bytes=0, ngpu=None):
    """Raise MemoryBudgetError (a MemoryError) when the run cannot fit the memory StarPU may
    use, naming the numbers and what to change; return the Budget otherwise.

    The run, plus ``SWAP_SLACK_TILES`` of its largest tiles (GPU and host: or 4% of them,
    whichever is more), must fit in GPU and host memory together, or on the disk swap alone;
    without either, in host memory.
    """
    b = budget(gpu_bytes, host_bytes, limit_cuda_mem, limit_cpu_mem, disk_bytes, ngpu)
    reason = _fits(estimate, b)
    b["needs"] = _needs(estimate, b)
    if reason is None:
        return b
    message = (f"not enough memory: the run needs {estimate.summary()}, but StarPU may use "
               f"{b.summary()}: {reason}. To fit, use one of: "
               f"{'; '.join(_suggestions(estimate, b))}")
    raise MemoryBudgetError(message, estimate, b)


def env_int(name):
    """An integer environment variable (None when unset or not a number)."""
    value = os.environ.get(name, "").strip()
    return int(value) if re.fullmatch(r"\d+", value) else None


def check_disk_swap_env():
    """Raise ValueError for a STARPU_DISK_SWAP_SIZE StarPU would abort on (below 16 MiB,
    or not a number of MiB) while STARPU_DISK_SWAP asks for a disk swap."""
    if not os.environ.get("STARPU_DISK_SWAP"):
        return
    text = os.environ.get("STARPU_DISK_SWAP_SIZE", "").strip()
    if not text:
        return
    if not re.fullmatch(r"\d+", text):
        raise ValueError(f"STARPU_DISK_SWAP_SIZE={text!r} should be a whole number of MiB")
    if int(text) * MiB < DISK_SWAP_MIN:
        raise ValueError(f"STARPU_DISK_SWAP_SIZE={text} MiB: StarPU needs a disk swap of at "
                         f"least {DISK_SWAP_MIN // MiB} MiB (it aborts on less)")


def disk_swap_bytes():
    """The disk swap StarPU will register from STARPU_DISK_SWAP[_SIZE] (0 without)."""
    path = os.environ.get("STARPU_DISK_SWAP")
    if not path:
        return 0
    check_disk_swap_env()
    size = env_int("STARPU_DISK_SWAP_SIZE")
    try:
        free = shutil.disk_usage(path).free
    except OSError:
        return 0
    return min(size * MiB, free) if size is not None else free


def _gpus_of_this_process(ncuda):
    """Memory of each GPU StarPU will use in this process: the visible ones, or under mpirun
    with several ranks on the node the ones its local rank takes (the Context's choice)."""
    from nntile.distributed import local_rank_gpus
    if _described is not None:  # another machine: this one's StarPU variables say nothing of it
        return list(_described.gpus)[:ncuda] if ncuda is not None else list(_described.gpus)
    if ncuda is None:
        ncuda = env_int("STARPU_NCUDA")
    gpus = gpu_memory() if _cuda_built() and ncuda != 0 else []
    chosen = local_rank_gpus(ncuda)
    named = os.environ.get("STARPU_WORKERS_CUDAID", "").replace(",", " ").split()
    if chosen is None and all(n.isdigit() for n in named) and named:
        chosen = [int(n) for n in named]
    if chosen is not None:
        gpus = [gpus[i] for i in chosen if i < len(gpus)]
    return gpus[:ncuda] if ncuda is not None else gpus


def _host_memory_of_this_process():
    """Host memory available now, shared equally among the ranks of this node."""
    from nntile.distributed import local_rank
    local = local_rank()
    return host_memory() // (local[1] if local else 1)


def budget_args(gpus):
    """budget()'s arguments for this process with these GPUs (bytes of each): what it may use
    of them, of host memory and of a disk swap, under the STARPU_* variables."""
    return (sum(gpus), _host_memory_of_this_process(), env_int("STARPU_LIMIT_CUDA_MEM"),
            env_int("STARPU_LIMIT_CPU_MEM"), disk_swap_bytes(), len(gpus))


def process_budget(ncuda=None):
    """The Budget of this process (of the described machine, where one is): what preflight
    checks the run against."""
    return budget(*budget_args(_gpus_of_this_process(ncuda)))


def _agree(refusal):
    """Under mpirun, a rank that fits learns the first other rank's refusal (a rank that does
    not fit keeps its own), so that all stop or all go on: a lone refusal would leave the
    other ranks waiting in StarPU-MPI's start for it."""
    _, size = launcher_rank()
    if size < 2:
        return refusal
    from nntile.distributed import mpi
    refusals = mpi().COMM_WORLD.allgather(refusal)
    if refusal is not None:
        return refusal
    return next((f"rank {rank} cannot fit its share: {text}"
                 for rank, text in enumerate(refusals) if text is not None), None)


# deeper models are first checked in closed form (preflight)
QUICK_ESTIMATE_LAYERS = 10000


def refuse_absurd_depth(config, gpus):
    """The estimate walks every layer's declarations, which takes hours and all host memory
    for absurd depths (n_layer 10**9): a CLIError from a bound in closed form first."""
    if config.num_hidden_layers <= QUICK_ESTIMATE_LAYERS:
        return
    weights = config.num_parameters() * 4  # at least the fp32 weights, every precision
    machine = sum(gpus) + host_memory() + disk_swap_bytes()
    if weights > machine:
        raise CLIError(f"not enough memory: the model's {config.num_parameters():,} "
                       f"parameters alone need {fmt_bytes(weights)}, more than this "
                       f"machine's {fmt_bytes(machine)} in GPUs, host memory and disk "
                       "swap (NNTILE_MEMORY_CHECK=0 tries anyway)")


def preflight(config, batch, seq, tiling=None, dtype="fp32", ncuda=None, optimizer="adamw",
              grad_clip=True, init="full", prog="nntile", quiet_below=GiB,
              distribution=None, training=True, recompute=False):
    """The check a program runs before StarPU starts: estimate, read the machine (and the
    STARPU_LIMIT_*_MEM / STARPU_DISK_SWAP* variables), print the estimate on stderr when it is
    at least ``quiet_below`` bytes, and raise a CLIError (one line, exit code 2) when the run
    cannot fit. NNTILE_MEMORY_CHECK=0 skips the refusal.

    Under mpirun with a ``distribution`` of replicas, each rank checks the whole model on its
    share of the batch (less the tiles of others' updates where they shard it); with one of tile owners, each rank checks its own share (a RankEstimate)
    against its GPUs and its part of the node's host memory, and all ranks agree: one rank
    that cannot fit stops them all, each with the message.

    ``recompute``: activation recomputation, on or off; None: as nntile.policy.recompute
    picks it for this machine. The estimate returned holds the Choice (``est.recompute``)."""
    import sys
    rank, _ = launcher_rank()
    gpus = _gpus_of_this_process(ncuda)
    check = os.environ.get("NNTILE_MEMORY_CHECK", "1") != "0"
    if check:
        refuse_absurd_depth(config, gpus)
    try:
        check_disk_swap_env()
    except ValueError as exc:
        raise CLIError(str(exc)) from None
    machine = budget_args(gpus)

    def estimate_with(flag):
        return estimate(config, batch, seq, tiling, dtype, optimizer, grad_clip, training,
                        init, distribution=distribution, rank=rank, recompute=flag)

    est = _with_recompute(estimate_with, recompute, budget(*machine))
    refusal, b = None, None
    try:
        b = check_fits(est, *machine)
    except MemoryBudgetError as exc:
        refusal = str(exc)
    refusal = _agree(refusal)
    if refusal is not None:
        if os.environ.get("NNTILE_MEMORY_CHECK", "1") == "0":
            print(f"{prog}: warning: {refusal} (NNTILE_MEMORY_CHECK=0: trying anyway)",
                  file=sys.stderr, flush=True)
            return est
        raise CLIError(f"{refusal} (NNTILE_MEMORY_CHECK=0 tries anyway)")
    if est.total >= quiet_below and rank == 0:
        print(f"{prog}: memory: needs {est.summary()}; StarPU may use {b.summary()}",
              file=sys.stderr, flush=True)
    if b["gpu"] and b["needs"] > b["host"] + b["disk"] and rank == 0:
        print(f"{prog}: note: host memory cannot hold every tile, so StarPU drops host copies "
              "to make room for what the GPU evicts: this trains, its first step the slowest "
              "(measured at 6.07B on one H100: 4.3-8.7 s, then 2.8-4.5 s; docs/performance.md, "
              "\"The first step on a new machine\")", file=sys.stderr, flush=True)
    return est


def _with_recompute(estimate_with, given, b):
    """The estimate of the run with activation recomputation or without, as given or as
    nntile.policy.recompute picks it from where each fits the budget ``b``; its
    ``recompute`` holds the Choice. Under mpirun every rank must build the same model: on
    for all where one rank's share needs it."""
    est = estimate_with(bool(given))
    if given is not None:
        est.recompute = recompute_rule(given, None, None)
        return est
    with_recompute = estimate_with(True)
    choice = recompute_rule(None, fits_where(est, b), fits_where(with_recompute, b))
    if _any_rank(choice.value) and not choice.value:
        choice = Choice(True, "nntile default: another MPI rank fits better with "
                              "recomputation, and every rank builds the same model")
    est = with_recompute if choice.value else est
    est.recompute = choice
    return est


def _any_rank(flag):
    """Under mpirun, whether ``flag`` holds on any rank (every rank calls it); else ``flag``."""
    if launcher_rank()[1] < 2:
        return flag
    from nntile.distributed import mpi
    return any(mpi().COMM_WORLD.allgather(bool(flag)))


# ---- what a process holds ---------------------------------------------------------------

def live_tensors():
    """Every registered nntile Tensor of this process (found through the garbage collector)."""
    import gc
    from nntile import Tensor
    # type(), not isinstance(): isinstance reads __class__, and some objects warn on that
    # (torch.distributed.reduce_op: a FutureWarning)
    return [o for o in gc.get_objects() if issubclass(type(o), Tensor) and o.is_registered]


def tensor_bytes(tensor):
    return tensor.traits.size * tensor.numpy_dtype.itemsize


def live_owned_bytes(rank):
    """Bytes of the tiles of registered tensors that ``rank`` owns (all tiles with one
    process): what RankEstimate.owned_total predicts."""
    total = 0
    for tensor in live_tensors():
        spec = TensorSpec("", tensor.shape, tensor.basetile, tensor.dtype, None)
        sizes = spec.tile_bytes()
        total += int(sizes.sum() if tensor.owners is None
                     else sizes[np.asarray(tensor.owners) == rank].sum())
    return total


def live_tensor_bytes():
    """(number of registered tensors, their bytes, Counter of (shape, basetile, dtype))."""
    tensors = live_tensors()
    return (len(tensors), sum(tensor_bytes(t) for t in tensors),
            Counter((tuple(t.shape), tuple(t.basetile), t.dtype) for t in tensors))
