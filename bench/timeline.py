"""Where a step's time goes, task by task: Context.timeline()'s records (StarPU's dates for
each finished task) turned into what the GPU was doing at each moment, and into a trace that
chrome://tracing or Perfetto opens.

At each moment of a window the GPU is in the first of these states that holds:
  running:   a task runs on one of its workers;
  fetching:  a task of its workers waits for its input to arrive (fetch_start..fetch_end);
  queued:    a task was handed to one of its workers' queues and has not started;
  cpu:       none of that, and a task runs on a CPU worker;
  starved:   none of that: no task for the GPU is ready (dependencies, or submission).
"""
import json

import numpy as np

STATES = ("running", "fetching", "queued", "cpu", "starved")
BIN_US = 10.0  # resolution of the state split, microseconds


def _covered(starts, ends, t0, nbins):
    """Which bins of BIN_US from t0 some interval [start, end) covers."""
    lo = np.clip(np.floor((starts - t0) / BIN_US), 0, nbins).astype(np.int64)
    hi = np.clip(np.ceil((ends - t0) / BIN_US), 0, nbins).astype(np.int64)
    keep = hi > lo
    diff = np.zeros(nbins + 1, np.int64)
    np.add.at(diff, lo[keep], 1)
    np.add.at(diff, hi[keep], -1)
    return np.cumsum(diff[:-1]) > 0


def is_gpu(worker):
    return str(worker).startswith("CUDA")


def states(table, t0, t1):
    """The window [t0, t1] (microseconds) split into STATES: a dict state -> boolean array over
    bins of BIN_US, exclusive (each bin in exactly one state)."""
    nbins = max(1, int(np.ceil((t1 - t0) / BIN_US)))
    gpu = np.array([is_gpu(w) for w in table["worker"]], bool)
    g, c = table[gpu], table[~gpu]
    raw = dict(running=_covered(g["start"], g["end"], t0, nbins),
               fetching=_covered(g["fetch_start"], g["fetch_end"], t0, nbins),
               queued=_covered(g["pushed"], g["start"], t0, nbins),
               cpu=_covered(c["start"], c["end"], t0, nbins))
    taken = np.zeros(nbins, bool)
    out = {}
    for state in STATES[:-1]:
        out[state] = raw[state] & ~taken
        taken |= raw[state]
    out["starved"] = ~taken
    return out


def split(table, t0, t1):
    """Seconds of [t0, t1] (microseconds) in each of STATES."""
    return {s: float(mask.sum()) * BIN_US * 1e-6 for s, mask in states(table, t0, t1).items()}


def concurrency(table, t0, t1, running):
    """Mean number of GPU tasks running at once over the ``running`` seconds of the window
    (split's) in which at least one runs."""
    g = table[np.array([is_gpu(w) for w in table["worker"]], bool)]
    start, end = np.clip(g["start"], t0, t1), np.clip(g["end"], t0, t1)
    return float((end - start).sum()) * 1e-6 / running if running else 0.0


def beside_others(table, t0, t1, op="collective"):
    """(seconds ``op``'s tasks ran in the window, the share of those seconds in which a task
    of another op ran too): how much of the collectives (the gradients' all-reduce) overlaps
    the rest of the step."""
    nbins = max(1, int(np.ceil((t1 - t0) / BIN_US)))
    mine = table["op"] == op
    ours = _covered(table[mine]["start"], table[mine]["end"], t0, nbins)
    others = _covered(table[~mine]["start"], table[~mine]["end"], t0, nbins)
    seconds = float(ours.sum()) * BIN_US * 1e-6
    return seconds, float((ours & others).sum()) / max(1, int(ours.sum()))


def slices(table, t0, t1, count=20):
    """The window in ``count`` equal slices: per slice its states' shares, the op that ran
    longest on the GPU in it and the tasks submitted in it."""
    masks = states(table, t0, t1)  # once for the window; each slice takes its bins
    nbins = len(masks["starved"])
    edges = np.linspace(t0, t1, count + 1)
    g = table[np.array([is_gpu(w) for w in table["worker"]], bool)]
    rows = []
    for i, (a, b) in enumerate(zip(edges[:-1], edges[1:])):
        lo, hi = i * nbins // count, max((i + 1) * nbins // count, i * nbins // count + 1)
        shares = {s: float(mask[lo:hi].mean()) for s, mask in masks.items()}
        overlap = np.clip(np.minimum(g["end"], b) - np.maximum(g["start"], a), 0, None)
        ops = {}
        for op, us in zip(g["op"], overlap):
            ops[op] = ops.get(op, 0.0) + us
        top = max(ops, key=ops.get) if ops and max(ops.values()) > 0 else "-"
        submitted = int(((table["submitted"] >= a) & (table["submitted"] < b)).sum())
        rows.append(dict(start_s=(a - t0) * 1e-6, end_s=(b - t0) * 1e-6, top_op=top,
                         submitted=submitted, **shares))
    return rows


