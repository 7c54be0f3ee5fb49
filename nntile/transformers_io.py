"""transformers ``save_pretrained`` directories in and out, for every model family, without
torch where it can be done without.

Reading: ``config.json`` (its ``model_type`` picks the family, nntile.models.FAMILIES) and the
weights of ``model.safetensors``, or of the shards that ``model.safetensors.index.json`` lists,
in fp32, fp16, bf16 or fp64: safetensors files are parsed here (an 8-byte header length, a JSON
header, the raw tensors) and bf16 is converted by its bits (``float_to_bf16_bits``, as the
tensors do), since numpy has no bfloat16.
``pytorch_model.bin`` (and its sharded index) need torch. Writing: ``config.json`` and one
``model.safetensors`` in fp32, fp64 or bf16 (rounded to nearest even), which
``AutoModelForCausalLM.from_pretrained`` loads; a tied model's file has no ``lm_head.weight``,
as transformers writes it. The state dicts are keyed by transformers' names; the family's name
map (nntile.models.name_map) turns them into parameters.
"""
import ctypes
import errno
import json
import math
import os
import shutil
import tempfile

import numpy as np

from nntile._core.core import bf16_bits_to_float, float_to_bf16_bits
from nntile.cli_common import CLIError

CONFIG_FILE = "config.json"
SAFETENSORS = "model.safetensors"
SAFETENSORS_INDEX = "model.safetensors.index.json"
TORCH_BIN = "pytorch_model.bin"
TORCH_BIN_INDEX = "pytorch_model.bin.index.json"
WEIGHT_FILES = (SAFETENSORS, SAFETENSORS_INDEX, TORCH_BIN, TORCH_BIN_INDEX)
# a tokenizer for the tokenizers library, and the files transformers writes beside it
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json",
                   "tokenizer.model")
# safetensors' dtype names; BF16 is read as its bits (uint16)
SAFETENSORS_DTYPES = {"F64": np.float64, "F32": np.float32, "F16": np.float16,
                      "BF16": np.uint16, "I64": np.int64, "I32": np.int32, "I16": np.int16,
                      "I8": np.int8, "U8": np.uint8, "BOOL": np.bool_}
WRITE_DTYPES = {"fp32": ("F32", "float32"), "fp64": ("F64", "float64"),
                "bf16": ("BF16", "bfloat16")}
AT_FDCWD, RENAME_EXCHANGE = -100, 2  # Linux's <fcntl.h> and <linux/fs.h>


class TransformersDirError(CLIError):
    """A transformers directory cannot be read, or written."""


def _first_line(exc):
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


# ---- safetensors -----------------------------------------------------------------------------

def read_safetensors(path, dtype=np.float32):
    """{name: array} of a safetensors file, floats as ``dtype`` (fp32 arrays of an fp32 file
    are views of the file, not copies)."""
    def bad(reason):
        return TransformersDirError(f"cannot load {path}: {reason}")
    try:
        size = os.path.getsize(path)
        with open(path, "rb") as f:
            head = f.read(8)
            if len(head) < 8:
                raise bad("too short for a safetensors file")
            length = int.from_bytes(head, "little")
            if length > size - 8:
                raise bad("not a safetensors file (its header length is past its end)")
            header = json.loads(f.read(length))
        if not isinstance(header, dict):
            raise ValueError("the header is not a JSON object")
    except (OSError, ValueError, UnicodeDecodeError) as exc:
        if isinstance(exc, TransformersDirError):
            raise
        raise bad(f"not a safetensors file ({_first_line(exc)})") from None
    header.pop("__metadata__", None)
    start = 8 + length
    data = np.memmap(path, np.uint8, "r", offset=start, shape=(size - start,)) \
        if size > start else np.zeros(0, np.uint8)
    out = {}
    for name, info in header.items():
        try:
            kind, shape, (begin, end) = info["dtype"], tuple(info["shape"]), info["data_offsets"]
        except (KeyError, TypeError, ValueError):
            raise bad(f"the header's entry for {name} is malformed") from None
        if kind not in SAFETENSORS_DTYPES:
            raise bad(f"{name} has dtype {kind}, which nntile does not read")
        item = np.dtype(SAFETENSORS_DTYPES[kind])
        if not 0 <= begin <= end <= len(data) or end - begin != math.prod(shape) * item.itemsize:
            raise bad(f"{name}'s bytes [{begin}, {end}) do not fit its shape {list(shape)} or "
                      "the file (truncated?)")
        array = data[begin:end].view(item).reshape(shape)
        if kind == "BF16":
            array = bf16_bits_to_float(array)
        if array.dtype.kind == "f":
            array = array.astype(dtype, copy=False)
        out[name] = array
    return out


