"""nntile-eval: the mean loss of a checkpoint on fixed batches of a data split.

    nntile-eval --checkpoint checkpoints/ckpt-600.h5 [--data DIR] [--batches N]

The batches are ``nntile.data.eval_batches``: windows spread evenly over the split, the same
ones that nntile-train measures its validation loss on.
"""
import json
import os
import sys

import numpy as np

from nntile.cli_common import (ArgumentParser, CLIError, DefaultsHelpFormatter,
                               add_runtime_args, add_tiling_args, add_verbose_arg,
                               check_inference_memory, checkpoint_seq_len, model_from_checkpoint,
                               positive_int, run_cli, start_context)
from nntile.data import EVAL_BATCHES


def build_parser():
    p = ArgumentParser(prog="nntile-eval", description=__doc__.split("\n\n")[0],
                       formatter_class=DefaultsHelpFormatter)
    p.add_argument("--checkpoint", required=True, help="an nntile checkpoint (.h5)")
    p.add_argument("--data", help="data directory (default: the one the checkpoint trained on)")
    p.add_argument("--split", choices=("val", "train"), default="val")
    p.add_argument("--batches", type=positive_int, help="batches to average (default: the "
                   f"checkpoint's --eval-batches, as its training measured, else "
                   f"{EVAL_BATCHES})")
    p.add_argument("--batch-size", type=positive_int, help="sequences per batch (the "
                   "checkpoint's training batch size, else 8)")
    p.add_argument("--seq-len", type=positive_int, help="tokens per sequence (the checkpoint's "
                   "training length, else the model's positions)")
    p.add_argument("--dtype", help="compute in fp32, tf32 or fp64 (default: the checkpoint's)")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    add_verbose_arg(p)
    add_tiling_args(p)
    add_runtime_args(p)
    return p


def eval_main(argv=None):
    from nntile.checkpoint import Checkpoint
    from nntile.data import TokenData, eval_batches
    args = build_parser().parse_args(argv)
    ckpt = Checkpoint(args.checkpoint)
    config = ckpt.config
    train = ckpt.get("train") or {}
    data_dir = args.data or train.get("data")
    if not data_dir:
        raise CLIError(f"checkpoint {args.checkpoint} names no data directory: pass --data")
    data = TokenData(data_dir)
    seq = checkpoint_seq_len(ckpt, args.seq_len)
    batch = args.batch_size or int(train.get("batch_size", 8))
    data.check_vocabulary(config.vocab_size, None, f"checkpoint {args.checkpoint}")
    nbatches = args.batches or int(train.get("eval_batches", EVAL_BATCHES))
    data.check(config.vocab_size, seq)
    tokens = data.splits[args.split]
    est = check_inference_memory(ckpt, args, batch, seq, args.dtype, "nntile-eval")
    batches = eval_batches(tokens, batch, seq, nbatches)
    ctx = start_context(args, verbose=args.verbose, run_bytes=est.total)
    try:
        model = model_from_checkpoint(ckpt, args, batch, seq, args.dtype)
        losses = [model.loss(x, y) for x, y in batches]
    finally:
        ctx.shutdown()
    loss = float(np.mean(losses))
    if args.json:
        print(json.dumps({"loss": loss, "split": args.split, "batches": nbatches,
                          "batch_size": batch, "seq_len": seq, "losses": losses,
                          "checkpoint": os.path.abspath(args.checkpoint),
                          "data": os.path.abspath(data_dir)}))
    else:
        print(f"{args.split} loss {loss:.6f} (perplexity {np.exp(loss):.3f}) over "
              f"{nbatches} batches of {batch}x{seq} tokens; checkpoint {args.checkpoint} "
              f"(step {ckpt.step}), data {data_dir}")
    return 0


def main(argv=None):
    return run_cli(eval_main, argv, "nntile-eval")


if __name__ == "__main__":
    sys.exit(main())
