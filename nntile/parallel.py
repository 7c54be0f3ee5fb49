"""Data parallelism over replicas: PyTorch DDP's part, for a model on tiles.

Every rank holds the whole model (``--distribution replicas``, nntile.Context). Each takes its
share of the global batch's rows, computes its loss and gradients, and the gradients are
summed over the ranks: after backward is submitted, the gradient tiles go to all-reduce
tasks (nntile._core's allreduce_sum) in buckets, in the order backward finishes them (the head
and the last block first). A bucket's task runs as soon as its tiles are final, so the last
layers' gradients travel while the first layers still run backward; the collectives of a rank
run one at a time in that order, which is the same on every rank. Every rank then applies
the same update to the same summed gradients, so the replicas stay equal.

With ``--distribution replicas:zero`` the update is sharded (Sharding): each gradient tile is
reduced to the one rank that updates it, whose optimizer states only it holds, and the
updated weights are broadcast from there.

Within one process that drives several GPUs, each GPU holds a replica too (DeviceReplicas,
``Context(device_replicas=...)``): PyTorch DDP's one replica per device, but with the update
sharded as ZeRO does, and with StarPU moving the tiles. The replicas share the parameters'
masters and compute copies and each has gradients of its own; every tile of a parameter has
a home device, where its summed gradient, its master, its optimizer states and the update
live. Each block's gradients are summed at home as soon as every replica has submitted its
backward, into the tile of the replica on that device, and each replica reads the updated
compute copy, which StarPU copies from home once a step. Between steps every replica's
gradients are dropped and read as zeros (nntile.nn.Parameter, Tensor.zero_when_dropped):
backward's first GEMM into a tile overwrites it.

With one process on one device (or a Context whose ranks own tiles through StarPU-MPI) the
wrapper passes the whole batch to the model and reduces nothing.
"""
import numpy as np

from nntile import ops
from nntile._core.core import (allreduce_sum, broadcast, collective_bytes, collective_check,
                               reduce_sum)
from nntile.declare import sharded_masters
from nntile.distributed import shard_owners

# DDP's default bucket: large enough that each collective runs near the link's bandwidth,
# small enough that the first buckets start while backward still runs
BUCKET_BYTES = 25 << 20


