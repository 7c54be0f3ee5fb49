"""Context.timeline(): StarPU's dates for every finished task, and bench/timeline.py's split of
a window into what the GPU was doing, against a per-microsecond count."""
import os
import sys

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

import nntile
from nntile import ops

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                                "bench"))
import timeline  # noqa: E402


def test_every_task_is_recorded_with_dates_in_order(ctx):
    a = nntile.Tensor((6, 6), (4, 4), "fp32")  # 4 tiles
    c = nntile.Tensor((6, 6), (4, 4), "fp32")
    one = nntile.Tensor((4,), (4,), "fp32")
    ctx.wait()
    ctx.profiling(True)
    try:
        ctx.record_timeline()
        t0 = ctx.clock_us()
        ops.fill(1.0, a)
        ops.gemm(1.0, a, "N", a, "N", 0.0, c)  # 4 C tiles x 2 K tiles
        ops.fill(1.0, one)
        ops.scal(2.0, one)
        ctx.wait()
        t1 = ctx.clock_us()
        table, dropped = ctx.timeline()
    finally:
        ctx.profiling(False)
    assert dropped == 0
    assert sorted(table["op"]) == ["fill"] * 5 + ["gemm"] * 8 + ["scal"]
    assert set(table["worker"]) <= set(ctx.workers)
    order = ["submitted", "pushed", "popped", "fetch_start", "fetch_end", "start", "end"]
    for before, after in zip(order, order[1:]):
        assert (table[before] <= table[after]).all(), (before, after)
    assert (table["submitted"] >= t0).all() and (table["end"] <= t1).all()
    # the scaling of the one-tile tensor waits for its fill, the last fill submitted
    fill = table[table["op"] == "fill"]
    scal = table[table["op"] == "scal"]
    assert scal["start"][0] >= fill["end"][np.argmax(fill["submitted"])]
    with pytest.raises(RuntimeError, match="record_timeline"):
        ctx.timeline()


def test_tasks_past_the_capacity_are_counted_not_recorded(ctx):
    a = nntile.Tensor((8,), (2,), "fp32")
    ctx.wait()
    ctx.profiling(True)
    try:
        ctx.record_timeline(capacity=3)
        ops.fill(2.0, a)  # 4 tasks
        ctx.wait()
        table, dropped = ctx.timeline()
    finally:
        ctx.profiling(False)
    assert len(table) == 3 and dropped == 1
    with pytest.raises(ValueError, match="positive"):
        ctx.record_timeline(capacity=0)


def _table(rows):
    table = np.zeros(len(rows), dtype=[("op", object), ("dtype", object), ("worker", object)]
                     + [(f, "f8") for f in ("submitted", "pushed", "popped", "fetch_start",
                                            "fetch_end", "start", "end")])
    for i, (worker, pushed, fetch_start, fetch_end, start, end) in enumerate(rows):
        table[i] = ("op", "fp32", worker, pushed, pushed, fetch_start, fetch_start, fetch_end,
                    start, end)
    return table


def _reference(rows, t0, t1):
    """The state of each microsecond, by the definition in bench/timeline.py."""
    out = dict.fromkeys(timeline.STATES, 0)
    for t in range(t0, t1):
        def any_(cond):
            return any(cond(r) for r in rows)
        if any_(lambda r: r[0].startswith("CUDA") and r[4] <= t < r[5]):
            out["running"] += 1
        elif any_(lambda r: r[0].startswith("CUDA") and r[2] <= t < r[3]):
            out["fetching"] += 1
        elif any_(lambda r: r[0].startswith("CUDA") and r[1] <= t < r[4]):
            out["queued"] += 1
        elif any_(lambda r: not r[0].startswith("CUDA") and r[4] <= t < r[5]):
            out["cpu"] += 1
        else:
            out["starved"] += 1
    return out


@st.composite
def tasks(draw):
    """Tasks whose dates fall on multiples of the split's resolution."""
    rows = []
    for _ in range(draw(st.integers(0, 6))):
        worker = draw(st.sampled_from(["CUDA 0", "CUDA 1", "CPU 0"]))
        dates = sorted(draw(st.lists(st.integers(0, 40), min_size=4, max_size=4)))
        pushed, fetch_start, fetch_end, start = dates
        end = start + draw(st.integers(0, 10))
        rows.append((worker,) + tuple(int(timeline.BIN_US) * d
                                      for d in (pushed, fetch_start, fetch_end, start, end)))
    return rows


@settings(max_examples=60, deadline=None)
@given(tasks(), st.integers(0, 20), st.integers(1, 40))
def test_the_split_matches_a_count_of_each_microsecond(rows, start, length):
    step = int(timeline.BIN_US)
    t0, t1 = start * step, (start + length) * step
    got = timeline.split(_table(rows), t0, t1)
    want = _reference(rows, t0, t1)
    assert got == pytest.approx({s: v * 1e-6 for s, v in want.items()}, abs=1e-12)
    assert sum(got.values()) == pytest.approx((t1 - t0) * 1e-6)


