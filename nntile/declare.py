"""What a run holds, declared as data.

Layers (nn/layers.pyx), the model (models/gpt2.pyx) and the optimizers (optim.py) declare
every tensor they register as a TensorSpec, and create their tensors from those specs and
from nothing else. So the list they declare is the list they register: nntile.memory sums it
without building anything, and a tensor added to a layer is added to the estimate with it.
"""
import math

import numpy as np

from nntile._core.core import Tensor

DTYPE_BYTES = {"fp32": 4, "tf32": 4, "fp64": 8, "bf16": 2, "int64": 8}
MiB = 1 << 20
GiB = 1 << 30
# what a tensor is for, as the memory estimate reports it
CATEGORIES = ("parameters", "gradients", "optimizer_states", "compute_copies", "activations",
              "workspaces", "logits")


class TensorSpec:
    """One tensor the run registers: its shape, tiles, dtype, what it is for, and under
    StarPU-MPI how its tiles get owners (``owners`` as ``Tensor(owners=...)`` takes it: None
    for weight-like tensors, "batch" for tensors with the batch first, or a list of ranks).

    ``category`` is None only for a tensor read back from the runtime (memory.live_*).
    ``shared``: one tensor serves every module of a model that declares the same name, shape,
    tiles and dtype (backward's scratch, see Module.scratch); the model registers it once."""

    __slots__ = ("name", "shape", "basetile", "dtype", "category", "owners", "shared")

    def __init__(self, name, shape, basetile, dtype, category, owners=None, shared=False):
        if category is not None and category not in CATEGORIES:
            raise ValueError(f"{name}: category {category!r}; use one of {CATEGORIES}")
        self.name = name
        self.shape = tuple(int(n) for n in shape)
        self.basetile = tuple(int(b) for b in basetile)
        self.dtype = dtype
        self.category = category
        self.owners = owners
        self.shared = shared

    def create(self, zero=True):
        """The Tensor this spec declares (zero, as every new Tensor, unless ``zero`` is
        False: then no tile is written, nor allocated, until a task writes it)."""
        return Tensor(self.shape, self.basetile, self.dtype, zero=zero, owners=self.owners)

    def renamed(self, name):
        """The same spec under another name (a layer's key under its place in the model)."""
        return TensorSpec(name, self.shape, self.basetile, self.dtype, self.category,
                          self.owners, self.shared)

    @property
    def shared_key(self):
        """What makes two shared specs one tensor: name, shape, tiles and dtype."""
        return (self.name,) + self.key

    @property
    def grid(self):
        return tuple(-(-n // b) for n, b in zip(self.shape, self.basetile))

    def tile_bytes(self):
        """Bytes of each tile, in the C order of the tile grid (tile i of the Tensor)."""
        per_dim = [np.array([b] * (n // b) + ([n % b] if n % b else []), dtype=np.int64)
                   for n, b in zip(self.shape, self.basetile)]
        elems = np.ones(1, dtype=np.int64)
        for sizes in per_dim:
            elems = np.multiply.outer(elems, sizes).reshape(-1)
        return elems * self.itemsize

    def tile_owners(self, distribution):
        """The rank of each tile under ``distribution`` (an nntile.distributed.Distribution)."""
        if isinstance(self.owners, (list, tuple)):
            return np.asarray(self.owners, dtype=np.int64)
        return np.asarray(distribution.owners(self.grid, self.owners == "batch"), dtype=np.int64)

    @property
    def itemsize(self):
        return DTYPE_BYTES[self.dtype]

    @property
    def key(self):
        """What identifies the allocation: (shape, basetile, dtype)."""
        return self.shape, self.basetile, self.dtype

    @property
    def nbytes(self):
        return math.prod(self.shape) * self.itemsize

    def tile_sizes(self):
        """[(elements of a tile, how many tiles have that many)], partial edge tiles included."""
        elems, counts = np.unique(self.tile_bytes() // self.itemsize, return_counts=True)
        return [(int(e), int(c)) for e, c in zip(elems, counts)]

    @property
    def ntiles(self):
        return math.prod(self.grid)

    @property
    def largest_tile(self):
        return math.prod(self.basetile) * self.itemsize

    def __repr__(self):
        return (f"TensorSpec({self.name!r}, {self.shape}, {self.basetile}, {self.dtype}, "
                f"{self.category})")


def sharded_masters(model):
    """The names of the parameters of ``model`` (built or only declared) whose masters
    replicas sharding the update keep only on the rank that updates each tile: those with a
    compute copy (bf16-mixed GEMM operands), which is all that forward and backward read;
    not the embeddings, whose lookup reads the master itself. In fp32 or tf32 the master is
    the weight every layer reads, so every rank keeps it whole."""
    embeddings = {name for name, _ in model.embedding_parameters()}
    return {name for name, param in model.named_parameters() if name not in embeddings
            and any(spec.category == "compute_copies" for spec in param.specs)}


def shard_owners(tile_bytes, nranks):
    """The rank that updates each parameter tile when replicas shard the update
    (Distribution ``zero``): ``tile_bytes`` holds, by parameter name, the bytes of its tiles
    (C order). Each tile in turn, parameters by name, goes to the rank holding the fewest
    bytes so far (the lowest such rank), so the shares differ by at most one tile; every rank
    computes the same owners, as does the memory estimate, whatever order it lists the
    parameters in. A list of a rank per tile, by parameter name."""
    held = [0] * nranks
    owners = {}
    for name in sorted(tile_bytes):
        ranks = []
        for size in tile_bytes[name]:
            rank = min(range(nranks), key=held.__getitem__)
            held[rank] += int(size)
            ranks.append(rank)
        owners[name] = ranks
    return owners
