"""What the benches and the bench CLIs share: quick mode, side-by-side timing, model FLOPs,
our training step, and the RESULT line the CLIs end with."""
import contextlib
import json
import os
import time

QUICK = os.environ.get("NNTILE_BENCH_QUICK") == "1"
RESULT_PREFIX = "RESULT "


@contextlib.contextmanager
def paused(ctx):
    """StarPU's idle workers poll for tasks and take the cores (and keep issuing CUDA calls):
    stop them while another library computes."""
    ctx.wait()
    ctx.pause()
    try:
        yield
    finally:
        ctx.resume()


def seconds(fn):
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def interleaved(ctx, ours, reference, rounds):
    """Seconds per round of ours and of the reference, alternating so that both see the same
    machine state; the reference runs with StarPU paused."""
    t_ours, t_ref = [], []
    for _ in range(rounds):
        ctx.wait()
        t_ours.append(seconds(ours))
        with paused(ctx):
            t_ref.append(seconds(reference))
    return t_ours, t_ref


def model_flops_per_step(nparams, n_layer, n_embd, seq, tokens):
    """6 FLOPs per parameter per token (forward and backward of the weight products), plus
    the attention scores and their use, which no parameter counts: 12 L E T per token."""
    return 6 * nparams * tokens + 12 * n_layer * n_embd * seq * tokens


def train_step(ctx, model, opt, ids, targets, idle=(), optimizer_on=None):
    """One AdamW step of our GPT2LMHead, waited for. ``idle``: tensors StarPU is told, once
    the step is submitted, will not be used soon (starpu_data_wont_use); ``optimizer_on``:
    the kind of worker the update tasks must run on (None: any)."""
    from nntile import ops
    model.zero_grad()
    model.submit_loss(ids, targets)
    model.backward()
    with ops.task_workers(optimizer_on):
        opt.step()
    for tensor in idle:
        tensor.wont_use()
    ctx.wait()


def op_table(stats, steps, rows=25):
    """Context.op_stats() of ``steps`` steps as a text table: per op and kernel dtype, the
    tasks and milliseconds of execution per step and the share of all execution time."""
    total = sum(s["seconds"] for s in stats) or 1e-30
    lines = [f"{'op':<28}{'dtype':<30}{'tasks/step':>11}{'ms/step':>10}{'share':>8}"]
    for s in stats[:rows]:
        lines.append(f"{s['op']:<28}{s['dtype']:<30}{s['tasks'] / steps:>11.0f}"
                     f"{1e3 * s['seconds'] / steps:>10.2f}{100 * s['seconds'] / total:>7.1f}%")
    if len(stats) > rows:
        rest = sum(s["seconds"] for s in stats[rows:])
        lines.append(f"{'(the other ' + str(len(stats) - rows) + ')':<58}{'':>11}"
                     f"{1e3 * rest / steps:>10.2f}{100 * rest / total:>7.1f}%")
    return "\n".join(lines)


def print_result(result):
    print(RESULT_PREFIX + json.dumps(result), flush=True)


def parse_result(output):
    """The JSON of the last RESULT line of a CLI's output (bench/scale.py and ours), or None."""
    for line in reversed(output.splitlines()):
        if line.startswith(RESULT_PREFIX):
            return json.loads(line[len(RESULT_PREFIX):])
    return None
