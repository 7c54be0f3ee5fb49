"""nntile: GPT training on tiled tensors scheduled by the StarPU runtime."""
from nntile._core.core import (Context, StarpuError, Tensor, TensorTraits, current_context,
                               HAVE_CUDA, DTYPES)
from nntile import ops

__all__ = ["Context", "StarpuError", "Tensor", "TensorTraits", "current_context", "ops",
           "HAVE_CUDA", "DTYPES"]
__version__ = "0.1.0"