def write_safetensors(path, arrays, weights="fp32"):
    """Write {name: float array} as a safetensors file in ``weights`` (fp32, fp64 or bf16),
    atomically (a temporary file renamed into place)."""
    kind, _ = WRITE_DTYPES[weights]
    header, offset, parts = {}, 0, []
    for name, array in arrays.items():
        shape = list(np.shape(array))
        array = (float_to_bf16_bits(array) if kind == "BF16" else
                 np.ascontiguousarray(array, SAFETENSORS_DTYPES[kind])).reshape(-1)
        header[name] = {"dtype": kind, "shape": shape,
                        "data_offsets": [offset, offset + array.nbytes]}
        offset += array.nbytes
        parts.append(array)
    header["__metadata__"] = {"format": "pt"}
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)  # the tensors start 8-byte aligned

    def write(f):
        f.write(len(text).to_bytes(8, "little"))
        f.write(text)
        for array in parts:
            f.write(memoryview(array).cast("B"))
    _atomic_write(path, write, "wb")


def _atomic_write(path, write, mode="w"):
    tmp = path + ".tmp"
    try:
        with open(tmp, mode) as f:
            write(f)
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


# ---- a directory in --------------------------------------------------------------------------

def read_config(hf_dir):
    """(config, notes) of a transformers directory: the config of its family (a one-line
    error for a family nntile does not have or settings it does not implement), and what it
    asks for that nntile ignores (dropout)."""
    from nntile.models import FAMILIES, config_from_dict
    if not os.path.isdir(hf_dir):
        raise TransformersDirError(f"{hf_dir} is not a directory (a transformers "
                                   "save_pretrained output)")
    path = os.path.join(hf_dir, CONFIG_FILE)
    if not os.path.isfile(path):
        raise TransformersDirError(f"{hf_dir} has no {CONFIG_FILE}")
    if not any(os.path.isfile(os.path.join(hf_dir, f)) for f in WEIGHT_FILES):
        raise TransformersDirError(f"{hf_dir} has no {SAFETENSORS} or {TORCH_BIN} (nor their "
                                   "sharded index)")
    try:
        with open(path) as f:
            data = json.load(f)
        if not isinstance(data, dict):
            raise ValueError("not a JSON object")
    except (OSError, ValueError, RecursionError) as exc:
        raise TransformersDirError(f"{path} cannot be read: {_first_line(exc)}") from None
    model_type = data.get("model_type") or "gpt2"
    if isinstance(model_type, str) and model_type not in FAMILIES:  # else config_from_dict's
        raise TransformersDirError(f"{hf_dir} holds a {model_type!r} model; nntile has "
                                   f"{', '.join(FAMILIES)}")
    try:
        config = config_from_dict(data)
    except (TypeError, ValueError) as exc:
        raise TransformersDirError(f"{path}: {exc}") from None
    return config, type(config).ignored(data)


