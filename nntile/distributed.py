"""Which MPI rank owns each tile.

Under StarPU-MPI every tile has one owner rank; a task runs on the rank that owns the tiles
it writes, and StarPU-MPI sends it the tiles it reads from other ranks. A distribution is
therefore all the parallelism there is: layers, loss and optimizer contain no MPI code.

Ranks form a grid of ``data`` x ``tensor`` processes (rank = d * tensor + t):

* tensors whose first axis is the batch (activations, token ids, per-row statistics) give
  their batch tiles to the ``data`` groups in turn, and within a group spread their other
  tiles over the ``tensor`` ranks;
* tensors without a batch axis (weights, their gradients and optimizer states, scalars)
  spread their tiles over all ranks in turn, so each rank updates its share (as ZeRO
  shards optimizer states).

``Distribution.data_parallel(n)`` is data x 1, ``Distribution.tensor_parallel(n)`` is 1 x n.
For other layouts, ``block_cyclic`` gives the owners of any tile grid over any process grid;
a tensor takes such a list directly (``Tensor(shape, tiles, owners=[...])``).
"""
import os

import numpy as np

CHOICES = ("data", "tensor", "mixed")


def local_rank():
    """(rank on this node, ranks on this node) as the launcher (Open MPI, MPICH/Hydra, Slurm)
    tells it, or None outside such a launcher."""
    local = next((os.environ[v] for v in ("OMPI_COMM_WORLD_LOCAL_RANK", "MPI_LOCALRANKID",
                                          "SLURM_LOCALID") if os.environ.get(v)), None)
    nlocal = next((os.environ[v] for v in ("OMPI_COMM_WORLD_LOCAL_SIZE", "MPI_LOCALNRANKS")
                   if os.environ.get(v)), None)
    if local is None or nlocal is None:
        return None
    return int(local), int(nlocal)


def local_rank_gpus(ncuda=None):
    """The CUDA devices this rank takes when several ranks share a node: local rank r gets
    r*k ... r*k+k-1 for k CUDA workers per rank (``ncuda``, else STARPU_NCUDA, else 1). None
    when there is nothing to choose (one rank on the node, ncuda=0) or STARPU_WORKERS_CUDAID
    already names the devices."""
    local = local_rank()
    if os.environ.get("STARPU_WORKERS_CUDAID") or ncuda == 0 or local is None or local[1] < 2:
        return None
    per_rank = ncuda or int(os.environ.get("STARPU_NCUDA") or 1)
    return [local[0] * per_rank + j for j in range(per_rank)]


def block_cyclic(grid, process_grid, axes=None):
    """Owner of each tile (C order over ``grid``) when tile coordinate ``c[axes[k]]`` goes
    to process-grid coordinate ``c[axes[k]] % process_grid[k]``; the rank is the C-order
    index in ``process_grid``. ``axes`` defaults to the first len(process_grid) axes."""
    grid = tuple(int(g) for g in grid)
    process_grid = tuple(int(p) for p in process_grid)
    if any(p < 1 for p in process_grid):
        raise ValueError(f"process grid {process_grid} must have positive sizes")
    axes = tuple(range(len(process_grid))) if axes is None else tuple(axes)
    if len(axes) != len(process_grid):
        raise ValueError(f"block_cyclic: {len(axes)} axes for a process grid of "
                         f"{len(process_grid)} dimensions")
    for a in axes:
        if not 0 <= a < len(grid):
            raise ValueError(f"block_cyclic: axis {a} is outside a tile grid of {len(grid)} axes")
    coords = np.indices(grid).reshape(len(grid), -1) if grid else np.zeros((0, 1), int)
    rank = np.zeros(coords.shape[1], dtype=np.int64)
    for a, p in zip(axes, process_grid):
        rank = rank * p + coords[a] % p
    return rank.astype(np.int32).tolist()


class Distribution:
    """A data x tensor process grid; see the module's documentation."""

    def __init__(self, data=1, tensor=1):
        for name, value in (("data", data), ("tensor", tensor)):
            if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
                raise ValueError(f"Distribution({name}={value!r}) must be a positive integer")
        self.data, self.tensor = int(data), int(tensor)

    @property
    def nranks(self):
        return self.data * self.tensor

    @classmethod
    def data_parallel(cls, nranks):
        return cls(data=nranks)

    @classmethod
    def tensor_parallel(cls, nranks):
        return cls(tensor=nranks)

    @classmethod
    def parse(cls, text, nranks):
        """From a --distribution value: data, tensor, or mixed[:DxT] (mixed alone picks
        two data groups when the rank count is even)."""
        text = str(text)
        kind, _, shape = text.partition(":")
        if kind == "data" and not shape:
            return cls.data_parallel(nranks)
        if kind == "tensor" and not shape:
            return cls.tensor_parallel(nranks)
        if kind == "mixed":
            if not shape:
                if nranks % 2:
                    raise ValueError(f"--distribution mixed needs an even number of ranks "
                                     f"(got {nranks}); give the grid as mixed:DxT")
                return cls(data=2, tensor=nranks // 2)
            try:
                d, t = (int(x) for x in shape.lower().split("x"))
            except ValueError:
                raise ValueError(f"--distribution {text!r}: write the grid as mixed:DxT, "
                                 "e.g. mixed:2x2") from None
            return cls(data=d, tensor=t)
        raise ValueError(f"--distribution {text!r}: use one of data, tensor, mixed[:DxT]")

    def check(self, world_size):
        """Raise (identically on every rank) unless the grid matches the ranks there are."""
        if self.nranks != world_size:
            raise ValueError(f"the distribution needs {self.nranks} ranks ({self.data} data x "
                             f"{self.tensor} tensor) but the run has {world_size}; a "
                             f"distribution cannot name a rank that does not exist")

    def check_batch_tiles(self, nbatch_tiles):
        """Data parallelism shares batch tiles: there must be one for each data group."""
        if nbatch_tiles < self.data:
            raise ValueError(f"{self.data} data-parallel groups but the batch has only "
                             f"{nbatch_tiles} tile(s) to share: use a batch of at least "
                             f"{self.data} x the batch tile, a smaller batch tile, or fewer "
                             "ranks")

    def owners(self, grid, batched):
        grid = tuple(int(g) for g in grid)
        ntiles = int(np.prod(grid, dtype=np.int64)) if grid else 1
        linear = np.arange(ntiles, dtype=np.int64)
        if not batched or not grid:
            return (linear % self.nranks).astype(np.int32).tolist()
        rest = ntiles // grid[0]
        group = (linear // rest) % self.data
        return (group * self.tensor + (linear % rest) % self.tensor).astype(np.int32).tolist()

    def describe(self):
        return f"{self.data} data x {self.tensor} tensor"

    def __repr__(self):
        return f"Distribution(data={self.data}, tensor={self.tensor})"
