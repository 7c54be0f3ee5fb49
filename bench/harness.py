"""What the benches and the bench CLIs share: quick mode, side-by-side timing, model FLOPs,
our training step, and the RESULT line the CLIs end with."""
import contextlib
import json
import os
import time

QUICK = os.environ.get("NNTILE_BENCH_QUICK") == "1"
RESULT_PREFIX = "RESULT "


@contextlib.contextmanager
def paused(ctx, blas_threads=None):
    """StarPU's idle workers poll for tasks and take the cores (and keep issuing CUDA calls):
    stop them while another library computes. ``blas_threads``: the threads numpy's BLAS
    calls get meanwhile, to match ours on as many CPU workers (None: its default, one per
    core)."""
    ctx.wait()
    ctx.pause()
    try:
        with blas_limit(blas_threads):
            yield
    finally:
        ctx.resume()


def blas_limit(threads):
    """threadpoolctl's limit: it sets every BLAS of the process, nntile's too, and sets them
    back after; nntile's runs no task meanwhile, StarPU being paused."""
    if threads is None:
        return contextlib.nullcontext()
    from threadpoolctl import threadpool_limits
    return threadpool_limits(threads, user_api="blas")


def seconds(fn):
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def reported_step(times, back_to_back):
    """The step a bench reports of its steps' seconds: the best after the first, each waited
    for; with the steps back to back (--pipeline), where one step's work runs on into the
    next, their mean after the first (the last waited for)."""
    if len(times) < 2:
        return times[0]
    return sum(times[1:]) / (len(times) - 1) if back_to_back else min(times[1:])


def interleaved(ctx, ours, reference, rounds, blas_threads=None):
    """Seconds per round of ours and of the reference, alternating so that both see the same
    machine state; the reference runs with StarPU paused (and numpy's BLAS on
    ``blas_threads``, see paused)."""
    t_ours, t_ref = [], []
    for _ in range(rounds):
        ctx.wait()
        t_ours.append(seconds(ours))
        with paused(ctx, blas_threads):
            t_ref.append(seconds(reference))
    return t_ours, t_ref


def model_flops_per_step(nparams, n_layer, n_embd, seq, tokens):
    """6 FLOPs per parameter per token (forward and backward of the weight products), plus
    the attention scores and their use, which no parameter counts: 12 L E T per token."""
    return 6 * nparams * tokens + 12 * n_layer * n_embd * seq * tokens


def program_tiling(config, batch, seq, given, ncpu, ncuda, dtype="fp32"):
    """The tiles nntile's programs take for this run (cli_common.default_tiles: one batch
    tile per worker, the policy's weight tiles), with those in ``given`` kept: a model built
    from tiles given by hand otherwise has the batch in one tile."""
    import argparse
    from nntile.cli_common import default_tiles
    runtime = argparse.Namespace(ncpu=ncpu, ncuda=ncuda, sched=None)
    chosen = default_tiles(config, batch, seq, given, runtime, dtype)
    return {**{key: choice.value for key, choice in chosen.items()}, **given}


def train_step(ctx, model, opt, ids, targets):
    """One AdamW step of a model built by a comparison bench, waited for (bench/scale.py
    takes nntile-train's step, nntile.training.TrainingLoop)."""
    model.zero_grad()
    model.submit_loss(ids, targets)
    model.backward()
    opt.step()
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


def kernel_name(full):
    """A CUDA kernel's name without its namespace, template and call arguments (cuBLAS's
    kernels keep their own names, cut to 48 characters)."""
    name = full.removeprefix("void ").replace("(anonymous namespace)", "")
    depth, out = 0, []
    for ch in name:
        if ch == "<":
            depth += 1
        elif ch == ">":
            depth -= 1
        elif ch == "(" and depth == 0:
            break
        elif depth == 0:
            out.append(ch)
    return "".join(out).rsplit("::", 1)[-1][:48]


def covered(spans):
    """Seconds in which at least one of the (start, stop) spans runs."""
    total, end = 0.0, None
    for start, stop in sorted(spans):
        if end is None or stop > end:
            total += stop - (start if end is None else max(start, end))
            end = stop
    return total


def gpu_time(fn, steps=1, trace_path=None):
    """Run ``fn`` ``steps`` times under PyTorch's profiler (CUPTI records every kernel of the
    process, StarPU's included) and summarise its trace (trace_summary)."""
    import tempfile
    import torch
    from torch.profiler import ProfilerActivity, profile
    def run():
        for _ in range(steps):
            fn()
        torch.cuda.synchronize()

    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        wall = seconds(run)
    with tempfile.NamedTemporaryFile(suffix=".json") as tmp:
        path = trace_path or tmp.name
        prof.export_chrome_trace(path)
        with open(path) as f:
            events = json.load(f)["traceEvents"]
    return trace_summary(events, wall)


