"""Train the same model with nntile and with PyTorch eager + transformers, in one process.

    python3 bench/compare_torch.py --n-embd 4096 --n-layer 4 --batch 4 --steps 5 \
        [--dtype tf32|fp32|bf16|bf16-mixed] [--ncpu N] [--ncuda N] [--sched NAME] ...
    python3 bench/compare_torch.py --model llama-3.2-1b --seq 2048 --batch 8 \
        --precision bf16-mixed
    python3 bench/compare_torch.py --model llama --n-embd 64 --n-layer 2 --n-head 4 \
        --n-kv-head 2 --vocab 100 --seq 32 --batch 2    # a toy Llama, e.g. on a CPU

--model: gpt2 (default; GPT2LMHeadModel, untied head), llama (LlamaForCausalLM of the flags)
or a named Llama shape (bench/shapes.py: llama-3.2-1b, llama-3.1-8b, tinyllama-1.1b,
smollm2-135m). Both sides start from the same random weights (ours is copied from the
transformers model): no dropout, AdamW. On a machine with a GPU (and nntile built with
CUDA) both train there: PyTorch with TF32 matrix products for tf32, the model cast to
bfloat16 for bf16, under torch.autocast(bfloat16) for bf16-mixed, with sdpa attention and
fused AdamW. Otherwise both train on the CPU. Tiles no flag gives are nntile's choice for
the machine (nntile.policy.tiles, printed by the Context). PyTorch runs first, with
StarPU's workers paused and before our model exists, and gives its memory back before ours
is built from the same initial weights. A side that runs out of memory is reported as "oom",
any other failure as "error" with its text.

Prints tokens/s, model TFLOP/s and the ratio, our timed steps per op (Context.op_stats),
then one RESULT JSON line. Model FLOPs, the same number for both sides: for GPT-2 6 N
tokens + 12 L E T tokens per step (N from GPT2Config.num_parameters, as bench/scale.py), for
Llama the family's LlamaConfig.flops_per_token. --plot-data FILE appends both sides'
records to the data bench/plot_performance.py draws.
"""
import argparse
import datetime
import json
import os
import sys
import time

import numpy as np

# PyTorch's best chance at the largest sizes: whole-segment growth instead of fragments
# (read when CUDA is first used)
os.environ.setdefault("PYTORCH_CUDA_ALLOC_CONF", "expandable_segments:True")
import torch  # noqa: E402

import nntile
import torch_reference
from harness import (model_flops_per_step, op_table, paused, print_result, program_tiling,
                     train_step)
from nntile.cli_common import add_verbose_arg, calibration_note, output_file, starpu_messages
from nntile.models import GPT2Config, GPT2LMHead, LlamaLM
from nntile.optim import AdamW
from shapes import add_model_args, llama_config, resolve_model

TILE_KEYS = ("batch", "seq", "embd", "head", "inner", "vocab")


