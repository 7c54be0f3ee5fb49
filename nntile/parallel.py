"""Data parallelism over replicas: PyTorch DDP's part, for a model on tiles.

Every rank holds the whole model (``--distribution replicas``, nntile.Context). Each takes its
share of the global batch's rows, computes its loss and gradients, and the gradients are
summed over the ranks: after backward is submitted, the gradient tiles go to all-reduce
tasks (nntile._core's allreduce_sum) in buckets, in the order backward finishes them (the head
and the last block first). A bucket's task runs as soon as its tiles are final, so the last
layers' gradients travel while the first layers still run backward; the collectives of a rank
run one at a time in that order, which is the same on every rank. Every rank then applies
the same update to the same summed gradients, so the replicas stay equal.

With one process (or a Context whose ranks own tiles through StarPU-MPI) the wrapper passes
the whole batch to the model and reduces nothing.
"""
import numpy as np

from nntile._core.core import allreduce_sum, collective_bytes, collective_check

# DDP's default bucket: large enough that each collective runs near the link's bandwidth,
# small enough that the first buckets start while backward still runs
BUCKET_BYTES = 25 << 20


class DataParallel:
    """``model`` trained by the replicas of ``ctx`` (nntile.Context); ``loss``, ``backward``
    and ``free_buffers`` stand for the model's, other attributes are the model's."""

    def __init__(self, model, ctx, bucket_bytes=BUCKET_BYTES):
        self.model = model
        self.replicas = ctx.world_size if ctx.replicated else 1
        self.rank = ctx.rank if ctx.replicated else 0
        self.comm = ctx.comm
        self.bucket_bytes = int(bucket_bytes)
        # backward finishes the parameters in the reverse of the order forward reads them
        self._gradients = [param.grad for _, param in reversed(list(model.named_parameters()))]
        self._bytes_at_step = 0

    def __getattr__(self, name):
        return getattr(self.model, name)

    def shard(self, array):
        """This rank's rows of a global [batch, seq] array (equal shares: the distribution
        checked the batch before StarPU started)."""
        array = np.asarray(array)
        if self.replicas == 1:
            return array
        rows = array.shape[0] // self.replicas
        if rows * self.replicas != array.shape[0]:
            raise ValueError(f"{self.replicas} replicas share a batch of {array.shape[0]} "
                             "rows unequally: use a multiple of the replica count")
        return array[self.rank * rows:(self.rank + 1) * rows]

    def submit_loss(self, input_ids, targets):
        """Submit forward and loss on this rank's rows (the model's ``loss_value``: their
        mean), without waiting."""
        self.model.submit_loss(self.shard(input_ids), self.shard(targets))

    def loss(self, input_ids, targets):
        """The mean cross-entropy over the global batch (every rank gets the same float)."""
        local = self.model.loss(self.shard(input_ids), self.shard(targets))
        if self.replicas == 1:
            return local
        return self.comm.allreduce(local) / self.replicas

    def backward(self, scale=1.0, reduce=True):
        """The model's backward on this rank's rows, then (``reduce``) the gradients summed
        over the replicas: each rank's mean is 1/replicas of the global one. With gradient
        accumulation, reduce on the last micro-batch only (DDP's no_sync)."""
        self.model.backward(scale / self.replicas)
        if reduce and self.replicas > 1:
            allreduce_sum(self._gradients, self.bucket_bytes)

    def check(self):
        """Raise if a collective failed inside a task (after the step's tasks ran)."""
        if self.replicas > 1:
            collective_check()

    def bytes_reduced(self):
        """Bytes of gradients this rank handed to all-reduce since the last call: each
        gradient tile once a step (a ring all-reduce then sends 2 (N-1)/N of them)."""
        total = collective_bytes() if self.replicas > 1 else 0
        step, self._bytes_at_step = total - self._bytes_at_step, total
        return step
