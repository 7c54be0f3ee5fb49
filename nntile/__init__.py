"""nntile: GPT training on tiled tensors scheduled by the StarPU runtime."""
from nntile.startup import quiet_interrupt_while_starting
quiet_interrupt_while_starting()  # first: Ctrl-C during the imports below ends a program quietly
from nntile._core.core import (AttentionMask, StarpuError, Tensor, TensorTraits,
                               current_context, HAVE_CUDA, HAVE_MPI, DTYPES)
from nntile.context import Context
from nntile.policy import launched_by_mpirun, launcher_rank
from nntile import ops
from nntile.distributed import Distribution

__all__ = ["AttentionMask", "Context", "StarpuError", "Tensor", "TensorTraits",
           "current_context", "ops", "Distribution", "launched_by_mpirun", "launcher_rank",
           "HAVE_CUDA", "HAVE_MPI", "DTYPES"]
__version__ = "0.1.0"

# Loaded on first use (PEP 562), so that `nntile.models.GPT2LMHead` works after a plain
# `import nntile` while `import nntile` stays as fast as before (76 ms; all of these
# imported eagerly: 105 ms on the 2-core development machine)
_SUBPACKAGES = ("models", "nn", "optim", "memory", "checkpoint", "data")


def __getattr__(name):
    if name == "load":  # nntile.load(CHECKPOINT_OR_TRANSFORMERS_DIR) -> (model, tokenizer)
        from nntile.pretrained import load
        return load
    if name in _SUBPACKAGES:
        import importlib
        return importlib.import_module(f"nntile.{name}")  # binds it here: one lookup only
    raise AttributeError(f"module 'nntile' has no attribute {name!r}")


def __dir__():
    return sorted(set(globals()) | set(_SUBPACKAGES) | {"load"})
