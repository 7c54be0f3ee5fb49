"""Train a wide GPT-2 or a Llama for a few steps and report throughput and memory (issue
"Scale").

    python3 bench/scale.py --n-embd 8192 --n-layer 4 --batch 4 --steps 3 [--ncuda 1]
        [--limit-cuda-mem MiB] [--sched dmdasd] [--tile-embd 2048] ...
        [--wont-use] [--disk-swap DIR [--disk-swap-mib N]] [--force]
    python3 bench/scale.py --model llama-3.1-8b --seq 2048 --batch 2 \
        --precision bf16-mixed --steps 3

GPT-2 (the default): n_head = n_embd / 128, sequence 1024, vocabulary 50257, untied. Llama
(--model llama of --n-embd, --n-inner, --n-layer, --n-head, --n-kv-head, or a named shape of
bench/shapes.py) as bench/deepspeed_ref.py trains it. AdamW, tf32 by default. Weights are
random (never zeros: matrix units run faster on zeros), written one tile at a time. Model
FLOPs: 6 N + 12 L E T per token for GPT-2, LlamaConfig.flops_per_token for Llama. Before
StarPU starts, the memory the run needs is estimated (nntile.memory) and compared with what
StarPU may use; a run that cannot fit exits with code 2 unless --force. Prints one JSON line at
the end.

Memory experiments: --wont-use tells StarPU after each optimizer step that gradients and Adam
states will not be used soon (starpu_data_wont_use); --disk-swap DIR gives StarPU a disk
memory node (STARPU_DISK_SWAP) to evict host memory to, of --disk-swap-mib MiB.
"""
import argparse
import os
import resource
import sys
import time

import numpy as np

import timeline
from harness import (gpu_time, gpu_time_table, model_flops_per_step, print_result,
                     reported_step, seconds)
from shapes import add_model_args, llama_config, resolve_model
# nntile.memory needs no running StarPU; the rest is imported once the environment is set
from nntile import fit, memory
from nntile.cli_common import (CLIError, add_disk_swap_args, add_dry_run_args,
                               add_recompute_arg, add_verbose_arg, apply_disk_swap,
                               calibration_note, default_tiles, launcher_rank, planned_machine,
                               starpu_messages)
from nntile.plan import live_at_turn, pcie_floor


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_model_args(p)
    p.add_argument("--precision", "--dtype", dest="dtype", default="tf32",
                   help="tf32 (default), fp32, bf16 or bf16-mixed")
    p.add_argument("--attention", default="fused", help="fused (default) or unfused "
                   "(GPT2Config.attention)")
    p.add_argument("--ncpu", type=int)
    p.add_argument("--ncuda", type=int)
    p.add_argument("--sched")
    p.add_argument("--device-replicas", choices=("on", "off"),
                   help="one replica of the model per GPU of the process (default: on with "
                        "several GPUs; off: any GPU runs any task)")
    p.add_argument("--limit-cuda-mem", type=int, help="MiB per GPU (STARPU_LIMIT_CUDA_MEM)")
    p.add_argument("--limit-cpu-mem", type=int, help="MiB of host memory (STARPU_LIMIT_CPU_MEM)")
    for key in ("batch", "seq", "embd", "head", "inner", "vocab"):
        p.add_argument(f"--tile-{key}", type=int)
    p.add_argument("--distribution", default="replicas",
                   help="under mpirun: replicas, data, tensor or mixed[:DxT] (see "
                   "nntile.distributed)")
    p.add_argument("--force", action="store_true",
                   help="run even when the estimate says it cannot fit")
    p.add_argument("--wont-use", action="store_true",
                   help="starpu_data_wont_use on gradients and optimizer states after each step")
    p.add_argument("--no-layer-priorities", dest="layer_priorities", action="store_false",
                   help="tasks without priorities (default: in layer order, "
                        "CausalLM.layer_priorities)")
    p.add_argument("--keep-activations", dest="free_activations", action="store_false",
                   help="keep activations valid after backward (default: dropped once read, "
                        "CausalLM.free_activations)")
    add_recompute_arg(p)
    p.add_argument("--optimizer-on", choices=("cpu", "cuda"),
                   help="run the AdamW tasks only on this kind of worker (cpu needs --ncpu)")
    p.add_argument("--pipeline", action="store_true", help="submit the steps after the first "
                   "back to back, as nntile-train does: the next step's forward may start "
                   "while the update runs; the step is then the mean of the steps after the "
                   "first, the last waited for (default: each step waited for, the best)")
    p.add_argument("--timeline", metavar="PATH", help="record the last step task by task: "
                   "print where the GPU's time went (bench/timeline.py) and write a Chrome "
                   "trace to PATH")
    p.add_argument("--cupti", metavar="PATH", help="run the last step under PyTorch's "
                   "profiler (CUPTI): print what the GPU ran, kernels and copies, and write "
                   "its Chrome trace to PATH (with --timeline, the step before the last)")
    add_disk_swap_args(p)
    add_verbose_arg(p)
    add_dry_run_args(p)
    args = p.parse_args(argv)
    args.timeline, args.cupti = (per_rank(path) for path in (args.timeline, args.cupti))
    for flag, path in (("--timeline", args.timeline), ("--cupti", args.cupti)):
        if path and os.path.exists(path):  # a trace written once is not replaced
            p.error(f"{flag} {path}: it exists; remove it or name another file")
        if path and args.pipeline:  # a traced step starts with no task in flight
            p.error(f"{flag} traces a step waited for; leave out --pipeline")
    return resolve_model(args)


