"""nntile-convert: transformers models <-> nntile checkpoints, for every model family.

    nntile-convert import HF_DIR OUT.h5     # a save_pretrained directory -> checkpoint
    nntile-convert export CKPT.h5 HF_DIR    # -> config.json + model.safetensors

config.json's model_type picks the family (nntile.models.FAMILIES). Both directions keep
every weight exactly (fp32 stays fp32; bf16 weights are read as the fp32 values they are).
Importing reads model.safetensors or its shards directly, pytorch_model.bin through torch
(nntile.transformers_io); exporting writes files that ``AutoModelForCausalLM.from_pretrained``
loads (and the tokenizer, when the checkpoint names one that is available locally).
"""
import os
import sys

import numpy as np

from nntile.cli_common import (ArgumentParser, CLIError, add_runtime_args, add_tiling_args,
                               add_verbose_arg, check_dtype, default_tiles, family_model,
                               model_from_checkpoint, model_tiling, output_file, program_main,
                               resolve_tiling, start_context, tiling_from_args)


def build_parser():
    p = ArgumentParser(prog="nntile-convert", description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="command", metavar="{import,export}")
    sub.required = True
    imp = sub.add_parser("import", help="transformers directory -> nntile checkpoint")
    imp.add_argument("hf_dir", metavar="HF_DIR")
    imp.add_argument("out", metavar="OUT.h5", type=output_file("model.h5"))
    imp.add_argument("--dtype", default="fp32",
                     help="precision to record: fp32 (default), tf32, fp64, bf16 or bf16-mixed")
    imp.add_argument("--tokenizer", help="tokenizer to record: byte, gpt2 or a directory "
                     "(default: HF_DIR's own tokenizer, else byte for 256 tokens, else gpt2)")
    add_tiling_args(imp)
    add_runtime_args(imp)
    exp = sub.add_parser("export", help="nntile checkpoint -> transformers directory")
    exp.add_argument("checkpoint", metavar="CKPT.h5")
    exp.add_argument("--dtype", default="fp32", choices=("fp32", "bf16"),
                     help="dtype of the weights written: fp32 (default: the master weights "
                     "as they are; fp64 for an fp64 checkpoint) or bf16 (rounded to nearest)")
    exp.add_argument("hf_dir", metavar="HF_DIR")
    add_runtime_args(exp)
    for sp in (imp, exp):
        sp.add_argument("--overwrite", action="store_true",
                        help="replace what the output already holds")
        add_verbose_arg(sp)
        sp.error = p.error  # one-line errors from the sub-commands too
    return p


def _tokenizer(args, config):
    """What the checkpoint records as the model's tokenizer: --tokenizer, else HF_DIR's own,
    else byte for 256 tokens, else GPT-2's."""
    from nntile.transformers_io import tokenizer_info
    if args.tokenizer == "byte":
        return {"name": "byte"}
    if args.tokenizer:
        if os.path.isdir(args.tokenizer):
            return tokenizer_info(args.tokenizer) or {"name": "gpt2",
                                                      "path": os.path.abspath(args.tokenizer)}
        return {"name": "gpt2", "path": args.tokenizer}
    found = tokenizer_info(args.hf_dir)
    if found:
        return found
    return {"name": "byte"} if config.vocab_size <= 256 else {"name": "gpt2", "path": "gpt2"}


def import_main(args):
    from nntile.checkpoint import save
    from nntile.transformers_io import read_config, read_model_state
    dtype = check_dtype(args.dtype)
    if os.path.exists(args.out) and not args.overwrite:
        raise CLIError(f"{args.out} already exists: replace it with --overwrite, or choose "
                       "another name")
    config, notes = read_config(args.hf_dir)
    model_type = family_model(config)
    given = tiling_from_args(args)  # else chosen for this machine, as nntile-train does
    tiles = resolve_tiling(given, config, None, None, default_tiles(
        config, None, None, given, args, dtype, training=False))
    tokenizer = _tokenizer(args, config)
    state = read_model_state(args.hf_dir, config, np.float64 if dtype == "fp64" else np.float32)
    for note in notes:
        print(f"nntile-convert: note: {note}", file=sys.stderr)
    ctx = start_context(args, verbose=args.verbose)
    try:
        model = model_type(config, tiling=model_tiling(tiles), dtype=dtype)
        model.load_state_dict(state)
        save(args.out, model, None, dict(
            config=config.to_dict(), tiling=tiles, dtype=dtype, step=0, tokenizer=tokenizer,
            source={"transformers": os.path.abspath(args.hf_dir)}))
    finally:
        ctx.shutdown()
    print(f"nntile-convert: {args.hf_dir} -> {args.out} ({config.name} "
          f"{config.num_parameters() / 1e6:.2f}M parameters, {dtype})")
    return 0


def export_main(args):
    from nntile.checkpoint import Checkpoint
    from nntile.transformers_io import WEIGHT_FILES, write_dir
    ckpt = Checkpoint(args.checkpoint)
    config = ckpt.config
    family_model(config)
    if os.path.exists(args.hf_dir) and not os.path.isdir(args.hf_dir):
        raise CLIError(f"{args.hf_dir} exists and is not a directory")
    present = [f for f in ("config.json",) + WEIGHT_FILES
               if os.path.exists(os.path.join(args.hf_dir, f))]
    if present and not args.overwrite:
        raise CLIError(f"{args.hf_dir} already holds a model ({', '.join(present)}): replace "
                       "it with --overwrite, or choose another directory")
    ctx = start_context(args, verbose=args.verbose)
    try:
        model = model_from_checkpoint(ckpt)
        state = model.state_dict()
    finally:
        ctx.shutdown()
    weights = "fp64" if args.dtype == "fp32" and ckpt.dtype == "fp64" else args.dtype
    note = write_dir(args.hf_dir, config, state, weights, ckpt.get("tokenizer"))
    print(f"nntile-convert: {args.checkpoint} -> {args.hf_dir} (config.json, "
          f"model.safetensors{note})")
    return 0


def convert_main(argv=None):
    args = build_parser().parse_args(argv)
    return import_main(args) if args.command == "import" else export_main(args)


main = program_main(convert_main, "nntile-convert", __name__)
