"""nntile-generate: continue a prompt with a trained checkpoint.

    nntile-generate --checkpoint checkpoints/ckpt-600.h5 --prompt "def main(" --max-new-tokens 200

The prompt runs through the model once; each new token then runs alone against the keys and
values of the tokens before it (nntile.models.kv_cache). Several --prompt run as batches, one
of the prompts of each length, and their texts come out in the order given. A text longer
than --seq-len goes on from its later half.
"""
import codecs
import sys

from nntile.cli_common import (ArgumentParser, CLIError, DefaultsHelpFormatter,
                               add_checkpoint_arg, add_dtype_arg,
                               add_runtime_args, add_tiling_args, add_verbose_arg,
                               check_inference_memory, checkpoint_seq_len, checkpoint_tiles,
                               model_tiling, nonneg_float, nonneg_int, positive_int, probability,
                               run_cli, start_context)
from nntile.data import checkpoint_tokenizer
from nntile.models.kv_cache import pick_token, token_probs  # noqa: F401 (nntile.generate's API)


def build_parser():
    p = ArgumentParser(prog="nntile-generate", description=__doc__.split("\n\n")[0],
                       formatter_class=DefaultsHelpFormatter)
    add_checkpoint_arg(p)
    p.add_argument("--prompt", action="append", help="text to continue; given several times, "
                   "the prompts of one length in tokens run as one batch")
    p.add_argument("--stop", help="stop a text after the token that completes this text (and "
                   "after the tokenizer's end-of-text token)")
    p.add_argument("--max-new-tokens", type=nonneg_int, default=200, help="tokens to add")
    p.add_argument("--temperature", type=nonneg_float, default=0.8,
                   help="divides the logits: lower is more conservative (0: greedy)")
    p.add_argument("--top-k", type=nonneg_int, default=0, help="sample among the k likeliest "
                   "tokens (0: all)")
    p.add_argument("--top-p", type=probability, default=1.0, help="sample among the "
                   "likeliest tokens whose probabilities add up to p (nucleus sampling; 1: all)")
    p.add_argument("--greedy", action="store_true", help="always take the likeliest token")
    p.add_argument("--seed", type=nonneg_int, default=0, help="seed of the sampling")
    p.add_argument("--seq-len", type=positive_int, help="the most tokens the model sees at "
                   "once (default: the checkpoint's training length, else n_positions)")
    p.add_argument("--tokenizer", help="byte, gpt2 or a local tokenizer directory (default: "
                   "what the checkpoint was trained with)")
    add_dtype_arg(p)
    add_verbose_arg(p)
    add_tiling_args(p)
    add_runtime_args(p)
    return p


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


def check_utf8(prompts):
    for text in prompts:
        try:
            text.encode("utf-8")
        except UnicodeEncodeError as exc:  # bytes that are not UTF-8 arrive as lone surrogates
            raise CLIError(f"--prompt is not UTF-8 text (at character {exc.start + 1}): pass "
                           "text in UTF-8") from None


def prompt_ids(prompts, tok):
    """The token ids of each prompt (lists of ints)."""
    ids = []
    for text in prompts:
        one = [int(i) for i in tok.encode(text)]
        if not one:  # nothing to condition on: start from a newline (or end-of-text)
            one = [tok.eot] if tok.eot is not None else [int(tok.encode("\n")[0])]
        ids.append(one)
    return ids


def continue_prompts(model, ids, args, tok, seq, printer):
    """The new tokens of each prompt, shown as they come where ``printer`` is given."""
    try:
        return model.generate(ids, args.max_new_tokens, temperature=0 if args.greedy
                              else args.temperature, top_k=args.top_k, top_p=args.top_p,
                              seed=args.seed, stop=args.stop, tokenizer=tok, window=seq,
                              on_token=printer and (lambda _, token: printer.add(token)))
    except ValueError as exc:  # the model's logits hold NaN or inf
        raise CLIError(f"cannot sample: {exc}") from None


def generate_main(argv=None):
    from nntile.checkpoint import Checkpoint
    from nntile.pretrained import load
    args = build_parser().parse_args(argv)
    prompts = args.prompt or [""]
    check_utf8(prompts)
    ckpt = Checkpoint(args.checkpoint)
    tok = checkpoint_tokenizer(ckpt, args.checkpoint, args.tokenizer)
    seq = checkpoint_seq_len(ckpt, args.seq_len)
    ids = prompt_ids(prompts, tok)
    batch = len(prompts)  # the most a batch can hold: the prompts of one length run together
    est = check_inference_memory(ckpt, args, batch, seq, args.dtype, "nntile-generate")
    ctx = start_context(args, verbose=args.verbose, run_bytes=est.total)
    if hasattr(sys.stdout, "reconfigure"):  # a terminal that cannot show a character: escape it
        sys.stdout.reconfigure(errors="backslashreplace")
    printer = Printer(tok) if batch == 1 else None
    if printer:
        sys.stdout.write(prompts[0])
        sys.stdout.flush()
    try:
        model = load(args.checkpoint, args.dtype,
                     model_tiling(checkpoint_tiles(ckpt, args, batch, seq)))[0]
        new = continue_prompts(model, ids, args, tok, seq, printer)
    finally:
        ctx.shutdown()
    if printer:
        printer.finish()
    for text, tokens in zip(prompts if not printer else (), new):
        print(text + tok.decode(tokens), end="\n\n")
    return 0


def main(argv=None):
    return run_cli(generate_main, argv, "nntile-generate")


if __name__ == "__main__":
    sys.exit(main())
