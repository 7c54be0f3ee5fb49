"""The node table: ours with the project's defaults beside PyTorch FSDP, on every GPU here.

    python3 bench/node_table.py [--configs 8192x4,8192x16,16384x4] [--steps 3] [--ngpu N]
        [--timeout 400] [--out table.json] [--logs build/node-table]

For each configuration EMBDxBATCH (wide GPT-2 of bench/scale.py: 4 layers, seq 1024, vocab
50257, tf32), ours runs as `bench/scale.py --ncuda N` with tiles only (no scheduler, worker or
--force flag: what a user gets), and FSDP as `torch.distributed.run --nproc-per-node N
bench/fsdp_ref.py` with the same global batch. Each side is its own process, with a timeout;
a refusal by our memory pre-check, an FSDP out-of-memory and a timeout are results. Prints the
table with ours/FSDP tokens per second, and writes every record to --out. On a machine without
GPUs (--ngpu 0), ours runs on the CPU workers and FSDP on --cpu-ranks gloo ranks: small
configurations only, to check the harness.
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
from nntile.cli_common import output_file

HERE = os.path.dirname(os.path.abspath(__file__))


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--configs", default="8192x4,8192x16,16384x4",
                   help="comma-separated EMBDxBATCH")
    p.add_argument("--n-layer", type=int, default=4)
    p.add_argument("--n-head", type=int, help="default n_embd / 128 (GPT-2 XL: 25)")
    p.add_argument("--seq", type=int, default=1024)
    p.add_argument("--vocab", type=int, default=50257)
    p.add_argument("--steps", type=int, default=3)
    p.add_argument("--ngpu", type=int, help="default: every visible GPU")
    p.add_argument("--cpu-ranks", type=int, default=2, help="FSDP ranks without GPUs")
    p.add_argument("--tile", type=int, default=4096, help="embd and inner tiles of ours")
    p.add_argument("--tile-vocab", type=int, default=8192)
    p.add_argument("--timeout", type=int, default=400, help="seconds per run")
    p.add_argument("--only", choices=["ours", "fsdp"])
    p.add_argument("--ours-args", default="", help="more arguments for bench/scale.py")
    p.add_argument("--fsdp-args", default="", help="more arguments for bench/fsdp_ref.py")
    p.add_argument("--out", type=output_file("node-table.json"),
                   help="write the records to this JSON file")
    p.add_argument("--logs", default="build/node-table")
    args = p.parse_args(argv)
    try:
        args.configs = [tuple(int(x) for x in c.lower().split("x")) for c in
                        args.configs.split(",") if c]
        assert all(len(c) == 2 and min(c) > 0 for c in args.configs)
    except (ValueError, AssertionError):
        p.error(f"--configs {args.configs!r}: expected EMBDxBATCH,... such as 8192x4")
    return args


def visible_gpus():
    try:
        out = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=20)
        return sum(line.startswith("GPU ") for line in out.stdout.splitlines())
    except (OSError, subprocess.SubprocessError):
        return 0


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
    env = dict(os.environ, PYTHONUNBUFFERED="1", NCCL_NVLS_ENABLE="0")
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


def commands(args, embd, batch, ngpu):
    tile = min(args.tile, embd)
    ours = [sys.executable, os.path.join(HERE, "scale.py"), "--n-embd", str(embd),
            "--n-layer", str(args.n_layer), "--seq", str(args.seq), "--vocab", str(args.vocab),
            "--batch", str(batch), "--steps", str(args.steps), "--ncuda", str(ngpu),
            "--tile-batch", str(2 if batch <= 8 else 4), "--tile-embd", str(tile),
            "--tile-inner", str(tile), "--tile-head", str(max(1, min(32, embd // 128))),
            "--tile-vocab", str(min(args.tile_vocab, args.vocab))]
    ranks = ngpu or args.cpu_ranks
    fsdp = [sys.executable, "-m", "torch.distributed.run", "--standalone",
            f"--nproc-per-node={ranks}", os.path.join(HERE, "fsdp_ref.py"),
            "--n-embd", str(embd), "--n-layer", str(args.n_layer), "--seq", str(args.seq),
            "--vocab", str(args.vocab), "--batch", str(batch), "--steps", str(args.steps)]
    if args.n_head:
        ours += ["--n-head", str(args.n_head)]
        fsdp += ["--n-head", str(args.n_head)]
    if not ngpu:
        fsdp += ["--dtype", "fp32"]
    # last, so that they override the defaults above
    return ours + shlex.split(args.ours_args), fsdp + shlex.split(args.fsdp_args)


def cell(side):
    if side is None:
        return "—"
    if side["status"] != "ok":
        return side["status"]
    return f"{side['tokens_per_s']:,.0f} tok/s, {side['tflops']:.1f} TFLOP/s"


def main(argv=None):
    args = parse_args(argv)
    ngpu = visible_gpus() if args.ngpu is None else args.ngpu
    os.makedirs(args.logs, exist_ok=True)
    records = []
    for embd, batch in args.configs:
        ours_cmd, fsdp_cmd = commands(args, embd, batch, ngpu)
        record = dict(n_embd=embd, batch=batch, ngpu=ngpu, ours=None, fsdp=None)
        for side, cmd in (("ours", ours_cmd), ("fsdp", fsdp_cmd)):
            if args.only in (None, side):
                print(f"=== {side} n_embd {embd} batch {batch}: {' '.join(cmd)}", flush=True)
                record[side] = run(f"{side}-{embd}x{batch}", cmd, args.timeout, args.logs)
                print(cell(record[side]), flush=True)
        ok = all(record[s] and record[s]["status"] == "ok" for s in ("ours", "fsdp"))
        record["ratio"] = (record["ours"]["tokens_per_s"] / record["fsdp"]["tokens_per_s"]
                           if ok else None)
        records.append(record)
    title = f"{device_name(ngpu)}, {datetime.date.today().isoformat()}"
    print(f"\n## Node table: {title}\n")
    print("| n_embd, batch | parameters | ours (defaults) | FSDP | ours/FSDP |")
    print("| --- | --- | --- | --- | --- |")
    for r in records:
        params = next((r[s]["params"] for s in ("ours", "fsdp") if r[s] and r[s].get("params")),
                      None)
        size = f"{params / 1e9:.2f}B" if params else "?"
        ratio = f"{r['ratio']:.2f}" if r["ratio"] else "—"
        print(f"| {r['n_embd']}, {r['batch']}x{args.seq} | {size} | {cell(r['ours'])} | "
              f"{cell(r['fsdp'])} | {ratio} |")
    if args.out:
        with open(args.out, "w") as f:
            json.dump(dict(device=title, records=records), f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