@settings(max_examples=60, deadline=None)
@given(tasks(), st.lists(st.booleans(), min_size=6, max_size=6))
def test_the_collectives_share_beside_other_tasks_matches_a_count(rows, collective):
    """bench/timeline.beside_others against each bin counted by hand."""
    table = _table(rows)
    table["op"] = ["collective" if c else "gemm" for c in collective[:len(rows)]]
    t0, t1, step = 0, 60 * int(timeline.BIN_US), int(timeline.BIN_US)
    ours = beside = 0
    for t in range(t0, t1, step):
        runs = [r["op"] for r in table if r["start"] <= t < r["end"]]
        if "collective" in runs:
            ours += 1
            beside += any(op != "collective" for op in runs)
    seconds, share = timeline.beside_others(table, t0, t1)
    assert seconds == pytest.approx(ours * step * 1e-6)
    assert share == pytest.approx(beside / ours if ours else 0.0)


@st.composite
def cupti_events(draw):
    """A CUPTI trace's kernels, copies each way, memsets and CUDA API calls, whole microseconds."""
    kinds = [("kernel", "void k<float>(int)"), ("gpu_memcpy", "Memcpy HtoD (Pinned -> Device)"),
             ("gpu_memcpy", "Memcpy DtoH (Device -> Pinned)"), ("gpu_memset", "Memset (Device)"),
             ("cuda_runtime", "cudaFree"), ("cuda_runtime", "cudaLaunchKernel")]
    return [dict(cat=cat, name=name, ts=draw(st.integers(0, 60)), dur=draw(st.integers(0, 20)))
            for cat, name in draw(st.lists(st.sampled_from(kinds), max_size=12))]


@settings(max_examples=60, deadline=None)
@given(cupti_events())
def test_the_trace_summary_matches_a_count_of_each_microsecond(events):
    from harness import trace_summary
    got = trace_summary(events, wall=1.0)

    def seconds_of(keep):
        return 1e-6 * len({t for e in events if keep(e) for t in range(e["ts"], e["ts"] + e["dur"])})
    assert got["lanes"]["kernels"] == pytest.approx(seconds_of(lambda e: e["cat"] == "kernel"))
    assert got["lanes"]["host to GPU"] == pytest.approx(seconds_of(lambda e: "HtoD" in e["name"]))
    assert got["lanes"]["GPU to host"] == pytest.approx(seconds_of(lambda e: "DtoH" in e["name"]))
    assert got["busy"] == pytest.approx(seconds_of(lambda e: not e["cat"].startswith("cuda")))
    frees = [e["dur"] for e in events if e["name"] == "cudaFree"]
    calls = {name: rest for name, *rest in got["calls"]}
    if frees:
        count, total, longest = calls["cudaFree"]
        assert count == len(frees)
        assert (total, longest) == pytest.approx((1e-6 * sum(frees), 1e-6 * max(frees)))
    else:
        assert "cudaFree" not in calls


def test_the_trace_summary_names_calls_over_a_millisecond_and_where_the_gaps_fall():
    """A thread blocked in a CUDA call starves its GPU: such calls, longest first, with their
    thread and start; each idle gap with where it starts."""
    from harness import gpu_time_table, trace_summary
    events = [dict(cat="kernel", name="void a<int>(int)", ts=100, dur=400),
              dict(cat="cuda_runtime", name="cudaMemGetInfo", ts=160, dur=1500, tid=7),
              dict(cat="cuda_runtime", name="cudaMallocFromPoolAsync", ts=170, dur=2500, tid=8),
              dict(cat="cuda_runtime", name="cudaLaunchKernel", ts=200, dur=999, tid=7),
              dict(cat="kernel", name="void b<int>(int)", ts=3000, dur=10)]
    got = trace_summary(events, wall=0.01)
    assert [(n, tid) for _, n, tid, _ in got["slow_calls"]] == [
        ("cudaMallocFromPoolAsync", 8), ("cudaMemGetInfo", 7)]
    assert [x for d, _, _, at in got["slow_calls"] for x in (d, at)] == pytest.approx(
        [2.5e-3, 170e-6, 1.5e-3, 160e-6])
    (gap,) = got["gaps"]
    assert gap[1:3] == ("a", "b") and (gap[0], gap[3]) == pytest.approx((2500e-6, 500e-6))
    text = gpu_time_table("step", got)
    assert "2.5 cudaMallocFromPoolAsync 8 0, 1.5 cudaMemGetInfo 7 0" in text
    assert "2500 us  a -> b, 0.4 ms in" in text


