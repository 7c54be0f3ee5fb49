# Shapes and tilings: how a tensor is cut into a grid of tiles (row-major, as numpy).

DEF MAX_NDIM = 16


def _as_shape(name, value, allow_empty=True):
    try:
        dims = tuple(value)
    except TypeError:
        dims = (value,)
    result = []
    for d in dims:
        if isinstance(d, bool) or not hasattr(d, "__index__"):
            raise TypeError(f"{name} must hold integers, got {value!r}")
        result.append(int(d))
    if len(result) > MAX_NDIM:
        raise ValueError(f"{name} has {len(result)} dimensions; at most {MAX_NDIM} are supported")
    return tuple(result)


cdef class TensorTraits:
    """A shape cut into tiles of shape ``basetile``; edge tiles may be smaller (partial).

    Tiles are numbered in row-major order of the grid; ``tile_index`` is a tuple of grid
    coordinates and ``tile_linear`` its position in that order.
    """

    def __init__(self, shape, basetile=None):
        shape = _as_shape("shape", shape)
        basetile = shape if basetile is None else _as_shape("basetile", basetile)
        if len(basetile) != len(shape):
            raise ValueError(f"basetile {basetile} has {len(basetile)} dimensions but shape "
                             f"{shape} has {len(shape)}")
        for dim, (n, b) in enumerate(zip(shape, basetile)):
            if n < 1:
                raise ValueError(f"shape {shape}: dimension {dim} is {n}; it must be >= 1")
            if not 1 <= b <= n:
                raise ValueError(f"basetile {basetile}: tile size {b} of dimension {dim} must "
                                 f"be between 1 and the dimension's size {n}")
        elements = 1
        for n in shape:
            elements *= n  # a Python int: the C products below must not overflow
        if elements >= 2 ** 62:
            raise ValueError(f"shape {shape} holds {elements} elements; nntile tensors hold "
                             "fewer than 2**62")
        self.shape = shape
        self.basetile = basetile
        self.ndim = len(shape)
        self.grid = tuple(-(-n // b) for n, b in zip(shape, basetile))
        cdef Py_ssize_t axis, stride = 1, size = 1
        for axis in range(self.ndim - 1, -1, -1):
            self._shape[axis] = shape[axis]
            self._basetile[axis] = basetile[axis]
            self._grid[axis] = self.grid[axis]
            self._grid_stride[axis] = stride
            stride *= self._grid[axis]
            size *= self._shape[axis]
        self.ntiles = stride
        self.size = size

    # C-level helpers used by the tile loops of tensor ops.
    cdef void tile_coords(self, Py_ssize_t linear, Py_ssize_t *coords) noexcept:
        cdef Py_ssize_t axis
        for axis in range(self.ndim):
            coords[axis] = linear // self._grid_stride[axis]
            linear -= coords[axis] * self._grid_stride[axis]

    cdef Py_ssize_t tile_linear(self, const Py_ssize_t *coords) noexcept:
        cdef Py_ssize_t axis, linear = 0
        for axis in range(self.ndim):
            linear += coords[axis] * self._grid_stride[axis]
        return linear

    cdef Py_ssize_t tile_dim(self, Py_ssize_t axis, Py_ssize_t coord) noexcept:
        cdef Py_ssize_t start = coord * self._basetile[axis]
        cdef Py_ssize_t rest = self._shape[axis] - start
        return rest if rest < self._basetile[axis] else self._basetile[axis]

    cdef Py_ssize_t tile_nelems_c(self, const Py_ssize_t *coords) noexcept:
        cdef Py_ssize_t axis, n = 1
        for axis in range(self.ndim):
            n *= self.tile_dim(axis, coords[axis])
        return n

    # Python API
    def _coords(self, tile_index):
        if isinstance(tile_index, (int,)) and not isinstance(tile_index, bool):
            if not 0 <= tile_index < self.ntiles:
                raise IndexError(f"tile {tile_index} out of range for {self.ntiles} tiles")
            return self.linear_to_index(tile_index)
        index = _as_shape("tile index", tile_index)
        if len(index) != self.ndim or any(not 0 <= i < g for i, g in zip(index, self.grid)):
            raise IndexError(f"tile index {tile_index} out of range for grid {self.grid}")
        return index

    def linear_to_index(self, Py_ssize_t linear):
        if not 0 <= linear < self.ntiles:
            raise IndexError(f"tile {linear} out of range for {self.ntiles} tiles")
        cdef Py_ssize_t coords[MAX_NDIM]
        self.tile_coords(linear, coords)
        return tuple(coords[axis] for axis in range(self.ndim))

    def index_to_linear(self, tile_index):
        index = self._coords(tile_index)
        cdef Py_ssize_t coords[MAX_NDIM]
        for axis in range(self.ndim):
            coords[axis] = index[axis]
        return self.tile_linear(coords)

    def tile_shape(self, tile_index):
        """Shape of one tile (smaller than basetile at the far edge of a dimension)."""
        index = self._coords(tile_index)
        return tuple(self.tile_dim(axis, index[axis]) for axis in range(self.ndim))

    def tile_offset(self, tile_index):
        """Element coordinates of a tile's first element."""
        index = self._coords(tile_index)
        return tuple(i * b for i, b in zip(index, self.basetile))

    def tile_slices(self, tile_index):
        """numpy slices selecting a tile's elements from the full array."""
        return tuple(slice(o, o + n) for o, n in
                     zip(self.tile_offset(tile_index), self.tile_shape(tile_index)))

    def element_tile(self, element):
        """(tile index, coordinates inside that tile) of an element."""
        element = _as_shape("element", element)
        if len(element) != self.ndim or any(not 0 <= e < n for e, n in zip(element, self.shape)):
            raise IndexError(f"element {element} out of range for shape {self.shape}")
        return (tuple(e // b for e, b in zip(element, self.basetile)),
                tuple(e % b for e, b in zip(element, self.basetile)))

    def leftover(self):
        """Size of the last tile along each dimension."""
        return tuple(n - (g - 1) * b for n, g, b in zip(self.shape, self.grid, self.basetile))

    def __eq__(self, other):
        if not isinstance(other, TensorTraits):
            return NotImplemented
        return self.shape == other.shape and self.basetile == other.basetile

    def __hash__(self):
        return hash((self.shape, self.basetile))

    def __repr__(self):
        return f"TensorTraits(shape={self.shape}, basetile={self.basetile})"
