"""HDF5 checkpoints: one file ``ckpt-<step>.h5`` per checkpoint.

Layout::

    params/<parameter name>               one dataset per parameter, chunks = its tile shape
    optim/<parameter name>/<state name>   the optimizer's state tensors (Adam moments, ...)
    attrs: format, format_version, config, tiling, dtype, step, schedule, optimizer,
           rng, data, train, tokenizer (JSON strings, except format/dtype/step)

Tensors are written tile by tile (one HDF5 chunk per tile, with a Fletcher-32 checksum), so
no whole tensor, let alone the whole model, is gathered in memory. Loading reads, for each
destination tile, its box of the dataset, so a checkpoint loads into any tiling. Under
StarPU-MPI each rank writes and reads only the tiles it owns, so a checkpoint written by N
ranks loads on M. Saving is atomic: the file is
written as ``*.tmp``, flushed, fsynced and renamed over its final name; a failed save removes
its temporary file and leaves every older checkpoint as it was.
"""
import json
import os
import re

import numpy as np

from nntile.cli_common import CLIError
from nntile.precision import PRECISIONS

FORMAT = "nntile-checkpoint"
FORMAT_VERSION = 1
NAME_RE = re.compile(r"^ckpt-(\d+)\.h5$")
REQUIRED = ("config", "tiling", "dtype", "step")
JSON_ATTRS = ("config", "tiling", "schedule", "optimizer", "rng", "data", "train", "tokenizer",
              "source")
# bf16 tiles come back from the runtime as float32 (exact), and are stored so.
NUMPY_DTYPES = {"fp32": np.float32, "tf32": np.float32, "bf16": np.float32, "fp64": np.float64}


class CheckpointError(CLIError):
    """A checkpoint cannot be read, does not fit the model, or cannot be written."""


def _h5py():
    try:
        import h5py
    except ImportError:
        raise CheckpointError("h5py is not installed (pip install h5py)") from None
    return h5py


def checkpoint_name(step):
    return f"ckpt-{int(step)}.h5"


def list_checkpoints(directory):
    """[(step, path)] of the finished checkpoints in a directory, oldest first."""
    try:
        names = os.listdir(directory)
    except OSError:
        return []
    found = []
    for name in names:
        match = NAME_RE.match(name)
        if match:
            found.append((int(match.group(1)), os.path.join(directory, name)))
    return sorted(found)


def latest(directory):
    found = list_checkpoints(directory)
    return found[-1][1] if found else None


def prune(directory, keep):
    """Delete all but the newest ``keep`` checkpoints (keep <= 0 keeps them all)."""
    if not keep or keep <= 0:
        return []
    removed = []
    for _, path in list_checkpoints(directory)[:-keep]:
        try:
            os.unlink(path)
            removed.append(path)
        except OSError:
            pass
    return removed


def _write_tile(dataset, slices, array):
    """One tile into its chunk (a separate function so tests can make it fail)."""
    dataset[slices] = array


def _tensors(model, optimizer):
    """(group, name, tensor) of everything a checkpoint holds, in file order."""
    out = [("params", name, param.value) for name, param in model.named_parameters()]
    if optimizer is not None:
        out += [("optim", name, t) for name, t in optimizer.state_tensors().items()]
    return out


def _create_dataset(f, group, name, tensor):
    npdtype = NUMPY_DTYPES.get(tensor.dtype, None) or tensor.numpy_dtype
    # Fletcher-32 checksums per chunk: damaged data fails to read instead of loading quietly.
    return f.require_group(group).create_dataset(name, shape=tensor.shape, dtype=npdtype,
                                                 chunks=tuple(tensor.basetile), fletcher32=True)


def _write_local_tiles(dataset, tensor):
    """The tiles this process owns (all of them without MPI) into their chunks."""
    traits = tensor.traits
    for i in tensor.local_tiles():
        _write_tile(dataset, traits.tile_slices(i), tensor.tile_to_array(i))


def _fsync_path(path, directory=False):
    fd = os.open(path, os.O_RDONLY | (getattr(os, "O_DIRECTORY", 0) if directory else 0))
    try:
        os.fsync(fd)
    except OSError:
        if not directory:
            raise
    finally:
        os.close(fd)


def _write_attrs(f, meta):
    f.attrs["format"] = FORMAT
    f.attrs["format_version"] = FORMAT_VERSION
    f.attrs["dtype"] = str(meta["dtype"])
    f.attrs["step"] = int(meta["step"])
    for key in JSON_ATTRS:
        if key in meta:
            f.attrs[key] = json.dumps(meta[key])