def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_model_args(p, steps_help="timed steps per side",
                   heads_help="default: heads of 128 from n_embd 1024 up (as bench/scale.py), "
                              "of 64 below")
    p.add_argument("--warmup", type=int,
                   help="untimed steps first (default 1 on CPU, 3 on GPU, where StarPU "
                        "calibrates its performance models)")
    p.add_argument("--precision", "--dtype", dest="dtype", default="tf32",
                   choices=["tf32", "fp32", "bf16", "bf16-mixed"],
                   help="bf16-mixed: ours against PyTorch under torch.autocast(bfloat16)")
    p.add_argument("--ncpu", type=int)
    p.add_argument("--ncuda", type=int)
    p.add_argument("--sched")
    p.add_argument("--attention", default="fused", choices=("fused", "unfused"),
                   help="ours: fused (flash) attention, or the unfused reference")
    for key in TILE_KEYS:
        p.add_argument(f"--tile-{key}", type=int)
    p.add_argument("--plot-data", type=output_file("records.json"),
                   help="append the two records to this JSON list")
    add_verbose_arg(p)
    return resolve_model(p.parse_args(argv),
                         heads=lambda n_embd: max(1, n_embd // (128 if n_embd >= 1024 else 64)))


def failure(exc):
    status = "oom" if torch_reference.is_oom(exc) else "error"
    return dict(status=status, error=f"{type(exc).__name__}: {exc}"[:500])


def summary(times, losses, flops, tokens):
    step = float(np.median(times))
    return dict(status="ok", step_s=step, steps_s=times, tokens_per_s=tokens / step,
                tflops=flops / step / 1e12, losses=losses)


def timed_steps(step, warmup, steps, loss=None, start=None):
    """Seconds of each step after ``warmup`` ones, and every step's loss: what ``step()``
    returns, or what ``loss()`` reads once the step is timed. ``start()`` is called before
    the first timed step."""
    times, losses = [], []
    for index in range(warmup + steps):
        if index == warmup and start is not None:
            start()
        begin = time.perf_counter()
        value = step()
        if index >= warmup:
            times.append(time.perf_counter() - begin)
        losses.append(value if loss is None else loss())
    return times, losses


def run_pytorch(hf, device, args, ids, targets, flops, warmup):
    try:
        trainer = torch_reference.Trainer(hf, device, args.dtype)
        tids, ttargets = trainer.tensors(ids, targets)
        times, losses = timed_steps(lambda: trainer.step(tids, ttargets), warmup, args.steps)
        trainer.close()
        return summary(times, losses, flops, ids.size)
    except Exception as exc:  # an OOM is a result here, not a crash
        return failure(exc)


def run_ours(ctx, model, args, ids, targets, flops, warmup):
    """Our side's summary, with ``ops``: the timed steps' tasks per op (Context.op_stats,
    counted with StarPU's profiling on, as bench/test_gpt2_gpu.py does)."""
    def count_ops():
        ctx.profiling(True)
        ctx.op_stats()  # counts from here

    note_calibration = calibration_note(ctx, lambda line: print(line, flush=True),
                                        args.verbose)

    def step():
        train_step(ctx, model, opt, ids, targets)
        note_calibration()

    try:
        opt = AdamW(model.named_parameters(), lr=1e-4)
        times, losses = timed_steps(step, warmup, args.steps,
                                    loss=lambda: float(model.loss_value.to_array()[0]),
                                    start=count_ops)
        ops = ctx.op_stats()
        ctx.profiling(False)
        return dict(summary(times, losses, flops, ids.size), ops=ops)
    except Exception as exc:
        return failure(exc)


def describe(name, side):
    if side["status"] != "ok":
        return f"{name}: {side['status']} ({side['error']})"
    return (f"{name}: {side['tokens_per_s']:,.0f} tokens/s, {side['tflops']:.3f} model TFLOP/s "
            f"(median step {side['step_s']:.3f} s), losses "
            + ", ".join(f"{x:.4f}" for x in side["losses"]))


def append_plot_data(path, result):
    records = []
    if os.path.exists(path):
        with open(path) as f:
            records = json.load(f)
    for system in ("nntile", "pytorch"):
        side = result[system]
        records.append(dict(
            system=system, device=result["device"], dtype=result["dtype"],
            n_embd=result["n_embd"], n_layer=result["n_layer"], params=result["params"],
            batch=result["batch"], seq=result["seq"],
            tflops=side.get("tflops"), status=side["status"],
            source=f"bench/compare_torch.py, {datetime.date.today().isoformat()}"))
    with open(path, "w") as f:
        json.dump(records, f, indent=1)
        f.write("\n")


def models_of(args):
    """(our config, FLOPs a step, the transformers model, our model class) the flags
    describe; both models start from the transformers model's weights."""
    tokens = args.batch * args.seq
    if args.model == "gpt2":
        config = GPT2Config(vocab_size=args.vocab, n_positions=max(1024, args.seq),
                            n_embd=args.n_embd, n_layer=args.n_layer, n_head=args.n_head,
                            tie_word_embeddings=False)
        flops = model_flops_per_step(config.num_parameters(), args.n_layer, args.n_embd,
                                     args.seq, tokens)
        hf = torch_reference.gpt2(args.vocab, config.n_positions, args.n_embd, args.n_layer,
                                  args.n_head)
        return config.replace(attention=args.attention), flops, hf, GPT2LMHead
    config = llama_config(args)
    flops = config.flops_per_token(args.seq) * tokens
    hf = torch_reference.llama(args.vocab, args.n_embd, args.n_inner, args.n_layer,
                               args.n_head, args.n_kv_head, args.seq, args.tied)
    return config.replace(attention=args.attention), flops, hf, LlamaLM


def build_ours(ctx, hf, model_type, config, tiling, args, ncpu, ncuda):
    """(our model from the transformers model's weights, or None with the failure's record;
    our tiling)."""
    try:
        tiling = program_tiling(config, args.batch, args.seq, tiling, ncpu, ncuda, args.dtype)
        model = model_type.from_transformers(hf, tiling, args.dtype)
        print(ctx.describe().splitlines()[-1], flush=True)  # the tiles, and why
        ctx.wait()
    except Exception as exc:
        return None, failure(exc), tiling
    return model, None, tiling


def main(argv=None):
    args = parse_args(argv)
    gpu = nntile.HAVE_CUDA and torch.cuda.is_available() and args.ncuda != 0
    device = "cuda" if gpu else "cpu"
    ncuda = (args.ncuda if args.ncuda is not None else 1) if gpu else 0
    # No CPU worker by default on a GPU: dmda would put large GEMMs on a core to calibrate.
    ncpu = args.ncpu if args.ncpu is not None or not gpu else 0
    warmup = args.warmup if args.warmup is not None else (3 if gpu else 1)
    tiling = {k: getattr(args, f"tile_{k}") for k in TILE_KEYS if getattr(args, f"tile_{k}")}
    config, flops, hf, model_type = models_of(args)
    nparams = config.num_parameters()
    device_name = (torch.cuda.get_device_name(0) if gpu
                   else f"CPU ({os.cpu_count()} cores, torch threads {torch.get_num_threads()})")
    print(f"model: {args.model}, {config.describe()}, {nparams / 1e9:.3f}B parameters, batch "
          f"{args.batch}x{args.seq}, {args.dtype}, on {device_name}; our tiling {tiling}",
          flush=True)
    rng = np.random.default_rng(0)
    ids = rng.integers(0, args.vocab, (args.batch, args.seq))
    targets = rng.integers(0, args.vocab, (args.batch, args.seq))
    # PyTorch trains first, on a GPU our runtime has not touched yet: building our model runs
    # tasks that leave tiles on the GPU, which would take PyTorch's memory. Ours then starts
    # from the same weights, kept on the host meanwhile.
    initial = {name: value.detach().clone() for name, value in hf.state_dict().items()}
    starpu_messages(args.verbose)
    with nntile.Context(ncpu=ncpu, ncuda=ncuda, sched=args.sched, verbose=args.verbose) as ctx:
        if not args.verbose:
            print(ctx.describe(verbose=False), flush=True)
        with paused(ctx):
            theirs = run_pytorch(hf, device, args, ids, targets, flops, warmup)
        print(describe("pytorch", theirs), flush=True)
        hf.to("cpu", torch.float32)  # the trainer moved (and for bf16 cast) it
        hf.load_state_dict(initial)
        del initial
        if gpu:
            torch.cuda.empty_cache()
        model, ours, tiling = build_ours(ctx, hf, model_type, config, tiling, args, ncpu, ncuda)
        del hf
        if model is not None:
            ours = run_ours(ctx, model, args, ids, targets, flops, warmup)
            model.unregister()
        print(describe("nntile", ours), flush=True)
        if ours["status"] == "ok":
            print(f"our timed steps per op ({args.steps} steps; a worker's tasks may overlap "
                  f"another's, so the times add up to more than the step):\n"
                  f"{op_table(ours['ops'], args.steps)}", flush=True)
        workers = ctx.workers
    ratio = (ours["tokens_per_s"] / theirs["tokens_per_s"]
             if ours["status"] == theirs["status"] == "ok" else None)
    if ratio is not None:
        print(f"ratio nntile / pytorch tokens/s: {ratio:.3f}", flush=True)
    result = dict(model=args.model, n_embd=args.n_embd, n_layer=args.n_layer,
                  n_head=args.n_head, n_kv_head=config.num_key_value_heads,
                  n_inner=config.intermediate_size, tied=config.tie_word_embeddings,
                  vocab=args.vocab, seq=args.seq, batch=args.batch, dtype=args.dtype,
                  params=nparams, flops_per_step=flops, device=device_name, workers=workers,
                  tiling=tiling, torch=torch.__version__, nntile=ours, pytorch=theirs,
                  ratio=ratio)
    if args.plot_data:
        append_plot_data(args.plot_data, result)
    print_result(result)


if __name__ == "__main__":
    sys.exit(main())
