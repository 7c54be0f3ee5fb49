"""Tensor operations; each validates its inputs and submits one StarPU task per tile."""
from contextlib import contextmanager

from nntile._core import core

# Every tensor op of the core module (core.OPS: the public functions of its op parts), under
# its own name.
globals().update({name: getattr(core, name) for name in core.OPS})

__all__ = [*core.OPS, "task_priority", "task_workers", "task_device"]


@contextmanager
def task_priority(priority):
    """Tasks submitted inside the block get ``priority`` (see ``set_task_priority``)."""
    previous = core.set_task_priority(priority)
    try:
        yield
    finally:
        core.set_task_priority(previous)


@contextmanager
def task_workers(kind):
    """Tasks submitted inside the block run only on ``kind`` workers (see
    ``set_task_workers``)."""
    previous = core.set_task_workers(kind)
    try:
        yield
    finally:
        core.set_task_workers(previous)


@contextmanager
def task_device(device):
    """Tasks submitted inside the block run on the CUDA workers of ``device`` (see
    ``set_task_device``)."""
    previous = core.set_task_device(device)
    try:
        yield
    finally:
        core.set_task_device(previous)
