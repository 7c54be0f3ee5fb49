"""Plot model TFLOP/s against model size from measured records.

    python3 bench/plot_performance.py [--data docs/plots/performance_data.json]
        [--out docs/plots/throughput_vs_size.png]

The data is a JSON list of records {"system": "nntile" | "pytorch" | ..., "device": ...,
"dtype": ..., "n_embd": ..., "params": ..., "tflops": ... (null when there is no figure),
"status": "ok" | "oom" | ..., "source": where the figure comes from}; bench/compare_torch.py
--plot-data appends to it. Each line is one system, device and dtype from one source (the
text of "source" before its first ':' or ','); a run without a figure (out of memory,
unfinished) is marked on the size axis with its status.
"""
import argparse
import json
import os
from collections import defaultdict

import matplotlib

matplotlib.use("Agg")  # files only: no display on the machines this runs on
import matplotlib.pyplot as plt  # noqa: E402

from nntile.cli_common import output_file  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DEFAULT_DATA = os.path.join(ROOT, "docs", "plots", "performance_data.json")
DEFAULT_OUT = os.path.join(ROOT, "docs", "plots", "throughput_vs_size.png")


def campaign(record):
    """Where a record comes from, up to its details: records of one campaign form a line, so
    that two measurements of one size from different runs stay apart."""
    source = record.get("source") or "unknown"
    return source.replace(",", ":").split(":")[0].strip()


def label(system, device, dtype, origin):
    return f"{system}{' ' + dtype if dtype else ''} ({device}) [{origin}]"


SYSTEM_COLORS = {"nntile": "tab:blue", "pytorch": "tab:orange"}
DTYPE_MARKERS = {"tf32": "o", "bf16": "s", "fp32": "D"}
LINESTYLES = ["-", "--", ":", "-."]


def plot(records, out):
    groups = defaultdict(list)
    for r in records:
        groups[(r["system"], r["device"], r.get("dtype"), campaign(r))].append(r)
    # Colour says the system, marker the dtype, line style the source.
    origins = sorted({key[3] for key in groups})
    others = iter(["tab:green", "tab:red", "tab:purple", "tab:brown", "tab:gray"])
    colors = {}
    fig, ax = plt.subplots(figsize=(10, 7))
    fig.subplots_adjust(bottom=0.3)  # the legend goes below the axes
    for key, group in sorted(groups.items(), key=lambda kv: tuple(str(k) for k in kv[0])):
        system, _, dtype, origin = key
        if system not in colors:
            colors[system] = SYSTEM_COLORS.get(system) or next(others, "black")
        style = LINESTYLES[origins.index(origin) % len(LINESTYLES)]
        # A system's sources put their labels on alternate sides: two figures of one size
        # from two sources stay legible.
        mine = sorted({k[3] for k in groups if k[0] == system})
        side = 1 if mine.index(origin) % 2 == 0 else -1
        group.sort(key=lambda r: r["params"])
        done = [r for r in group if r["status"] == "ok" and r["tflops"] is not None]
        ax.plot([r["params"] / 1e9 for r in done], [r["tflops"] for r in done],
                linestyle=style, marker=DTYPE_MARKERS.get(dtype, "^"), color=colors[system],
                label=label(*key))
        for r in done:
            ax.annotate(f"{r['tflops']:g}", (r["params"] / 1e9, r["tflops"]),
                        textcoords="offset points", xytext=(7 * side, -3),
                        ha="left" if side > 0 else "right", fontsize=8)
        for r in group:
            if r in done:
                continue
            ax.plot(r["params"] / 1e9, 0, "X", markersize=10, color=colors[system],
                    clip_on=False)
            ax.annotate(f"{system}\n{r['status']}\nn_embd {r['n_embd']}",
                        (r["params"] / 1e9, 0), textcoords="offset points", xytext=(0, 10),
                        ha="center", fontsize=8, color=colors[system])
    ax.set_xlabel("parameters (billions)")
    ax.set_ylabel("model TFLOP/s (6 N + 12 L E T per token)")
    ax.set_title("GPT-2 training throughput against model size")
    top = max((r["tflops"] for r in records if r["tflops"] is not None), default=1.0)
    ax.set_ylim(0, 1.1 * top)
    ax.set_xlim(left=0)
    ax.grid(alpha=0.3)
    ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.1), ncol=2, fontsize=8)
    # each record's full source stays in the data file; docs/performance.md gives commands
    fig.savefig(out, dpi=120, bbox_inches="tight")
    plt.close(fig)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--data", default=DEFAULT_DATA)
    p.add_argument("--out", type=output_file("throughput.png"), default=DEFAULT_OUT)
    args = p.parse_args(argv)
    with open(args.data) as f:
        records = json.load(f)
    plot(records, args.out)
    print(f"wrote {args.out} from {len(records)} records in {args.data}")


if __name__ == "__main__":
    main()
