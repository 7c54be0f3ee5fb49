"""nntile-generate: continue a prompt with a trained checkpoint.

    nntile-generate --checkpoint checkpoints/ckpt-600.h5 --prompt "def main(" --max-new-tokens 200

The tiled model always runs on one [1, seq_len] window, padded on the right: the model is
causal, so the logits at position t depend only on tokens up to t, and no tensor is
reallocated as the text grows. Longer texts slide the window.
"""
import codecs
import sys

import numpy as np

from nntile.cli_common import (ArgumentParser, CLIError, DefaultsHelpFormatter,
                               add_checkpoint_arg, add_dtype_arg,
                               add_runtime_args, add_tiling_args, add_verbose_arg,
                               check_inference_memory, checkpoint_seq_len,
                               model_from_checkpoint, nonneg_float, nonneg_int, positive_int,
                               probability, run_cli, start_context)
from nntile.data import checkpoint_tokenizer


def build_parser():
    p = ArgumentParser(prog="nntile-generate", description=__doc__.split("\n\n")[0],
                       formatter_class=DefaultsHelpFormatter)
    add_checkpoint_arg(p)
    p.add_argument("--prompt", default="", help="text to continue")
    p.add_argument("--max-new-tokens", type=nonneg_int, default=200, help="tokens to add")
    p.add_argument("--temperature", type=nonneg_float, default=0.8,
                   help="divides the logits: lower is more conservative (0: greedy)")
    p.add_argument("--top-k", type=nonneg_int, default=0, help="sample among the k likeliest "
                   "tokens (0: all)")
    p.add_argument("--top-p", type=probability, default=1.0, help="sample among the "
                   "likeliest tokens whose probabilities add up to p (nucleus sampling; 1: all)")
    p.add_argument("--greedy", action="store_true", help="always take the likeliest token")
    p.add_argument("--seed", type=nonneg_int, default=0, help="seed of the sampling")
    p.add_argument("--seq-len", type=positive_int, help="window length (default: the "
                   "checkpoint's training length, else n_positions)")
    p.add_argument("--tokenizer", help="byte, gpt2 or a local tokenizer directory (default: "
                   "what the checkpoint was trained with)")
    add_dtype_arg(p)
    add_verbose_arg(p)
    add_tiling_args(p)
    add_runtime_args(p)
    return p


def token_probs(logits, temperature=1.0, top_k=0, top_p=1.0):
    """The distribution the next token is drawn from (float64): softmax(logits / temperature),
    cut to the ``top_k`` likeliest tokens (0: all), then to the fewest likeliest whose
    probabilities add up to ``top_p`` at least, renormalised."""
    logits = np.asarray(logits, dtype=np.float64)
    if not np.isfinite(logits).all():
        raise ValueError("the model's logits hold NaN or inf")
    # the largest logit subtracted before dividing: a tiny temperature then sends the others
    # to -inf (probability 0), never to inf - inf = NaN
    with np.errstate(over="ignore"):
        z = (logits - logits.max()) / temperature
    if top_k and top_k < len(z):
        z = np.where(z < np.partition(z, -top_k)[-top_k], -np.inf, z)
    probs = np.exp(z)
    probs /= probs.sum()
    if top_p < 1:
        order = np.argsort(-probs, kind="stable")
        keep = order[:np.searchsorted(np.cumsum(probs[order]), top_p) + 1]
        nucleus = np.zeros_like(probs)
        nucleus[keep] = probs[keep]
        probs = nucleus / nucleus.sum()
    return probs


def pick_token(logits, rng, temperature, top_k, greedy, top_p=1.0):
    """The next token from a vector of logits."""
    if greedy or temperature == 0:
        return int(np.argmax(logits))
    probs = token_probs(logits, temperature, top_k, top_p)
    return int(rng.choice(len(probs), p=probs))


class Printer:
    """Writes decoded text to stdout as tokens arrive."""

    def __init__(self, tokenizer, out=None):
        self.tok = tokenizer
        self.out = out or sys.stdout  # looked up now: under mpirun, rank > 0 writes nowhere
        self.ids = []
        self.shown = ""
        self.bytes = codecs.getincrementaldecoder("utf-8")(errors="replace") \
            if tokenizer.name == "byte" else None

    def add(self, token):
        if self.bytes is not None:
            text = self.bytes.decode(bytes([token]))
        else:
            self.ids.append(token)
            full = self.tok.decode(self.ids)
            if full.endswith("\ufffd"):  # an unfinished multi-byte character: wait
                return
            text = full[len(self.shown):] if full.startswith(self.shown) else full
            self.shown = full
        self.out.write(text)
        self.out.flush()

    def finish(self):
        if self.bytes is not None:
            self.out.write(self.bytes.decode(b"", final=True))
        self.out.write("\n")
        self.out.flush()


def generate_main(argv=None):
    from nntile.checkpoint import Checkpoint
    args = build_parser().parse_args(argv)
    try:
        args.prompt.encode("utf-8")
    except UnicodeEncodeError as exc:  # bytes that are not UTF-8 arrive as lone surrogates
        raise CLIError(f"--prompt is not UTF-8 text (at character {exc.start + 1}): pass text "
                       "in UTF-8") from None
    ckpt = Checkpoint(args.checkpoint)
    tok = checkpoint_tokenizer(ckpt, args.checkpoint, args.tokenizer)
    seq = checkpoint_seq_len(ckpt, args.seq_len)
    ids = [int(i) for i in tok.encode(args.prompt)]
    if not ids:  # nothing to condition on: start from a newline (or end-of-text)
        ids = [tok.eot] if tok.eot is not None else [int(tok.encode("\n")[0])]
    rng = np.random.default_rng(args.seed)
    est = check_inference_memory(ckpt, args, 1, seq, args.dtype, "nntile-generate")
    ctx = start_context(args, verbose=args.verbose, run_bytes=est.total)
    if hasattr(sys.stdout, "reconfigure"):  # a terminal that cannot show a character: escape it
        sys.stdout.reconfigure(errors="backslashreplace")
    printer = Printer(tok)
    sys.stdout.write(args.prompt)
    sys.stdout.flush()
    try:
        model = model_from_checkpoint(ckpt, args, 1, seq, args.dtype)
        window = np.zeros((1, seq), dtype=np.int64)
        for _ in range(args.max_new_tokens):
            context = ids[-seq:]
            window[0, :len(context)] = context
            window[0, len(context):] = 0  # padding: never seen by the positions we read
            logits = model.forward(window)[0, len(context) - 1, :tok.vocab_size]
            try:
                token = pick_token(logits, rng, args.temperature, args.top_k, args.greedy,
                                   args.top_p)
            except ValueError as exc:
                raise CLIError(f"cannot sample: {exc}") from None
            ids.append(token)
            printer.add(token)
    finally:
        ctx.shutdown()
    printer.finish()
    return 0


def main(argv=None):
    return run_cli(generate_main, argv, "nntile-generate")


if __name__ == "__main__":
    sys.exit(main())
