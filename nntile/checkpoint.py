"""HDF5 checkpoints: one file ``ckpt-<step>.h5`` per checkpoint.

Layout::

    params/<parameter name>               one dataset per parameter, chunks = its tile shape
    optim/<parameter name>/<state name>   the optimizer's state tensors (Adam moments, ...)
    attrs: format, format_version, config, tiling, dtype, step, schedule, optimizer,
           rng, data, train, tokenizer (JSON), checksum; strings of fixed length.
           config holds the family's model_type (nntile.models.FAMILIES; none: gpt2)

Tensors are written tile by tile (one HDF5 chunk per tile, with a Fletcher-32 checksum), so
no whole tensor, let alone the whole model, is gathered in memory. Loading reads, for each
destination tile, its box of the dataset, so a checkpoint loads into any tiling. Under
StarPU-MPI each rank writes and reads only the tiles it owns, so a checkpoint written by N
ranks loads on M. Damage is found, never loaded: the chunk checksums cover the tiles, the
attribute 'checksum' covers the attributes and the layout, and opening checks the chunk
index. Saving is atomic: the file is written as ``*.tmp`` into space reserved beforehand
(a full disk is a clear error before anything is written), flushed, fsynced and renamed
over its final name; a failed save removes its temporary file and leaves every older
checkpoint as it was. Only finite values are saved.
"""
import errno
import hashlib
import io
import itertools
import json
import os
import re
import shutil

import numpy as np

from nntile.errors import CLIError
from nntile.precision import PRECISIONS

FORMAT = "nntile-checkpoint"
# 2: adds the attribute 'checksum' (see _checksum); version 1 files still load
FORMAT_VERSION = 2
NAME_RE = re.compile(r"^ckpt-(\d+)\.h5$")
PARTIAL_RE = re.compile(r"^ckpt-\d+\.h5\.tmp$")  # a save in progress, or one a kill cut short
REQUIRED = ("config", "tiling", "dtype", "step")
JSON_ATTRS = ("config", "tiling", "schedule", "optimizer", "rng", "data", "train", "tokenizer",
              "source")
# bf16 tiles come back from the runtime as float32 (exact), and are stored so.
NUMPY_DTYPES = {"fp32": np.float32, "tf32": np.float32, "bf16": np.float32, "fp64": np.float64}


# What h5py raises for a damaged file: HDF5's errors arrive as any of these.
H5_ERRORS = (OSError, RuntimeError, KeyError, ValueError, TypeError, IndexError)


class CheckpointError(CLIError):
    """A checkpoint cannot be read, does not fit the model, or cannot be written."""


def _first_line(exc):
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


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


# `make train` keeps each run in a directory of its own under one parent, and names the newest
# in this file of the parent: a file, not a link to the directory, which TensorBoard would
# follow and list every run twice
LATEST_RUN = "LATEST"


def latest_run(directory):
    """The run directory that ``directory``'s LATEST file names, else None."""
    try:
        with open(os.path.join(directory, LATEST_RUN)) as f:
            name = f.read().strip()
    except (OSError, UnicodeDecodeError):
        return None
    run = os.path.join(directory, name)
    return run if name and os.path.isdir(run) else None


def prune(directory, keep, keep_path=None):
    """Delete all but the newest ``keep`` checkpoints (keep <= 0 keeps them all), and never
    ``keep_path`` (the one just saved)."""
    if not keep or keep <= 0:
        return []
    removed = []
    for _, path in list_checkpoints(directory)[:-keep]:
        if keep_path is not None and os.path.abspath(path) == os.path.abspath(keep_path):
            continue
        try:
            os.unlink(path)
            removed.append(path)
        except OSError:
            pass
    return removed


def remove_partial(directory):
    """Delete the temporary files of saves that never finished (a killed run's): they are
    never loaded, but each holds the space of a whole checkpoint."""
    for name in os.listdir(directory):
        if PARTIAL_RE.match(name):
            os.unlink(os.path.join(directory, name))


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
    # A tile HDF5 cannot find (a damaged chunk index) reads as the fill value: NaN, which no
    # checkpoint holds, so loading refuses it.
    return f.require_group(group).create_dataset(name, shape=tensor.shape, dtype=npdtype,
                                                 chunks=tuple(tensor.basetile), fletcher32=True,
                                                 fillvalue=np.nan)


