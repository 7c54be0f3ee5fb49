"""The training step of a causal LM, as nntile-train and bench/scale.py both take it: the
model over the replicas of the Context (nntile.parallel.DataParallel; the model itself with
one process), AdamW, and a step of ``grad_accum`` micro-batches whose tasks are all
submitted before the loss is read, so that the workers never wait for Python between
forward, backward and the update."""
from contextlib import nullcontext
from dataclasses import dataclass

from nntile import ops
from nntile.optim import AdamW
from nntile.parallel import DataParallel


@dataclass(frozen=True)
class StepResult:
    loss: float  # the mean over the step's micro-batches and the replicas' rows
    lr: float


class TrainingLoop:
    """``optimizer``: AdamW's arguments (``lr`` a float or an nntile.optim.LRSchedule).
    ``optimizer_on``: the kind of worker the update tasks run on (None: as the Context places
    them); with the update on CPU workers, forward and backward stay on the GPUs (a CPU
    worker would otherwise be handed matrix products to calibrate dmda's models). ``idle``:
    tensors StarPU is told after each step that they will not be used soon
    (starpu_data_wont_use)."""

    def __init__(self, model, ctx, grad_accum=1, optimizer_on=None, **optimizer):
        if grad_accum < 1:
            raise ValueError(f"grad_accum {grad_accum} must be >= 1")
        self.model = model
        self.replicas = DataParallel(model, ctx)
        self.opt = AdamW(model.named_parameters(), sharding=self.replicas.sharding, **optimizer)
        self.grad_accum = grad_accum
        self.optimizer_on = optimizer_on
        self.idle = ()

    def step(self, next_batch, abandon=lambda: False):
        """One optimizer step over ``grad_accum`` batches of ``next_batch()`` ((ids, targets),
        global [batch, seq] arrays): a StepResult, or None where ``abandon()`` holds before a
        micro-batch or the update (the weights are then those before the step)."""
        losses = []
        for micro in range(self.grad_accum):
            if abandon():
                return None
            last = micro == self.grad_accum - 1
            with self._placed("cuda" if self.optimizer_on == "cpu" else None):
                self.replicas.submit_loss(*next_batch())
                if micro == 0:  # after forward, which reads no gradient: the GPUs start on it
                    self.replicas.zero_grad()
                self.replicas.backward(scale=1.0 / self.grad_accum, reduce=last)
            if not last:  # the next micro-batch's forward writes the loss again
                losses.append(self._loss())
        if abandon():
            return None
        with self._placed(self.optimizer_on):
            lr = self.opt.step()
        self.replicas.check()
        losses.append(self._loss())
        for tensor in self.idle:
            tensor.wont_use()
        return StepResult(sum(losses) / len(losses), lr)

    def evaluate(self, batches):
        """The mean loss over ``batches`` of (ids, targets), forward only."""
        losses = [self.replicas.loss(x, y) for x, y in batches]
        if self.model.free_activations:  # no backward reads the last loss's activations
            self.replicas.free_buffers()
        return sum(losses) / len(losses)

    def _loss(self):
        """The last forward's loss, averaged over the replicas (the same float on every
        rank); waits for that forward only."""
        local = self.replicas.submitted_loss()
        if self.replicas.replicas == 1:
            return local
        return self.replicas.comm.allreduce(local) / self.replicas.replicas

    @staticmethod
    def _placed(workers):
        return ops.task_workers(workers) if workers else nullcontext()
