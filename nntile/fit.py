"""Whether a run fits the memory StarPU may use, and the refusal a program gives before
StarPU starts when it does not.

``check_fits`` compares an estimate (nntile.memory) with what this machine offers
(nntile.machine) the way StarPU 1.4 spends memory:

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
"""
import os
import sys

from nntile.distributed import agree_refusal, most_over_ranks
from nntile import machine, policy
from nntile.errors import CLIError
from nntile.memory import GiB, MiB, RankEstimate, estimate, fmt_bytes
from nntile.policy import STARPU_MARGIN, Choice, launcher_rank
from nntile.policy import recompute as recompute_rule
# the rule lives in nntile.policy; the name stays importable from here
from nntile.policy import cuda_limit_mib as default_cuda_limit_mib

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


class MemoryBudgetError(MemoryError):
    """The run cannot fit in the memory StarPU may use; the message says by how much and what
    to change. ``estimate`` and ``budget`` hold the numbers."""

    def __init__(self, message, estimate=None, budget=None):
        super().__init__(message)
        self.estimate = estimate
        self.budget = budget

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
    if config.recomputed_blocks(args["recompute"]) < config.num_hidden_layers and \
            fits(recompute=True):
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


def budget_args(gpus):
    """budget()'s arguments for this process with these GPUs (bytes of each): what it may use
    of them, of host memory and of a disk swap, under the STARPU_* variables."""
    return (sum(gpus), machine.host_memory_of_this_process(),
            machine.env_int("STARPU_LIMIT_CUDA_MEM"), machine.env_int("STARPU_LIMIT_CPU_MEM"),
            machine.disk_swap_bytes(), len(gpus))


def process_budget(ncuda=None):
    """The Budget of this process (of the described machine, where one is): what preflight
    checks the run against."""
    return budget(*budget_args(machine.gpus_of_this_process(ncuda)))


def check_recompute(config, recompute):
    """A one-line CLIError where --recompute BLOCKS names more blocks than the model has."""
    try:
        config.recomputed_blocks(recompute)
    except ValueError:
        raise CLIError(f"--recompute {recompute}: the model has {config.num_hidden_layers} "
                       f"blocks ({config.field_name('num_hidden_layers')})") from None


def chosen_total(config, batch, seq, dtype, ncuda=None, recompute=None):
    """The bytes a training run registers in this process, for any tiles (the total does not
    depend on them), with recomputation as preflight chooses it: the Context's runtime settings
    follow from this total, so the tiles picked before StarPU starts must follow from it too
    (a run that fits one GPU only by recomputing gets that GPU's two workers and two batch
    tiles, not the four of a run past its memory)."""
    check_recompute(config, recompute)

    def estimate_with(flag):
        return estimate(config, batch, seq, None, dtype, recompute=flag)
    gpus = machine.gpus_of_this_process(ncuda)
    return _with_recompute(estimate_with, recompute, budget(*budget_args(gpus)), len(gpus)).total


# deeper models are first checked in closed form (preflight)
QUICK_ESTIMATE_LAYERS = 10000


