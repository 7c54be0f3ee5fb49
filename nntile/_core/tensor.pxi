# Tiled tensors: one StarPU data handle per tile, owned and placed by StarPU.
import numpy as np
from libc.stdlib cimport malloc, free
from libc.string cimport memcpy
from libc.stdint cimport uintptr_t
cimport cython

cdef extern from "codelets.h":
    enum nntile_dtype:
        NNTILE_FP32
        NNTILE_FP64
        NNTILE_TF32
        NNTILE_INT64
        NNTILE_BF16
        NNTILE_BF16_FP32
        NNTILE_DTYPE_COUNT

# dtype name -> (codelet table column, numpy storage dtype). bf16 tiles hold bfloat16 bits in
# uint16; the host side reads and writes them as float32 (see float_to_bf16_bits).
DTYPES = {
    "fp32": (NNTILE_FP32, np.dtype(np.float32)),
    "tf32": (NNTILE_TF32, np.dtype(np.float32)),
    "fp64": (NNTILE_FP64, np.dtype(np.float64)),
    "int64": (NNTILE_INT64, np.dtype(np.int64)),
    "bf16": (NNTILE_BF16, np.dtype(np.uint16)),
}
FLOAT_DTYPES = ("fp32", "tf32", "fp64", "bf16")


def float_to_bf16_bits(array):
    """bfloat16 bits (a uint16 array) of the values of a real array, rounded to nearest, ties
    to even, from the array's own precision (float64 is rounded once, not through float32).
    Values beyond the bfloat16 range become infinities; a NaN stays a (quiet) NaN of the same
    sign."""
    a = np.asarray(array)
    if a.dtype.kind not in "fiub":
        raise TypeError(f"cannot convert an array of dtype {a.dtype} to bf16")
    if a.dtype.kind == "f" and a.dtype.itemsize <= 4:
        # float16/float32 are exact in float32: round its bits as the kernels do
        u = np.ascontiguousarray(a, dtype=np.float32).view(np.uint32)
        with np.errstate(over="ignore"):
            rounded = (u + np.uint32(0x7FFF) + ((u >> np.uint32(16)) & np.uint32(1))) >> np.uint32(16)
        quiet_nan = (u >> np.uint32(16)) | np.uint32(0x40)
        bits = np.where((u & np.uint32(0x7FFFFFFF)) > np.uint32(0x7F800000), quiet_nan, rounded)
        return bits.astype(np.uint16)
    # Wider types: x = m * 2**e with 0.5 <= |m| < 1; bfloat16 keeps 8 significant bits, so
    # its spacing there is 2**(e-8) (2**-133 for subnormals). Scaling by powers of two is
    # exact and rint rounds half to even, so q is x correctly rounded to bfloat16.
    x = np.asarray(a, dtype=np.float64)
    _, e = np.frexp(x)
    s = np.maximum(e - 8, -133)
    with np.errstate(over="ignore", invalid="ignore"):
        q = np.ldexp(np.rint(np.ldexp(x, -s)), s)
        f = np.ascontiguousarray(q, dtype=np.float32)  # exact, or +-inf past the range
    bits = f.view(np.uint32) >> np.uint32(16)
    bits = np.where(np.isnan(x), bits | np.uint32(0x40), bits)
    return bits.astype(np.uint16)


def bf16_bits_to_float(bits):
    """float32 values (exact) of an array of bfloat16 bits."""
    bits = np.asarray(bits)
    if bits.dtype != np.uint16:
        raise TypeError(f"bfloat16 bits must be a uint16 array, got {bits.dtype}")
    return (bits.astype(np.uint32) << np.uint32(16)).view(np.float32)
_NUMPY_TO_DTYPE = {np.dtype(np.float32): "fp32", np.dtype(np.float64): "fp64",
                   np.dtype(np.int64): "int64"}


def _check_dtype(dtype):
    if dtype not in DTYPES:
        raise ValueError(f"unknown dtype {dtype!r}; nntile supports {', '.join(DTYPES)}")
    return dtype