def trace_summary(events, wall):
    """A CUPTI Chrome trace's events (microseconds) over ``wall`` seconds, as a dict: ``wall``,
    ``busy`` seconds in which the GPU ran at least one kernel or copy, ``kernels`` [(name,
    launches, seconds)] most time first, ``gaps`` [(seconds, kernel before, kernel after, start)]
    longest first: the GPU's idle spans between its first and last kernel, ``lanes``: seconds
    in which at least one kernel ran, one copy host to GPU ran, one copy GPU to host ran,
    ``first`` the first kernel's start (gaps end with the second's start),
    ``calls`` [(CUDA API call, count, seconds, longest)] of the host threads, most time first,
    and ``slow_calls`` [(seconds, CUDA API call, host thread, seconds into the trace)] of the
    calls over a millisecond, longest first: a thread blocked in one starves its GPU.
    What the GPU ran against the wall time tells work from waiting, the gaps' neighbours what
    it waited for, and the calls what the threads that feed it were doing (cudaFree, for
    one, waits for the whole device)."""
    spans, by_name, lanes, calls, slow = [], {}, {"kernels": [], "host to GPU": [],
                                                  "GPU to host": []}, {}, []
    for e in events:
        if "dur" not in e:
            continue
        start, stop = e["ts"] * 1e-6, (e["ts"] + e["dur"]) * 1e-6
        if e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset"):
            name = kernel_name(e["name"]) if e["cat"] == "kernel" else e["cat"]
            spans.append((start, stop, name))
            count, total = by_name.get(name, (0, 0.0))
            by_name[name] = (count + 1, total + e["dur"] * 1e-6)
            lane = ("kernels" if e["cat"] == "kernel" else "host to GPU" if "HtoD" in e["name"]
                    else "GPU to host" if "DtoH" in e["name"] else None)
            if lane:
                lanes[lane].append((start, stop))
        elif e.get("cat") in ("cuda_runtime", "cuda_driver"):
            count, total, longest = calls.get(e["name"], (0, 0.0, 0.0))
            calls[e["name"]] = (count + 1, total + stop - start, max(longest, stop - start))
            if stop - start > 1e-3:
                slow.append((stop - start, e["name"], e.get("tid"), start))
    busy, gaps, end, last = 0.0, [], None, None
    spans.sort()
    for start, stop, name in spans:  # the union of the spans: overlapping kernels once
        if end is not None and start > end:
            gaps.append((start - end, last, name, end))
        if end is None or stop > end:
            busy += stop - (start if end is None else max(start, end))
            end, last = stop, name
    first = spans[0][0] if spans else 0.0
    return dict(wall=wall, busy=busy, gaps=sorted(gaps, reverse=True), first=first,
                slow_calls=sorted(slow, reverse=True),
                lanes={lane: covered(s) for lane, s in lanes.items()},
                kernels=sorted(((n, c, t) for n, (c, t) in by_name.items()), key=lambda r: -r[2]),
                calls=sorted(((n, c, t, m) for n, (c, t, m) in calls.items()),
                             key=lambda r: -r[2]))


def gpu_time_table(label, t, steps=1, top=20):
    """gpu_time's result ``t`` as text, per step."""
    wall, busy, rows, gaps = t["wall"], t["busy"], t["kernels"], t["gaps"]
    total = sum(s for _, _, s in rows)
    small = [g for g, *_ in gaps if g < 50e-6]
    lines = [f"{label}: step {1e3 * wall / steps:.2f} ms, GPU running {1e3 * busy / steps:.2f} "
             f"ms ({100 * busy / wall:.0f}%), kernels and copies {1e3 * total / steps:.2f} ms, "
             f"{sum(c for _, c, _ in rows) / steps:.0f} launches",
             "  at least one running: " + ", ".join(
                 f"{lane} {1e3 * v / steps:.2f} ms ({100 * v / wall:.0f}%)"
                 for lane, v in t["lanes"].items()),
             f"  idle between kernels {1e3 * sum(g for g, *_ in gaps) / steps:.2f} ms in "
             f"{len(gaps) / steps:.0f} gaps; those under 50 us: {len(small) / steps:.0f}, "
             f"{1e3 * sum(small) / steps:.2f} ms; the longest:"]
    lines += [f"    {1e6 * g:8.0f} us  {a} -> {b}, {1e3 * (at - t['first']):.1f} ms in"
              for g, a, b, at in gaps[:6]]
    if t["calls"]:
        lines.append("  CUDA calls of the host threads (count, ms, longest ms): " + ", ".join(
            f"{n} {c / steps:.0f} {1e3 * s / steps:.1f} {1e3 * m:.1f}"
            for n, c, s, m in t["calls"][:12]))
    if t["slow_calls"]:
        slow = ", ".join(f"{1e3 * d:.1f} {n} {tid} {1e3 * (at - t['first']):.0f}"
                         for d, n, tid, at in t["slow_calls"][:16])
        lines.append(f"  calls over 1 ms (ms, call, thread, ms after the first kernel): {slow}")
    lines.append(f"  {'kernel':<50}{'launches':>9}{'ms':>9}")
    lines += [f"  {n:<50}{c / steps:>9.0f}{1e3 * s / steps:>9.2f}" for n, c, s in rows[:top]]
    if len(rows) > top:
        lines.append(f"  {'(the other ' + str(len(rows) - top) + ')':<59}"
                     f"{1e3 * sum(s for _, _, s in rows[top:]) / steps:>9.2f}")
    return "\n".join(lines)


def print_result(result):
    print(RESULT_PREFIX + json.dumps(result), flush=True)


def parse_result(output):
    """The JSON of the last RESULT line of a CLI's output (bench/scale.py and ours), or None."""
    for line in reversed(output.splitlines()):
        if line.startswith(RESULT_PREFIX):
            return json.loads(line[len(RESULT_PREFIX):])
    return None
