"""Tensor operations; each validates its inputs and submits one StarPU task per tile."""
from contextlib import contextmanager

from nntile._core import core

# Every tensor op of the core module (core.OPS: the public functions of its op parts), under
# its own name.
globals().update({name: getattr(core, name) for name in core.OPS})

__all__ = [*core.OPS, "task_priority", "task_workers", "task_device"]


@contextmanager
def _while(setter, value):
    """``setter(value)`` for the tasks submitted inside the block, then the value before."""
    previous = setter(value)
    try:
        yield
    finally:
        setter(previous)


def task_priority(priority):
    """Tasks submitted inside the block get ``priority`` (see ``set_task_priority``)."""
    return _while(core.set_task_priority, priority)


def task_workers(kind):
    """Tasks submitted inside the block run only on ``kind`` workers (see
    ``set_task_workers``)."""
    return _while(core.set_task_workers, kind)


def task_device(device):
    """Tasks submitted inside the block run on the workers of ``device`` (see
    ``set_task_device``)."""
    return _while(core.set_task_device, device)