def _shards(hf_dir, index_name):
    """The files an index.json names, each once, in order."""
    path = os.path.join(hf_dir, index_name)
    try:
        with open(path) as f:
            weight_map = json.load(f)["weight_map"]
        files = list(dict.fromkeys(weight_map.values()))
    except (OSError, ValueError, KeyError, TypeError, AttributeError, RecursionError) as exc:
        raise TransformersDirError(f"{path} cannot be read: {_first_line(exc)}") from None
    for name in files:
        if os.path.basename(name) != name or not os.path.isfile(os.path.join(hf_dir, name)):
            raise TransformersDirError(f"{path} names {name!r}, which {hf_dir} does not hold")
    return [os.path.join(hf_dir, name) for name in files]


def _read_torch(path, dtype):
    try:
        import torch
    except ImportError:
        raise TransformersDirError(f"reading {path} needs torch (pip install torch), or "
                                   f"weights in {SAFETENSORS}") from None
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
        if not isinstance(state, dict):
            raise ValueError("it does not hold a state dict")
    except Exception as exc:  # torch raises many kinds for unreadable files
        raise TransformersDirError(f"cannot load {path}: {_first_line(exc)}") from None
    torch_dtype = torch.float64 if dtype == np.float64 else torch.float32
    return {k: (v.to(torch_dtype) if v.is_floating_point() else v).numpy()
            for k, v in state.items() if isinstance(v, torch.Tensor)}


def read_state(hf_dir, dtype=np.float32):
    """transformers' state dict of a directory, as numpy arrays (floats in ``dtype``), from
    model.safetensors, its shards, or else pytorch_model.bin and its shards (through torch)."""
    join = lambda name: os.path.join(hf_dir, name)  # noqa: E731
    if os.path.isfile(join(SAFETENSORS)):
        files, read = [join(SAFETENSORS)], read_safetensors
    elif os.path.isfile(join(SAFETENSORS_INDEX)):
        files, read = _shards(hf_dir, SAFETENSORS_INDEX), read_safetensors
    elif os.path.isfile(join(TORCH_BIN)):
        files, read = [join(TORCH_BIN)], _read_torch
    elif os.path.isfile(join(TORCH_BIN_INDEX)):
        files, read = _shards(hf_dir, TORCH_BIN_INDEX), _read_torch
    else:
        raise TransformersDirError(f"{hf_dir} has no {SAFETENSORS} or {TORCH_BIN}")
    state = {}
    for path in files:
        state.update(read(path, dtype))
    return state


def read_model_state(hf_dir, config, dtype=np.float32):
    """read_state, checked against the model of ``config`` before StarPU starts: every tensor
    of its family's name map, in its shape, and nothing else; a one-line error naming the
    first that is not (missing, of another size than config.json says, transposed)."""
    state = read_state(hf_dir, dtype)
    try:
        return config.name_map().check(state)
    except (KeyError, ValueError) as exc:
        raise TransformersDirError(f"{hf_dir}: {exc.args[0] if exc.args else exc}") from None


def tokenizer_info(hf_dir):
    """How a checkpoint records the tokenizer of a transformers directory: its tokenizer.json
    (the tokenizers library reads it), a GPT-2 tokenizer's vocab.json and merges.txt
    (transformers reads them), or None."""
    if os.path.isfile(os.path.join(hf_dir, "tokenizer.json")):
        return {"name": "tokenizer.json", "path": os.path.abspath(hf_dir)}
    if os.path.isfile(os.path.join(hf_dir, "vocab.json")):
        return {"name": "gpt2", "path": os.path.abspath(hf_dir)}
    return None


# ---- a directory out -------------------------------------------------------------------------