def _error_text(exc):
    return getattr(exc, "strerror", None) or str(exc)


def _publish(tmp, path):
    _fsync_path(tmp)
    os.replace(tmp, path)
    _fsync_path(os.path.dirname(os.path.abspath(path)), directory=True)


def save(path, model, optimizer=None, meta=None):
    """Write a checkpoint atomically; raise CheckpointError (older files untouched) on failure.

    ``meta`` holds the JSON-able attributes (config, tiling, dtype, step, schedule, optimizer,
    rng, data, train, tokenizer); the tensors come from ``model.named_parameters()`` and
    ``optimizer.state_tensors()``. Under StarPU-MPI every rank calls this and each writes
    the tiles it owns into the one file (see _save_collective).
    """
    h5py = _h5py()
    meta = dict(meta or {})
    for key in REQUIRED:
        if key not in meta:
            raise ValueError(f"checkpoint metadata needs {key!r}")
    from nntile import current_context
    ctx = current_context()
    if ctx is not None and ctx.world_size > 1:
        return _save_collective(h5py, ctx, path, model, optimizer, meta)
    tmp = path + ".tmp"
    try:
        with h5py.File(tmp, "w") as f:
            _write_attrs(f, meta)
            f.create_group("params")
            if optimizer is not None:
                f.create_group("optim")
            for group, name, tensor in _tensors(model, optimizer):
                _write_local_tiles(_create_dataset(f, group, name, tensor), tensor)
            f.flush()
        _publish(tmp, path)
    except BaseException as exc:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        if isinstance(exc, (OSError, RuntimeError, ValueError, TypeError)):
            raise CheckpointError(f"cannot save checkpoint {path}: {_error_text(exc)}") from None
        raise
    return path


def _save_collective(h5py, ctx, path, model, optimizer, meta):
    """Rank 0 creates the file with every dataset and writes its tiles; then each rank in
    turn opens it and writes its own tiles (HDF5 without MPI-IO allows one writer at a
    time), so no tensor is ever gathered. The file is the same as a one-process save's.
    The outcome travels along the ranks and back, so every rank raises the same error."""
    comm, rank, size = ctx.comm, ctx.rank, ctx.world_size
    tmp = path + ".tmp"
    tensors = _tensors(model, optimizer)
    error = None if rank == 0 else comm.recv(source=rank - 1, tag=7401)
    if error is None:
        try:
            with h5py.File(tmp, "w" if rank == 0 else "r+") as f:
                if rank == 0:
                    _write_attrs(f, meta)
                    f.create_group("params")
                    if optimizer is not None:
                        f.create_group("optim")
                for group, name, tensor in tensors:
                    ds = (_create_dataset(f, group, name, tensor) if rank == 0
                          else f[f"{group}/{name}"])
                    _write_local_tiles(ds, tensor)
                f.flush()
        except (OSError, RuntimeError, ValueError, TypeError, KeyError) as exc:
            error = f"rank {rank}: {_error_text(exc)}"
    comm.send(error, dest=(rank + 1) % size, tag=7401)
    if rank == 0:
        error = comm.recv(source=size - 1, tag=7401)
        try:
            if error is None:
                _publish(tmp, path)
        except OSError as exc:
            error = _error_text(exc)
        if error is not None:
            try:
                os.unlink(tmp)
            except OSError:
                pass
    error = comm.bcast(error, root=0)
    if error is not None:
        raise CheckpointError(f"cannot save checkpoint {path}: {error}")
    return path