def per_rank(path):
    """Under mpirun each rank writes its own trace: trace.json becomes trace.rank1.json."""
    rank, nranks = launcher_rank()
    if not path or nranks == 1:
        return path
    root, ext = os.path.splitext(path)
    return f"{root}.rank{rank}{ext}"


class RandomPool:
    """Normal(0, scale) values for many tiles at memcpy speed: drawing billions of fresh
    samples would take minutes, so tiles are cut from one pool (the values only have to be
    non-zero and varied: matrix units run faster on zeros). Where a tile is cut depends only
    on its tensor and position, so every rank count gives the same weights."""

    def __init__(self, rng, scale=0.02, size=1 << 24):
        self.pool = scale * rng.standard_normal(2 * size, dtype=np.float32)
        self.size = size

    def reader(self, tensor_index):
        def read(slices):
            shape = tuple(s.stop - s.start for s in slices)
            n = int(np.prod(shape))
            out = np.empty(n, dtype=np.float32)
            start = (tensor_index * 1000003
                     + sum((k + 1) * 7919 * s.start for k, s in enumerate(slices))) % self.size
            done = 0
            while done < n:
                take = min(n - done, self.size)
                out[done:done + take] = self.pool[start:start + take]
                start = (start + take + 7919) % self.size
                done += take
            return out.reshape(shape)
        return read


def show_memory(ctx, say):
    """StarPU's own accounting per memory node, to see which one fills up; returns the host
    bytes in use (host memory fills with copies until a GPU needs room: see nntile.memory)."""
    gib = 2 ** 30
    nodes = ctx.memory_nodes()
    say("StarPU memory: " + "; ".join(
        f"{n['node']} used {n['used'] / gib:.1f} of {n['total'] / gib:.1f} GiB"
        for n in nodes), flush=True)
    return sum(n["used"] for n in nodes if n["node"].startswith("NUMA"))


def traffic(bus):
    """Bytes a step moved from host to GPUs, from GPUs to host and between GPUs (bus_stats),
    and the calibrated host<->GPU bandwidth of all GPU links together (bytes/s each way)."""
    def kind(name):
        return "gpu" if name.startswith("CUDA") else "host" if name.startswith("NUMA") else name
    moved = {"h2d": 0, "d2h": 0, "d2d": 0}
    bandwidth = {"h2d": 0.0, "d2h": 0.0}
    for b in bus:
        way = {("host", "gpu"): "h2d", ("gpu", "host"): "d2h",
               ("gpu", "gpu"): "d2d"}.get((kind(b["src"]), kind(b["dst"])))
        if way:
            moved[way] += b["bytes"]
            if way in bandwidth:
                bandwidth[way] += b["bandwidth"]
    return moved, bandwidth