def refuse_absurd_depth(config, gpus):
    """The estimate walks every layer's declarations, which takes hours and all host memory
    for absurd depths (n_layer 10**9): a CLIError from a bound in closed form first."""
    if config.num_hidden_layers <= QUICK_ESTIMATE_LAYERS:
        return
    weights = config.num_parameters() * 4  # at least the fp32 weights, every precision
    offered = sum(gpus) + machine.host_memory() + machine.disk_swap_bytes()
    if weights > offered:
        raise CLIError(f"not enough memory: the model's {config.num_parameters():,} "
                       f"parameters alone need {fmt_bytes(weights)}, more than this "
                       f"machine's {fmt_bytes(offered)} in GPUs, host memory and disk "
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

    ``recompute``: activation recomputation, on or off, or of a number of blocks (the first
    ones); None: as nntile.policy.recompute picks it for this machine. The estimate returned
    holds the Choice (``est.recompute``)."""
    check_recompute(config, recompute)
    rank, _ = launcher_rank()
    gpus = machine.gpus_of_this_process(ncuda)
    check = os.environ.get("NNTILE_MEMORY_CHECK", "1") != "0"
    if check:
        refuse_absurd_depth(config, gpus)
    try:
        machine.check_ncuda(ncuda)
        machine.check_disk_swap_env()
    except ValueError as exc:
        raise CLIError(str(exc)) from None
    offers = budget_args(gpus)

    def estimate_with(flag):
        return estimate(config, batch, seq, tiling, dtype, optimizer, grad_clip, training,
                        init, distribution=distribution, rank=rank, recompute=flag)

    est = _with_recompute(estimate_with, recompute, budget(*offers), len(gpus))
    refusal, b = None, None
    try:
        b = check_fits(est, *offers)
    except MemoryBudgetError as exc:
        refusal = str(exc)
    refusal = agree_refusal(refusal)
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


def _with_recompute(estimate_with, given, b, devices):
    """The estimate of the run with activation recomputation or without, as given or as
    nntile.policy.recompute picks it from where each fits the budget ``b``; its
    ``recompute`` holds the Choice. Where recomputation brings the run into the ``devices``
    GPUs, only the fewest first blocks that keep each GPU's share within
    policy.keeps_activations recompute. Under mpirun every rank must build the same model:
    each recomputes the most blocks any rank needs."""
    est = estimate_with(given or False)
    if given is not None:
        est.recompute = recompute_rule(given, None, None)
        return est
    with_recompute = estimate_with(True)
    choice = recompute_rule(None, fits_where(est, b), fits_where(with_recompute, b))
    config = est.args["config"]
    if choice.value:
        est = with_recompute
        if fits_where(with_recompute, b) == "gpu":
            est, choice = (_fewest_recomputed(estimate_with, with_recompute, b, devices,
                                              config.num_hidden_layers) or (est, choice))
    blocks = config.recomputed_blocks(choice.value)
    agreed = most_over_ranks(blocks)
    if agreed != blocks:
        choice = Choice(True if agreed == config.num_hidden_layers else agreed,
                        "nntile default: another MPI rank recomputes more blocks, and every "
                        "rank builds the same model")
        est = estimate_with(choice.value)
    est.recompute = choice
    return est


def _gpu_share(est, b, devices):
    """What one of ``devices`` GPUs holds of the run: a replica's share where several each
    train one (policy.device_replica_bytes, at least an even split otherwise), else all."""
    if devices > 1:
        return policy.device_replica_bytes(est.breakdown, devices)
    return _needs(est, b)


def _fewest_recomputed(estimate_with, with_recompute, b, devices, layers):
    """(estimate, Choice) of the fewest first blocks of ``layers`` to recompute that keep the
    run in the GPUs and a GPU's share within policy.keeps_activations, where fewer than
    every block do (None otherwise). A run that no longer fits the GPUs whole gets the tiles
    and settings of a run past GPU memory: the 16-layer wide GPT-2 on two H200s recomputing
    8 blocks (a GPU's share no larger than with 16, the run 4.6% larger than the GPUs) ran
    at 0.59x the speed of 12 blocks, moving 130-350 GiB a step to the host.
    ``with_recompute``: the estimate with every block recomputed."""
    gpu_bytes = b["gpu"] / devices
    recomputing_all = _gpu_share(with_recompute, b, devices)
    probed = {}  # kept blocks: (estimate, a GPU's share), for the one chosen

    def keeps(kept):
        est = estimate_with(layers - kept)
        probed[kept] = est, _gpu_share(est, b, devices)
        return fits_where(est, b) == "gpu" and policy.keeps_activations(
            probed[kept][1], gpu_bytes, recomputing_all)
    kept = _largest(keeps, layers)
    if kept is None:
        return None
    est, need = probed[kept]
    return est, policy.fewest_recomputed(layers - kept, need, gpu_bytes, recomputing_all)
