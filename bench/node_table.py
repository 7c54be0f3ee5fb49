"""The node table: ours with the project's defaults beside PyTorch FSDP2, on every GPU here.

    python3 bench/node_table.py [--configs 8192x4,8192x16,16384x4] [--steps 3] [--ngpu N]
        [--sides ours,fsdp,fsdp-ac] [--timeout 400] [--out table.json] [--logs build/node-table]
    python3 bench/node_table.py --model llama-3.2-1b --precision bf16-mixed --batch 16 --seq 2048
    python3 bench/node_table.py --capacity llama-3.2-1b,llama-3.2-3b,llama-3.1-8b --batch 8 \
        --seq 2048 --precision bf16-mixed --steps 2

The sides: ours (`bench/scale.py --ncuda N`, no scheduler, worker or --force flag: what a user
gets), fsdp (`torch.distributed.run --nproc-per-node N bench/fsdp_ref.py`, one rank per GPU,
the same global batch) and fsdp-ac (the same with --activation-checkpointing). The wide GPT-2
(the default --model, 4 layers, seq 1024, vocab 50257) runs for each configuration EMBDxBATCH
of --configs; a Llama (--model, a named shape of bench/shapes.py or `llama` of the shape flags)
at --batch. Ours takes nntile's tiles (nntile.policy.tiles) unless --ours-args gives some. Each
side is its own process, with a timeout; a refusal by our memory pre-check, an FSDP
out-of-memory and a timeout are results. Both sides run their steps back to back, as training
loops do (--pipeline of both scripts: the mean of the steps after the first); --waited times
each step alone and keeps the best (docs/performance.md, "Steps back to back"). Prints the
table with ours/FSDP2 and ours/(FSDP2+AC) tokens per second, and writes every record to
--out. --capacity runs each named Llama shape of a list and prints the largest that each side
trains. On a machine without GPUs (--ngpu 0), ours runs on the CPU workers and FSDP on
--cpu-ranks gloo ranks: small shapes only, to check the harness.
"""
import argparse
import datetime
import json
import os
import shlex
import signal
import subprocess
import sys

from harness import RESULT_PREFIX
from shapes import LLAMA_SHAPES, add_model_args, llama_config, resolve_model
from nntile.cli_common import output_file
from nntile.machine import gpu_memory

HERE = os.path.dirname(os.path.abspath(__file__))
# each side's column; for the FSDP sides, the record key and the column of ours/that side
SIDES = {"ours": "ours (defaults)", "fsdp": "FSDP2", "fsdp-ac": "FSDP2+AC"}
RATIOS = {"fsdp": ("ratio", "ours/FSDP2"), "fsdp-ac": ("ratio_ac", "ours/(FSDP2+AC)")}
# NVLink multicast stays off on shared hosts (NCCL, PyTorch's symmetric memory, NVSHMEM)
NO_MULTICAST = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1",
                "NVSHMEM_DISABLE_NVLS": "1"}


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_model_args(p, heads_help="default n_embd / 128 (GPT-2 XL: 25)",
                   batch_help="global batch of a Llama (the wide GPT-2's is in --configs)")
    p.add_argument("--configs", default="8192x4,8192x16,16384x4",
                   help="the wide GPT-2's comma-separated EMBDxBATCH")
    p.add_argument("--capacity", metavar="MODELS",
                   help="comma-separated named Llama shapes: which trains on each side")
    p.add_argument("--precision", default="tf32", choices=["tf32", "fp32", "bf16", "bf16-mixed"])
    p.add_argument("--sides", default=",".join(SIDES), help="comma-separated, of "
                   + ", ".join(SIDES))
    p.add_argument("--ngpu", type=int, help="default: every visible GPU")
    p.add_argument("--cpu-ranks", type=int, default=2, help="FSDP ranks without GPUs")
    p.add_argument("--timeout", type=int, default=400, help="seconds per run")
    p.add_argument("--waited", action="store_true", help="time each step alone, waited for "
                   "on both sides, and keep the best (default: the steps back to back, as "
                   "training loops run them, their mean: --pipeline of both scripts)")
    p.add_argument("--ours-args", default="", help="more arguments for bench/scale.py (ours "
                   "runs with nntile's tiles and runtime settings otherwise, e.g. "
                   "\"--tile-inner 4096\" to give a tile)")
    p.add_argument("--fsdp-args", default="", help="more arguments for bench/fsdp_ref.py")
    p.add_argument("--out", type=output_file("node-table.json"),
                   help="write the records to this JSON file")
    p.add_argument("--logs", default="build/node-table")
    args = p.parse_args(argv)
    args.sides = [s for s in args.sides.split(",") if s]
    if not args.sides or set(args.sides) - set(SIDES):
        p.error(f"--sides: expected some of {', '.join(SIDES)}")
    try:
        args.rows = rows(args)
    except ValueError as exc:
        p.error(str(exc))
    return args


