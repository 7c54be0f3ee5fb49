"""A run's plan before it runs: its memory by kind and by place, its tiles, whether it
recomputes activations, what crosses PCIe each step and how long a step should take
(``nntile-train --dry-run``, ``bench/scale.py --dry-run``).

Memory comes from nntile.memory (the declarations, no StarPU), on this machine or on one
described (nntile.machine.described). Time comes from a small model:

* compute: the model's FLOPs per step (``config.flops_per_token(seq) * tokens``), a quarter
  more with recomputation (most of each block's forward runs again in backward), at a
  sustained rate;
* transfers: the bytes live when backward starts that the GPUs cannot hold go out and come
  back each step (``pcie_floor``), ``TRAFFIC_OVER_FLOOR`` times that in practice, through
  host<->GPU links of ``PCIE_BYTES_S`` each way, one direction after the other;
* a step is both, less the ``OVERLAP`` share of the shorter that hides behind the other.

The constants are fitted to one H100 80GB with 128 GiB of host memory (2026-11-27,
bf16-mixed, sequence 2048; tests/test_dry_run.py holds the runs and checks each prediction
within 25%): Llama-3.1-8B batch 8 and 16 with recomputation (4.64 and 6.67 s, 76-105 GiB each
way per step), batch 2 without (3.71 s), Llama-3.2-3B batch 4 and 32, Llama-3.2-1B batch 8
and 64, and a 6.07B GPT-2 of n_embd 10240 (3.17 s, ~60 GiB each way). Other GPUs are taken
to be H100s; several GPUs to split the work evenly (not measured).
"""
from dataclasses import dataclass

from nntile import fit, machine
from nntile.memory import GiB, fmt_bytes

# Sustained rate of a GPU by compute dtype (FLOP/s of model FLOPs). bf16: fitted to the runs
# above (in GPU memory 456 TFLOP/s at Llama-3.2-1B batch 8; peak GEMMs reach 700-790). tf32:
# 228.5 TFLOP/s, the wide GPT-2 of n_embd 4096 in memory (docs/performance.md, "One GPU in
# memory").
# fp32 and fp64 (no tensor cores for fp32): not measured, 3/4 of the H100's 67 TFLOP/s peak.
GPU_FLOPS = {"bf16": 470e12, "tf32": 230e12, "fp32": 50e12, "fp64": 50e12}
# A CPU core: GPT-2 of n_embd 256 (bench/test_gpt2_cpu.py, 16M parameters) trained at 1,607
# tokens/s on the 2-core development machine: ~80 GFLOP/s a core (docs/performance.md,
# "CPU-only defaults"). fp64 is taken at half.
CPU_FLOPS_PER_CORE = 80e9
# Host<->GPU bandwidth of one GPU's link, each way: StarPU's calibration on the H100 host
# measured 53-54 GB/s.
PCIE_BYTES_S = 53.5e9
# Bytes moved each way per step over the floor (pcie_floor): 1.1-1.4x on the runs above
# (8B batch 8: 71.7 GiB floor, 76-95 moved; 3B batch 32: 21.2 and ~25; GPT-2: 51.7 and ~60).
TRAFFIC_OVER_FLOOR = 1.2
# The share of the shorter of compute and transfers that hides behind the other (fitted).
OVERLAP = 0.6
# Recomputation runs each block's forward again but for the MLP's output projection
# (PreNormBlock.recompute): forward is a third of training's FLOPs, and that projection about
# a quarter of a block's (Llama's down_proj: 27% of Llama-3.1-8B's block; GPT-2's c_proj a third).
RECOMPUTE_FLOPS = 1.25


def pcie_floor(live_at_turn, gpu_total, bandwidth):
    """Bytes that must cross the host<->GPU links each way per step, and the seconds that
    takes at least at the bandwidths ({"h2d", "d2h"}: bytes/s), with every task on the GPUs.
    Take the moment backward starts: of the bytes live then (all but backward's scratch, which
    is written before it is read), those the GPUs cannot hold are on the host. Each was
    written on a GPU since the same moment of the last step (forward, backward, the optimizer
    or zero_grad write every such tile once a step), so it went out; and backward or the
    optimizer reads it, so it comes in."""
    cross = max(0, live_at_turn - gpu_total) if gpu_total else 0
    if not cross or not bandwidth["h2d"] or not bandwidth["d2h"]:
        return cross, 0.0
    return cross, max(cross / bandwidth["h2d"], cross / bandwidth["d2h"])


def live_at_turn(est):
    """Bytes live when backward starts: all the run allocates but backward's scratch."""
    return est.alloc_bytes - est["workspaces"]


@dataclass
class Step:
    """A predicted step: its FLOPs (the model's, without recomputation's), seconds of
    compute and of transfers, the step's seconds, the bytes moved each way and the floor."""
    flops: float
    tokens: int
    compute_s: float
    transfer_s: float
    seconds: float
    moved: int
    floor: int
    floor_s: float

    @property
    def tokens_per_s(self):
        return self.tokens / self.seconds

    @property
    def flops_per_s(self):
        return self.flops / self.seconds


def compute_rate(dtype, ngpu, cores):
    """Sustained FLOP/s of the GPUs (an H100 each), or of ``cores`` CPU cores without."""
    from nntile.precision import precision_dtypes
    compute = precision_dtypes(dtype)[1]
    if ngpu:
        return GPU_FLOPS[compute] * ngpu
    return CPU_FLOPS_PER_CORE * cores * (0.5 if compute == "fp64" else 1)


