"""Train a wide GPT-2 for a few steps and report throughput and memory (issue "Scale").

    python3 bench/scale.py --n-embd 8192 --n-layer 4 --batch 4 --steps 3 [--ncuda 1]
        [--limit-cuda-mem MiB] [--sched dmdasd] [--tile-embd 2048] ...

n_head = n_embd / 128, sequence 1024, vocabulary 50257, AdamW, tf32 by default. Weights are
random (never zeros: matrix units run faster on zeros). Prints one JSON line at the end.
"""
import argparse
import json
import resource
import sys
import time

import numpy as np

import nntile
from nntile.models import GPT2Config, GPT2LMHead
from nntile.optim import AdamW


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--n-embd", type=int, default=1024)
    p.add_argument("--n-layer", type=int, default=4)
    p.add_argument("--seq", type=int, default=1024)
    p.add_argument("--vocab", type=int, default=50257)
    p.add_argument("--batch", type=int, default=4)
    p.add_argument("--steps", type=int, default=3)
    p.add_argument("--dtype", default="tf32")
    p.add_argument("--ncpu", type=int)
    p.add_argument("--ncuda", type=int)
    p.add_argument("--sched")
    p.add_argument("--limit-cuda-mem", type=int)
    p.add_argument("--limit-cpu-mem", type=int)
    for key in ("batch", "seq", "embd", "head", "inner", "vocab"):
        p.add_argument(f"--tile-{key}", type=int)
    args = p.parse_args(argv)
    E = args.n_embd
    config = GPT2Config(vocab_size=args.vocab, n_positions=max(1024, args.seq), n_embd=E,
                        n_layer=args.n_layer, n_head=max(1, E // 128), tie_word_embeddings=False)
    tiling = {k: getattr(args, f"tile_{k}") for k in ("batch", "seq", "embd", "head", "inner", "vocab")
              if getattr(args, f"tile_{k}")}
    nparams = config.num_parameters()
    tokens = args.batch * args.seq
    flops_per_step = 6 * nparams * tokens + 12 * args.n_layer * E * args.seq * tokens
    print(f"model: n_embd {E}, {args.n_layer} layers, {nparams / 1e9:.2f}B parameters, "
          f"{16 * nparams / 2**30:.1f} GiB for weights+grads+Adam, tiling {tiling}", flush=True)
    rng = np.random.default_rng(0)
    with nntile.Context(ncpu=args.ncpu, ncuda=args.ncuda, sched=args.sched,
                        limit_cuda_mem=args.limit_cuda_mem, limit_cpu_mem=args.limit_cpu_mem,
                        verbose=True) as ctx:
        t0 = time.perf_counter()
        model = GPT2LMHead(config, tiling, args.dtype)
        for name, param in model.named_parameters():
            shape = param.value.shape
            if name.endswith("weight") and len(shape) > 1:
                param.value.write(0.02 * rng.standard_normal(shape, dtype=np.float32))
            elif name.endswith("weight"):
                param.value.fill(1.0)
        opt = AdamW(model.named_parameters(), lr=1e-4, max_grad_norm=1.0)
        ctx.wait()
        print(f"built and initialised in {time.perf_counter() - t0:.1f} s", flush=True)
        ids = rng.integers(0, args.vocab, (args.batch, args.seq))
        targets = rng.integers(0, args.vocab, (args.batch, args.seq))
        times, losses = [], []
        for step in range(args.steps):
            start = time.perf_counter()
            model.zero_grad()
            model.submit_loss(ids, targets)
            model.backward()
            opt.step()
            ctx.wait()
            times.append(time.perf_counter() - start)
            losses.append(float(model.loss_value.to_array()[0]))
            print(f"step {step + 1}: {times[-1]:.2f} s, loss {losses[-1]:.4f}, "
                  f"{flops_per_step / times[-1] / 1e12:.1f} TFLOP/s", flush=True)
        best = min(times[1:]) if len(times) > 1 else times[0]
        result = dict(n_embd=E, n_layer=args.n_layer, params=nparams, batch=args.batch,
                      seq=args.seq, step_s=best, tokens_per_s=tokens / best,
                      tflops=flops_per_step / best / 1e12, losses=losses,
                      max_rss_gib=resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20,
                      workers=ctx.workers, tiling=tiling)
        print("RESULT " + json.dumps(result), flush=True)


if __name__ == "__main__":
    sys.exit(main())