class Checkpoint:
    """A checkpoint's metadata, checked on opening; tensors are read by ``load_*``."""

    def __init__(self, path):
        self.path = path
        if not os.path.exists(path):
            raise CheckpointError(f"checkpoint {path} does not exist")
        if os.path.isdir(path):
            raise CheckpointError(f"checkpoint {path} is a directory, not an .h5 file")
        h5py = _h5py()
        try:
            with h5py.File(path, "r") as f:
                attrs = {k: f.attrs[k] for k in f.attrs}
                self.param_names = self._names(f, "params")
                self.optim_names = self._names(f, "optim")
        except OSError as exc:
            raise CheckpointError(f"checkpoint {path} is not a readable HDF5 file (truncated "
                                  f"or corrupt?): {str(exc).splitlines()[0]}") from None
        if attrs.get("format") != FORMAT:
            raise CheckpointError(f"checkpoint {path} is not an nntile checkpoint (attribute "
                                  f"'format' is {attrs.get('format')!r})")
        version = int(attrs.get("format_version", 0))
        if version > FORMAT_VERSION or version < 1:
            raise CheckpointError(f"checkpoint {path} has format version {version}; this "
                                  f"nntile reads version {FORMAT_VERSION}")
        for key in REQUIRED:
            if key not in attrs:
                raise CheckpointError(f"checkpoint {path} lacks the attribute {key!r}")
        self.meta = {}
        for key, value in attrs.items():
            if key in JSON_ATTRS:
                try:
                    value = json.loads(value)
                except (TypeError, ValueError):
                    raise CheckpointError(f"checkpoint {path}: attribute {key!r} is not valid "
                                          "JSON") from None
            elif isinstance(value, np.generic):
                value = value.item()
            self.meta[key] = value
        self.step = int(self.meta["step"])
        self.dtype = str(self.meta["dtype"])
        if self.dtype not in PRECISIONS:
            raise CheckpointError(f"checkpoint {path}: attribute 'dtype' is {self.dtype!r}")
        if not isinstance(self.meta["config"], dict) or not isinstance(self.meta["tiling"], dict):
            raise CheckpointError(f"checkpoint {path}: attributes 'config' and 'tiling' must "
                                  "be JSON objects")

    @staticmethod
    def _names(f, group):
        if group not in f:
            return []
        names = []
        f[group].visititems(lambda name, obj: names.append(name)
                            if hasattr(obj, "shape") else None)
        return names

    @property
    def config(self):
        from nntile.models import GPT2Config
        try:
            return GPT2Config.from_dict(self.meta["config"])
        except (TypeError, ValueError) as exc:
            raise CheckpointError(f"checkpoint {self.path}: attribute 'config' is invalid: "
                                  f"{exc}") from None

    @property
    def has_optimizer(self):
        return bool(self.optim_names)

    def get(self, key, default=None):
        return self.meta.get(key, default)

    def _load(self, group, tensors, what):
        h5py = _h5py()
        expected = set(tensors)
        present = set(self.param_names if group == "params" else self.optim_names)
        extra = sorted(present - expected)
        if extra:
            raise CheckpointError(f"checkpoint {self.path} holds {group}/{extra[0]}, which "
                                  f"the {what} does not have (a different model?)")
        try:
            f = h5py.File(self.path, "r")
        except OSError as exc:
            raise CheckpointError(f"checkpoint {self.path} is not a readable HDF5 file: "
                                  f"{str(exc).splitlines()[0]}") from None
        with f:
            for name, tensor in tensors.items():
                key = f"{group}/{name}"
                if key not in f:
                    raise CheckpointError(f"checkpoint {self.path} has no dataset {key}")
                ds = f[key]
                if not hasattr(ds, "shape"):
                    raise CheckpointError(f"checkpoint {self.path}: {key} is not a dataset")
                if tuple(ds.shape) != tuple(tensor.shape):
                    raise CheckpointError(f"checkpoint {self.path}: {key} has shape "
                                          f"{tuple(ds.shape)}, the {what} expects "
                                          f"{tuple(tensor.shape)}")
                if ds.dtype.kind != "f":
                    raise CheckpointError(f"checkpoint {self.path}: {key} has dtype {ds.dtype}")
                try:
                    # each destination tile reads its own box of the dataset, whatever the
                    # tiling it was saved with; under MPI a rank reads only its own tiles
                    tensor.write_tiles(lambda slices: ds[slices])
                except (OSError, ValueError, RuntimeError) as exc:
                    raise CheckpointError(f"checkpoint {self.path}: cannot read {key} "
                                          f"(truncated or corrupt?): "
                                          f"{str(exc).splitlines()[0]}") from None

    def load_params(self, model):
        tensors = {name: param.value for name, param in model.named_parameters()}
        self._load("params", tensors, "model")
        model.refresh_copies()  # bf16-mixed: the GEMMs' bf16 copies of the loaded masters

    def load_optimizer(self, optimizer):
        if not self.has_optimizer:
            raise CheckpointError(f"checkpoint {self.path} holds no optimizer state (imported "
                                  "weights? start from it with --init instead of --resume)")
        self._load("optim", optimizer.state_tensors(), "optimizer")
        state = self.meta.get("optimizer") or {}
        if "step_count" not in state:
            raise CheckpointError(f"checkpoint {self.path}: attribute 'optimizer' lacks "
                                  "step_count")
        optimizer.step_count = int(state["step_count"])
