"""The defaults nntile takes where it is not told: plain functions of the situation.

What the machine offers (a ``Machine``: cores, GPUs and their memory, MPI ranks) and what the
run is (the model's dimensions, the data's shape, the memory estimate) go in; a ``Choice``
(the value and why) comes out. Nothing here starts StarPU or imports nntile's core, so every
rule can be tested alone (tests/test_policy.py), as mpi4py keeps ``mpi4py.rc`` apart from its
binding. ``nntile.Context`` asks these rules for what its arguments and the ``STARPU_*``
variables leave open and hands the resolved values to the core; the programs ask ``tiles``
for the tile sizes that no flag gives.

Each rule's docstring names the measurement in docs/performance.md that it rests on.
"""
import os
import re
from dataclasses import dataclass, field

GiB = 1 << 30
MiB = 1 << 20


class Choice(tuple):
    """(value, reason): a setting and where it came from (an argument, a variable, a rule)."""

    def __new__(cls, value, reason):
        return super().__new__(cls, (value, reason))

    value = property(lambda self: self[0])
    reason = property(lambda self: self[1])


@dataclass(frozen=True)
class Machine:
    """What this process may use. ``gpus``: bytes of each GPU StarPU would use (empty without
    CUDA); ``cores``: the cores this process may run on; ``mpi``: whether it is a StarPU-MPI
    rank, ``one_core``: whether that rank has a single core; ``cuda_built``: whether nntile
    was built with CUDA."""
    cores: int = 1
    gpus: tuple = ()
    mpi: bool = False
    one_core: bool = False
    cuda_built: bool = False


# ---- MPI launchers --------------------------------------------------------------------------

# (rank, size) environment variables that MPI launchers (Open MPI, MPICH/PMI, PMIx, Slurm's
# srun) set in every process they start.
LAUNCHER_VARS = (("OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE"), ("PMI_RANK", "PMI_SIZE"),
                 ("PMIX_RANK", "PMIX_SIZE"), ("SLURM_PROCID", "SLURM_NTASKS"))


def _launcher(env=None):
    env = os.environ if env is None else env
    for rank_var, size_var in LAUNCHER_VARS:
        rank = env.get(rank_var, "")
        if rank.isdigit():
            size = env.get(size_var, "")
            return int(rank), int(size) if size.isdigit() else 1
    return None


def launcher_rank(env=None):
    """(rank, number of ranks) that an MPI launcher gave this process, read from its
    environment without starting MPI; (0, 1) when no launcher started it."""
    return _launcher(env) or (0, 1)


def launched_by_mpirun(env=None):
    """Whether this process was started by an MPI launcher (mpirun, mpiexec, srun)."""
    return _launcher(env) is not None