def main(argv=None):
    args = parse_args(argv)
    try:
        with planned_machine(args):  # --machine: the run planned for another machine
            return run(args)
    except CLIError as exc:
        print(f"scale.py: error: {exc}", file=sys.stderr, flush=True)
        return 2


INIT = "tiles"  # the weights are written from numpy tile by tile (nntile.memory.estimate)


def model_config(args):
    """The config of the model the flags describe: a wide GPT-2 or a Llama."""
    if args.model != "gpt2":
        return llama_config(args, args.attention)
    from nntile.models import GPT2Config
    return GPT2Config(vocab_size=args.vocab, n_positions=max(1024, args.seq), n_embd=args.n_embd,
                      n_layer=args.n_layer, n_head=args.n_head, tie_word_embeddings=False,
                      attention=args.attention)


def write_weights(model, rng):
    """Random weights (never zeros: matrix units run faster on zeros), written tile by tile
    (under MPI each rank writes only the tiles it owns), and ones for the norms' weights;
    the bf16 copies that bf16-mixed GEMMs read refreshed from them."""
    pool = RandomPool(rng)
    for index, (name, param) in enumerate(model.named_parameters()):
        if name.endswith("weight") and len(param.value.shape) > 1:
            param.value.write_tiles(pool.reader(index))
        elif name.endswith("weight"):
            param.value.fill(1.0)
    model.refresh_copies()


def checked_estimate(args, config, tiling, distribution):
    """(the estimate of this rank's share, with its recomputation chosen; the disk swap's
    backend) of a run that fits, else a CLIError (under mpirun all ranks agree)."""
    backend = apply_disk_swap(args, lambda: memory.estimate(config, args.batch, args.seq,
                                                            tiling, args.dtype, init=INIT))
    if args.force:
        os.environ["NNTILE_MEMORY_CHECK"] = "0"
    return fit.preflight(config, args.batch, args.seq, tiling, args.dtype, ncuda=args.ncuda,
                         init=INIT, prog="scale.py", quiet_below=0, distribution=distribution,
                         recompute=args.recompute), backend


def timed_step(ctx, loop, batch, step, args, say):
    """(seconds, loss) of training step ``step`` (from 0), waited for: the wall clock, or
    CUPTI's with --cupti for the last step (the one before it with --timeline too: CUPTI's
    set-up and export would fall inside the timeline's window), the last step recorded task
    by task with --timeline."""
    traced = args.timeline and step == args.steps - 1
    under_cupti = args.cupti and step == args.steps - 1 - bool(args.timeline)
    if traced:
        ctx.record_timeline()
        t0 = ctx.clock_us()
    result = []

    waited = not args.pipeline or step in (0, args.steps - 1)

    def step_fn():
        result.append(loop.step(lambda: batch))
        if waited:
            ctx.wait()

    if under_cupti:
        cupti = gpu_time(step_fn, 1, args.cupti)
        taken = cupti["wall"]
        say(gpu_time_table(f"step {step + 1} (CUPTI)", cupti), flush=True)
    else:
        taken = seconds(step_fn)
    if traced:
        t1 = ctx.clock_us()
        table, dropped = ctx.timeline()
        say(timeline.report(table, t0, t1, dropped), flush=True)
        timeline.write_trace(table, args.timeline, t0)
    return taken, result[-1].loss


def collective_note(ctx, replicas, sent, reduced):
    """What the last step moved between ranks, for its line."""
    if reduced and replicas.sharding is not None:
        return (f", gradients reduced and weights broadcast: {reduced[-1] / 2**30:.2f} "
                "GiB of tiles a rank")
    if reduced:  # a ring all-reduce sends 2 (N-1)/N of them from each rank
        ring = 2 * (ctx.world_size - 1) / ctx.world_size * reduced[-1]
        return (f", all-reduced {reduced[-1] / 2**30:.2f} GiB of gradients a rank "
                f"(ring: {ring / 2**30:.2f} GiB sent a rank)")
    return f", MPI moved {sent[-1] / 2**30:.2f} GiB" if sent else ""