def op_rows(table, t0, t1):
    """The GPU workers' time in the window by (op, dtype), longest first: dicts of op, dtype,
    tasks, seconds (each task's run clipped to the window, summed over the workers: tasks that
    share a GPU each count whole) and share (of all GPU task time)."""
    g = table[np.array([is_gpu(w) for w in table["worker"]], bool)]
    taken = np.clip(np.minimum(g["end"], t1) - np.maximum(g["start"], t0), 0, None) * 1e-6
    rows = {}
    for op, dtype, seconds in zip(g["op"], g["dtype"], taken):
        row = rows.setdefault((op, dtype), dict(op=op, dtype=dtype, tasks=0, seconds=0.0))
        row["tasks"] += 1
        row["seconds"] += float(seconds)
    total = float(taken.sum()) or 1.0
    out = sorted(rows.values(), key=lambda r: -r["seconds"])
    for row in out:
        row["share"] = row["seconds"] / total
    return out


def op_lines(table, t0, t1, top=12):
    """op_rows' first ``top`` as the report's lines, the rest summed in one."""
    rows = op_rows(table, t0, t1)
    lines = [f"  {'GPU time by op':<34}{'tasks':>7}{'ms':>9}{'share':>7}"]
    for r in rows[:top]:
        lines.append(f"  {(r['op'] + ' ' + str(r['dtype']))[:34]:<34}{r['tasks']:>7}"
                     f"{1e3 * r['seconds']:>9.1f}{100 * r['share']:>6.1f}%")
    if len(rows) > top:
        rest = rows[top:]
        lines.append(f"  {'(the other ' + str(len(rest)) + ')':<34}"
                     f"{sum(r['tasks'] for r in rest):>7}"
                     f"{1e3 * sum(r['seconds'] for r in rest):>9.1f}"
                     f"{100 * sum(r['share'] for r in rest):>6.1f}%")
    return lines


def report(table, t0, t1, dropped=0, count=20):
    """A text summary of the window: the state split, GPU concurrency, submission, the slices
    and the GPU's time by op."""
    total = (t1 - t0) * 1e-6
    sp = split(table, t0, t1)
    lines = [f"timeline: {len(table)} tasks in {total:.3f} s"
             + (f" ({dropped} finished past the buffer, not recorded)" if dropped else ""),
             "  GPU " + ", ".join(f"{s} {v:.3f} s ({100 * v / total:.0f}%)" for s, v in sp.items()),
             "  GPU tasks running at once, when any runs: "
             f"{concurrency(table, t0, t1, sp['running']):.2f}"]
    if len(table) and (table["op"] == "collective").any():
        seconds, beside = beside_others(table, t0, t1)
        lines.append(f"  collectives ran {seconds:.3f} s, {100 * beside:.0f}% of that time beside "
                     "other tasks")
    if len(table):
        last = (table["submitted"].max() - t0) * 1e-6
        lines.append(f"  the last task was submitted {last:.3f} s into the window")
    lines.append(f"  {'slice (s)':<14}{'run':>5}{'fetch':>6}{'queue':>6}{'cpu':>5}"
                 f"{'starv':>6}{'subm':>6}  top op on the GPU")
    for r in slices(table, t0, t1, count):
        lines.append(f"  {r['start_s']:5.2f}-{r['end_s']:5.2f}   "
                     + "".join(f"{100 * r[s]:>{w}.0f}" for s, w in
                               zip(STATES, (5, 6, 6, 5, 6)))
                     + f"{r['submitted']:>6}  {r['top_op']}")
    if len(table):
        lines += op_lines(table, t0, t1)
    return "\n".join(lines)


def write_trace(table, path, t0=0.0):
    """The records as a Chrome trace (JSON): one row per worker, each task a span from start
    to end, and its wait for input on a row of its own below it."""
    events = []
    for r in table:
        args = dict(dtype=r["dtype"], queued_us=round(r["start"] - r["pushed"], 1))
        events.append(dict(name=r["op"], ph="X", pid=0, tid=r["worker"], ts=r["start"] - t0,
                           dur=max(0.0, r["end"] - r["start"]), args=args))
        if r["fetch_end"] > r["fetch_start"]:
            events.append(dict(name="fetch " + r["op"], ph="X", pid=1, tid=r["worker"],
                               ts=r["fetch_start"] - t0,
                               dur=r["fetch_end"] - r["fetch_start"]))
    with open(path, "w") as f:
        json.dump(dict(traceEvents=events, displayTimeUnit="ms"), f)
