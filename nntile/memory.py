"""How much memory a run needs, summed from its declarations.

``estimate`` sums the tensors a run registers for a config, a tiling and a [batch, seq]
shape, as the family's model (nntile.models), its layers and the optimizer declare them
(nntile.declare: this module holds no list of its own), with the tile shapes StarPU will
allocate. Byte counts are exact sums of tile sizes; ``alloc_bytes`` adds StarPU's rounding of
tiles up to 4 MiB to its 16 KiB sub-allocation blocks (src/datawizard/malloc.h, malloc.c
``starpu_malloc_on_node_flags``), which applies on GPUs and to pinned host memory. Writing
weights from numpy allocates every parameter tile in host memory first (plus the numpy array
of the parameter being written).

What the machine offers is nntile.machine's, whether the run fits it nntile.fit's.
"""
import math
from collections import Counter

import numpy as np

from nntile._core.core import Tensor
# the declarations and byte units are nntile.declare's; their names stay importable from here
from nntile.declare import (CATEGORIES, DTYPE_BYTES, GiB, MiB, TensorSpec,  # noqa: F401
                            shard_owners, sharded_masters)
from nntile.models import model_class
from nntile.optim import BY_NAME

SUBALLOC_MAX = 4 << 20             # CHUNK_ALLOC_MAX = 32 MiB / 8 (src/datawizard/malloc.h)
SUBALLOC_BLOCK = 16 << 10          # CHUNK_ALLOC_MIN
PAGE = 4096                        # unistd_o_direct reads and writes whole pages only
NUMPY_INIT_BYTES = 8               # float64 (or two float32) temporaries per written element


def fmt_bytes(n):
    """1.5 GiB, 12.0 MiB, 16 KiB or 12 B."""
    n = float(n)
    for unit, size in (("TiB", 1 << 40), ("GiB", GiB), ("MiB", MiB), ("KiB", 1 << 10)):
        if abs(n) >= size:
            return f"{n / size:.1f} {unit}"
    return f"{int(n)} B"


