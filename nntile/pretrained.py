"""nntile.load: a model with its weights and its tokenizer, from an nntile checkpoint (.h5) or
a transformers directory (save_pretrained's output), ready to run or generate:

    model, tokenizer = nntile.load("checkpoints/ckpt-600.h5")
    ids = tokenizer.encode("def main(")
    new = model.generate([ids], max_new_tokens=64, tokenizer=tokenizer)[0]
"""
import os

import numpy as np


def load(path, dtype=None, tiling=None):
    """(model, tokenizer) of ``path``: the model of its family (nntile.models) holding its
    weights, in ``dtype`` (default: the checkpoint's; fp32 for a transformers directory) and
    ``tiling`` (default: the checkpoint's, else nntile's); the tokenizer it records or holds
    (nntile.data.get_tokenizer), None where it has none. Everything is read and checked
    before StarPU starts; a default nntile.Context is started where none is running."""
    from nntile.cli_common import family_model
    read = _read_dir if os.path.isdir(path) else _read_checkpoint
    config, dtype, tiling, tokenizer, fill = read(path, dtype, tiling)
    model_type = family_model(config)
    _running_context()
    model = model_type(config, tiling=tiling, dtype=dtype)
    fill(model)
    return model, tokenizer


def _read_dir(path, dtype, tiling):
    from nntile.cli_common import check_dtype
    from nntile.data import get_tokenizer
    from nntile.transformers_io import read_config, read_model_state, tokenizer_info
    config = read_config(path)[0]
    dtype = check_dtype(dtype or "fp32")
    state = read_model_state(path, config, np.float64 if dtype == "fp64" else np.float32)
    info = tokenizer_info(path)
    tokenizer = get_tokenizer(info["name"], info["path"]) if info else None
    return config, dtype, tiling, tokenizer, lambda model: model.load_state_dict(state)


def _read_checkpoint(path, dtype, tiling):
    from nntile.checkpoint import Checkpoint
    from nntile.cli_common import CLIError, check_dtype, checkpoint_tiles, model_tiling
    from nntile.data import checkpoint_tokenizer
    ckpt = Checkpoint(path)
    try:
        tokenizer = checkpoint_tokenizer(ckpt, path)
    except CLIError:  # it names none
        tokenizer = None
    tiling = tiling or model_tiling(checkpoint_tiles(ckpt))
    return (ckpt.config, check_dtype(dtype or ckpt.dtype), tiling, tokenizer,
            ckpt.load_params)


def _running_context():
    from nntile.context import Context, current_context
    if current_context() is None:
        global _context
        _context = Context()  # stops at exit


_context = None
