"""The scheduler study: train a wide GPT-2 under each StarPU scheduler, at each depth.

    python3 bench/schedulers.py [--scheds dmdasd,dmdas,dmda,lws,heteroprio] [--layers 4,12]
        [--timeout 900] [any bench/scale.py argument: --n-embd 4096 --ncuda 1 --tile-embd ...]

StarPU fixes its scheduler when it starts and runs once per process, so every (scheduler,
depth) pair is a fresh `python3 bench/scale.py --sched NAME --n-layer L ...` process; the
other arguments go to it unchanged. Prints a markdown table of tokens/s and model TFLOP/s
(bench/scale.py's best step after the first) with the fastest scheduler per depth, then one
RESULT JSON line. A run that fails or times out puts its error text in its cell.
"""
import argparse
import os
import subprocess
import sys

from harness import parse_result, print_result

SCALE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "scale.py")
DEFAULT_SCHEDS = "dmdasd,dmdas,dmda,lws,heteroprio"


def error_text(output, limit=160):
    """The line that says why a run failed: StarPU's or Python's last error line."""
    lines = [line.strip() for line in output.splitlines() if line.strip()]
    for line in reversed(lines):
        if "rror" in line or "[starpu]" in line or "bort" in line:
            return line[:limit]
    return (lines[-1] if lines else "no output")[:limit]


def run(sched, n_layer, extra, timeout):
    cmd = [sys.executable, SCALE, "--sched", sched, "--n-layer", str(n_layer)] + extra
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired as exc:
        out = exc.stdout or ""
        if isinstance(out, bytes):  # what the child printed before it was killed
            out = out.decode(errors="replace")
        return dict(status="timeout", error=f"timed out after {timeout} s; last output: "
                    f"{error_text(out)}")
    result = parse_result(proc.stdout)
    missing = f"scheduling policy '{sched}' was not found"
    if missing in proc.stderr:  # StarPU then runs its default scheduler: not this one's figure
        return dict(status="error", error=f"StarPU: {missing}")
    if proc.returncode != 0 or result is None:
        return dict(status="error", returncode=proc.returncode,
                    error=error_text(proc.stderr + "\n" + proc.stdout))
    return dict(status="ok", **result)


def cell(run_result):
    if run_result["status"] != "ok":
        return f"{run_result['status']}: {run_result['error']}".replace("|", "\\|")
    return f"{run_result['tokens_per_s']:,.0f} tok/s, {run_result['tflops']:.3g} TFLOP/s"


def table(scheds, layers, results):
    lines = ["| scheduler | " + " | ".join(f"{n} layers" for n in layers) + " |",
             "| --- |" + " --- |" * len(layers)]
    for sched in scheds:
        lines.append(f"| {sched} | "
                     + " | ".join(cell(results[sched][n]) for n in layers) + " |")
    lines.append("")
    for n in layers:
        ok = [(results[s][n]["tokens_per_s"], s) for s in scheds
              if results[s][n]["status"] == "ok"]
        if ok:
            best, name = max(ok)
            lines.append(f"fastest at {n} layers: {name} ({best:,.0f} tokens/s)")
        else:
            lines.append(f"fastest at {n} layers: none finished")
    return "\n".join(lines)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--scheds", default=DEFAULT_SCHEDS, help="comma-separated")
    p.add_argument("--layers", default="4,12", help="comma-separated depths")
    p.add_argument("--timeout", type=float, default=900, help="seconds per run")
    p.add_argument("--no-calibration-run", action="store_true",
                   help="skip the untimed first run that calibrates StarPU's performance "
                        "models (kept in ~/.starpu/sampling) for the dmda family")
    args, extra = p.parse_known_args(argv)
    if any(a in ("--sched", "--n-layer") or a.startswith(("--sched=", "--n-layer="))
           for a in extra):
        p.error("--sched and --n-layer are what the study varies; use --scheds and --layers")
    scheds = [s for s in args.scheds.split(",") if s]
    layers = [int(n) for n in args.layers.split(",") if n]
    results = {s: {} for s in scheds}
    if not args.no_calibration_run:
        # Uncalibrated, dmda-type schedulers first run every kernel on every worker kind to
        # measure it; without this, the first scheduler of the list would pay for all.
        print(f"--- calibration run (dmda, {layers[0]} layers, not reported)", flush=True)
        print(cell(run("dmda", layers[0], extra, args.timeout)), flush=True)
    for n_layer in layers:
        for sched in scheds:
            print(f"--- {sched}, {n_layer} layers", flush=True)
            results[sched][n_layer] = run(sched, n_layer, extra, args.timeout)
            print(cell(results[sched][n_layer]), flush=True)
    print()
    print(f"scale.py arguments: {' '.join(extra) or '(defaults)'}")
    print(table(scheds, layers, results), flush=True)
    print_result(dict(args=extra, results={s: {str(n): r for n, r in v.items()}
                                           for s, v in results.items()}))


if __name__ == "__main__":
    sys.exit(main())