def _write_local_tiles(dataset, tensor, tiles=None):
    """The tiles ``tiles`` (default: those this process owns, all of them without MPI) into
    their chunks."""
    traits = tensor.traits
    for i in tensor.local_tiles() if tiles is None else tiles:
        tile = tensor.tile_to_array(i)
        if not np.isfinite(tile).all():
            raise ValueError(f"{dataset.name.lstrip('/')} holds NaN or inf (training "
                             "diverged?); a checkpoint keeps only finite values")
        _write_tile(dataset, traits.tile_slices(i), tile)


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
    _set_text(f, "format", FORMAT)
    f.attrs["format_version"] = FORMAT_VERSION
    _set_text(f, "dtype", str(meta["dtype"]))
    f.attrs["step"] = int(meta["step"])
    for key in JSON_ATTRS:
        if key in meta:
            _set_text(f, key, json.dumps(meta[key]))


def _set_text(f, key, text):
    """A string attribute of fixed length: stored in the object header itself. (h5py's
    default, a variable-length string, lives in HDF5's global heap, and one damaged bit
    there made reading the attributes hang.)"""
    data = text.encode("utf-8")
    f.attrs.create(key, np.array(data), dtype=_h5py().string_dtype("utf-8", len(data)))


def _plain(value):
    """An attribute's value as JSON can write it, whichever numpy and h5py read it."""
    if isinstance(value, bytes):
        return value.decode("utf-8", "replace")
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, np.ndarray):
        return value.tolist()
    return value


def _chunks(ds):
    """The stored chunks of a dataset: chunk_offset, filter_mask, byte_offset, size."""
    if not hasattr(ds.id, "chunk_iter"):  # HDF5 before 1.14
        return [ds.id.get_chunk_info(i) for i in range(ds.id.get_num_chunks())]
    chunks = []
    ds.id.chunk_iter(chunks.append)
    return chunks


def _datasets(f):
    """{path: dataset} of every dataset in a file."""
    found = {}
    f.visititems(lambda name, obj: found.__setitem__(name, obj)
                 if isinstance(obj, _h5py().Dataset) else None)
    return found