def build(ctx, args, config, tiling, est, rng, say):
    """(the model with random weights, its TrainingLoop, seconds to build and write them,
    seconds waited for host memory pinned ahead, host memory in use) on the running Context,
    ready for step 1."""
    from nntile.models import model_class
    from nntile.nn.warm_up import before_first_step
    from nntile.training import TrainingLoop
    t0 = time.perf_counter()
    model = model_class(config.model_type)(config, tiling, args.dtype,
                                           recompute=est.recompute.value)
    model.layer_priorities = args.layer_priorities
    model.free_activations = args.free_activations
    write_weights(model, rng)
    # nntile-train's step; the model itself unless ranks are replicas (replicas:zero:
    # the optimizer updates this rank's tiles)
    loop = TrainingLoop(model, ctx, optimizer_on=args.optimizer_on, lr=1e-4,
                        max_grad_norm=1.0)
    ctx.wait()
    init_s = time.perf_counter() - t0
    say(f"built and initialised in {init_s:.1f} s (weights written "
        f"from numpy per {INIT})", flush=True)
    pin_wait_s, attention_s, shapes = before_first_step(model, args.batch, args.seq)
    arena = ctx.host_arena_stats()
    if arena:
        say(f"host memory pinned ahead: {arena['pinned'] / 2**30:.1f} GiB, "
            f"{pin_wait_s:.1f} s more waited for it before step 1", flush=True)
    if shapes:
        say(f"attention's GPU code prepared in {attention_s:.1f} s", flush=True)
    host_at_start = show_memory(ctx, say)
    return model, loop, init_s, pin_wait_s, host_at_start


def planned(args):
    """(config, tile choices, tiling) of the run the flags describe: the tiles no flag gives
    chosen for this machine and run, as nntile-train does; STARPU_LIMIT_* from their flags."""
    for flag, variable in ((args.limit_cuda_mem, "STARPU_LIMIT_CUDA_MEM"),
                           (args.limit_cpu_mem, "STARPU_LIMIT_CPU_MEM")):
        if flag:
            os.environ[variable] = str(flag)
    config = model_config(args)
    given = {k: getattr(args, f"tile_{k}") for k in ("batch", "seq", "embd", "head", "inner", "vocab")
             if getattr(args, f"tile_{k}")}
    choices = default_tiles(config, args.batch, args.seq, given, args, args.dtype)
    tiling = {k: v for k, (v, _) in choices.items() if k != "batch_count"}
    return config, choices, tiling


def flops_of_step(args, config):
    tokens = args.batch * args.seq
    if args.model == "gpt2":
        return model_flops_per_step(config.num_parameters(), args.n_layer, args.n_embd,
                                    args.seq, tokens)
    return config.flops_per_token(args.seq) * tokens


class Steps:
    """What each step took and moved, as measured after it."""

    def __init__(self, ctx, replicas, host_at_start):
        self.ctx, self.replicas, self.host_at_start = ctx, replicas, host_at_start
        self.times, self.losses, self.sent, self.reduced = [], [], [], []
        self.moved, self.busy, self.host_used = [], [], []
        self.bandwidth, self.measured = None, None
        self._sent_before = 0

    def start(self):
        ctx = self.ctx
        self._sent_before = sum(ctx.bytes_sent()) if ctx.owner_ranks > 1 else 0
        ctx.bus_stats(), ctx.worker_stats()  # both count from here

    def record(self, seconds_taken, loss, say):
        ctx = self.ctx
        self.times.append(seconds_taken)
        self.losses.append(loss)
        step_moved, self.bandwidth = traffic(ctx.bus_stats())
        self.moved.append(step_moved)
        gpus = [w for w in ctx.worker_stats() if w["worker"].startswith("CUDA")]
        self.busy.append(sum(w["executing_s"] for w in gpus)
                         / max(1e-9, sum(w["total_s"] for w in gpus)))
        if ctx.owner_ranks > 1:  # bytes all ranks sent through StarPU-MPI in this step
            self.sent.append(ctx.comm.allreduce(sum(ctx.bytes_sent()) - self._sent_before))
        if ctx.replicated:  # the gradients each rank handed to the all-reduce
            self.reduced.append(self.replicas.bytes_reduced())
        self.host_used.append(show_memory(ctx, say))

    def line(self, flops_per_step):
        """The last step's line."""
        # host memory StarPU allocated in this step (pinned, where there are GPUs: slow to
        # allocate; docs/performance.md, "Step 1 past GPU memory")
        before = self.host_used[-2] if len(self.host_used) > 1 else self.host_at_start
        grew = self.host_used[-1] - before
        mpi = collective_note(self.ctx, self.replicas, self.sent, self.reduced)
        arena = self.ctx.host_arena_stats()  # host memory pinned ahead (nntile.policy)
        pinned = (f"; pinned ahead {arena['pinned'] / 2**30:.1f} GiB, waited for "
                  f"{arena['wait_s']:.2f} s in all" if arena else "")
        seconds_taken, moved = self.times[-1], self.moved[-1]
        return (f"step {len(self.times)}: {seconds_taken:.2f} s, loss {self.losses[-1]:.4f}, "
                f"{flops_per_step / seconds_taken / 1e12:.1f} TFLOP/s{mpi}; host->GPU "
                f"{moved['h2d'] / 2**30:.1f} GiB, GPU->host {moved['d2h'] / 2**30:.1f}"
                f" GiB, GPU->GPU {moved['d2d'] / 2**30:.1f} GiB; GPUs busy "
                f"{100 * self.busy[-1]:.0f}%; host memory in use {grew / 2**30:+.1f} GiB{pinned}")