def write_dir(hf_dir, config, state, weights="fp32", tokenizer=None):
    """Write config.json, model.safetensors (``weights``: fp32, fp64 or bf16) of a model's
    transformers state dict, and the tokenizer a checkpoint records (write_tokenizer), as the
    directory ``hf_dir``; a note on the tokenizer for the program's summary.
    The directory is built beside ``hf_dir`` and swapped in whole, so that ``hf_dir`` holds
    the old model or the new one at every instant, even if the process is killed; what else
    the old directory held (a README, its tokenizer where none is written) is carried over,
    its weights are not (they would shadow the new ones)."""
    _, torch_dtype = WRITE_DTYPES[weights]
    target = os.path.realpath(hf_dir)  # a link to a directory: the directory
    parent = os.path.dirname(target)
    tmp = remove = None
    try:
        os.makedirs(parent, exist_ok=True)
        tmp = tempfile.mkdtemp(prefix=f".{os.path.basename(target)}.nntile-", dir=parent)
        write_safetensors(os.path.join(tmp, SAFETENSORS), state, weights)
        _atomic_write(os.path.join(tmp, CONFIG_FILE), lambda f: json.dump(
            config.to_transformers_dict(torch_dtype), f, indent=2))
        note = write_tokenizer(tokenizer, tmp)
        _carry_over(target, tmp)
        remove = _swap_in(tmp, target)
    except OSError as exc:
        raise TransformersDirError(f"cannot write {hf_dir}: {exc.strerror or exc}") from None
    finally:
        for path in (tmp, remove):  # after the swap, the old directory
            if path is not None:
                shutil.rmtree(path, ignore_errors=True)
    return note


def _carry_over(old, new):
    """Into ``new``: what the directory ``old`` (if any) holds and ``new`` does not, but weight
    files; hard links where the file system has them, so nothing large is copied. ``new``
    takes ``old``'s permissions, else the umask's."""
    if not os.path.isdir(old):
        mask = os.umask(0)
        os.umask(mask)
        os.chmod(new, 0o777 & ~mask)
        return
    skip = set(os.listdir(new)) | set(WEIGHT_FILES)
    shutil.copytree(old, new, symlinks=True, dirs_exist_ok=True, copy_function=_link_or_copy,
                    ignore=lambda directory, names: skip if directory == old else ())


def _link_or_copy(src, dst):
    try:
        os.link(src, dst)
    except OSError:
        shutil.copy2(src, dst)


def _swap_in(new, path):
    """Put the directory ``new`` at ``path``; the path returned holds what ``path`` held (to
    delete). One step on Linux (renameat2's RENAME_EXCHANGE), so that ``path`` is never
    missing; elsewhere the old directory moves aside first."""
    if not os.path.lexists(path):
        os.rename(new, path)
        return None
    if _exchange(new, path):
        return new
    aside = new + ".old"
    os.rename(path, aside)
    os.rename(new, path)
    return aside


def _exchange(a, b):
    """Swap the names of two paths in one step; False where the system cannot (no renameat2
    in the C library, or a kernel or file system without RENAME_EXCHANGE)."""
    rename = getattr(ctypes.CDLL(None, use_errno=True), "renameat2", None)
    if rename is None:
        return False
    if rename(AT_FDCWD, os.fsencode(a), AT_FDCWD, os.fsencode(b), RENAME_EXCHANGE) == 0:
        return True
    err = ctypes.get_errno()
    if err in (errno.ENOSYS, errno.EINVAL, errno.ENOTSUP):
        return False
    raise OSError(err, os.strerror(err), b)


def write_tokenizer(info, hf_dir):
    """Copy a recorded tokenizer into ``hf_dir`` (OSError where it cannot); a note for the
    program's summary."""
    info = info or {}
    if info.get("name") == "tokenizer.json":
        source = info.get("path") or ""
        files = [f for f in TOKENIZER_FILES if os.path.isfile(os.path.join(source, f))]
        if "tokenizer.json" not in files:
            return f" (tokenizer {source}/tokenizer.json not found: not written)"
        for name in files:
            shutil.copyfile(os.path.join(source, name), os.path.join(hf_dir, name))
        return " and the tokenizer"
    if info.get("name") == "gpt2":
        from nntile.data import get_tokenizer
        try:
            get_tokenizer("gpt2", info.get("path")).tok.save_pretrained(hf_dir)
            return " and the tokenizer"
        except (CLIError, OSError):
            return " (tokenizer not available locally: not written)"
    return ""