class Sharding:
    """The update of replicas sharded over them (ZeRO-2, with sharded masters): the rank of
    each parameter tile (nntile.distributed.shard_owners, by the masters' bytes) is the only
    one that keeps its summed gradient, updates it and holds its optimizer states and, for
    the parameters named in ``owner_masters`` (nntile.declare.sharded_masters: bf16-mixed
    GEMM weights), its fp32 master; it then broadcasts the updated compute tensor (the bf16
    copy, or the master where layers read it). Every rank builds the same Sharding of the
    same parameters.

    A gradient tile exists on a rank only from backward's first write into it until its
    piece of backward is reduced to its owner (reduce_gradients); the owner keeps its own
    until the next step starts (drop)."""

    def __init__(self, named_parameters, nranks, rank, bucket_bytes, owner_masters=()):
        named = list(named_parameters)
        self.params = [param for _, param in named]
        self.rank, self.bucket_bytes = rank, bucket_bytes
        # each master's declaration (Parameter.specs[0]) gives its tiles' bytes
        owners = shard_owners({name: p.specs[0].tile_bytes() for name, p in named}, nranks)
        self._roots = {id(p): owners[name] for name, p in named}
        owner_masters = set(owner_masters)
        self._sharded_masters = [p for name, p in named if name in owner_masters]
        self._tiles = {}  # id(tensor): the tiles of it this rank holds
        for param in self.params:
            self.hold(param, param.value, param.grad)

    def roots(self, param):
        """The rank that updates each tile of ``param``."""
        return self._roots[id(param)]

    def mine(self, param):
        """The linear indices of the tiles of ``param`` this rank updates."""
        return [i for i, rank in enumerate(self._roots[id(param)]) if rank == self.rank]

    def others(self, param):
        return [i for i, rank in enumerate(self._roots[id(param)]) if rank != self.rank]

    def hold(self, param, *tensors):
        """Record that of ``tensors`` (with the tiles of ``param``) this rank keeps its own
        tiles: a checkpoint takes each tile from the rank that updates it."""
        for tensor in tensors:
            self._tiles[id(tensor)] = self.mine(param)

    def tiles_to_save(self, tensor):
        """The tiles of ``tensor`` (a parameter or a state) this rank writes into a checkpoint."""
        return self._tiles[id(tensor)]

    def drop_masters(self):
        """Start a step: drop the other ranks' tiles of the sharded masters (whole after
        initialisation or a checkpoint's load, which write every tile)."""
        for param in self._sharded_masters:
            param.value.invalidate(self.others(param))

    def reduce_gradients(self, params):
        """Sum each gradient tile of ``params`` over the ranks into its owner's, in buckets in
        the order of ``params`` (backward's), then free the other ranks' copies."""
        reduce_sum([p.grad for p in params], [self.roots(p) for p in params],
                   self.bucket_bytes)
        for param in params:
            param.grad.invalidate(self.others(param))

    def sum_over_ranks(self, tensor):
        """All-reduce ``tensor`` (a partial sum of this rank's tiles, e.g. a norm)."""
        allreduce_sum([tensor], self.bucket_bytes)

    def broadcast_weights(self):
        """After the update: every rank gets the updated weights that forward reads from the
        ranks that updated them: the compute copies, and the masters that every rank keeps
        whole (those without a copy, and the embeddings, whose lookup reads the master)."""
        sharded = {id(p) for p in self._sharded_masters}
        tensors = [(p, t) for p in self.params for t in (p.value, p.copy)
                   if t is not None and not (t is p.value and id(p) in sharded)]
        broadcast([t for _, t in tensors], [self.roots(p) for p, _ in tensors],
                  self.bucket_bytes)


def equal_rows(array, parts, what):
    """``array`` ([batch, ...]) cut into ``parts`` equal runs of rows."""
    rows = array.shape[0] // parts
    if rows * parts != array.shape[0]:
        raise ValueError(f"{parts} {what} share a batch of {array.shape[0]} rows unequally: "
                         f"use a multiple of {parts}")
    return [array[i * rows:(i + 1) * rows] for i in range(parts)]