def run_steps(ctx, loop, args, est, host_at_start, flops_per_step, rng, say, after_step):
    """Train args.steps steps on random tokens (after_step() after each); their Steps."""
    ids = rng.integers(0, args.vocab, (args.batch, args.seq))
    targets = rng.integers(0, args.vocab, (args.batch, args.seq))
    steps = Steps(ctx, loop.replicas, host_at_start)
    ended = None
    for step in range(args.steps):
        steps.start()
        seconds_taken, loss = timed_step(ctx, loop, (ids, targets), step, args, say)
        if args.pipeline and ended is not None:  # since the last step's loss was read
            seconds_taken = time.perf_counter() - ended
        ended = time.perf_counter()
        after_step()
        steps.record(seconds_taken, loss, say)
        if steps.measured is None:  # every tensor exists after the first step
            steps.measured = memory.live_tensor_bytes()[1]
            say(f"registered tensors: {memory.fmt_bytes(steps.measured)} "
                f"(estimate {memory.fmt_bytes(est.whole.total)})", flush=True)
        say(steps.line(flops_per_step), flush=True)
    return steps


def say_pcie_floor(est, gpu_total, bandwidth, step_s, say):
    """(bytes across host<->GPU links each way, the seconds that takes at least); said
    where it is not zero."""
    cross, floor_s = pcie_floor(live_at_turn(est), gpu_total, bandwidth)
    if floor_s:
        say(f"PCIe floor: {cross / 2**30:.1f} GiB live when backward starts that the GPUs "
            f"cannot hold, out and in each step at {bandwidth['h2d'] / 1e9:.1f} / "
            f"{bandwidth['d2h'] / 1e9:.1f} GB/s: {floor_s:.2f} s; step {step_s:.2f} s "
            f"= {step_s / floor_s:.1f}x the floor", flush=True)
    return cross, floor_s