def _checksum(f, datasets):
    """SHA-256 of what gives a checkpoint's bytes their meaning: its attributes, and each
    dataset's name, shape, tile shape, type, filters and chunk index (where each tile is
    stored). The tiles carry their own Fletcher-32 checksums, so together nothing damaged
    loads quietly. (Fletcher-32 alone passes zeros: a damaged chunk address pointing at
    free space loaded a tile of zeros.)"""
    described = [[name, list(ds.shape), list(ds.chunks or ()), ds.dtype.str,
                  bool(ds.fletcher32),
                  sorted([list(c.chunk_offset), c.byte_offset, c.size, c.filter_mask]
                         for c in _chunks(ds))]
                 for name, ds in sorted(datasets.items())]
    attrs = sorted([key, _plain(f.attrs[key])] for key in f.attrs if key != "checksum")
    text = json.dumps([attrs, described], sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()


def _stored_bytes(tensor):
    """An upper bound of the file space a tensor's chunks take: the tiles with their
    checksums, and the nodes of HDF5's chunk index (a B-tree of up to 64 chunks a node,
    nodes at least half full)."""
    traits = tensor.traits
    itemsize = np.dtype(NUMPY_DTYPES.get(tensor.dtype, None) or tensor.numpy_dtype).itemsize
    chunk = itemsize * int(np.prod(traits.basetile)) + 4
    node = 64 * (16 + 8 * traits.ndim) + 512
    return traits.ntiles * chunk + 2 * (traits.ntiles // 32 + 1) * node


def _create(h5py, tmp, meta, tensors):
    """Write a checkpoint's layout: attributes and empty datasets. HDF5 does not survive a
    failed write (a full disk crashed the process), so it writes nothing to disk here: the
    layout is built in memory and written by Python."""
    image = io.BytesIO()
    with h5py.File(image, "w") as f:
        _write_attrs(f, meta)
        f.create_group("params")
        if any(group == "optim" for group, _, _ in tensors):
            f.create_group("optim")
        for group, name, tensor in tensors:
            _create_dataset(f, group, name, tensor)
        _set_text(f, "checksum", "0" * 64)  # its place: _finish writes it
    with open(tmp, "wb") as out:
        out.write(image.getvalue())


def _reserve(path, size):
    """Allocate the file up to ``size`` bytes, so that HDF5 then writes into space that
    exists (a full disk is found here, as a clear OSError). HDF5 gives back what it did
    not use when it closes the file."""
    directory = os.path.dirname(os.path.abspath(path))
    with open(path, "r+b") as f:
        try:
            os.posix_fallocate(f.fileno(), 0, size)
            return
        except OSError as exc:
            if exc.errno not in (errno.EOPNOTSUPP, errno.EINVAL, errno.ENOSPC):
                raise
            unsupported = exc.errno != errno.ENOSPC
    free = shutil.disk_usage(directory).free
    if unsupported and free >= size:
        return  # a file system without fallocate: its free space has to do
    raise OSError(errno.ENOSPC, f"not enough free space in {directory}: the checkpoint "
                  f"needs up to {size / 2**20:.1f} MiB, {free / 2**20:.1f} MiB are free")


def _write_part(h5py, tmp, tensors, tiles_of=None):
    """Write the tiles this process owns (or ``tiles_of(tensor)``), into space reserved
    first (under MPI each rank reserves again: the one before gave back the rest when it
    closed the file)."""
    _reserve(tmp, os.path.getsize(tmp) + sum(_stored_bytes(t) for _, _, t in tensors)
             + (64 << 10))
    with h5py.File(tmp, "r+") as f:
        for group, name, tensor in tensors:
            _write_local_tiles(f[f"{group}/{name}"], tensor,
                               None if tiles_of is None else tiles_of(tensor))
        f.flush()


def _error_text(exc):
    return getattr(exc, "strerror", None) or str(exc)


def _attempt(step, *args):
    """None, or the one-line reason why ``step(*args)`` failed."""
    try:
        step(*args)
    except H5_ERRORS as exc:
        return _first_line(_error_text(exc))
    return None


def _finish(h5py, tmp, path):
    """Once every tile is written (the chunk index is final): write the checksum, in place
    (the attribute exists at its length, in space reserved), and publish the file."""
    with h5py.File(tmp, "r+") as f:
        place = f.attrs.get_id("checksum")
        place.write(np.array(_checksum(f, _datasets(f)).encode()), mtype=place.get_type())
    _fsync_path(tmp)
    os.replace(tmp, path)
    _fsync_path(os.path.dirname(os.path.abspath(path)), directory=True)


def _remove(path):
    try:
        os.unlink(path)
    except OSError:
        pass


def save(path, model, optimizer=None, meta=None):
    """Write a checkpoint atomically; raise CheckpointError (older files untouched) on failure.

    ``meta`` holds the JSON-able attributes (config, tiling, dtype, step, schedule, optimizer,
    rng, data, train, tokenizer); the tensors come from ``model.named_parameters()`` and
    ``optimizer.state_tensors()``, and must be finite. Under MPI every rank calls this: under
    StarPU-MPI each writes the tiles it owns into the one file (see _save_collective); of
    replicas, rank 0 writes it, or, where they shard the update (``optimizer.sharding``),
    each writes the tiles it updates, in the same way.
    """
    h5py = _h5py()
    meta = dict(meta or {})
    for key in REQUIRED:
        if key not in meta:
            raise ValueError(f"checkpoint metadata needs {key!r}")
    from nntile._core.core import current_context
    ctx = current_context()
    tensors = _tensors(model, optimizer)
    tmp = path + ".tmp"
    if ctx is not None and ctx.owner_ranks > 1:
        error = _save_collective(h5py, ctx, tmp, path, tensors, meta)
    elif ctx is not None and ctx.replicated and getattr(optimizer, "sharding", None):
        # only the rank that updates a tile holds its states (and a dropped master)
        error = _save_collective(h5py, ctx, tmp, path, tensors, meta,
                                 optimizer.sharding.tiles_to_save)
    elif ctx is not None and ctx.replicated:  # every rank holds it all: rank 0 writes
        error = _save_alone(h5py, tmp, path, tensors, meta) if ctx.rank == 0 else None
        error = ctx.comm.bcast(error, root=0)
    else:
        error = _save_alone(h5py, tmp, path, tensors, meta)
    if error is not None:
        raise CheckpointError(f"cannot save checkpoint {path}: {error}")
    return path


def _save_alone(h5py, tmp, path, tensors, meta):
    """One process writes every tile; the error, or None."""
    try:
        return (_attempt(_create, h5py, tmp, meta, tensors)
                or _attempt(_write_part, h5py, tmp, tensors)
                or _attempt(_finish, h5py, tmp, path))
    finally:
        if os.path.exists(tmp):  # failed, or interrupted (Ctrl-C): no partial file left
            _remove(tmp)


def _save_collective(h5py, ctx, tmp, path, tensors, meta, tiles_of=None):
    """Rank 0 creates the file; then each rank in turn opens it and writes its own tiles
    (HDF5 without MPI-IO allows one writer at a time), so no tensor is ever gathered. The
    file is the same as a one-process save's. The outcome travels along the ranks and
    back, so every rank gets the same error (or None). ``tiles_of(tensor)``: the tiles a
    rank writes, where not those it owns."""
    comm, rank, size = ctx.comm, ctx.rank, ctx.world_size
    error = None if rank == 0 else comm.recv(source=rank - 1, tag=7401)
    if error is None and rank == 0:
        error = _attempt(_create, h5py, tmp, meta, tensors)
    if error is None:
        error = _attempt(_write_part, h5py, tmp, tensors, tiles_of)
        if error is not None:
            error = f"rank {rank}: {error}"
    comm.send(error, dest=(rank + 1) % size, tag=7401)
    if rank == 0:
        error = comm.recv(source=size - 1, tag=7401) or _attempt(_finish, h5py, tmp, path)
        if error is not None:
            _remove(tmp)
    return comm.bcast(error, root=0)


def _dataset_problem(ds):
    """Why a dataset cannot be loaded as it is stored, or None: it must hold IEEE floats
    (the checksum sees only numpy's name of the type), and its chunk index must list each
    tile once, with every filter applied (a missing tile would load as zeros; this also
    guards files of format version 1, which have no checksum)."""
    h5t = _h5py().h5t
    stored = ds.id.get_type()
    if not (stored.equal(h5t.IEEE_F32LE) or stored.equal(h5t.IEEE_F64LE)):
        return f"is stored as {ds.dtype}, not as IEEE float32 or float64"
    if ds.chunks is None:
        return "is not stored in tiles"
    chunks = _chunks(ds)
    tiles = set(itertools.product(*(range(0, n, c) for n, c in zip(ds.shape, ds.chunks))))
    if len(chunks) != len(tiles) or {tuple(c.chunk_offset) for c in chunks} != tiles:
        return f"has {len(chunks)} stored tiles where it should have {len(tiles)}"
    if any(c.filter_mask for c in chunks):
        return "has tiles stored without their checksum"
    return None


class Checkpoint:
    """A checkpoint's metadata, checked on opening; tensors are read by ``load_*``."""

    def __init__(self, path):
        self.path = path
        if not os.path.exists(path):
            raise CheckpointError(f"checkpoint {path} does not exist")
        if os.path.isdir(path):
            raise CheckpointError(f"checkpoint {path} is a directory, not an .h5 file")
        if not os.path.isfile(path):  # opening a FIFO would block
            raise CheckpointError(f"checkpoint {path} is not a regular file (a pipe or a "
                                  "device?)")
        h5py = _h5py()
        try:
            with h5py.File(path, "r") as f:
                attrs = {key: _plain(f.attrs[key]) for key in f.attrs}
                version = self._check_format(attrs)
                datasets = _datasets(f)
                if version >= 2 and attrs.get("checksum") != _checksum(f, datasets):
                    raise CheckpointError(f"checkpoint {path} is corrupt: its attributes or "
                                          "layout do not match their checksum")
                for name, ds in datasets.items():
                    problem = _dataset_problem(ds)
                    if problem:
                        raise CheckpointError(f"checkpoint {path}: {name} {problem} "
                                              "(corrupt?)")
        except H5_ERRORS as exc:
            raise self._unreadable(exc) from None
        self.param_names = [n.partition("/")[2] for n in datasets if n.startswith("params/")]
        self.optim_names = [n.partition("/")[2] for n in datasets if n.startswith("optim/")]
        self.meta = {}
        for key, value in attrs.items():
            if key in JSON_ATTRS:
                try:
                    value = json.loads(value)
                except (TypeError, ValueError, RecursionError):
                    raise CheckpointError(f"checkpoint {path}: attribute {key!r} is not valid "
                                          "JSON") from None
            self.meta[key] = value
        try:
            self.step = int(self.meta["step"])
        except (TypeError, ValueError):
            raise CheckpointError(f"checkpoint {path}: attribute 'step' is "
                                  f"{self.meta['step']!r}") from None
        self.dtype = str(self.meta["dtype"])
        if self.dtype not in PRECISIONS:
            raise CheckpointError(f"checkpoint {path}: attribute 'dtype' is {self.dtype!r}")
        if not isinstance(self.meta["config"], dict) or not isinstance(self.meta["tiling"], dict):
            raise CheckpointError(f"checkpoint {path}: attributes 'config' and 'tiling' must "
                                  "be JSON objects")

    def _check_format(self, attrs):
        """The format version, once the attributes say this is a checkpoint we can read."""
        path = self.path
        if attrs.get("format") != FORMAT:
            raise CheckpointError(f"checkpoint {path} is not an nntile checkpoint (attribute "
                                  f"'format' is {attrs.get('format')!r})")
        version = attrs.get("format_version")
        if not isinstance(version, int) or not 1 <= version <= FORMAT_VERSION:
            raise CheckpointError(f"checkpoint {path} has format version {version!r}; this "
                                  f"nntile reads versions 1 to {FORMAT_VERSION}")
        for key in REQUIRED:
            if key not in attrs:
                raise CheckpointError(f"checkpoint {path} lacks the attribute {key!r}")
        return version

    def _unreadable(self, exc):
        return CheckpointError(f"checkpoint {self.path} is not a readable HDF5 file "
                               f"(truncated or corrupt?): {_first_line(exc)}")

    @property
    def config(self):
        """The model's config, of the family its model_type names (none: gpt2, what
        checkpoints held before nntile had families)."""
        from nntile.models import config_from_dict
        try:
            return config_from_dict(self.meta["config"])
        except (TypeError, ValueError) as exc:
            raise CheckpointError(f"checkpoint {self.path}: attribute 'config' is invalid: "
                                  f"{exc}") from None

    @property
    def has_optimizer(self):
        return bool(self.optim_names)

    def get(self, key, default=None):
        return self.meta.get(key, default)

    def _load(self, group, tensors, what, tiles_of=None):
        h5py = _h5py()
        expected = set(tensors)
        present = set(self.param_names if group == "params" else self.optim_names)
        extra = sorted(present - expected)
        if extra:
            raise CheckpointError(f"checkpoint {self.path} holds {group}/{extra[0]}, which "
                                  f"the {what} does not have (a different model?)")
        try:
            with h5py.File(self.path, "r") as f:
                for name, tensor in tensors.items():
                    self._load_one(f, f"{group}/{name}", tensor, what,
                                   None if tiles_of is None else tiles_of(tensor))
        except H5_ERRORS as exc:
            raise self._unreadable(exc) from None

    def _load_one(self, f, key, tensor, what, tiles=None):
        if key not in f:
            raise CheckpointError(f"checkpoint {self.path} has no dataset {key}")
        ds = f[key]
        if not hasattr(ds, "shape"):
            raise CheckpointError(f"checkpoint {self.path}: {key} is not a dataset")
        if tuple(ds.shape) != tuple(tensor.shape):
            raise CheckpointError(f"checkpoint {self.path}: {key} has shape "
                                  f"{tuple(ds.shape)}, the {what} expects {tuple(tensor.shape)}")
        def read(slices):
            values = ds[slices]
            if not np.isfinite(values).all():
                raise ValueError("NaN or inf, which no checkpoint holds")
            return values
        try:
            # each destination tile reads its own box of the dataset, whatever the tiling it
            # was saved with; under MPI a rank reads only its own tiles
            tensor.write_tiles(read, tiles)
        except H5_ERRORS as exc:
            raise CheckpointError(f"checkpoint {self.path}: cannot read {key} (truncated or "
                                  f"corrupt?): {_first_line(exc)}") from None

    def load_params(self, model):
        tensors = {name: param.value for name, param in model.named_parameters()}
        self._load("params", tensors, "model")
        model.refresh_copies()  # bf16-mixed: the GEMMs' bf16 copies of the loaded masters

    def load_optimizer(self, optimizer):
        if not self.has_optimizer:
            raise CheckpointError(f"checkpoint {self.path} holds no optimizer state (imported "
                                  "weights? start from it with --init instead of --resume)")
        # with a sharded update, each rank reads the states of the tiles it updates
        sharding = getattr(optimizer, "sharding", None)
        self._load("optim", optimizer.state_tensors(), "optimizer",
                   None if sharding is None else sharding.tiles_to_save)
        state = self.meta.get("optimizer") or {}
        if "step_count" not in state:
            raise CheckpointError(f"checkpoint {self.path}: attribute 'optimizer' lacks "
                                  "step_count")
        optimizer.step_count = int(state["step_count"])