cdef inline object _tile_view(starpu_data_handle_t handle, Py_ssize_t nbytes, object npdtype,
                              tuple shape):
    """A numpy array over a tile's host copy (valid while the tile is acquired)."""
    cdef char *ptr = <char *> starpu_vector_get_local_ptr(handle)
    cdef char[::1] raw = <char[:nbytes]> ptr
    return np.frombuffer(raw, dtype=npdtype).reshape(shape)


# The garbage collector must not clear `traits` of a tensor held in a reference cycle before
# __dealloc__ runs: __dealloc__ needs it to release the tiles (a cleared one segfaulted).
@cython.no_gc_clear
cdef class Tensor:
    """A tensor cut into tiles; each tile is a StarPU handle that StarPU allocates and moves.

    A new tensor starts filled with zeros: StarPU cannot read a tile nobody wrote.

    Under StarPU-MPI each tile has an owner rank: ``owners`` is a list of ranks (one per tile,
    C order over the tile grid), or None for the running Context's distribution of tensors
    without a batch axis, or "batch" for its distribution of tensors whose first axis is the
    batch. Every rank must create the same tensors in the same order.
    """

    def __cinit__(self):
        self.handles = NULL
        self.registered = False

    def __init__(self, shape, basetile=None, dtype="fp32", bint zero=True, owners=None):
        global _live_tensors
        ctx = _running_context
        if ctx is None:
            raise RuntimeError("no nntile.Context is running: start one before creating tensors")
        self.traits = shape if isinstance(shape, TensorTraits) else TensorTraits(shape, basetile)
        if isinstance(shape, TensorTraits) and basetile is not None:
            raise TypeError("pass either TensorTraits or shape and basetile, not both")
        self.dtype = _check_dtype(dtype)
        self.dtype_id = DTYPES[dtype][0]
        self.itemsize = DTYPES[dtype][1].itemsize
        cdef Py_ssize_t coords[MAX_NDIM]
        cdef Py_ssize_t i, n
        cdef Py_ssize_t ntiles = self.traits.ntiles
        if _prod(self.traits.basetile) >= 2 ** 32:  # the base tile is the largest
            raise ValueError(f"a tile of {self.traits.basetile} holds 2**32 elements or "
                             "more; use smaller tiles")
        if ntiles >= 2 ** 32:
            raise ValueError(f"{ntiles} tiles of {self.traits.basetile}: nntile registers "
                             "fewer than 2**32 tiles a tensor; use larger tiles")
        self.owners = _resolve_owners(ctx, self.traits, owners)
        _check_fits_starpu(self.traits, self.itemsize, self.owners)
        self.handles = <starpu_data_handle_t *> malloc(ntiles * sizeof(starpu_data_handle_t))
        if self.handles == NULL:
            raise MemoryError()
        global _mpi_next_tag
        for i in range(ntiles):
            self.traits.tile_coords(i, coords)
            n = self.traits.tile_nelems_c(coords)
            # Home node -1: no user buffer, StarPU allocates the tile where it is first needed
            # (under MPI, only on the ranks that use it).
            starpu_vector_data_register(&self.handles[i], -1, 0, <uint32_t> n, self.itemsize)
            if _mpi_on:
                nntile_mpi_register(self.handles[i], _mpi_next_tag,
                                    0 if self.owners is None else self.owners[i])
                _mpi_next_tag += 1
        self.epoch = _epoch
        self.registered = True
        _live_tensors.add(self)
        if zero:
            fill(0, self)

    def __dealloc__(self):
        cdef Py_ssize_t i
        if self.handles != NULL:
            if self.registered and self.epoch == _epoch and _running_context is not None:
                for i in range(self.traits.ntiles):
                    starpu_data_unregister_submit(self.handles[i])
            free(self.handles)
            self.handles = NULL

    cdef int check_usable(self, str role) except -1:
        if self.closed_by_shutdown:
            raise RuntimeError(f"{role} belongs to an nntile.Context that was shut down")
        if not self.registered:
            raise RuntimeError(f"{role} was unregistered and can no longer be used")
        if self.epoch != _epoch or _running_context is None:
            raise RuntimeError(f"{role} belongs to an nntile.Context that was shut down")
        return 0

    cdef starpu_data_handle_t handle(self, Py_ssize_t linear) noexcept:
        return self.handles[linear]

    @property
    def shape(self):
        return self.traits.shape

    @property
    def basetile(self):
        return self.traits.basetile

    @property
    def grid(self):
        return self.traits.grid

    @property
    def ndim(self):
        return self.traits.ndim

    @property
    def ntiles(self):
        return self.traits.ntiles

    @property
    def is_registered(self):
        return self.registered and self.epoch == _epoch and _running_context is not None

    @property
    def numpy_dtype(self):
        return DTYPES[self.dtype][1]

    @classmethod
    def from_array(cls, array, basetile=None, dtype=None, owners=None):
        """A new tensor holding a copy of a numpy array, cut into tiles of ``basetile``
        (``owners`` as for Tensor())."""
        array = np.asarray(array)
        if dtype is None:
            if array.dtype.kind in "iu":
                dtype = "int64"
            elif array.dtype not in _NUMPY_TO_DTYPE:
                raise TypeError(f"array dtype {array.dtype} has no nntile dtype; use float32, "
                                "float64 or an integer type")
            else:
                dtype = _NUMPY_TO_DTYPE[array.dtype]
        _check_dtype(dtype)
        tensor = cls(array.shape, basetile, dtype, zero=False, owners=owners)
        tensor.write(array)
        return tensor

    def write(self, array):
        """Overwrite the tensor's contents with a numpy array of the same shape (a bf16 tensor
        takes real values and stores them rounded to nearest even)."""
        self.check_usable("tensor")
        array = np.asarray(array)
        if array.shape != self.traits.shape:
            raise ValueError(f"array of shape {array.shape} does not match tensor shape "
                             f"{self.traits.shape}")
        npdtype = DTYPES[self.dtype][1]
        if self.dtype in FLOAT_DTYPES and array.dtype.kind not in "fiub":
            raise TypeError(f"cannot write an array of dtype {array.dtype} into a {self.dtype} tensor")
        if npdtype.kind == "i":
            if array.dtype.kind not in "iub":
                raise TypeError(f"an int64 tensor takes integer arrays, got {array.dtype}")
            if array.dtype.kind == "u" and array.size and array.max() > np.iinfo(np.int64).max:
                raise ValueError(f"the array holds {array.max()}, more than an int64 tensor "
                                 "holds")
        self._write_tiles(lambda slices: array[slices])

    def write_tiles(self, read, tiles=None):
        """Overwrite the tensor tile by tile: ``read(slices)`` returns the values of the tile
        at ``slices`` (a tuple of slices into the whole tensor); ``tiles``: the linear indices
        of the tiles written (default all). Under StarPU-MPI, each rank reads only the tiles
        it owns; every rank must call this."""
        self.check_usable("tensor")
        self._write_tiles(read, tiles)

    def _write_tiles(self, read, tiles=None):
        npdtype = DTYPES[self.dtype][1]
        cdef Py_ssize_t i
        cdef starpu_data_handle_t h
        cdef int ret
        for i in _tile_range(self, tiles):
            h = self.handles[i]
            if _mpi_on:
                # other ranks may hold received copies of the old contents
                nntile_mpi_cache_flush(h)
                if self.owners is not None and self.owners[i] != _mpi_rank:
                    continue
            shape = self.traits.tile_shape(i)
            values = np.asarray(read(self.traits.tile_slices(i)))
            if values.shape != shape:
                raise ValueError(f"tile {self.traits.linear_to_index(i)} should have shape "
                                 f"{shape}, got {values.shape}")
            if self.dtype == "bf16":
                values = float_to_bf16_bits(values)
            nntile_tile_written(h)
            with nogil:
                ret = starpu_data_acquire(h, STARPU_W)
            CHKERR(ret, "starpu_data_acquire")
            try:
                view = _tile_view(h, self.itemsize * _prod(shape), npdtype, shape)
                view[...] = values
            finally:
                starpu_data_release(h)

    def is_local(self, Py_ssize_t linear):
        """Whether this rank owns tile ``linear`` (always true without MPI)."""
        return self.owners is None or self.owners[linear] == _mpi_rank

    def local_tiles(self):
        """Linear indices of the tiles this rank owns."""
        return [i for i in range(self.traits.ntiles) if self.is_local(i)]

    def to_array(self):
        """A numpy copy of the whole tensor (waits for the tasks that write it); float32 for a
        bf16 tensor. Under StarPU-MPI every rank must call it, and every rank gets it all."""
        self.check_usable("tensor")
        npdtype = DTYPES[self.dtype][1]
        result = np.empty(self.traits.shape, dtype=npdtype)
        cdef Py_ssize_t i
        cdef starpu_data_handle_t h
        cdef int ret
        for i in range(self.traits.ntiles):
            h = self.handles[i]
            if _mpi_on:
                nntile_mpi_get_on_all(h)
            with nogil:
                ret = starpu_data_acquire(h, STARPU_R)
            CHKERR(ret, "starpu_data_acquire")
            try:
                shape = self.traits.tile_shape(i)
                result[self.traits.tile_slices(i)] = _tile_view(
                    h, self.itemsize * _prod(shape), npdtype, shape)
            finally:
                starpu_data_release(h)
        if self.dtype == "bf16":
            return bf16_bits_to_float(result)
        return result

    def tile_to_array(self, tile_index):
        """A numpy copy of one tile; under StarPU-MPI, only on the rank that owns it."""
        self.check_usable("tensor")
        cdef Py_ssize_t i = self.traits.index_to_linear(tile_index)
        if not self.is_local(i):
            raise RuntimeError(f"tile {tile_index} is owned by rank {self.owners[i]}, not by "
                               f"this rank ({_mpi_rank}); read it there, or use to_array()")
        cdef starpu_data_handle_t h = self.handles[i]
        cdef int ret
        with nogil:
            ret = starpu_data_acquire(h, STARPU_R)
        CHKERR(ret, "starpu_data_acquire")
        try:
            shape = self.traits.tile_shape(i)
            tile = _tile_view(h, self.itemsize * _prod(shape), DTYPES[self.dtype][1], shape).copy()
        finally:
            starpu_data_release(h)
        return bf16_bits_to_float(tile) if self.dtype == "bf16" else tile

    def fill(self, value):
        fill(value, self)

    def clear(self):
        """Zero every tile: drop it where it reads as zeros once dropped (zero_when_dropped;
        no task runs and the tile takes no memory until its next use), else fill it."""
        self.check_usable("tensor")
        cdef Py_ssize_t i
        for i in self.local_tiles():
            if not nntile_tile_drops_to_zero(self.handles[i]):
                fill(0, self)
                return
        self.invalidate()

    def copy(self, basetile=None):
        """A new tensor with the same contents, cut into ``basetile`` (default: the same)."""
        self.check_usable("tensor")
        same_tiles = basetile is None or tuple(basetile) == self.traits.basetile
        result = Tensor(self.traits.shape, basetile or self.traits.basetile, self.dtype,
                        owners=self.owners if same_tiles else None)
        copy(self, result)
        return result

    def wont_use(self):
        """Hint that the tiles will not be used soon: StarPU may evict them from GPU memory."""
        self.check_usable("tensor")
        cdef Py_ssize_t i
        for i in range(self.traits.ntiles):
            starpu_data_wont_use(self.handles[i])

    def write_back(self, tiles=None):
        """Copy this rank's tiles (``tiles``, linear indices: default all, which must all hold
        contents) to host memory in the background, after the tasks submitted so far that
        write them. Past GPU memory StarPU evicts a tile whose only valid copy is on the GPU
        by copying it out inside the GPU's driver thread, which meanwhile launches nothing; a
        tile written back is dropped at once."""
        self.check_usable("tensor")
        cdef Py_ssize_t i
        for i in _tile_range(self, tiles):
            if self.is_local(i):
                CHKERR(nntile_write_back(self.handles[i]), "starpu_data_acquire_on_node_cb")

    def zero_when_dropped(self, tiles=None):
        """Let the tiles ``tiles`` (linear indices; default all) read as zeros whenever they
        hold no valid contents: once invalidated (``invalidate``), a tile takes no memory
        until a task next reads it, which then finds it zero (StarPU's initialisation codelet
        of the handle, run where that task runs). Gradients are dropped so between steps
        (``clear``), and backward accumulates into them as into zeroed ones; a GEMM's first
        product overwrites such a tile instead, until the tile is next written."""
        self.check_usable("tensor")
        cdef Py_ssize_t i
        for i in _tile_range(self, tiles):
            nntile_zero_when_dropped(self.handles[i])

    def set_homes(self, homes):
        """Give each tile (``homes``: one CUDA device per tile, in linear order; None for a
        tile of no home) the device its tasks run on where the submitter chose none
        (ops.set_task_device): the first homed tile of a task decides."""
        self.check_usable("tensor")
        homes = list(homes)
        if len(homes) != self.traits.ntiles:
            raise ValueError(f"set_homes: {len(homes)} homes for {self.traits.ntiles} tiles")
        for home in homes:
            if home is not None and not 0 <= home < _device_count:
                raise ValueError(f"set_homes: device {home!r}, but the runtime drives "
                                 f"{_device_count} devices")
        cdef Py_ssize_t i
        for i, home in enumerate(homes):
            nntile_tile_set_home(self.handles[i], -1 if home is None else home)

    def swap_tiles(self, Tensor other, tiles):
        """Exchange the tiles ``tiles`` (linear indices) with ``other``'s, a tensor of the
        same tiles and dtype: each then names the other's StarPU handles there, with their
        contents and the tasks submitted on them. Where a sum lands in another tensor's tile
        (nntile.parallel.DeviceReplicas), the tensor that should hold it takes that tile
        instead of a copy being made. Not under StarPU-MPI, whose tags name the tiles."""
        self.check_usable("tensor")
        other.check_usable("tensor")
        if other.traits != self.traits or other.dtype != self.dtype:
            raise ValueError(f"swap_tiles: {other!r} is not tiled as {self!r}")
        if _mpi_on:
            raise RuntimeError("swap_tiles: StarPU-MPI names each tile by its tag")
        cdef Py_ssize_t i
        cdef starpu_data_handle_t h
        for i in _tile_range(self, tiles):
            h = self.handles[i]
            self.handles[i] = other.handles[i]
            other.handles[i] = h

    @property
    def homes(self):
        """The home device of each tile (None where it has none), see ``set_homes``."""
        self.check_usable("tensor")
        cdef Py_ssize_t i
        cdef int home
        result = []
        for i in range(self.traits.ntiles):
            home = nntile_tile_home(self.handles[i])
            result.append(None if home < 0 else home)
        return result

    def invalidate(self, tiles=None):
        """Drop the contents (of the tiles ``tiles``, linear indices: default all), after the
        tasks submitted so far that use them: StarPU may free the tiles' buffers without
        writing them anywhere. The tensor stays registered, but a
        task must write it before one reads it again (StarPU aborts otherwise). Under
        StarPU-MPI every rank calls it at the same point, and the copies that other ranks
        received are dropped too."""
        self.check_usable("tensor")
        cdef Py_ssize_t i
        cdef starpu_data_handle_t h
        for i in _tile_range(self, tiles):
            h = self.handles[i]
            if _mpi_on:
                nntile_mpi_cache_flush(h)  # a rank that does not own the tile drops its copy
            if self.is_local(i):
                starpu_data_invalidate_submit(h)
                nntile_tile_dropped(h)

    def valid_tiles(self):
        """How many of this rank's tiles have valid contents on some memory node (StarPU's
        view; call it once the tasks that use the tensor are done, e.g. after
        ``Context.wait``). A tile that was invalidated and not written since has none."""
        self.check_usable("tensor")
        cdef Py_ssize_t i, count = 0
        cdef unsigned node
        cdef int allocated, valid, requested
        for i in range(self.traits.ntiles):
            if not self.is_local(i):
                continue
            for node in range(starpu_memory_nodes_get_count()):
                starpu_data_query_status(self.handles[i], node, &allocated, &valid, &requested)
                if valid:
                    count += 1
                    break
        return count

    def unregister(self):
        """Release every tile now (after the tasks that use them). Safe to call twice."""
        global _live_tensors
        if not self.registered:
            return
        cdef Py_ssize_t i
        cdef starpu_data_handle_t h
        if self.epoch == _epoch and _running_context is not None:
            for i in range(self.traits.ntiles):
                h = self.handles[i]
                with nogil:
                    starpu_data_unregister(h)
        self.registered = False
        _live_tensors.discard(self)

    def _release_at_shutdown(self):
        self.unregister()
        self.closed_by_shutdown = True

    def __repr__(self):
        state = "" if self.is_registered else ", unregistered"
        return (f"nntile.Tensor(shape={self.traits.shape}, basetile={self.traits.basetile}, "
                f"dtype={self.dtype}{state})")


