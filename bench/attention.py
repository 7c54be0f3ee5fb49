"""Fused against unfused attention: training steps of one GPT-2, in alternation.

    python3 bench/attention.py [--seq 1024] [--batch 8] [--ncpu 2] [--ncuda 1]
        [--variants fused,fused:256,unfused] [--rounds 3] [--precision fp32]
        [--n-embd 256 --n-layer 4 --n-head 4 --vocab 50257]

The model is bench/test_gpt2_cpu.py's (n_embd 256, 4 layers, 4 heads, vocabulary 50257, batch
tiles of one sample) unless told otherwise. A variant is an attention ("fused" or "unfused")
and, after a colon, the sequence tile (default: the whole sequence, one tile): fused with
several sequence tiles runs the grid of query-tile x key-tile tasks whose results merge.
Each variant is a model of its own in one StarPU context; a round runs one AdamW step of each
in turn, after one step each that allocates. Prints, per variant, the step times and the
execution time per op (StarPU's profiling), then one RESULT JSON line.
"""
import argparse
import statistics

import numpy as np

from harness import op_table, print_result, seconds, train_step


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--seq", type=int, default=1024)
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--tile-batch", type=int, default=1)
    p.add_argument("--n-embd", type=int, default=256)
    p.add_argument("--n-layer", type=int, default=4)
    p.add_argument("--n-head", type=int, default=4)
    p.add_argument("--vocab", type=int, default=50257)
    p.add_argument("--precision", "--dtype", dest="dtype", default="fp32")
    p.add_argument("--variants", default="fused,unfused",
                   help="comma-separated attention[:seq tile], e.g. fused,fused:256,unfused")
    p.add_argument("--rounds", type=int, default=3, help="timed steps per variant")
    p.add_argument("--core", action="store_true",
                   help="time the attention core alone (forward and backward of "
                   "nntile.nn.attention.CoreAttention on q, k, v of the model's shape)")
    p.add_argument("--ncpu", type=int)
    p.add_argument("--ncuda", type=int)
    p.add_argument("--sched")
    from nntile.cli_common import add_verbose_arg
    add_verbose_arg(p)
    return p.parse_args(argv)


def main(argv=None):
    args = parse_args(argv)
    import nntile
    from nntile.cli_common import starpu_messages
    from nntile.models import GPT2Config, GPT2LMHead
    from nntile.optim import AdamW
    from nntile.train import init_weights
    variants = []
    for text in args.variants.split(","):
        attention, _, tile = text.partition(":")
        variants.append((text, attention, int(tile) if tile else args.seq))
    rng = np.random.default_rng(0)
    ids = rng.integers(0, args.vocab, (args.batch, args.seq))
    targets = rng.integers(0, args.vocab, (args.batch, args.seq))
    starpu_messages(args.verbose)
    with nntile.Context(ncpu=args.ncpu, ncuda=args.ncuda, sched=args.sched) as ctx:
        print(ctx.describe(verbose=args.verbose), flush=True)
        runs = []
        if args.core:
            return core_main(args, ctx, variants)
        for name, attention, tile in variants:
            config = GPT2Config(vocab_size=args.vocab, n_positions=args.seq,
                                n_embd=args.n_embd, n_layer=args.n_layer, n_head=args.n_head,
                                attention=attention)
            tiling = dict(batch=args.tile_batch, seq=tile, vocab=min(8192, args.vocab))
            model = GPT2LMHead(config, tiling, args.dtype)
            init_weights(model, config, 0)
            opt = AdamW(model.named_parameters(), lr=1e-4)
            runs.append(dict(name=name, model=model, opt=opt, times=[], ops=[]))
        for run in runs:  # the first step of each allocates its buffers
            train_step(ctx, run["model"], run["opt"], ids, targets)
        ctx.profiling(True)
        ctx.op_stats()
        for _ in range(args.rounds):
            for run in runs:
                run["times"].append(seconds(
                    lambda: train_step(ctx, run["model"], run["opt"], ids, targets)))
                run["ops"].append(ctx.op_stats())
        ctx.profiling(False)
        result = {}
        for run in runs:
            t = run["times"]
            print(f"\n{run['name']}: step {min(t):.3f} s best, {statistics.median(t):.3f} s "
                  f"median of {len(t)} ({', '.join(f'{x:.3f}' for x in t)})")
            merged = {}
            for stats in run["ops"]:
                for s in stats:
                    key = (s["op"], s["dtype"])
                    tasks, secs = merged.get(key, (0, 0.0))
                    merged[key] = (tasks + s["tasks"], secs + s["seconds"])
            rows = sorted(({"op": k[0], "dtype": k[1], "tasks": v[0], "seconds": v[1]}
                           for k, v in merged.items()), key=lambda s: -s["seconds"])
            print(op_table(rows, len(t), rows=12))
            result[run["name"]] = dict(best_s=min(t), median_s=statistics.median(t),
                                       steps_s=t)
            run["model"].unregister()
        print_result(dict(seq=args.seq, batch=args.batch, dtype=args.dtype, variants=result))


def core_main(args, ctx, variants):
    """Forward and backward of the attention core alone, variants in alternation."""
    import nntile
    from nntile.nn.attention import CoreAttention
    H, D = args.n_head, args.n_embd // args.n_head
    shape = (args.batch, args.seq, H, D)
    rng = np.random.default_rng(0)
    result = {}
    runs = []
    for name, attention, tile in variants:
        tiles = (args.tile_batch, tile, H, D)
        core = CoreAttention(H, H, D, H, args.dtype, attention == "fused")
        x = [nntile.Tensor.from_array(rng.standard_normal(shape), tiles, core.compute)
             for _ in range(4)]
        grads = [nntile.Tensor(shape, tiles, core.compute) for _ in range(3)]
        runs.append((name, core, x, grads, []))

    def step(core, x, grads):
        core.forward(*x[:3])
        core.backward(x[3], *grads)
        ctx.wait()

    for name, core, x, grads, times in runs:
        step(core, x, grads)
    for _ in range(args.rounds):
        for name, core, x, grads, times in runs:
            times.append(seconds(lambda: step(core, x, grads)))
    for name, core, x, grads, times in runs:
        print(f"{name}: attention core forward + backward {min(times):.3f} s best, "
              f"{statistics.median(times):.3f} s median of {len(times)}")
        result[name] = dict(best_s=min(times), median_s=statistics.median(times))
        core.unregister()
        for t in x + grads:
            t.unregister()
    print_result(dict(seq=args.seq, batch=args.batch, dtype=args.dtype, core=result))


if __name__ == "__main__":
    main()
