"""Training curves of several nntile-train runs in one plot (and their data, compacted).

    python3 bench/plot_convergence.py fp32=RUN_DIR bf16-mixed=RUN_DIR \
        [--out docs/plots/convergence_bf16_mixed.png] [--data docs/plots/convergence_bf16_mixed.json]

Each RUN_DIR holds the metrics.jsonl of an nntile-train run. The plot shows each run's
training loss (a 50-step moving average) and validation loss, and below, their differences
from the first run's; the data file keeps step, loss and val_loss of every record. Prints the
final validation losses and their differences.
"""
import argparse
import json
import os

import numpy as np

from nntile.cli_common import output_file

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def read_runs(specs):
    runs = {}
    for spec in specs:
        name, _, path = spec.partition("=")
        with open(os.path.join(path, "metrics.jsonl")) as f:
            records = [json.loads(line) for line in f]
        runs[name] = [{k: r[k] for k in ("step", "loss", "val_loss") if k in r}
                      for r in records]
    return runs


def plot(runs, out, window=50):
    """Top: each run's curves; bottom: each run's curves minus the first run's (the curves
    overlap where the runs agree)."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, (ax, diff) = plt.subplots(2, 1, figsize=(8, 6.5), sharex=True,
                                   gridspec_kw=dict(height_ratios=(2, 1)))
    curves = {}
    for name, records in runs.items():
        steps = np.array([r["step"] for r in records])
        smooth = np.convolve([r["loss"] for r in records], np.ones(window) / window, "valid")
        val = np.array([(r["step"], r["val_loss"]) for r in records if "val_loss" in r])
        curves[name] = (steps[window - 1:], smooth, val)
    base = next(iter(curves.values()))
    for (name, (steps, smooth, val)), color in zip(curves.items(), ("C0", "C1", "C2", "C3")):
        ax.plot(steps, smooth, color=color, linewidth=1,
                label=f"{name} train (mean of {window} steps)")
        ax.plot(val[:, 0], val[:, 1], "o--", color=color, label=f"{name} validation")
        if curves[name] is not base:
            diff.plot(steps, smooth - base[1], color=color, linewidth=1, label=f"{name} train")
            diff.plot(val[:, 0], val[:, 1] - base[2][:, 1], "o--", color=color,
                      label=f"{name} validation")
    ax.set_ylabel("loss (nats/token)")
    diff.set_ylabel(f"minus {next(iter(curves))}")
    diff.axhline(0, color="black", linewidth=0.5)
    diff.set_xlabel("step")
    for a in (ax, diff):
        a.grid(alpha=0.3)
        a.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(out, dpi=100)
    plt.close(fig)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("runs", nargs="+", metavar="NAME=RUN_DIR")
    p.add_argument("--out", type=output_file("convergence.png"),
                   default=os.path.join(ROOT, "docs", "plots", "convergence_bf16_mixed.png"))
    p.add_argument("--data", type=output_file("convergence.json"),
                   default=os.path.join(ROOT, "docs", "plots", "convergence_bf16_mixed.json"))
    args = p.parse_args(argv)
    runs = read_runs(args.runs)
    plot(runs, args.out)
    with open(args.data, "w") as f:
        json.dump(runs, f, separators=(",", ":"))
        f.write("\n")
    final = {name: [r["val_loss"] for r in records if "val_loss" in r][-1]
             for name, records in runs.items()}
    first = next(iter(final.values()))
    for name, value in final.items():
        print(f"{name}: final validation loss {value:.4f} "
              f"({100 * (value - first) / first:+.3f}% against the first)")


if __name__ == "__main__":
    main()
