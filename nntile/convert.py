"""nntile-convert: transformers GPT-2 <-> nntile checkpoints.

    nntile-convert import HF_DIR OUT.h5     # a save_pretrained directory -> checkpoint
    nntile-convert export CKPT.h5 HF_DIR    # -> config.json + model.safetensors

Both directions keep every weight exactly (fp32 stays fp32). Importing reads model.safetensors
directly (else ``GPT2LMHeadModel.from_pretrained(HF_DIR, local_files_only=True)``, e.g. for
pytorch_model.bin); exporting writes files that
``GPT2LMHeadModel.from_pretrained`` loads (and the tokenizer, when the checkpoint names one that
is available locally).
"""
import json
import os
import sys

import numpy as np

from nntile.cli_common import (ArgumentParser, CLIError, add_runtime_args, add_tiling_args,
                               add_verbose_arg, check_dtype, model_from_checkpoint,
                               model_tiling, output_file, resolve_tiling, run_cli,
                               start_context, tiling_from_args)

WEIGHT_FILES = ("model.safetensors", "pytorch_model.bin", "model.safetensors.index.json",
                "pytorch_model.bin.index.json")
TOKENIZER_FILES = ("tokenizer.json", "vocab.json")


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


UNSUPPORTED = {"scale_attn_weights": True, "scale_attn_by_inverse_layer_idx": False,
               "reorder_and_upcast_attn": False, "add_cross_attention": False}


def _read_hf_config(hf_dir):
    if not os.path.isdir(hf_dir):
        raise CLIError(f"{hf_dir} is not a directory (a transformers save_pretrained output)")
    path = os.path.join(hf_dir, "config.json")
    if not os.path.isfile(path):
        raise CLIError(f"{hf_dir} has no config.json")
    if not any(os.path.isfile(os.path.join(hf_dir, f)) for f in WEIGHT_FILES):
        raise CLIError(f"{hf_dir} has no model.safetensors or pytorch_model.bin")
    try:
        with open(path) as f:
            data = json.load(f)
        if not isinstance(data, dict):
            raise ValueError("not a JSON object")
    except (OSError, ValueError, RecursionError) as exc:
        raise CLIError(f"{path} cannot be read: {exc}") from None
    if data.get("model_type", "gpt2") != "gpt2":
        raise CLIError(f"{hf_dir} holds a {data['model_type']!r} model; only gpt2 converts")
    for key, usual in UNSUPPORTED.items():
        if data.get(key, usual) != usual:
            raise CLIError(f"{path}: {key}={data[key]!r} is not supported (only {usual!r})")
    from nntile.models import GPT2Config
    try:
        return GPT2Config.from_dict(data)
    except (TypeError, ValueError) as exc:
        raise CLIError(f"{path}: {exc}") from None


def _read_safetensors(path):
    """transformers' state dict from a single model.safetensors (None: let transformers try)."""
    try:
        from safetensors.numpy import load_file
    except ImportError:
        return None
    try:
        raw = load_file(path)
    except Exception as exc:  # bfloat16 weights and the like: transformers reads those
        if type(exc).__name__ == "SafetensorError":  # a damaged file
            raise CLIError(f"cannot load {path}: {str(exc).splitlines()[0]}") from None
        return None
    state = {}
    for key, value in raw.items():
        if not key.startswith(("transformer.", "lm_head.")):
            key = "transformer." + key  # checkpoints saved from GPT2Model
        state[key] = value
    return state


def _read_with_transformers(hf_dir, dtype):
    try:
        import torch
        import transformers
        from transformers import GPT2LMHeadModel
    except ImportError as exc:
        raise CLIError(f"reading {hf_dir} needs torch and transformers ({exc})") from None
    transformers.logging.set_verbosity_error()
    transformers.logging.disable_progress_bar()
    try:
        hf = GPT2LMHeadModel.from_pretrained(
            hf_dir, local_files_only=True,
            torch_dtype=torch.float64 if dtype == "fp64" else torch.float32)
    except Exception as exc:  # transformers raises many kinds for unreadable files
        reason = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise CLIError(f"transformers cannot load {hf_dir}: {reason}") from None
    return {k: v.detach().cpu().numpy() for k, v in hf.state_dict().items()}