def alloc_sizes(tile_bytes):
    """What StarPU allocates for tiles of these sizes (an array of bytes): a tile of up to
    4 MiB rounds up to its 16 KiB sub-allocation blocks."""
    rounded = -(-np.maximum(tile_bytes, 1) // SUBALLOC_BLOCK) * SUBALLOC_BLOCK
    return np.where(tile_bytes <= SUBALLOC_MAX, rounded, tile_bytes)


def alloc_bytes(spec):
    """Bytes StarPU allocates on a GPU (or in pinned host memory) for all the tiles."""
    return int(alloc_sizes(spec.tile_bytes()).sum())


def unaligned_tiles(spec):
    """Tiles whose size is not a whole number of pages (unistd_o_direct cannot swap them)."""
    return int(np.count_nonzero(spec.tile_bytes() % PAGE))


def tensor_specs(config, batch, seq, tiling=None, dtype="fp32", optimizer="adamw",
                 grad_clip=True, training=True, nranks=1, model=None, recompute=False):
    """Every tensor a run of ``model`` (the config's family's model class, or a subclass)
    registers, as the model and the optimizer declare them: the model's, the optimizer's,
    then the first step's.

    ``training``: forward, loss and backward have run once for [batch, seq] (forward only
    creates the forward buffers). ``optimizer``: "adamw" (two states per parameter), "sgd"
    (one buffer per parameter) or None; ``grad_clip``: the optimizer's one-element norm tensor
    (and under StarPU-MPI, with ``nranks`` > 1, one partial norm per rank). ``dtype`` is a
    precision: under bf16-mixed, tensors are fp32 or bf16 as the layers make them, and every
    GEMM weight has a bf16 copy ("compute_copies"). ``recompute``: the model recomputes
    activations (CausalLM: True, or the first N blocks), those blocks then sharing one set
    of inner buffers.
    """
    if optimizer is not None and optimizer not in BY_NAME:
        raise ValueError(f"optimizer {optimizer!r}: use 'adamw', 'sgd' or None")
    declared = declared_model(config, tiling, dtype, model, recompute)
    specs = declared.tensor_specs()
    if optimizer is not None:
        specs += BY_NAME[optimizer].tensor_specs(declared.named_parameters(), grad_clip, nranks)
    return specs + declared.tensor_specs(batch, seq, training)


def declared_model(config, tiling=None, dtype="fp32", model=None, recompute=False):
    """``model`` (default: the config's family's model class) declared, not built."""
    return (model or model_class(config.model_type))(
        config, {k: v for k, v in (tiling or {}).items() if v is not None}, dtype, create=False,
        recompute=recompute)


class Estimate:
    """Bytes a run needs, by category (``est["activations"]``), with the tensors behind them."""

    def __init__(self, specs, args, init="full"):
        self.specs = specs
        self.args = args
        self.init = init
        self.breakdown = {c: sum(s.nbytes for s in specs if s.category == c) for c in CATEGORIES}
        self.recompute = None  # preflight's Choice of activation recomputation

    def __getitem__(self, category):
        return self.breakdown[category]

    def with_args(self, args):
        """The same estimate for other tensor_specs arguments (a smaller batch, ...)."""
        return Estimate(tensor_specs(**args), args, self.init)

    @property
    def whole(self):
        """The estimate of the whole model (under StarPU-MPI, of all ranks together)."""
        return self

    def keys(self):
        return self.breakdown.keys()

    def as_dict(self):
        return dict(self.breakdown, total=self.total, alloc=self.alloc_bytes,
                    init_host_peak=self.init_host_peak, largest_tile=self.largest_tile)

    @property
    def total(self):
        return sum(self.breakdown.values())

    @property
    def alloc_bytes(self):
        """The total with StarPU's 16 KiB rounding of small tiles (GPU, pinned host memory)."""
        return sum(alloc_bytes(s) for s in self.specs)

    @property
    def ntensors(self):
        return len(self.specs)

    @property
    def ntiles(self):
        return sum(s.ntiles for s in self.specs)

    @property
    def largest_tile(self):
        return max(s.largest_tile for s in self.specs)

    @property
    def unaligned_tiles(self):
        return sum(unaligned_tiles(s) for s in self.specs)

    @property
    def init_numpy_bytes(self):
        """The numpy temporaries of initialisation: the largest parameter written from a
        full float64 array (``init="full"``), one tile at a time (``"tiles"``), or none."""
        params = [s for s in self.specs if s.category == "parameters"]
        if self.init == "full":
            return max(math.prod(s.shape) for s in params) * NUMPY_INIT_BYTES
        if self.init == "tiles":
            return max(math.prod(s.basetile) for s in params) * NUMPY_INIT_BYTES
        return 0

    @property
    def init_host_peak(self):
        """Host bytes while weights are written from numpy: every parameter tile is allocated
        in host memory by the write, plus the numpy array being written."""
        return self["parameters"] + self["compute_copies"] + self.init_numpy_bytes

    def summary(self):
        parts = ", ".join(f"{c.replace('_', ' ')} {fmt_bytes(self[c])}" for c in CATEGORIES)
        return (f"{fmt_bytes(self.total)} in {self.ntensors} tensors of {self.ntiles} tiles "
                f"({parts}; largest tile {fmt_bytes(self.largest_tile)}; host peak while "
                f"writing weights {fmt_bytes(self.init_host_peak)})")

    def __repr__(self):
        return f"<Estimate {self.summary()}>"


# Under StarPU-MPI a task runs on the rank that owns the tiles it writes and receives the
# tiles it reads from their owners. Gradients and optimizer states are only ever read by
# tasks of their own rank (the optimizer step, the partial gradient norm); tiles of these
# categories may be read by other ranks' tasks, which then hold a received copy.
READ_BY_OTHER_RANKS = ("parameters", "compute_copies", "activations", "workspaces", "logits")


class ShareEstimate(Estimate):
    """What one rank holds of a run whose ``whole`` estimate is given; a subclass fills the
    breakdown from the tiles the rank holds."""

    def __init__(self, whole, distribution, rank):
        super().__init__(whole.specs, whole.args, whole.init)
        self._whole, self.distribution, self.rank = whole, distribution, rank

    def with_args(self, args):
        return type(self)(super().with_args(args), self.distribution, self.rank)

    @property
    def whole(self):
        return self._whole


class RankEstimate(ShareEstimate):
    """What one rank of a StarPU-MPI run holds: the tiles it owns (exact), plus room for a
    received copy of every tile of other ranks that tasks may read (parameters, activations,
    workspaces, logits; not gradients or optimizer states, which stay with their owner).
    StarPU-MPI keeps a received copy until the owner writes the tile, so the room is an upper
    bound; measured on loopback, the copies alive at once were well under it.

    The categories (``est["parameters"]`` ...) and ``total`` are owned + room; ``owned`` and
    ``received`` give the two parts."""

    def __init__(self, whole, distribution, rank):
        if not 0 <= rank < distribution.nranks:
            raise ValueError(f"rank {rank} does not exist in a run of {distribution.nranks}")
        super().__init__(whole, distribution, rank)
        self.owned = dict.fromkeys(CATEGORIES, 0)
        self.received = dict.fromkeys(CATEGORIES, 0)
        self._alloc = 0
        for spec in self.specs:
            sizes = spec.tile_bytes()
            mine = spec.tile_owners(distribution) == rank
            held = mine if spec.category not in READ_BY_OTHER_RANKS else np.ones_like(mine)
            self.owned[spec.category] += int(sizes[mine].sum())
            self.received[spec.category] += int(sizes[held & ~mine].sum())
            self._alloc += int(alloc_sizes(sizes[held]).sum())
        self.breakdown = {c: self.owned[c] + self.received[c] for c in CATEGORIES}

    @property
    def alloc_bytes(self):
        return self._alloc

    @property
    def owned_total(self):
        return sum(self.owned.values())

    @property
    def init_host_peak(self):
        """Each rank writes only the parameter tiles it owns."""
        return self.owned["parameters"] + self.init_numpy_bytes

    def summary(self):
        return (f"rank {self.rank} of {self.distribution.nranks} "
                f"({self.distribution.describe()}): {fmt_bytes(self.total)} = "
                f"{fmt_bytes(self.owned_total)} of tiles it owns + up to "
                f"{fmt_bytes(sum(self.received.values()))} of other ranks' tiles it reads; "
                f"the whole model: {self.whole.summary()}")


def sharded_tiles(specs, nranks, rank, masters=()):
    """{spec name: mask of the tiles ``rank`` keeps} of the tensors that replicas sharding
    the update (nntile.parallel.Sharding) hold in part: each parameter's optimizer states and
    gradient, and the masters of the parameters ``masters`` (nntile.declare.sharded_masters).
    A gradient's other tiles are held too while its piece of backward is in flight
    (ShardedEstimate)."""
    owners = shard_owners({s.name: s.tile_bytes() for s in specs
                           if s.category == "parameters"}, nranks)
    masks = {name: np.asarray(ranks) == rank for name, ranks in owners.items()}
    held = {}
    for spec in specs:
        param = spec.name.rpartition("/")[0]
        if spec.category in ("optimizer_states", "gradients") and param in masks:
            held[spec.name] = masks[param]
        elif spec.category == "parameters" and spec.name in masters:
            held[spec.name] = masks[spec.name]
    return held


def gradients_in_flight(declared, specs, held):
    """The most bytes of other ranks' gradient tiles a replica holds at once: those of the
    largest block, whose piece of backward is being reduced, and those of every parameter
    outside the blocks (a tied head's gradient is the embedding's, written first and reduced
    last)."""
    others = {s.name[:-len("/grad")]: int(s.tile_bytes()[~held[s.name]].sum())
              for s in specs if s.category == "gradients"}
    named = {id(p): name for name, p in declared.named_parameters()}
    blocks = [[named[id(p)] for _, p in block.named_parameters()] for block in declared.blocks]
    in_blocks = {name for block in blocks for name in block}
    outside = sum(size for name, size in others.items() if name not in in_blocks)
    return outside + max((sum(others[name] for name in block) for block in blocks), default=0)


class ShardedEstimate(ShareEstimate):
    """What one replica holds where replicas shard the update (Distribution ``zero``): the
    whole model on its share of the rows (``whole``), but of the tensors sharded_tiles names,
    only the tiles it updates, and of the gradients also those in flight at the peak of
    backward (gradients_in_flight). In fp32 and tf32 the masters stay whole: they are the
    weights every layer reads."""

    def __init__(self, whole, distribution, rank):
        super().__init__(whole, distribution, rank)
        args = whole.args
        declared = declared_model(args["config"], args["tiling"], args["dtype"],
                                  args["model"], args["recompute"])
        self._held = sharded_tiles(whole.specs, distribution.data, rank,
                                   sharded_masters(declared))
        self.in_flight = gradients_in_flight(declared, whole.specs, self._held)
        self.breakdown = dict.fromkeys(CATEGORIES, 0)
        for spec in self.specs:
            self.breakdown[spec.category] += int(self._tile_bytes(spec).sum())
        self.breakdown["gradients"] += self.in_flight

    def _tile_bytes(self, spec):
        sizes = spec.tile_bytes()
        held = self._held.get(spec.name)
        return sizes if held is None else sizes[held]

    @property
    def alloc_bytes(self):
        return (sum(int(alloc_sizes(self._tile_bytes(s)).sum()) for s in self.specs)
                + int(alloc_sizes(np.array([self.in_flight])).sum()))

    @property
    def init_host_peak(self):
        """Every rank writes every master at initialisation."""
        return self._whole.init_host_peak

    def summary(self):
        return (f"rank {self.rank} of {self.distribution.nranks} "
                f"({self.distribution.describe()}): {super().summary()}")


def estimate(config, batch, seq, tiling=None, dtype="fp32", optimizer="adamw", grad_clip=True,
             training=True, init="full", distribution=None, rank=None, model=None,
             recompute=False):
    """Bytes a run of ``config``'s model registers for a [batch, seq] input: parameters,
    gradients, optimizer states, activations kept for backward, workspaces (inputs, backward
    buffers, gradient ping-pong) and logits. ``init``: how weights are written from numpy
    ("full" arrays, per "tiles", or None when they come from GPU tasks).

    With a ``distribution`` of several ranks (nntile.distributed), what ``rank`` holds: a
    RankEstimate; of replicas, the whole model on batch / replicas rows, or, where they shard
    the update, a ShardedEstimate. ``model``: a subclass of the family's model class to estimate instead.
    ``recompute``: with activation recomputation (True, or of the first N blocks), whose
    activations are every block's input and output, one recomputing block's inner
    activations and those of the blocks that do not recompute (CausalLM)."""
    if init not in ("full", "tiles", None):
        raise ValueError(f"init {init!r}: use 'full', 'tiles' or None")
    nranks = distribution.nranks if distribution is not None else 1
    if nranks > 1 and rank is None:
        raise ValueError("estimate(distribution=...) needs the rank whose share to estimate")
    if distribution is not None and distribution.replicas:
        whole = estimate(config, batch // distribution.data, seq, tiling, dtype, optimizer,
                         grad_clip, training, init, model=model, recompute=recompute)
        return ShardedEstimate(whole, distribution, rank) if distribution.zero else whole
    args = dict(config=config, batch=batch, seq=seq, tiling=dict(tiling or {}), dtype=dtype,
                optimizer=optimizer, grad_clip=grad_clip, training=training, nranks=nranks,
                model=model, recompute=recompute)
    whole = Estimate(tensor_specs(**args), args, init)
    return whole if nranks == 1 else RankEstimate(whole, distribution, rank)


# ---- what a process holds ---------------------------------------------------------------

def live_tensors():
    """Every registered nntile Tensor of this process (found through the garbage collector)."""
    import gc
    # type(), not isinstance(): isinstance reads __class__, and some objects warn on that
    # (torch.distributed.reduce_op: a FutureWarning)
    return [o for o in gc.get_objects() if issubclass(type(o), Tensor) and o.is_registered]


def tensor_bytes(tensor):
    return tensor.traits.size * tensor.numpy_dtype.itemsize


def live_owned_bytes(rank):
    """Bytes of the tiles of registered tensors that ``rank`` owns (all tiles with one
    process): what RankEstimate.owned_total predicts."""
    total = 0
    for tensor in live_tensors():
        spec = TensorSpec("", tensor.shape, tensor.basetile, tensor.dtype, None)
        sizes = spec.tile_bytes()
        total += int(sizes.sum() if tensor.owners is None
                     else sizes[np.asarray(tensor.owners) == rank].sum())
    return total


def live_tensor_bytes():
    """(number of registered tensors, their bytes, Counter of (shape, basetile, dtype))."""
    tensors = live_tensors()
    return (len(tensors), sum(tensor_bytes(t) for t in tensors),
            Counter((tuple(t.shape), tuple(t.basetile), t.dtype) for t in tensors))
