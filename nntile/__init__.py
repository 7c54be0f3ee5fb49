"""nntile: GPT training on tiled tensors scheduled by the StarPU runtime."""
from nntile._core.core import (Context, StarpuError, Tensor, TensorTraits, current_context,
                               launched_by_mpirun, launcher_rank, HAVE_CUDA, HAVE_MPI, DTYPES)
from nntile import ops
from nntile.distributed import Distribution

__all__ = ["Context", "StarpuError", "Tensor", "TensorTraits", "current_context", "ops",
           "Distribution", "launched_by_mpirun", "launcher_rank", "HAVE_CUDA", "HAVE_MPI",
           "DTYPES"]
__version__ = "0.1.0"
