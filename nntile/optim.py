"""Optimizers and learning-rate schedules; every update is one task per parameter tile.

Clipping by global gradient norm stays on the workers: the squared norm is accumulated into a
one-element tensor that each update task reads, so no step waits for the host.

Parameters, gradients and states are in the model's master dtype. A parameter with a compute
copy (bf16-mixed) has it refreshed after each update: by the update task itself for Adam
(adam_step_refresh), by one cast task per tile for SGD.

With a ``sharding`` (nntile.parallel.Sharding: replicas that shard the update), AdamW updates
only this rank's tiles; the other tiles' states are never written, so StarPU never allocates
them, and the updated weights are then broadcast.
"""
import math
from contextlib import nullcontext

from nntile import ops
from nntile._core.core import current_context
from nntile.declare import TensorSpec


class LRSchedule:
    """Linear warm-up from 0 to ``lr`` over ``warmup`` steps, then cosine decay to ``min_lr``
    at ``total`` steps (constant after ``warmup`` when ``total`` is None)."""

    def __init__(self, lr, warmup=0, total=None, min_lr=0.0):
        if lr <= 0 or warmup < 0 or (total is not None and total < warmup):
            raise ValueError(f"learning-rate schedule: lr={lr}, warmup={warmup}, total={total}")
        self.lr, self.warmup, self.total, self.min_lr = lr, warmup, total, min_lr

    def __call__(self, step):
        """Learning rate of optimizer step ``step`` (1-based)."""
        if self.warmup and step <= self.warmup:
            return self.lr * step / self.warmup
        if self.total is None or self.total == self.warmup:
            return self.lr
        progress = min(1.0, (step - self.warmup) / (self.total - self.warmup))
        return self.min_lr + 0.5 * (self.lr - self.min_lr) * (1 + math.cos(math.pi * progress))

    def state(self):
        return {"lr": self.lr, "warmup": self.warmup, "total": self.total, "min_lr": self.min_lr}


def _send_back(tensors, tiles=None):
    """Copy the tensors (their tiles ``tiles``: default all) to host memory after the tasks
    submitted so far, and put them first in line when StarPU makes room on the GPU: nothing
    reads them before the next update."""
    for tensor in tensors:
        tensor.write_back(tiles)
        tensor.wont_use()


def last_share(named_parameters, share):
    """The ids of the last parameters (in model order, which ends with the last blocks, the
    final norm and the head) that together hold at most ``share`` of the elements: those the
    update runs on CPU workers (nntile.policy.cpu_update; backward leaves them in host memory
    with their states)."""
    if not share:
        return frozenset()
    sizes = [math.prod(param.value.shape) for _, param in named_parameters]
    room, taken = share * sum(sizes), set()
    for (_, param), size in zip(reversed(named_parameters), reversed(sizes)):
        if size > room:
            break
        room -= size
        taken.add(id(param))
    return frozenset(taken)


