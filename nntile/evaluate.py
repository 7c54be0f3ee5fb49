"""nntile-eval: the mean loss of a checkpoint on fixed batches of a data split, or on every
token of a text file or a split.

    nntile-eval --checkpoint checkpoints/ckpt-600.h5 [--data DIR] [--batches N]
    nntile-eval --checkpoint checkpoints/ckpt-600.h5 --text notes.txt

The batches are ``nntile.data.eval_batches``: windows spread evenly over the split, the same
ones that nntile-train measures its validation loss on. ``--text`` and ``--all-tokens`` score
each token once instead (but the first, which nothing precedes): windows of the sequence length
side by side, the last one ending at the last token and scoring only the tokens the others
left.
"""
import json
import os

import numpy as np

from nntile.cli_common import (ArgumentParser, CLIError, DefaultsHelpFormatter,
                               add_checkpoint_arg, add_dtype_arg,
                               add_runtime_args, add_tiling_args, add_verbose_arg,
                               check_inference_memory, checkpoint_seq_len,
                               model_from_checkpoint, positive_int, program_main, start_context)
from nntile.data import EVAL_BATCHES, checkpoint_tokenizer, eval_batches, windows


def build_parser():
    p = ArgumentParser(prog="nntile-eval", description=__doc__.split("\n\n")[0],
                       formatter_class=DefaultsHelpFormatter)
    add_checkpoint_arg(p)
    p.add_argument("--data", help="data directory (default: the one the checkpoint trained on)")
    p.add_argument("--split", choices=("val", "train"), default="val")
    p.add_argument("--batches", type=positive_int, help="batches to average (default: the "
                   f"checkpoint's --eval-batches, as its training measured, else "
                   f"{EVAL_BATCHES})")
    p.add_argument("--batch-size", type=positive_int, help="sequences per batch (the "
                   "checkpoint's training batch size, else 8)")
    p.add_argument("--seq-len", type=positive_int, help="tokens per sequence (the checkpoint's "
                   "training length, else the model's positions)")
    add_dtype_arg(p)
    p.add_argument("--text", metavar="FILE", help="a UTF-8 text file, tokenized with the "
                   "checkpoint's tokenizer: its perplexity, each token scored once")
    p.add_argument("--tokenizer", help="the tokenizer of --text (default: the checkpoint's)")
    p.add_argument("--all-tokens", action="store_true", help="each token of the split scored "
                   "once, instead of --batches batches")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    add_verbose_arg(p)
    add_tiling_args(p)
    add_runtime_args(p)
    return p


def eval_main(argv=None):
    from nntile.checkpoint import Checkpoint
    args = build_parser().parse_args(argv)
    ckpt = Checkpoint(args.checkpoint)
    if args.text is not None:
        if args.data is not None or args.all_tokens:
            raise CLIError("--text conflicts with --data and --all-tokens: it is the data")
        return _score_all(ckpt, args, _text_tokens(ckpt, args), args.text)
    if args.tokenizer is not None:
        raise CLIError("--tokenizer goes with --text (prepared data holds tokens)")
    train = ckpt.get("train") or {}
    data_dir = args.data or train.get("data")
    if not data_dir:
        raise CLIError(f"checkpoint {args.checkpoint} names no data directory: pass --data "
                       "(or --text FILE)")
    data = _prepared(data_dir, ckpt, args)
    if args.all_tokens:
        return _score_all(ckpt, args, data.splits[args.split], f"{data_dir} {args.split}")
    config = ckpt.config
    seq = checkpoint_seq_len(ckpt, args.seq_len)
    batch = args.batch_size or int(train.get("batch_size", 8))
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


def _prepared(data_dir, ckpt, args):
    from nntile.data import TokenData
    if os.path.isdir(data_dir) and not os.path.exists(os.path.join(data_dir, "train.bin")):
        raise CLIError(f"data directory {data_dir} holds no train.bin: prepare it with "
                       "nntile-prepare, or score a text file with --text FILE")
    data = TokenData(data_dir)
    data.check_vocabulary(ckpt.config.vocab_size, None, f"checkpoint {args.checkpoint}")
    return data


def _text_tokens(ckpt, args):
    tok = checkpoint_tokenizer(ckpt, args.checkpoint, args.tokenizer)
    if not os.path.isfile(args.text):
        raise CLIError(f"--text {args.text}: " + ("not a regular file"
                       if os.path.exists(args.text) else "no such file"))
    try:
        with open(args.text, encoding="utf-8") as f:
            text = f.read()
    except (OSError, UnicodeDecodeError) as exc:
        raise CLIError(f"--text {args.text}: {exc}") from None
    return np.asarray(tok.encode(text), dtype=np.int64)


def single_pass_windows(n_tokens, seq):
    """[(start, first scored target)] of windows of ``seq`` inputs covering the targets
    1..n_tokens-1 each once: side by side, the last one ending at the last token."""
    targets = n_tokens - 1
    plan = [(start, 0) for start in range(0, targets - seq + 1, seq)]
    done = len(plan) * seq
    if done < targets:  # the rest: the last window, past what the others scored
        plan.append((targets - seq, done - (targets - seq)))
    return plan


def _score_all(ckpt, args, tokens, what):
    """The mean loss over every token of ``tokens`` but the first, each scored once."""
    if len(tokens) < 2:
        raise CLIError(f"{what}: fewer than 2 tokens, nothing to score")
    if int(np.max(tokens)) >= ckpt.config.vocab_size:
        raise CLIError(f"{what}: token id {int(np.max(tokens))} is past the model's "
                       f"vocabulary of {ckpt.config.vocab_size}")
    seq = min(checkpoint_seq_len(ckpt, args.seq_len), len(tokens) - 1)
    batch = args.batch_size or 1
    est = check_inference_memory(ckpt, args, batch, seq, args.dtype, "nntile-eval")
    plan = single_pass_windows(len(tokens), seq)
    ctx = start_context(args, verbose=args.verbose, run_bytes=est.total)
    total = 0.0
    try:
        model = model_from_checkpoint(ckpt, args, batch, seq, args.dtype)
        for i in range(0, len(plan), batch):
            chunk = plan[i:i + batch]
            starts = [start for start, _ in chunk]
            x, y = windows(tokens, starts + starts[-1:] * (batch - len(chunk)), seq)
            logits = model.forward(x).astype(np.float64)
            logp = logits - logits.max(-1, keepdims=True)
            logp -= np.log(np.exp(logp).sum(-1, keepdims=True))
            for row, (_, first) in enumerate(chunk):
                total -= np.take_along_axis(logp[row, first:], y[row, first:, None], -1).sum()
    finally:
        ctx.shutdown()
    scored = len(tokens) - 1
    loss = total / scored
    if args.json:
        print(json.dumps({"loss": loss, "tokens": scored, "seq_len": seq, "source": what,
                          "checkpoint": os.path.abspath(args.checkpoint)}))
    else:
        print(f"loss {loss:.6f} (perplexity {np.exp(loss):.3f}) over {scored:,} tokens of "
              f"{what}, each scored once in windows of {seq}; checkpoint {args.checkpoint} "
              f"(step {ckpt.step})")
    return 0


main = program_main(eval_main, "nntile-eval", __name__)