def rank_core_share(cores, local_rank, ranks_on_node):
    """The cores local rank ``local_rank`` of ``ranks_on_node`` takes when the launcher bound
    nothing: a contiguous share of ``cores`` (one core each, in turn, when there are more ranks
    than cores). Two ranks that both took every core pinned their threads to the same first
    cores, where they took turns: a step of 3.7 s had not finished in 95 s
    (docs/performance.md, "Why the two-rank run stalled")."""
    cores = sorted(cores)
    if len(cores) >= ranks_on_node:
        return cores[local_rank * len(cores) // ranks_on_node:
                     (local_rank + 1) * len(cores) // ranks_on_node]
    return [cores[local_rank % len(cores)]]


def mpi_yield_when_idle(one_core):
    """Open MPI's ``mpi_yield_when_idle`` for a rank (None: leave MPI's default). On a rank of
    one core, StarPU-MPI's progress thread shares the core with a worker; yielding after each
    poll that finds nothing was 1.0-1.9x faster on the README's MPI lines (6-8x slower with
    tiny tiles; nntile.distributed.mpi has the numbers)."""
    return "1" if one_core else None


def mpi_progress_thread_unbound(one_core, placement_chosen):
    """Whether StarPU-MPI's progress thread is left unpinned (STARPU_MPI_NOBIND): on a rank of
    one core it would be pinned onto the worker's core with a warning; unpinned, it runs on the
    rank's one core all the same (README, "Several processes and machines")."""
    return one_core and not placement_chosen


def collectives(gpu_workers, cpu_workers, env):
    """How replicas sum their gradients: "nccl" on the rank's GPU where it has one (the tiles
    stay on the GPU, and NCCL takes NVLink or the network), else "mpi" on its CPU workers
    (StarPU copies the tiles to host memory for them). NNTILE_COLLECTIVES=nccl|mpi chooses."""
    value = env.get("NNTILE_COLLECTIVES") or ("nccl" if gpu_workers else "mpi")
    if value not in ("nccl", "mpi"):
        raise ValueError(f"NNTILE_COLLECTIVES={value!r}: use nccl or mpi")
    if value == "nccl" and not gpu_workers:
        raise ValueError("NCCL collectives run on a GPU, but this rank has no CUDA worker")
    if value == "mpi" and not cpu_workers:
        raise ValueError("MPI collectives run on CPU workers, but this rank has none (ncpu 0)")
    return value


# ---- workers and scheduler ------------------------------------------------------------------

GPU_ONLY = "nntile default with GPUs: GPU workers only; give ncpu to add CPU workers"
SHARED_CORE = ("nntile default on an MPI rank with one core: one CPU worker, sharing it with "
               "the MPI thread")
CUDA_LIMIT = "nntile default: GPU memory less max(3 GiB, 3%)"
TWO_PER_GPU = "nntile default with GPUs: two workers per GPU overlap transfers and kernels"
FOUR_PAST_MEMORY = ("nntile default on one GPU that cannot hold the run: four workers keep "
                    "more transfers in flight")
CALIBRATE_FAST = ("nntile default: a performance model is trusted after its first measurement, "
                  "so the first step is scheduled by models instead of calibrating")


def cpu_workers(gpu_workers, machine, cpu_update_share=0):
    """CPU workers where ``ncpu`` is not given (None: StarPU's default, every core).
    Where part of the update runs on CPU workers (``cpu_update``), every core but those of
    the threads beside the workers.

    With GPUs, none: a CPU worker that takes a matrix product the GPU would run 100x faster
    holds up every task after it (docs/performance.md, "Defaults at scale"; lws with 8 CPU
    workers beside one H100: 1,132 against 52,645 tokens/s, "Scheduler study"). On an MPI rank
    of one core, one: StarPU-MPI would keep that core for its progress thread and leave no
    worker (README, "Several processes and machines")."""
    if gpu_workers and cpu_update_share:
        return Choice(max(1, machine.cores - gpu_workers - THREADS_BESIDE_WORKERS),
                      CPU_UPDATE_WORKERS)
    if gpu_workers:
        return Choice(0, GPU_ONLY)
    if machine.mpi and machine.one_core:
        return Choice(1, SHARED_CORE)
    return Choice(None, "StarPU default")


def scheduler(gpu_workers, cpu_workers):
    """The scheduler where none is given (docs/performance.md, "Defaults at scale", the table
    "lws against dmdas, where users run", and "Scheduler study")."""
    if not gpu_workers:
        return Choice("lws", "nntile default without GPUs: locality work stealing")
    if cpu_workers:
        # lws lets CPU workers steal matrix products from the GPUs and collapses (1,132 vs
        # 52,645 tokens/s with 8 CPU workers beside one H100); dmdas places each task where
        # its performance model says it ends first
        return Choice("dmdas", "nntile default for GPU and CPU workers together")
    if gpu_workers > 1:
        # once tiles fill the GPUs, dmdas's history models keep being flushed ("Too big
        # deviation") and its placements turn to noise: lws was 2.35x faster at 14.5B on 2
        # H200s and 10x on 4; dmdas leads by 3-10% only where a model leaves GPUs half empty
        return Choice("lws", f"nntile default for {gpu_workers} GPUs")
    # one GPU: a tie in memory; past it lws fetches a task's tiles only when the task starts,
    # while dmdas prefetches as it places (1.27x faster at twice the GPU's memory, 3.8x at its
    # limit, on an H100)
    return Choice("dmdas", "nntile default for one GPU")


def device_replica_bytes(breakdown, devices):
    """What one of ``devices`` GPUs holds when each trains a replica (nntile.parallel.
    DeviceReplicas), from a run's bytes by category (nntile.memory.Estimate.breakdown): the
    weights GEMMs read (compute copies, or the parameters themselves), and its share of
    everything else. A replica's activations are its share of the batch's. Of the gradients
    a GPU keeps the tiles it is home to: backward sums each block's gradients there and drops
    the other replicas' (DeviceReplicas.sum_gradients). Gradients and activations are not
    held at once: backward writes a block's gradients as it frees that block's activations,
    so while one grows the other shrinks. Counting every replica's gradients whole kept
    13.0B (Llama-2-13B's shape, batch 8x2048) and a 16-layer wide GPT-2 (13.7B, 16x1024)
    off replicas on two H200s, where a replica per GPU is 1.37x and 1.12x faster
    (docs/performance.md, "Several GPUs in one process")."""
    shared = breakdown["parameters"] + breakdown["optimizer_states"]
    weights = breakdown["compute_copies"] or breakdown["parameters"]
    if not breakdown["compute_copies"]:
        shared -= breakdown["parameters"]  # the weights GEMMs read, counted whole above
    per_batch = breakdown["workspaces"] + breakdown["logits"]
    held_in_turn = max(breakdown["gradients"], breakdown["activations"])
    return int(weights + (shared + per_batch + held_in_turn) / devices)


def device_replicas(given, devices, owner_ranks, replica_bytes=None, gpu_bytes=None, rows=None):
    """How many replicas of a model one process trains on its CUDA devices
    (nntile.parallel.DeviceReplicas): one per device where there are several (against any
    GPU running any task, bf16-mixed on two H200s: 1.39x on Llama-3.2-1B's shape, 1.11x on
    the wide 4.05B model, 1.36x on Llama-3.1-8B's at batch 8), unless turned off, the ranks
    own tiles through StarPU-MPI, or a replica per GPU would not fit (``replica_bytes``,
    policy.device_replica_bytes, against ``gpu_bytes``). With one (1) every GPU
    may run any task: the weight tiles then follow the tasks from GPU to GPU, and a gradient
    tile moves on every task that accumulates into it (docs/performance.md, "Several GPUs in
    one process"). ``rows``: the batch rows the process trains (None: not known), which the
    replicas share equally."""
    if devices < 2:
        return Choice(1, "one device")
    if owner_ranks > 1:
        return Choice(1, "ranks own the tiles (StarPU-MPI)")
    if given is not None:
        return Choice(devices if given else 1, "given")
    if rows is not None and rows % devices:
        return Choice(1, f"nntile default: a batch of {rows} rows does not share equally "
                         f"over {devices} GPUs")
    if replica_bytes is not None and gpu_bytes and replica_bytes > gpu_bytes:
        return Choice(1, f"nntile default: a replica per GPU would need "
                         f"{replica_bytes / 2**30:.1f} GiB of {gpu_bytes / 2**30:.1f} GiB a GPU")
    return Choice(devices, "nntile default: a replica per GPU")


def past_gpu_memory(gpu_workers, run_bytes, gpu_bytes):
    """Whether the run (``run_bytes``; None: not known) is known not to fit the GPUs
    (``gpu_workers`` of ``gpu_bytes`` each; None: not known)."""
    return bool(gpu_workers and run_bytes is not None and gpu_bytes is not None
                and run_bytes > gpu_workers * gpu_bytes)


def workers_per_gpu(gpu_workers, run_bytes, gpu_bytes):
    """CUDA workers per GPU where none is given. ``run_bytes``: what the run registers (None:
    not known, or not this process's alone, as under MPI); ``gpu_bytes``: what StarPU may use
    of each GPU.

    Two, each with its own CUDA stream, so that one waits for its tiles or launches while the
    other's kernels run (H100, tf32, n_embd 8192: 0.53 -> 0.47 s per step in memory, 3.39 ->
    2.37-2.63 s at 1.23x its memory; docs/performance.md, "Past GPU memory on one GPU: two
    workers per GPU"). Four on one GPU that cannot hold the run (6.07B at batch 16: 9.1-10.7 s
    against 10.6-12.3 s with two; in memory four are no faster and vary more: "Activations
    dropped after backward"). Several GPUs past their memory were not measured: two."""
    if gpu_workers == 1 and past_gpu_memory(gpu_workers, run_bytes, gpu_bytes):
        return Choice(4, FOUR_PAST_MEMORY)
    return Choice(2, TWO_PER_GPU)


# ---- memory ---------------------------------------------------------------------------------

GPU_RESERVE_MIN = 3 << 30          # CUDA context, cuBLAS; nvidia-smi shows ~0.5 GiB more than CUDA
GPU_RESERVE_FRACTION = 0.03
STARPU_MARGIN = 0.9                # FREE_MARGIN in driver_cuda.c, "global_mem *= 0.9" in topology.c


def cuda_limit_mib(gpu_total_bytes):
    """What nntile lets StarPU use of a GPU of that size, in MiB: all but max(3 GiB, 3%), and
    never less than StarPU's own 90%. On an 80 GB H100 this is 76.7 GiB instead of 71.3, which
    took the wide n_embd 8192 GPT-2 (77.4 GiB) from 0.83 to 0.51 s per step
    (docs/performance.md, "StarPU's GPU memory margin")."""
    reserve = max(GPU_RESERVE_MIN, GPU_RESERVE_FRACTION * gpu_total_bytes)
    return int(max(gpu_total_bytes - reserve, STARPU_MARGIN * gpu_total_bytes) // MiB)


def calibrate_minimum():
    """Measurements StarPU wants of a task's size on a worker before it trusts the model
    (STARPU_CALIBRATE_MINIMUM; StarPU's default is 10). Until then dmda-type schedulers place
    such a task on the least loaded worker to measure it, ignoring where its tiles are, and
    prefetch nothing: the first step of 6.07B past an H100's memory took 92.6 s against
    7.04-7.42 s later. One measurement makes the model usable from the first occurrence of each
    tile size on; later ones refine its mean (docs/performance.md, "The first step")."""
    return Choice(1, CALIBRATE_FAST)


RECOMPUTE_TO_FIT = ("nntile default: with activation recomputation the run fits {better}; "
                    "without, {worse}")
NO_RECOMPUTE = "nntile default: recomputation would not make the run fit better"
# where a run fits, from worst to best: nowhere (the memory pre-check refuses it), only with
# host memory (or a disk swap) beside or instead of the GPUs (nntile.fit.check_fits), in
# the GPUs alone
FITS = (None, "host", "gpu")
FITS_WORDS = {None: "nowhere (the memory pre-check refuses it)",
              "host": "only with host memory", "gpu": "in GPU memory"}


def recompute(given, without, with_recompute):
    """Whether backward recomputes each block's forward (CausalLM's ``recompute``): ``given``
    (--recompute [BLOCKS] or --no-recompute: True, False or a number of blocks) where there is
    one, else on exactly where it makes the run fit better (for every block; nntile.fit then
    trims them to the fewest that keeps_activations allows). ``without`` and
    ``with_recompute``: where the run fits each way, one of ``FITS`` (nntile.fit.fits_where;
    without GPUs, "host" is host memory alone).

    Recomputation runs most of the blocks' forward twice (not the MLP's output projection):
    about a quarter more arithmetic. Past GPU memory the same GPU ran at 34-40% of its
    in-memory rate (n_embd 8192 on one H100: 72-85 against 215 TFLOP/s; docs/performance.md,
    "Past GPU memory on one GPU"), so a run that
    recomputation brings into GPU memory should gain (not measured with recomputation); a
    run the pre-check would refuse can run at all."""
    if given is not None:
        return Choice(given, "argument")
    if FITS.index(with_recompute) > FITS.index(without):
        return Choice(True, RECOMPUTE_TO_FIT.format(better=FITS_WORDS[with_recompute],
                                                    worse=FITS_WORDS[without]))
    return Choice(False, NO_RECOMPUTE)


# The share of a GPU's StarPU memory that a recomputing run's estimate may fill before it keeps
# a block's activations instead of recomputing them. Estimates undercount what StarPU holds
# by up to ~1.2x: Llama-3.1-8B at batch 16x2048 on two H200s (136.2 GiB each, a replica per
# GPU) recomputing 20 of 32 blocks (an estimate of 104.8 GiB a GPU, 77%) filled the GPUs with
# no host traffic after step 1; 12 blocks (123.8 GiB, 91%) moved 1.8 GiB each way in step 2.
RECOMPUTE_FILL = 0.77


def keeps_activations(gpu_need, gpu_bytes, need_recomputing_all=0):
    """Whether a run that needs ``gpu_need`` bytes of each GPU (a replica's, or the whole run's
    on one GPU) may keep the activations it keeps: where recomputation is on by default, it
    recomputes only the fewest first blocks that keep this true. The need may fill
    ``RECOMPUTE_FILL`` of ``gpu_bytes`` (what StarPU may use of each), or, where recomputing
    every block already needs more, as much as that (``need_recomputing_all``): a GPU keeps
    a replica's activations and its home gradients in turn, so activations below the
    gradients take no room of their own. Each block left out runs its forward once instead
    of twice: on that 8B run 20 blocks instead of 32 took the step from 1.97 to 1.80 s
    (18,169 tokens/s against 16,612); the 16-layer wide GPT-2 on two H200s (96% of a GPU
    recomputing every block) ran 1.42 s a step recomputing 11 blocks against 1.50 s for
    all 16, with no host traffic (docs/performance.md, "Past a replica's memory")."""
    return gpu_need <= activation_room(gpu_bytes, need_recomputing_all)


def activation_room(gpu_bytes, need_recomputing_all):
    """The most a GPU's need may be where it keeps activations (keeps_activations)."""
    return max(RECOMPUTE_FILL * gpu_bytes, need_recomputing_all)


def fewest_recomputed(blocks, gpu_need, gpu_bytes, need_recomputing_all=0):
    """The Choice of recomputing the first ``blocks`` blocks (keeps_activations)."""
    room = activation_room(gpu_bytes, need_recomputing_all)
    return Choice(blocks, f"nntile default: the fewest that leave a margin, "
                          f"{gpu_need / 2**30:.1f} GiB a GPU by the estimate, within "
                          f"{room / 2**30:.1f} GiB ({room / gpu_bytes:.0%} of "
                          f"{gpu_bytes / 2**30:.1f} GiB)")


PIN_AHEAD = ("nntile default on GPUs that cannot hold the run: StarPU's host copies of tiles "
             "come from host memory pinned ahead of need on a thread of its own")
PIN_AS_NEEDED = ("nntile default where the GPUs hold the run, or there are none: StarPU pins "
                 "host memory as it needs it")
PINNING_OFF = "STARPU_DISABLE_PINNING: StarPU pins nothing"
# The arena pins this much per call (each registration stalls the GPU's thread up to ~37 ms),
# from the start and as fast as it can: initialisation and step 1 of 6.07B take 73 GiB in ~20
# s, faster than a machine that has never touched its memory pins it (3.6-6.1 GB/s), so the
# programs wait for the rest before step 1 (Context.finish_pinning).
PIN_CHUNK = 1 << 30


def pinned_host_mib(gpu_workers, run_bytes, gpu_bytes, env):
    """MiB of host memory to pin ahead of StarPU's need (0: none). ``run_bytes``: what the
    run registers (None: not known, or not this process's alone); ``gpu_bytes``: what StarPU
    may use of each GPU.

    Past GPU memory StarPU pins the host copies of evicted tiles as it first needs them, in
    the one thread that drives every worker of the GPU: 47.2 GiB in step 1 of 6.07B at batch
    16, at 0.34 s per GiB of step time, while cudaHostAlloc takes 0.33-0.66 s per GiB
    (docs/performance.md, "Step 1 past GPU memory"). Pinned ahead, on a thread of its own and
    5x faster, those steps need not wait: 49.2, 21.1, 7.0 s became 7.2-11.7, 6.2-7.8, 5.1-6.6 s
    (one H100; on two past their memory, 8.50B: 7.6, 5.8, 11.3 s became 4.9, 3.2, 2.3 s;
    "Host memory pinned ahead"). At most the run's size (the core bounds it by StarPU's host
    limit); in GPU memory StarPU pins little and nothing is taken ahead."""
    if env.get("STARPU_DISABLE_PINNING", "").strip() not in ("", "0"):
        return Choice(0, PINNING_OFF)
    if past_gpu_memory(gpu_workers, run_bytes, gpu_bytes):
        return Choice(-(-run_bytes // MiB), PIN_AHEAD)
    return Choice(0, PIN_AS_NEEDED)


WRITE_BEHIND = ("nntile default on GPUs that cannot hold the run: each update's tiles are "
                "copied to host memory right after it, so that evicting them waits for no copy")
NO_WRITE_BEHIND = "nntile default where the GPUs hold the run, or there are none: nothing to evict"


def write_behind(gpu_workers, run_bytes, gpu_bytes):
    """Whether each optimizer update copies the tiles it wrote (parameters, their compute
    copies, optimizer states) to host memory right after it, and puts those only the next
    update reads first in line for eviction (1), or leaves them on the GPU (0). Past GPU
    memory StarPU evicts a tile whose only valid copy is on the GPU by copying it out inside
    the GPU's driver thread, which launches nothing meanwhile: 6.07B at batch 16 on one H100
    (bf16-mixed) spent 2.2 s of a 5.8 s step with no kernel and no copy running, its forward
    at a tenth of the GPU while the update's states were copied out one by one; written back,
    the step took 3.2-3.5 s against 5.3 s in the same call, and with the states evicted first
    about 20 GiB less was copied out each step (docs/performance.md, "Where the step
    waited"). In GPU memory it would only add copies."""
    if past_gpu_memory(gpu_workers, run_bytes, gpu_bytes):
        return Choice(1, WRITE_BEHIND)
    return Choice(0, NO_WRITE_BEHIND)


POOL = ("nntile default: StarPU's GPU buffers come from a memory pool of each GPU that keeps "
        "what is freed, so making room never waits for the whole device")


def cuda_pool():
    """Whether StarPU's GPU buffers come from a stream-ordered memory pool of each device (1)
    or from cudaMalloc and cudaFree (0) (NNTILE_CUDA_POOL, read by
    scripts/starpu-patches/cuda-memory-pool.patch). On one GPU past its memory the pool took
    step 1 of 6.07B from 7.63 to 5.90 s and kept later steps steadier: cudaFree waits for every
    stream of the device (docs/performance.md, "Where the step waited"). On several GPUs of one
    process StarPU copies tiles between them, and a pool's memory is not mapped for the other
    devices, so those copies went through host memory: 4 H100s, n_embd 8192 at batch 4, 2.34 s
    a step against 0.31 s without the pool, at 55 GB/s instead of NVLink's 320
    ("Four H100s"). The patch now opens each pool to the other GPUs (cudaMemPoolSetAccess),
    and where several GPUs fill their memory the pool wins most: Llama-3.1-8B at 8x2048 on two
    H200s, a replica per GPU, 20,394 tokens/s against 16,203 with cudaMalloc, 46 GiB crossing
    between the GPUs a step either way ("The pool on several GPUs")."""
    return Choice(1, POOL)


UPDATE_ON_CPU = ("nntile default on one GPU that cannot hold a run without compute copies: the "
                 "update of the later half of the parameters runs on CPU workers, next to its "
                 "states in host memory; every other task on the GPU")
UPDATE_WITH_STEP = "nntile default: the update runs where the rest of the step runs"
CPU_UPDATE_WORKERS = ("nntile default where part of the update runs on CPU workers: every core "
                      "but the main thread's, the pinning thread's and one per GPU")
# the share measured best (6.07B tf32 on one H100: 0.29, 0.5 and 1 tried), and the CPU workers
# it was measured with (fewer stream the states more slowly: not measured)
CPU_UPDATE_SHARE = 0.5
CPU_UPDATE_MIN_WORKERS = 13
THREADS_BESIDE_WORKERS = 2  # the main thread, which submits, and the host arena's


def cpu_update(gpu_workers, run_bytes, gpu_bytes, machine, training):
    """The share of the parameters (by bytes, from the model's end: the head, the final norm,
    the last blocks) whose optimizer update runs on CPU workers; 0: the update runs with the
    rest of the step. ``training``: (master dtype, compute dtype) of the run's precision, None
    when not training or not known.

    Past one GPU's memory, backward leaves the first blocks' tiles on the GPU and the last
    blocks' in host memory with their optimizer states; updated on the GPU, those states
    cross PCIe in and out each step. In tf32 on one H100 with 13 CPU workers
    (docs/performance.md, "The update where its states live"), half updated on the CPU moved
    a third to a half less to the GPU, the step within 7% either way: 6.07B at batch 16,
    3.54-4.24 s a step and 57-66 GiB in (0.91-1.04x the floor) against 3.54-3.91 s and 92-106
    GiB; 8.50B at batch 8, 3.54-3.76 s against 3.81-3.85 (66-68 against 111-114 GiB); 10.04B
    at batch 6, 4.56-4.68 s against 4.32-4.50 (92-101 against 138-141 GiB). 29% on the CPU
    moved 72-78 GiB; all of it took 6.81 s (the CPU streams 28 bytes per parameter through
    host memory). Not taken with compute copies (bf16-mixed: 29% on the CPU, 3.00-3.18 s
    against 2.86-3.03), on several GPUs or ranks (host memory shared: not measured), nor with
    fewer than ``CPU_UPDATE_MIN_WORKERS`` cores to spare."""
    spare = machine.cores - gpu_workers - THREADS_BESIDE_WORKERS
    if (gpu_workers == 1 and not machine.mpi and training is not None
            and training[0] == training[1] and spare >= CPU_UPDATE_MIN_WORKERS
            and past_gpu_memory(gpu_workers, run_bytes, gpu_bytes)):
        return Choice(CPU_UPDATE_SHARE, UPDATE_ON_CPU)
    return Choice(0, UPDATE_WITH_STEP)


HISTORY_TOLERANT = ("nntile default: a measurement up to 11x off a performance model's mean "
                    "refines it instead of flushing it back to calibration")


def history_max_error():
    """How far (percent) a task's measured time may stray from its history model's mean
    before StarPU counts it an error; once errors reach the samples, StarPU flushes the model
    and calibrates that size again, placing its tasks without models (STARPU_HISTORY_MAX_ERROR,
    StarPU's default 50). Several workers share a GPU, so a kernel's time varies far more than
    that with what runs beside it: 6.07B at batch 16 on one H100 (bf16-mixed, fresh models)
    flushed 594 times in 3 steps at 50%, 10 times at 1000%, and its steps took 19.1, 8.8, 5.5 s
    against 7.2, 6.2, 6.0 s (docs/performance.md, "Host memory pinned ahead").
    A first measurement more than 11x off (a kernel's first launch) is still flushed."""
    return Choice(1000, HISTORY_TOLERANT)


# ---- resolving a Context's settings ---------------------------------------------------------

# Each runtime setting, with the StarPU environment variable it falls back to.
SETTINGS = (
    ("ncpu", "STARPU_NCPU"),
    ("ncuda", "STARPU_NCUDA"),
    ("sched", "STARPU_SCHED"),
    ("limit_cuda_mem", "STARPU_LIMIT_CUDA_MEM"),
    ("limit_cpu_mem", "STARPU_LIMIT_CPU_MEM"),
    ("calibrate", "STARPU_CALIBRATE"),
    ("workers_per_gpu", "STARPU_NWORKER_PER_CUDA"),
    ("calibrate_minimum", "STARPU_CALIBRATE_MINIMUM"),
    ("history_max_error", "STARPU_HISTORY_MAX_ERROR"),
    ("pinned_host_mem", "NNTILE_PINNED_HOST_MEM"),
    ("write_behind", "NNTILE_WRITE_BEHIND"),
    ("cuda_pool", "NNTILE_CUDA_POOL"),
    ("cpu_update", "NNTILE_CPU_UPDATE"),
)
# the settings whose nntile default reaches StarPU through its environment variable
DEFAULTS_IN_ENV = ("limit_cuda_mem", "workers_per_gpu", "calibrate_minimum", "history_max_error",
                   "cuda_pool")


def runtime_settings(machine, given, env, run_bytes=None, training=None):
    """{setting: Choice} for every setting of SETTINGS: the argument (``given``), else the
    STARPU_ variable (``env``, as the user set it), else nntile's rule for the ``machine``,
    else StarPU's own default. ``run_bytes``: the bytes the run registers (the memory
    estimate), None when not known; ``training``: (master dtype, compute dtype) of a training
    run's precision, None when not training or not known."""
    result = {}
    for name, var in SETTINGS:
        if given.get(name) is not None:
            result[name] = Choice(given[name], "argument")
        elif env.get(var):
            result[name] = Choice(env[var], f"${var}")
        else:
            result[name] = Choice(None, "StarPU default")
    if result["ncuda"].value is None and not machine.cuda_built:
        result["ncuda"] = Choice(0, "built without CUDA")
    gpus = gpu_workers(machine, result["ncuda"].value)
    if result["limit_cuda_mem"].value is None and gpus and machine.gpus:
        result["limit_cuda_mem"] = Choice(cuda_limit_mib(min(machine.gpus)), CUDA_LIMIT)
    own_bytes = bytes_of_this_process(machine, run_bytes)
    gpu_bytes = gpu_limit_bytes(result)
    if result["cpu_update"].value is None:
        # CPU workers of the user's own (ncpu) take whatever the scheduler gives them
        result["cpu_update"] = (Choice(0, UPDATE_WITH_STEP) if result["ncpu"].value is not None
                                else cpu_update(gpus, own_bytes, gpu_bytes, machine, training))
    if result["ncpu"].value is None:
        result["ncpu"] = cpu_workers(gpus, machine, share(result["cpu_update"].value) or 0)
    if result["sched"].value is None:
        cpus = result["ncpu"].value
        result["sched"] = scheduler(gpus, cpus is None or int(cpus) > 0)
    if result["workers_per_gpu"].value is None and gpus:
        result["workers_per_gpu"] = workers_per_gpu(gpus, own_bytes, gpu_bytes)
    if result["calibrate_minimum"].value is None:
        result["calibrate_minimum"] = calibrate_minimum()
    if result["history_max_error"].value is None:
        result["history_max_error"] = history_max_error()
    if result["pinned_host_mem"].value is None:
        result["pinned_host_mem"] = pinned_host_mib(gpus, own_bytes, gpu_bytes, env)
    if result["write_behind"].value is None:
        result["write_behind"] = write_behind(gpus, own_bytes, gpu_bytes)
    if result["cuda_pool"].value is None and gpus:
        result["cuda_pool"] = cuda_pool()
    return result


def bytes_of_this_process(machine, run_bytes):
    """What the rules that weigh a run against the GPUs may count as this process's alone:
    under MPI other processes share the node's GPUs and host memory (not measured): None."""
    return None if machine.mpi else run_bytes


def gpu_limit_bytes(settings):
    """The bytes StarPU may use of each GPU under ``settings`` (None: not known)."""
    limit = settings["limit_cuda_mem"].value
    return int(limit) * MiB if limit is not None else None


def gpu_workers(machine, ncuda):
    """How many CUDA devices StarPU will drive: ``ncuda`` when given, else every visible GPU."""
    if not machine.cuda_built:
        return 0
    return int(ncuda) if ncuda is not None else len(machine.gpus)


# ---- tiles ----------------------------------------------------------------------------------

WIDE_TILE = 4096   # the embd and inner tiles of every wide run in docs/performance.md
VOCAB_TILE = 8192  # the vocabulary's tiles where it is larger


@dataclass
class Run:
    """What a run trains: ``sizes`` as a config's ``sizes()`` gives them ({key: (size,
    default tile)}, keys batch, seq, embd, head, inner, vocab), the ``batch`` and ``seq`` of its
    data where known, and ``run_bytes``, the memory estimate (None: not known)."""
    sizes: dict
    batch: int = None
    seq: int = None
    run_bytes: int = None
    tiles_given: dict = field(default_factory=dict)
    data_groups: int = 1  # under StarPU-MPI, the ranks that share the batch out
    head_dim: int = None  # default: embd / heads
    head_group: int = 1   # query heads that share a key/value head (grouped-query attention)


def run_of(config, batch=None, seq=None, run_bytes=None, given=None, data_groups=1):
    """The Run of a model family's config (nntile.models: sizes(), and the canonical
    head_dim, num_attention_heads, num_key_value_heads)."""
    return Run(config.sizes(), batch, seq, run_bytes, dict(given or {}), data_groups,
               head_dim=config.head_dim,
               head_group=config.num_attention_heads // config.num_key_value_heads)


def batch_tiles(settings, machine, past=False):
    """How many tiles the batch is cut into, and why: one per worker that runs in parallel,
    except on several GPUs that hold the run (not ``past`` their memory): one per GPU.

    On one GPU, one per CUDA worker: two workers then run two independent chains of tasks and
    the GPU idles between dependent tasks far less (GPT-2 124M on an H100, batch 8 in 2 tiles:
    12% idle instead of 28%, 0.956 -> 1.06x PyTorch; three tiles were slower; the XL shape
    and n_embd 8192 b4 were measured with two; docs/performance.md, "GPT-2 124M on the H100:
    where the step went"). Past its memory, with four workers, four (6.07B at batch 16: 7.50 s
    per step against 9.06 s with two tiles, "Activations dropped after backward"). Several
    GPUs past their memory: as many on each, so that a replica per GPU (nntile.parallel.
    DeviceReplicas, whose share of the batch is its GPU's) runs the chains of one GPU. Several
    GPUs that hold the run: one tile a replica, whose weight gradients then come from one
    GEMM over its whole share instead of two partial sums. With the MLP's tiles of the
    one-GPU rule, two H200s ran Llama-3.1-8B at 8x2048 from 20,782 to 22,007 tokens/s
    (1.16 to 1.21x FSDP2) and Llama-2-13B's shape from 1.17 to 1.22x FSDP2 + AC; the
    16-layer wide model ran 1.19x FSDP2 + AC on two GPUs of a four-GPU host (1.14x before),
    every other row of the node table 1.20x or more, and four H200s 1.23-1.52x FSDP2
    (docs/performance.md, "Several GPUs in one process"). On four GPUs, before the memory
    pool, one tile a GPU had lost 4% on the 8B shape and gained 6% on the 1B shape.
    On CPU workers, one per worker (``make train`` and bench/test_gpt2_cpu.py,
    docs/performance.md, "Tiles by situation")."""
    gpus = gpu_workers(machine, settings["ncuda"].value)
    if gpus > 1 and not past:
        return gpus, f"one per GPU ({gpus}), each a replica's share"
    if gpus:
        count = int(settings["workers_per_gpu"].value or 2)
        on = f"{count} on each of {gpus} GPUs" if gpus > 1 else f"{count}"
        return count * gpus, f"one per CUDA worker ({on})"
    cpus = settings["ncpu"].value
    count = max(1, int(cpus) if cpus is not None else machine.cores)
    return count, f"one per CPU worker ({count})"


def tiles(run, settings, machine):
    """{tiling key: Choice} of the tiles no one gave (``run.tiles_given`` wins where given).

    * vocab: tiles of 8192 where it is larger. A GEMM whose rows are not a multiple of 8
      elements (GPT-2's 50,257) falls off cuBLAS's tensor-core kernels: the head's GEMMs ran
      5x slower (124M bf16-mixed on an H100: 63 -> 51 ms of kernels per step; tiles of 4096
      and 16384 were no better), docs/performance.md, "GPT-2 124M on the H100".
    * embd: one tile below 6144, tiles of 4096 from there: a last tile of less than half
      the others runs its GEMMs at a loss (Llama-2-13B's 5120 as 4096 + 1024: 8 of its
      blocks 4% slower a step than in one tile; two tiles of 2560 were slower still; one
      H200, docs/performance.md, "Tiles by situation").
    * inner: the fewest equal tiles (multiples of 256) that keep an MLP weight tile within
      4096 x 8192 elements on GPUs that hold the run, 4096 x 4096 past GPU memory, where
      tiles move between host and GPU. Several GPUs kept 4096 x 4096 before, from a
      measurement that was the allocator's (Llama-3.1-8B at 8x2048 on two full H200s, GPU
      buffers from cudaMalloc: 17,720 tokens/s with 7168s against 20,931 with 4096s; with
      the memory pool, 21,186 and 21,159; "Tiles by situation"). On Llama-2-13B's shape on two
      H200s, 3 x 4608 and 2 x 6912 ran alike (10,311 and 10,303), and the wide model's
      32768 in 8192s, 16384s, or with n_embd whole, within 2% (10,966, 10,893, 10,784). On one
      GPU the larger tiles halve the tasks and the partial sums of the MLP's backward:
      Llama-3.1-8B's 14336 in 2 of 7168 instead of 3 of 4096 and one of 2048 (1.6-2.2% a
      step), n_embd 8192's 32768 in 8192s (1.0-1.2%), Llama-2-13B's 13824 in 3 of 4608 with
      its embd whole (one H200, "Tiles by situation").
      Both give the hand tiles of the wide runs past memory (n_embd 10240: 4096 and 4096,
      "Activations dropped after backward") and of GPT-2 124M and the XL shape (1600 wide,
      inner 6400), which ran fastest in one tile ("GPT-2 124M on the H100"). One tile of a
      6.07B model's MLP weight is 1.6 GiB.
    * head: as many heads as fill the embd tile (32 of 128 in 4096; all of 124M's 12).
    * seq: one tile (every measured run).
    * batch: ``batch_tiles`` tiles (under StarPU-MPI, that many for each data-parallel group
      of ranks, nntile.distributed): one per CUDA worker, or one per GPU where several GPUs
      hold the run.
    """
    sizes = run.sizes
    embd, n_head = sizes["embd"][0], sizes["head"][0]
    head_dim = run.head_dim or embd // n_head
    out = {}
    embd_tile = embd if 2 * embd < 3 * WIDE_TILE else WIDE_TILE
    out["embd"] = Choice(embd_tile, "one tile below 6144, tiles of 4096 from there")
    gpus = gpu_workers(machine, settings["ncuda"].value)
    past = past_gpu_memory(gpus, bytes_of_this_process(machine, run.run_bytes),
                           gpu_limit_bytes(settings))
    rows = WIDE_TILE if past else 2 * WIDE_TILE
    out["inner"] = Choice(equal_tiles(sizes["inner"][0], WIDE_TILE * rows // embd_tile),
                          f"the fewest equal weight tiles within 4096 x {rows}"
                          + (" past GPU memory" if past else ""))
    # whole groups of heads sharing a key/value head (the family's check_tiles)
    group = run.head_group
    out["head"] = Choice(max(group, min(n_head, embd_tile // head_dim) // group * group),
                         "the heads that fill an embd tile")
    out["vocab"] = Choice(min(sizes["vocab"][0], VOCAB_TILE),
                          "one tile up to 8192, tiles of 8192 beyond: cuBLAS's tensor-core "
                          "kernels")
    seq = run.seq or sizes["seq"][0]
    out["seq"] = Choice(seq, "one tile")
    count, why = batch_tiles(settings, machine, past)
    if run.data_groups > 1:  # each data-parallel group of ranks takes its own batch tiles
        count, why = count * run.data_groups, f"{why} on each of {run.data_groups} data groups"
    if run.batch is not None:
        out["batch"] = Choice(-(-run.batch // count), f"the batch in {count} tiles, {why}")
    else:
        out["batch"] = Choice(None, f"the batch in {count} tiles, {why}")
        out["batch_count"] = Choice(count, why)
    for key, value in run.tiles_given.items():
        if value is not None and key in out:
            out[key] = Choice(value, "given")
    if out["batch"].reason == "given":
        out.pop("batch_count", None)
    order = ("batch", "seq", "embd", "head", "inner", "vocab", "batch_count")
    return {key: out[key] for key in order if key in out}


def equal_tiles(size, most, unit=256):
    """The tile that cuts ``size`` into the fewest tiles of at most ``most``, of equal size
    rounded up to ``unit`` where cut (the last tile takes the rest)."""
    if size <= most:
        return size
    most = max(unit, most // unit * unit)
    count = -(-size // most)
    return -(-size // count // unit) * unit if size % count else size // count


def describe_tiles(choices):
    """One line: each tile and, grouped, why."""
    by_reason = {}
    for key, (value, reason) in choices.items():
        if key == "batch_count":
            continue
        by_reason.setdefault(reason, []).append(f"{key} {value if value is not None else '-'}")
    return "; ".join(f"{', '.join(keys)} ({reason})" for reason, keys in by_reason.items())


# ---- StarPU's environment -------------------------------------------------------------------

def _zero_or_one(text):
    return text.strip() in ("0", "1")


def _whole(minimum):
    def check(text):
        return re.fullmatch(r"\s*\d+\s*", text) is not None and int(text) >= minimum
    return check


# The STARPU_ variables nntile reads or sets, and what StarPU accepts without aborting (StarPU
# asserts on a negative STARPU_NCPU and on a STARPU_CALIBRATE that is not a number); and
# nntile's own runtime variable, checked as early.
STARPU_ENV = {
    "STARPU_NCPU": (_whole(0), "a whole number of CPU workers (0 or more)"),
    "STARPU_NCUDA": (_whole(0), "a whole number of GPUs (0 or more)"),
    "STARPU_NWORKER_PER_CUDA": (_whole(1), "a whole number of workers per GPU (1 or more)"),
    "STARPU_LIMIT_CUDA_MEM": (_whole(1), "a whole number of MiB (1 or more)"),
    "STARPU_LIMIT_CPU_MEM": (_whole(1), "a whole number of MiB (1 or more)"),
    "STARPU_CALIBRATE": (lambda t: t.strip() in ("0", "1", "2"), "0, 1 or 2"),
    "STARPU_CALIBRATE_MINIMUM": (_whole(1), "a whole number of measurements (1 or more)"),
    "STARPU_HISTORY_MAX_ERROR": (_whole(0), "a whole number of percent (0 or more)"),
    "STARPU_SILENT": (_whole(0), "0 or 1"),
    "STARPU_CATCH_SIGNALS": (_whole(0), "0 or 1"),
    "STARPU_MPI_NOBIND": (_whole(0), "0 or 1"),
    "NNTILE_PINNED_HOST_MEM": (_whole(0), "a whole number of MiB (0: pin as StarPU needs)"),
    "NNTILE_WRITE_BEHIND": (_zero_or_one,
                            "0 or 1 (1: copy each update's tiles to host memory after it)"),
    "NNTILE_CUDA_POOL": (_zero_or_one, "0 or 1 (1: GPU buffers from a memory pool of each device)"),
    "NNTILE_CPU_UPDATE": (lambda t: share(t) is not None,
                          "a share of the parameters from 0 to 1 (0: update on the GPUs)"),
    "STARPU_WORKERS_CUDAID": (lambda t: re.fullmatch(r"\s*\d+(\s*[, ]\s*\d+)*\s*", t)
                              is not None, "GPU numbers separated by commas or spaces"),
}


def share(text):
    """A share from 0 to 1 written as text or a number, else None."""
    try:
        value = float(text)
    except (TypeError, ValueError):
        return None
    return value if 0.0 <= value <= 1.0 else None


def check_starpu_env(env):
    """Raise ValueError, naming the variable and what it should be, for a STARPU_ variable that
    StarPU would abort on (or misread) at start-up."""
    for name, (valid, what) in STARPU_ENV.items():
        text = env.get(name)
        if text is not None and text != "" and not valid(text):
            raise ValueError(f"{name}={text!r} should be {what}")


def check_scheduler(name, schedulers):
    """Raise ValueError for a scheduler StarPU does not have (StarPU warns and falls back to
    its default), listing those it has."""
    if name not in schedulers:
        raise ValueError(f"scheduler {name!r} does not exist; StarPU has: "
                         f"{', '.join(schedulers)}")