def rows(args):
    """The shapes of the table's rows: argparse namespaces with every shape flag, resolved
    (bench/shapes.py)."""
    return [resolve_model(argparse.Namespace(**dict(vars(args), **shape)))
            for shape in shapes(args)]


def shapes(args):
    """What each row changes of the flags' shape."""
    if args.capacity:
        names = [m for m in args.capacity.split(",") if m]
        unknown = [m for m in names if m not in LLAMA_SHAPES]
        if unknown or not names:
            raise ValueError(f"--capacity {args.capacity!r}: expected named Llama shapes, "
                             f"of {', '.join(LLAMA_SHAPES)}")
        return [dict(model=m) for m in names]
    if args.model != "gpt2":
        return [{}]
    try:
        configs = [tuple(int(x) for x in c.lower().split("x"))
                   for c in args.configs.split(",") if c]
        assert configs and all(len(c) == 2 and min(c) > 0 for c in configs)
    except (ValueError, AssertionError):
        raise ValueError(f"--configs {args.configs!r}: expected EMBDxBATCH,... such as "
                         "8192x4") from None
    return [dict(n_embd=e, batch=b) for e, b in configs]


def device_name(ngpu):
    if not ngpu:
        return f"CPU ({os.cpu_count()} cores)"
    out = subprocess.run(["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"],
                         capture_output=True, text=True, timeout=20)
    return f"{ngpu}x {out.stdout.splitlines()[0].strip()}"


def results(output):
    """The RESULT lines of a run, parsed: one from rank 0, and one from each rank that failed
    (fsdp_ref.py)."""
    return [json.loads(line[len(RESULT_PREFIX):]) for line in output.splitlines()
            if line.startswith(RESULT_PREFIX)]


def communicate(cmd, timeout, env):
    """Output and exit code of ``cmd``, or code None after ``timeout`` seconds. The run is
    stopped with SIGTERM first: torchrun starts its workers in sessions of their own and
    passes a SIGTERM on to them, while a SIGKILL would leave them running (on the GPUs the
    next configuration uses)."""
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            env=env, start_new_session=True)
    try:
        return proc.communicate(timeout=timeout)[0], proc.returncode
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGTERM)
        try:  # torchrun waits up to 30 s for its workers before it kills them
            output = proc.communicate(timeout=60)[0]
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            output = proc.communicate()[0]
        return output, None


def run(name, cmd, timeout, logs):
    """A side's record: its RESULT line's fields, or a status saying why there is none."""
    env = dict(os.environ, PYTHONUNBUFFERED="1", **NO_MULTICAST)
    log = os.path.join(logs, f"{name}.log")
    output, code = communicate(cmd, timeout, env)
    with open(log, "w") as f:
        f.write(" ".join(cmd) + "\n" + output)
    found = results(output)
    # one rank out of memory is the run's result, whatever its peers then reported
    result = next((r for r in found if r.get("status") == "oom"), found[-1] if found else None)
    if code is None:
        return dict(status="timeout", log=log)
    if result is not None:
        result.setdefault("status", "ok")
        return dict(result, log=log)
    if code == 2:  # our memory pre-check, or a bad argument: one line on stderr
        lines = [line for line in output.splitlines() if "error:" in line]
        return dict(status="refused", error=(lines or ["?"])[-1][:300], log=log)
    return dict(status="error", error=output.strip().splitlines()[-1:] or ["?"], log=log)


def shape_flags(row):
    """The flags of bench/scale.py and bench/fsdp_ref.py (bench/shapes.py's) for a row."""
    if row.model in LLAMA_SHAPES:
        flags = ["--model", row.model]
    else:
        flags = ["--model", row.model, "--n-embd", row.n_embd, "--n-layer", row.n_layer,
                 "--vocab", row.vocab]
        for flag in ("n_head", "n_inner", "n_kv_head"):
            if getattr(row, flag):
                flags += ["--" + flag.replace("_", "-"), getattr(row, flag)]
        flags += ["--tied"] if row.tied else []
    return [str(f) for f in flags + ["--seq", row.seq, "--batch", row.batch, "--steps", row.steps]]