def predict_step(flops, tokens, recomputed, rate, cross, ngpu):
    """The Step of ``flops`` model FLOPs at ``rate`` FLOP/s, with the share ``recomputed`` of
    the blocks recomputing theirs, and ``cross`` bytes of floor each way between host and
    ``ngpu`` GPUs."""
    compute_s = flops * (1 + (RECOMPUTE_FLOPS - 1) * recomputed) / rate
    bandwidth = PCIE_BYTES_S * max(ngpu, 1)
    floor_s = cross / bandwidth
    moved = int(cross * TRAFFIC_OVER_FLOOR)
    transfer_s = 2 * moved / bandwidth  # out, then in
    seconds = compute_s + transfer_s - OVERLAP * min(compute_s, transfer_s)
    return Step(flops, tokens, compute_s, transfer_s, seconds, moved, cross, floor_s)


@dataclass
class Plan:
    """What a run will take: the estimate (with preflight's recomputation Choice), the Budget
    it was checked against, the tile Choices, the predicted Step and where the machine came
    from."""
    est: object
    budget: dict
    tiles: dict
    step: Step
    machine: str

    def text(self, title):
        """The plan in a few aligned lines under ``title``."""
        rows = [("machine", self.machine), *self._memory(), ("tiles", self._tiles()),
                ("recompute", f"{self._recomputed()} ({self.est.recompute.reason})"),
                ("PCIe per step", self._pcie()), ("predicted step", self._time())]
        return "\n".join([title] + [f"  {name:<16} {value}" for name, value in rows])

    def _recomputed(self):
        config = self.est.args["config"]
        blocks = config.recomputed_blocks(self.est.recompute.value)
        if blocks in (0, config.num_hidden_layers):
            return "on" if blocks else "off"
        return f"the first {blocks} of {config.num_hidden_layers} blocks"

    def _memory(self):
        est, b = self.est, self.budget
        kinds = ", ".join(f"{c.replace('_', ' ')} {fmt_bytes(est[c])}" for c in est.keys())
        place = fit.by_place(est, b)
        where = ", ".join(f"{name} {fmt_bytes(place[key])} of {fmt_bytes(b[key])}"
                          for key, name in (("gpu", "GPU"), ("host", "host"), ("disk", "disk"))
                          if b[key] or key == "host")
        return [("memory by kind", f"{kinds}; total {fmt_bytes(est.total)} in {est.ntiles:,} "
                                   f"tiles (largest {fmt_bytes(est.largest_tile)})"),
                ("memory by place", f"{where} (held of what StarPU may use)")]

    def _tiles(self):
        from nntile.policy import describe_tiles
        return describe_tiles(self.tiles)

    def _pcie(self):
        s = self.step
        if not s.floor:
            return "none needed (the GPUs hold the run, or there are none)"
        return (f"in ~{s.moved / GiB:.0f} GiB, out ~{s.moved / GiB:.0f} GiB (floor "
                f"{s.floor / GiB:.1f} GiB each way, {s.floor_s:.2f} s at "
                f"{PCIE_BYTES_S / 1e9:.1f} GB/s a GPU)")

    def _time(self):
        s = self.step
        parts = f"compute {s.compute_s:.2f} s"
        if s.transfer_s:
            parts += f", transfers {s.transfer_s:.2f} s, {OVERLAP:.0%} of the shorter overlapped"
        return (f"{s.seconds:.2f} s ({parts}), "
                f"{s.tokens_per_s:,.0f} tokens/s, {s.flops_per_s / 1e12:.1f} TFLOP/s")


def describe_machine(b, ngpu, described):
    """One line: the GPUs, host memory and disk StarPU may use, and where they come from."""
    origin = "described (--machine)" if described else "this machine"
    gpus = f"{ngpu} GPU{'s' if ngpu > 1 else ''} (rates of an H100)" if ngpu else "no GPU"
    return f"{origin}, {gpus}: {b.summary()}"


def plan(est, config, batch, seq, dtype, tiles, ncuda=None, micro_batches=1):
    """The Plan of a run that preflight accepted (``est``, its recomputation chosen) on this
    process's machine (the described one where nntile.machine.described holds one): a step
    of ``micro_batches`` micro-batches of [batch, seq] (each crossing PCIe as a whole step
    does: an upper bound)."""
    b = fit.process_budget(ncuda)
    gpus = machine.gpus_of_this_process(ncuda)
    rate = compute_rate(dtype, len(gpus), machine.probe().cores)
    cross, _ = pcie_floor(live_at_turn(est), b["gpu"], {"h2d": 1, "d2h": 1})
    tokens = batch * seq
    recomputed = config.recomputed_blocks(est.recompute.value) / config.num_hidden_layers
    one = predict_step(config.flops_per_token(seq) * tokens, tokens, recomputed, rate, cross,
                       len(gpus))
    step = Step(*(v * micro_batches for v in (one.flops, one.tokens, one.compute_s,
                                              one.transfer_s, one.seconds, one.moved,
                                              one.floor, one.floor_s)))
    return Plan(est, b, tiles, step, describe_machine(b, len(gpus),
                                                      machine._described is not None))