class DeviceReplicas:
    """``model`` and a replica of it on each other CUDA device of the process (see the
    module): replica d runs its forward and backward on device d only; ``sum_gradients``
    adds the replicas' gradients into ``model``'s, tile by tile on each tile's home device,
    whose update (the optimizer's tasks on ``model``'s parameters) then runs there too."""

    def __init__(self, model, devices):
        self.models = [model]
        for _ in range(1, devices):
            replica = type(model)(model.config, dtype=model.dtype, create=False,
                                  tiling=dict(model.tiles, batch_count=model.batch_count),
                                  recompute=model.recompute)
            replica.layer_priorities = model.layer_priorities
            replica.free_activations = model.free_activations
            replica.create(sharing=model)
            self.models.append(replica)
        named = list(model.named_parameters())
        homes = shard_owners({name: p.specs[0].tile_bytes() for name, p in named}, devices)
        for name, param in named:
            for tensor in (param.value, param.copy):
                if tensor is not None:
                    tensor.set_homes(homes[name])
        for replica in self.models:  # a gradient tile is summed at its home, in any replica
            for name, param in replica.named_parameters():
                param.grad.set_homes(homes[name])
        self._holding = False

    def each(self):
        """(device, replica) pairs, with the tasks submitted meanwhile on that device."""
        for device, model in enumerate(self.models):
            with ops.task_device(device):
                yield device, model

    def take_turns(self, pieces):
        """Run ``pieces`` (one generator per replica, each submitting a piece of work per
        ``next``) in turns, each on its replica's device, so that every device gets work from
        the start of the step; yields what each turn's pieces yielded, one per replica."""
        running = list(enumerate(pieces))
        while running:
            results = []
            for device, piece in list(running):
                with ops.task_device(device):
                    try:
                        results.append(next(piece))
                    except StopIteration:
                        running.remove((device, piece))
            if results:
                yield results

    def submit_loss(self, shares):
        """Every replica's forward and loss on its (input_ids, targets) share, in turns."""
        for _ in self.take_turns([model.submit_loss_steps(*share)
                                  for model, share in zip(self.models, shares)]):
            pass

    def backward(self, scale, reduce):
        """Every replica's backward, in turns; with ``reduce``, each piece's gradients summed
        into the first replica's as soon as every replica has submitted that piece. Every
        replica's embedding lookup adds into the first replica's token table gradient, at each
        tile's home (CausalLM.backward_steps' ``table_into``): the stream's gradient moves
        there, not the table's at the end of backward, and no other replica's table gradient
        is written (Llama-3.1-8B's is 2 GiB in fp32, written last in backward). A tied table
        is summed with the head's piece, with what earlier micro-batches left in each replica's;
        an untied one is summed so only where none did."""
        tied = self.models[0].config.tie_word_embeddings
        summed_at_lookup = reduce and (tied or not self._holding)
        table_into = self.models[0].embedding.weight.grad if summed_at_lookup else None
        for finished in self.take_turns([model.backward_steps(scale, table_into)
                                         for model in self.models]):
            if reduce:
                self.sum_gradients(finished)
        self._holding = not reduce  # each replica then holds its micro-batches' gradients

    def sum_gradients(self, params):
        """Sum the gradients of ``params`` ([the same parameters of each replica]) over the
        replicas, each tile into the tile of the replica that runs on its home device, then
        drop the other replicas' (Tensor.invalidate: StarPU may reuse their buffers for the
        rest of backward, as FSDP frees a block's gradients once reduce-scattered; the next
        ``zero_grad`` writes them again). The first replica's gradient, which the optimizer
        reads, then takes the summed tiles (Tensor.swap_tiles), so that a device holds one
        replica's gradients and no second copy of the sums it is home to."""
        for same in zip(*params):
            grads = [param.grad for param in same]
            by_home = {}
            for tile, home in enumerate(grads[0].homes):
                by_home.setdefault(home, []).append(tile)
            for home, tiles in by_home.items():
                for device, grad in enumerate(grads):
                    if device != home:
                        ops.add(1.0, grad, 1.0, grads[home], tiles=tiles)
                        grad.invalidate(tiles)
                if home != 0:
                    grads[0].swap_tiles(grads[home], tiles)

    def unregister(self):
        for replica in self.models[1:]:
            replica.unregister()