class Optimizer:
    STATES = ()  # the state tensors of each parameter, by name

    def __init__(self, named_parameters, lr, max_grad_norm=None, sharding=None):
        self.params = list(named_parameters)
        self.sharding = sharding
        if not self.params:
            raise ValueError("optimizer got no parameters")
        self.schedule = lr if isinstance(lr, LRSchedule) else LRSchedule(lr)
        if max_grad_norm is not None and max_grad_norm <= 0:
            raise ValueError(f"max_grad_norm={max_grad_norm} must be positive")
        self.max_grad_norm = max_grad_norm
        self.step_count = 0
        ctx = current_context()
        specs = self.tensor_specs(self.params, max_grad_norm is not None, ctx.owner_ranks,
                                  ctx.device_replicas)
        tensors = {spec.name: spec.create(zero=sharding is None) for spec in specs}
        self.normsq = tensors.get("optimizer/normsq")
        self._normsq_parts = tensors.get("optimizer/normsq_parts")
        if self._normsq_parts is not None and ctx.owner_ranks == 1:  # one partial per device
            self._normsq_parts.set_homes(range(ctx.device_replicas))
        self.states = {name: tuple(tensors[f"{name}/{state}"] for state in self.STATES)
                       for name, _ in self.params}
        if sharding is not None:  # states start as zeros on the tiles this rank updates
            for name, param in self.params:
                sharding.hold(param, *self.states[name])
                for tensor in self.states[name]:
                    ops.fill(0, tensor, tiles=self._tiles(param))
        self._by_param = {id(p): n for n, p in self.params}
        self._on_cpu = last_share(self.params, current_context().cpu_update_share)
        if current_context().writes_behind:  # the states start as zeros written on the GPU
            for name, param in self.params:
                _send_back(self.states[name], self._tiles(param))

    @classmethod
    def tensor_specs(cls, named_parameters, grad_clip=True, nranks=1, ndevices=1):
        """The tensors this optimizer creates for these parameters (model.named_parameters(),
        of a model built or only declared), as TensorSpecs: with ``grad_clip`` the squared
        gradient norm (and its partials, one per rank under StarPU-MPI or else one per device
        of a replica per device), then each parameter's ``STATES``. All are in the master
        dtype; a state has its parameter's tiles and, under StarPU-MPI, the same owner per
        tile, so that each update task finds all its tiles on one rank."""
        values = [(name, param.specs[0]) for name, param in named_parameters]
        dtype = values[0][1].dtype
        specs = []
        if grad_clip:
            specs.append(TensorSpec("optimizer/normsq", (1,), (1,), dtype, "optimizer_states"))
            if nranks > 1:
                # each rank sums the squares of its own gradient tiles, and only these
                # partials (one number per rank) travel
                specs.append(TensorSpec("optimizer/normsq_parts", (nranks, 1), (1, 1), dtype,
                                        "optimizer_states", owners=list(range(nranks))))
            elif ndevices > 1:
                # each device sums the tiles at home there, all devices at once: one number
                # carried from device to device for every tile would make a serial chain
                specs.append(TensorSpec("optimizer/normsq_parts", (ndevices, 1), (1, 1),
                                        dtype, "optimizer_states"))
        for name, value in values:
            specs += [TensorSpec(f"{name}/{state}", value.shape, value.basetile, value.dtype,
                                 "optimizer_states", value.owners) for state in cls.STATES]
        return specs

    def _tiles(self, param):
        """The tiles of ``param`` this rank updates (None: all)."""
        return None if self.sharding is None else self.sharding.mine(param)

    def _submit_grad_norm(self):
        target = self.normsq if self._normsq_parts is None else self._normsq_parts
        # in the order backward finishes the gradients (the last parameters first), so that
        # the sums run behind backward, not after it
        for i, (_, param) in enumerate(reversed(self.params)):
            ops.sumsq(param.grad, 0.0 if i == 0 else 1.0, target, tiles=self._tiles(param))
        if self._normsq_parts is not None:
            ops.sum_slice(1.0, self._normsq_parts, 0.0, self.normsq, 0)
        if self.sharding is not None:  # each rank summed the squares of its own tiles
            self.sharding.sum_over_ranks(self.normsq)

    def grad_norm(self):
        """Global gradient norm of the last step (waits for it)."""
        if self.normsq is None:
            raise RuntimeError("grad_norm is measured only with max_grad_norm set")
        return math.sqrt(float(self.normsq.to_array()[0]))

    def step(self):
        self.step_count += 1
        if self.normsq is not None:
            self._submit_grad_norm()
        lr = self.schedule(self.step_count)
        write_behind = current_context().writes_behind
        for name, param in self.params:
            with ops.task_workers("cpu") if id(param) in self._on_cpu else nullcontext():
                self._update(param, lr)
            if write_behind:  # past GPU memory (nntile.policy.write_behind)
                param.compute.write_back()  # the next forward reads it
                # only the next update reads the states, and the master where a copy exists;
                # with a sharding, only this rank's tiles of them hold contents
                _send_back(self.states[name] + (() if param.copy is None else (param.value,)),
                           self._tiles(param))
        if self.sharding is not None:
            self.sharding.broadcast_weights()
        return lr

    def state_tensors(self):
        """Optimizer state tensors keyed by '<parameter name>/<state name>'."""
        return {f"{name}/{state}": tensor for name, tensors in self.states.items()
                for state, tensor in zip(self.STATES, tensors)}


class AdamW(Optimizer):
    """torch.optim.AdamW (``decoupled=True``) or Adam with L2 weight decay (``decoupled=False``)."""
    STATES = ("exp_avg", "exp_avg_sq")

    def __init__(self, named_parameters, lr=1e-3, betas=(0.9, 0.999), eps=1e-8,
                 weight_decay=0.01, max_grad_norm=None, decoupled=True, sharding=None):
        super().__init__(named_parameters, lr, max_grad_norm, sharding)
        self.betas, self.eps, self.weight_decay, self.decoupled = betas, eps, weight_decay, decoupled

    @property
    def moments(self):
        """(exp_avg, exp_avg_sq) of each parameter, by name."""
        return self.states

    def _update(self, param, lr):
        m, v = self.states[self._by_param[id(param)]]
        ops.adam_step(self.step_count, lr, self.betas[0], self.betas[1], self.eps,
                      self.weight_decay, self.decoupled, param.value, param.grad, m, v,
                      self.normsq, self.max_grad_norm or 0.0, copy=param.copy,
                      tiles=self._tiles(param))


def Adam(named_parameters, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.0,
         max_grad_norm=None):
    return AdamW(named_parameters, lr, betas, eps, weight_decay, max_grad_norm, decoupled=False)


class SGD(Optimizer):
    """torch.optim.SGD: momentum, dampening, Nesterov, L2 weight decay."""
    STATES = ("momentum_buffer",)

    def __init__(self, named_parameters, lr=1e-2, momentum=0.0, dampening=0.0,
                 weight_decay=0.0, nesterov=False, max_grad_norm=None):
        super().__init__(named_parameters, lr, max_grad_norm)
        if nesterov and (momentum <= 0 or dampening != 0):
            raise ValueError("Nesterov momentum needs momentum > 0 and dampening 0")
        self.momentum, self.dampening = momentum, dampening
        self.weight_decay, self.nesterov = weight_decay, nesterov

    def _update(self, param, lr):
        buf, = self.states[self._by_param[id(param)]]
        ops.sgd_step(self.step_count, lr, self.momentum, self.dampening, self.weight_decay,
                     self.nesterov, param.value, param.grad, buf, self.normsq,
                     self.max_grad_norm or 0.0)
        param.refresh()


# the optimizers nntile.memory can estimate, by the names it takes
BY_NAME = {"adamw": AdamW, "adam": AdamW, "sgd": SGD}