cdef _check_fits_starpu(TensorTraits traits, Py_ssize_t itemsize, owners):
    """Refuse, before registering, a tensor whose tiles (on this rank: those it owns) are more
    than all of StarPU's memory nodes may hold together, or a tile larger than the largest
    node: StarPU would wait for room that never comes."""
    cdef unsigned node
    cdef long total
    capacity, largest = 0, 0
    for node in range(starpu_memory_nodes_get_count()):
        total = starpu_memory_get_total(node)
        if total < 0:  # a node without a limit: nothing to compare with
            return
        capacity += total
        largest = max(largest, total)
    tile_bytes = _prod(traits.basetile) * itemsize
    nbytes = traits.size * itemsize
    if owners is not None:
        nbytes = min(nbytes, sum(1 for rank in owners if rank == _mpi_rank) * tile_bytes)
    if nbytes > capacity:
        raise MemoryError(f"a tensor of shape {traits.shape} needs {_bytes(nbytes)}, more than "
                          f"StarPU may use in all its memory nodes ({_bytes(capacity)})")
    if tile_bytes > largest:
        raise MemoryError(f"a tile of {traits.basetile} needs {_bytes(tile_bytes)}, more than "
                          f"StarPU may use in any one memory node ({_bytes(largest)}); use "
                          "smaller tiles")


def _bytes(n):
    return f"{n / 2**30:.1f} GiB" if n >= 2**30 else f"{n / 2**20:.1f} MiB"


cdef object _resolve_owners(object ctx, TensorTraits traits, object owners):
    """Tuple of owner ranks for a new tensor, or None with one process."""
    if isinstance(owners, str):
        if owners != "batch":
            raise ValueError(f"owners={owners!r}: use 'batch', None or a list of ranks")
        resolved = ctx.owners_for(traits.grid, True)
    elif owners is None:
        resolved = ctx.owners_for(traits.grid, False)
    else:
        resolved = [int(r) for r in owners]
        if len(resolved) != traits.ntiles:
            raise ValueError(f"owners has {len(resolved)} ranks for {traits.ntiles} tiles")
        bad = [r for r in resolved if not 0 <= r < _mpi_size]
        if bad:
            raise ValueError(f"owners names rank {bad[0]}, but the run has {_mpi_size} "
                             f"rank(s) (0 to {_mpi_size - 1})")
        if _mpi_size == 1:
            resolved = None
    return None if resolved is None else tuple(resolved)


cdef Py_ssize_t _prod(tuple shape):
    cdef Py_ssize_t n = 1
    for d in shape:
        n *= <Py_ssize_t> d
    return n