class DataParallel:
    """``model`` trained by the replicas of ``ctx`` (nntile.Context): one per rank where ranks
    are replicas, and one per CUDA device of each rank where ``ctx.device_replicas`` (see the
    module). ``submit_loss``, ``loss``, ``backward``, ``zero_grad`` and ``free_buffers`` stand
    for the model's; other attributes are the model's (the first replica's, whose parameters
    the optimizer updates)."""

    def __init__(self, model, ctx, bucket_bytes=BUCKET_BYTES):
        self.model = model
        self.replicas = ctx.world_size if ctx.replicated else 1
        self.rank = ctx.rank if ctx.replicated else 0
        self.comm = ctx.comm
        self.bucket_bytes = int(bucket_bytes)
        devices = getattr(ctx, "device_replicas", 1)
        self.devices = DeviceReplicas(model, devices) if devices > 1 else None
        # backward finishes the parameters in the reverse of the order forward reads them
        named = list(model.named_parameters())
        self._backward_order = [param for _, param in reversed(named)]
        zero = self.replicas > 1 and getattr(ctx.distribution, "zero", False)
        # the optimizer takes it (AdamW(..., sharding=...)) to update only this rank's tiles
        self.sharding = (Sharding(named, self.replicas, self.rank, self.bucket_bytes,
                                  sharded_masters(model)) if zero else None)
        self._bytes_at_step = 0

    def __getattr__(self, name):
        return getattr(self.model, name)

    def shard(self, array):
        """This rank's rows of a global [batch, seq] array (equal shares: the distribution
        checked the batch before StarPU started)."""
        array = np.asarray(array)
        if self.replicas == 1:
            return array
        return equal_rows(array, self.replicas, "replicas")[self.rank]

    def _each(self):
        """(share, model) of every replica of this process: (0, the model) with one."""
        return self.devices.each() if self.devices is not None else [(0, self.model)]

    def _split(self, array):
        """This process's rows, cut into one share per replica of it."""
        rows = self.shard(array)
        return equal_rows(rows, len(self.devices.models), "GPUs") if self.devices else [rows]

    def submit_loss(self, input_ids, targets):
        """Submit forward and loss on this process's rows (each replica's ``loss_value``: the
        mean over its share), without waiting."""
        if self.devices is None:
            self.model.submit_loss(self.shard(input_ids), self.shard(targets))
        else:
            self.devices.submit_loss(list(zip(self._split(input_ids), self._split(targets))))

    def submitted_loss(self):
        """The mean cross-entropy over this process's rows of the last ``submit_loss``
        (waits for it)."""
        models = self.devices.models if self.devices else [self.model]
        return float(np.mean([float(m.loss_value.to_array()[0]) for m in models]))

    def loss(self, input_ids, targets):
        """The mean cross-entropy over the global batch (every rank gets the same float)."""
        self.submit_loss(input_ids, targets)
        local = self.submitted_loss()
        if self.replicas == 1:
            return local
        return self.comm.allreduce(local) / self.replicas

    def backward(self, scale=1.0, reduce=True):
        """Every replica's backward on its rows, then (``reduce``) the gradients summed over
        the replicas: each replica's mean is 1/replicas of the global one. With gradient
        accumulation, reduce on the last micro-batch only (DDP's no_sync)."""
        for _ in self.backward_steps(scale, reduce):
            pass

    def backward_steps(self, scale=1.0, reduce=True):
        """``backward`` in pieces: yields each piece's parameters once the piece's backward is
        submitted, before its gradients are reduced. With the update sharded (and one replica
        per process), each piece's gradients go to their owners as soon as it is submitted
        and the other ranks drop them: a rank then holds its own shard of the gradients and
        the pieces in flight (what ZeRO-2 holds), not the whole."""
        if self.devices is not None:
            self.devices.backward(scale / self.replicas / len(self.devices.models), reduce)
            pieces = [self._backward_order]
        else:
            pieces = self.model.backward_steps(scale / self.replicas)
        piecewise = self.sharding is not None and self.devices is None
        for piece in pieces:
            yield piece
            if reduce and self.replicas > 1 and piecewise:
                self.sharding.reduce_gradients(piece)
        if not reduce or self.replicas == 1 or piecewise:
            return
        if self.sharding is not None:
            self.sharding.reduce_gradients(self._backward_order)
        else:
            allreduce_sum([p.grad for p in self._backward_order], self.bucket_bytes)

    def zero_grad(self):
        """Zero the gradients (Module.zero_grad: dropped, where they then read as zeros);
        with the update sharded over the replicas of one device each, drop the masters of
        other ranks' tiles too (Sharding.drop_masters)."""
        for _, model in self._each():
            model.zero_grad()
        if self.sharding is not None and self.devices is None:
            self.sharding.drop_masters()

    def free_buffers(self):
        for _, model in self._each():
            model.free_buffers()

    def check(self):
        """Raise if a collective failed inside a task (after the step's tasks ran)."""
        if self.replicas > 1:
            collective_check()

    def bytes_reduced(self):
        """Bytes of tiles this rank handed to collectives since the last call: without
        sharding, each gradient tile once a step (a ring all-reduce then sends 2 (N-1)/N of
        them); with it, each gradient tile (reduce) and each weight tile forward reads
        (broadcast) once, and the gradient norm."""
        total = collective_bytes() if self.replicas > 1 else 0
        step, self._bytes_at_step = total - self._bytes_at_step, total
        return step