def commands(args, row, ngpu):
    """Each side's command line for a row."""
    shape = shape_flags(row)
    ours = [sys.executable, os.path.join(HERE, "scale.py"), *shape, "--ncuda", str(ngpu),
            "--precision", args.precision]
    # without GPUs, tf32 is fp32
    dtype = "fp32" if not ngpu and args.precision == "tf32" else args.precision
    fsdp = [sys.executable, "-m", "torch.distributed.run", "--standalone",
            f"--nproc-per-node={ngpu or args.cpu_ranks}", os.path.join(HERE, "fsdp_ref.py"),
            *shape, "--dtype", dtype]
    timing = [] if args.waited else ["--pipeline"]
    # last, so that they override the defaults above
    fsdp += timing + shlex.split(args.fsdp_args)
    return {"ours": ours + timing + shlex.split(args.ours_args), "fsdp": fsdp,
            "fsdp-ac": fsdp + ["--activation-checkpointing"]}


def cell(side):
    if side is None:
        return "—"
    if side["status"] != "ok":
        return side["status"]
    return f"{side['tokens_per_s']:,.0f} tok/s, {side['tflops']:.1f} TFLOP/s"


def row_name(row):
    return f"{row.n_embd if row.model == 'gpt2' else row.model}, {row.batch}x{row.seq}"


def measure(args, row, ngpu):
    """The record of one row: each side's, and ours over each FSDP side's tokens/s."""
    record = dict(model=row.model, n_embd=row.n_embd, batch=row.batch, seq=row.seq,
                  ngpu=ngpu, precision=args.precision, **{side: None for side in SIDES})
    if row.model != "gpt2":
        record["params"] = llama_config(row).num_parameters()
    cmds = commands(args, row, ngpu)
    for side in args.sides:
        print(f"=== {side} {row_name(row)}: {' '.join(cmds[side])}", flush=True)
        name = f"{side}-{row_name(row).replace(', ', '-')}"
        record[side] = run(name, cmds[side], args.timeout, args.logs)
        print(cell(record[side]), flush=True)
        record["params"] = record.get("params") or record[side].get("params")
    for side, (key, _) in RATIOS.items():
        ok = all(record[s] and record[s]["status"] == "ok" for s in ("ours", side))
        record[key] = record["ours"]["tokens_per_s"] / record[side]["tokens_per_s"] \
            if ok else None
    return record


def side_name(args, side):
    """A side's column: ours says which arguments it ran with where not the defaults."""
    if side == "ours" and args.ours_args.strip():
        return f"ours ({args.ours_args.strip()})"
    return SIDES[side]


def print_table(args, records, title):
    compared = [s for s in args.sides if s in RATIOS and "ours" in args.sides]
    head = (["shape, batch", "parameters"] + [side_name(args, s) for s in args.sides]
            + [RATIOS[s][1] for s in compared])
    print(f"\n## Node table: {title}\n")
    print("| " + " | ".join(head) + " |")
    print("|" + " --- |" * len(head))
    for r, row in zip(records, args.rows):
        size = f"{r['params'] / 1e9:.2f}B" if r.get("params") else "?"
        cells = [cell(r[s]) for s in args.sides]
        cells += [f"{r[RATIOS[s][0]]:.2f}" if r[RATIOS[s][0]] else "—" for s in compared]
        print("| " + " | ".join([row_name(row), size] + cells) + " |")


def print_capacity(args, records):
    """The largest shape each side trained."""
    print()
    for side in args.sides:
        trained = [r for r in records if r[side] and r[side]["status"] == "ok"]
        best = max(trained, key=lambda r: r["params"], default=None)
        print(f"largest trained, {side_name(args, side)}: " + (
            f"{best['model']} ({best['params'] / 1e9:.2f}B)" if best else "none"))


def main(argv=None):
    args = parse_args(argv)
    ngpu = len(gpu_memory()) if args.ngpu is None else args.ngpu
    os.makedirs(args.logs, exist_ok=True)
    records = [measure(args, row, ngpu) for row in args.rows]
    timing = "each step waited for" if args.waited else "steps back to back"
    title = (f"{device_name(ngpu)}, {args.precision}, {timing}, "
             f"{datetime.date.today().isoformat()}")
    print_table(args, records, title)
    if args.capacity:
        print_capacity(args, records)
    if args.out:
        with open(args.out, "w") as f:
            json.dump(dict(device=title, records=records), f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