def result_of(args, config, ctx, est, backend, steps, flops_per_step, tiling, built, say):
    """The RESULT record of the run."""
    init_s, pin_wait_s = built
    ibest = steps.times.index(min(steps.times[1:])) if len(steps.times) > 1 else 0
    step_s = reported_step(steps.times, args.pipeline)
    gpu_total = sum(n["total"] for n in ctx.memory_nodes() if n["node"].startswith("CUDA"))
    cross, floor_s = say_pcie_floor(est, gpu_total, steps.bandwidth, step_s, say)
    tokens = args.batch * args.seq
    return dict(model=args.model, n_embd=args.n_embd, n_layer=args.n_layer,
                params=config.num_parameters(), flops_per_step=flops_per_step,
                batch=args.batch, seq=args.seq, step_s=step_s, tokens_per_s=tokens / step_s,
                tflops=flops_per_step / step_s / 1e12, losses=steps.losses,
                max_rss_gib=resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20,
                estimate_gib=est.whole.total / 2**30,
                rank_need_gib=est.total / 2**30, measured_gib=(steps.measured or 0) / 2**30,
                wont_use=args.wont_use, layer_priorities=args.layer_priorities,
                free_activations=args.free_activations, recompute=est.recompute.value,
                optimizer_on=args.optimizer_on, disk_swap=args.disk_swap, disk_backend=backend,
                workers=ctx.workers, tiling=tiling, ranks=ctx.world_size,
                distribution=repr(ctx.distribution) if ctx.world_size > 1 else None,
                mpi_bytes_per_step=steps.sent[1:] or steps.sent, steps_s=steps.times,
                allreduce_bytes_per_step=steps.reduced[1:] or steps.reduced,
                gpu_busy=steps.busy[ibest],
                moved_gib={k: v / 2**30 for k, v in steps.moved[ibest].items()},
                host_gpu_gbps={k: v / 1e9 for k, v in steps.bandwidth.items()},
                gpu_gib=gpu_total / 2**30, pcie_cross_gib=cross / 2**30,
                pcie_floor_s=floor_s, host_used_gib=[h / 2**30 for h in steps.host_used],
                host_at_start_gib=steps.host_at_start / 2**30, init_s=init_s,
                pin_wait_s=pin_wait_s, pinned_ahead=ctx.host_arena_stats())


def run(args):
    from nntile.distributed import Distribution
    from nntile.policy import describe_tiles
    config, choices, tiling = planned(args)
    nparams = config.num_parameters()
    flops_per_step = flops_of_step(args, config)
    rank, nranks = launcher_rank()
    say = print if rank == 0 else (lambda *a, **k: None)
    say(f"model: {args.model}, {config.describe()}, {nparams / 1e9:.2f}B parameters, "
        f"{16 * nparams / 2**30:.1f} GiB for weights+grads+Adam, tiling {tiling}, "
        f"{args.attention} attention", flush=True)
    say(f"tiles: {describe_tiles(choices)}", flush=True)
    distribution = Distribution.parse(args.distribution, nranks) if nranks > 1 else None
    try:
        est, backend = checked_estimate(args, config, tiling, distribution)
    except CLIError as exc:
        print(f"scale.py: error: {exc} (--force runs it anyway)", file=sys.stderr, flush=True)
        return 2
    if args.dry_run:  # the plan, without starting StarPU
        from nntile.plan import plan
        print(plan(est, config, args.batch, args.seq, args.dtype, choices, args.ncuda)
              .text(f"scale.py --dry-run: {args.model}, batch {args.batch} x {args.seq}"),
              flush=True)
        return 0

    import nntile
    rng = np.random.default_rng(0)
    starpu_messages(args.verbose)
    with nntile.Context(ncpu=args.ncpu, ncuda=args.ncuda, sched=args.sched,
                        limit_cuda_mem=args.limit_cuda_mem, limit_cpu_mem=args.limit_cpu_mem,
                        verbose=args.verbose and rank == 0, distribution=distribution,
                        mpi_stats=nranks > 1, run_bytes=est.total, training=args.dtype,
                        run_breakdown=est.breakdown, run_batch=args.batch,
                        device_replicas=None if args.device_replicas is None
                        else args.device_replicas == "on") as ctx:
        if not args.verbose:
            say(ctx.describe(verbose=False), flush=True)
        note_calibration = calibration_note(ctx, lambda line: say(line, flush=True),
                                            args.verbose)
        model, loop, init_s, pin_wait_s, host_at_start = build(ctx, args, config, tiling,
                                                                est, rng, say)
        if args.wont_use:
            loop.idle = ([p.grad for _, p in model.named_parameters()]
                         + list(loop.opt.state_tensors().values()))
        say(f"recompute: {est.recompute.value} ({est.recompute.reason})", flush=True)
        ctx.profiling(True)  # worker busy shares and bus bytes per step
        steps = run_steps(ctx, loop, args, est, host_at_start, flops_per_step, rng, say,
                          note_calibration)
        result = result_of(args, config, ctx, est, backend, steps, flops_per_step, tiling,
                           (init_s, pin_wait_s), say)
        if rank == 0:
            print_result(result)


if __name__ == "__main__":
    sys.exit(main())