def import_main(args):
    from nntile.checkpoint import save
    from nntile.models import GPT2LMHead
    dtype = check_dtype(args.dtype)
    if os.path.exists(args.out) and not args.overwrite:
        raise CLIError(f"{args.out} already exists: replace it with --overwrite, or choose "
                       "another name")
    config = _read_hf_config(args.hf_dir)
    tiles = resolve_tiling(tiling_from_args(args), config, None, None)
    if args.tokenizer:
        tokenizer = {"name": "byte"} if args.tokenizer == "byte" else \
            {"name": "gpt2", "path": os.path.abspath(args.tokenizer)
             if os.path.isdir(args.tokenizer) else args.tokenizer}
    elif any(os.path.isfile(os.path.join(args.hf_dir, f)) for f in TOKENIZER_FILES):
        tokenizer = {"name": "gpt2", "path": os.path.abspath(args.hf_dir)}
    elif config.vocab_size <= 256:
        tokenizer = {"name": "byte"}
    else:
        tokenizer = {"name": "gpt2", "path": "gpt2"}
    weights = os.path.join(args.hf_dir, "model.safetensors")
    state = _read_safetensors(weights) if os.path.isfile(weights) else None
    if state is None:
        state = _read_with_transformers(args.hf_dir, dtype)
    ctx = start_context(args, verbose=args.verbose)
    try:
        model = GPT2LMHead(config, tiling=model_tiling(tiles), dtype=dtype)
        try:
            model.load_state_dict(state)
        except (KeyError, ValueError, TypeError) as exc:
            raise CLIError(f"{args.hf_dir}: {str(exc).strip(chr(34) + chr(39))}") from None
        save(args.out, model, None, dict(
            config=config.to_dict(), tiling=tiles, dtype=dtype, step=0, tokenizer=tokenizer,
            source={"transformers": os.path.abspath(args.hf_dir)}))
    finally:
        ctx.shutdown()
    print(f"nntile-convert: {args.hf_dir} -> {args.out} ({config.num_parameters() / 1e6:.2f}M "
          f"parameters, {dtype})")
    return 0


def _save_bf16(state, path):
    """state (float arrays) as bf16 safetensors; numpy has no bfloat16, torch writes it."""
    try:
        import torch
        from safetensors.torch import save_file
    except ImportError:
        raise CLIError("exporting bf16 needs torch (pip install torch)") from None
    save_file({k: torch.from_numpy(np.ascontiguousarray(v, np.float32)).to(torch.bfloat16)
               for k, v in state.items()}, path, metadata={"format": "pt"})


def hf_config_dict(config, torch_dtype):
    """A transformers GPT-2 config.json for a GPT2Config whose weights are torch_dtype."""
    c = config
    out = {"architectures": ["GPT2LMHeadModel"], "model_type": "gpt2",
           "vocab_size": c.vocab_size, "n_positions": c.n_positions, "n_ctx": c.n_positions,
           "n_embd": c.n_embd, "n_layer": c.n_layer, "n_head": c.n_head, "n_inner": c.n_inner,
           "activation_function": c.activation_function,
           "layer_norm_epsilon": c.layer_norm_epsilon,
           "tie_word_embeddings": c.tie_word_embeddings,
           "torch_dtype": torch_dtype}
    if c.vocab_size > 50256:
        out["bos_token_id"] = out["eos_token_id"] = 50256
    else:
        out["bos_token_id"] = out["eos_token_id"] = None
    return out


def _atomic_write(path, write):
    tmp = path + ".tmp"
    try:
        write(tmp)
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def export_main(args):
    from nntile.checkpoint import Checkpoint
    ckpt = Checkpoint(args.checkpoint)
    config = ckpt.config
    try:
        from safetensors.numpy import save_file
    except ImportError:
        raise CLIError("exporting needs the safetensors package (pip install safetensors)") \
            from None
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
    state = {k: np.ascontiguousarray(v) for k, v in state.items()}
    if args.dtype == "bf16":
        torch_dtype = "bfloat16"
        write_weights = lambda p: _save_bf16(state, p)  # noqa: E731
    else:
        torch_dtype = "float64" if ckpt.dtype == "fp64" else "float32"
        write_weights = lambda p: save_file(state, p, metadata={"format": "pt"})  # noqa: E731
    try:
        os.makedirs(args.hf_dir, exist_ok=True)
        _atomic_write(os.path.join(args.hf_dir, "model.safetensors"), write_weights)

        def write_config(path):
            with open(path, "w") as f:
                json.dump(hf_config_dict(config, torch_dtype), f, indent=2)
        _atomic_write(os.path.join(args.hf_dir, "config.json"), write_config)
        for stale in present:  # --overwrite: weights in other files would shadow ours
            if stale in WEIGHT_FILES and stale != "model.safetensors":
                os.unlink(os.path.join(args.hf_dir, stale))
    except OSError as exc:
        raise CLIError(f"cannot write {args.hf_dir}: {exc.strerror or exc}") from None
    note = ""
    info = ckpt.get("tokenizer") or {}
    if info.get("name") == "gpt2":
        try:
            from nntile.data import get_tokenizer
            get_tokenizer("gpt2", info.get("path")).tok.save_pretrained(args.hf_dir)
            note = " and the tokenizer"
        except (CLIError, OSError):
            note = " (tokenizer not available locally: not written)"
    print(f"nntile-convert: {args.checkpoint} -> {args.hf_dir} (config.json, "
          f"model.safetensors{note})")
    return 0


def convert_main(argv=None):
    args = build_parser().parse_args(argv)
    return import_main(args) if args.command == "import" else export_main(args)


def main(argv=None):
    return run_cli(convert_main, argv, "nntile-convert")


if __name__ == "__main__":
    sys.exit(main())