def test_scale_writes_the_last_steps_trace_and_keeps_an_existing_one(tmp_path):
    import json
    import subprocess
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    trace = tmp_path / "trace.json"
    cmd = [sys.executable, os.path.join(root, "bench", "scale.py"), "--n-embd", "64",
           "--n-layer", "1", "--batch", "2", "--seq", "16", "--vocab", "50", "--steps", "2",
           "--ncpu", "2", "--timeline", str(trace)]
    env = dict(os.environ, PYTHONPATH=root)
    done = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=240)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "timeline: " in done.stdout and "starved" in done.stdout
    events = json.loads(trace.read_text())["traceEvents"]
    assert events and {e["ph"] for e in events} == {"X"}
    again = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=240)
    assert again.returncode == 2
    assert f"--timeline {trace}: it exists" in again.stderr.strip().splitlines()[-1]
    assert json.loads(trace.read_text())["traceEvents"] == events


def test_scale_trains_bf16_mixed_from_its_first_step():
    """bench/scale.py writes weights tile by tile: the bf16 copies that the GEMMs read must
    follow, or the first loss is exactly ln(vocabulary) (all-zero logits) and the first update
    is lost."""
    import json
    import math
    import subprocess
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    cmd = [sys.executable, os.path.join(root, "bench", "scale.py"), "--n-embd", "64",
           "--n-layer", "1", "--batch", "2", "--seq", "16", "--vocab", "50", "--steps", "1",
           "--ncpu", "2", "--precision", "bf16-mixed"]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=240,
                          env=dict(os.environ, PYTHONPATH=root))
    assert done.returncode == 0, done.stderr[-2000:]
    result = json.loads(next(line for line in done.stdout.splitlines()
                             if line.startswith("RESULT "))[len("RESULT "):])
    assert abs(result["losses"][0] - math.log(50)) > 1e-3, result["losses"]


def test_op_rows_sum_each_ops_gpu_time_in_the_window():
    step = int(timeline.BIN_US)
    table = _table([("CUDA 0", 0, 0, 0, 0, 4 * step), ("CUDA 1", 0, 0, 0, 2 * step, 8 * step),
                    ("CPU 0", 0, 0, 0, 0, 9 * step)])
    table["op"] = ["gemm", "add", "gemm"]
    rows = timeline.op_rows(table, step, 6 * step)  # clipped to the window; CPU left out
    assert [(r["op"], r["tasks"]) for r in rows] == [("add", 1), ("gemm", 1)]
    assert [r["seconds"] for r in rows] == pytest.approx([4 * step * 1e-6, 3 * step * 1e-6])
    assert sum(r["share"] for r in rows) == pytest.approx(1.0)
    text = timeline.report(table, step, 6 * step)
    assert "GPU time by op" in text and "add fp32" in text


def test_the_next_step_is_submitted_while_the_last_one_runs_backward(ctx, rng):
    """TrainingLoop steps back to back (no wait between them, as nntile-train runs them):
    the next step writes its token ids and targets into spare buffers, so its forward is
    submitted before the last step's backward is done, and starts before that step's
    update ends (the blocks' forward waits for their own update only). The same losses as
    steps waited for one by one."""
    from nntile.models import LlamaConfig, model_class
    from nntile.training import TrainingLoop
    config = LlamaConfig(vocab_size=512, hidden_size=256, intermediate_size=512,
                         num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2,
                         max_position_embeddings=128)
    tiling = {"batch": 4, "seq": 128, "embd": 128, "head": 2, "inner": 256, "vocab": 256}
    ids, targets = rng.integers(0, 512, (2, 8, 128))

    def losses(back_to_back):
        model = model_class("llama")(config, tiling, "fp32")
        for _, param in model.named_parameters():
            param.value.write(np.random.default_rng(1).standard_normal(param.value.shape) / 50)
        loop = TrainingLoop(model, ctx, lr=1e-3, max_grad_norm=1.0)
        out = [loop.step(lambda: (ids, targets)).loss]
        ctx.wait()
        ctx.profiling(True)
        ctx.record_timeline()
        out.append(loop.step(lambda: (ids, targets)).loss)
        if not back_to_back:
            ctx.wait()
        second = ctx.clock_us()
        out.append(loop.step(lambda: (ids, targets)).loss)
        ctx.wait()
        table, _ = ctx.timeline()
        ctx.profiling(False)
        model.unregister()
        return out, table[table["submitted"] < second], table[table["submitted"] >= second]

    waited, _, _ = losses(False)
    pipelined, last, following = losses(True)
    assert pipelined == pytest.approx(waited, rel=1e-6)
    update = last[np.char.startswith(last["op"].astype(str), "adam")]
    backward_end = last[~np.char.startswith(last["op"].astype(str), "adam")]["end"].max()
    assert following["submitted"].min() < backward_end
    assert following["start"].min() < update["end"].max()
