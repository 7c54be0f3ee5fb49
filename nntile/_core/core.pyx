# cython: language_level=3, boundscheck=False, wraparound=False
# The core extension module: runtime, tiled tensors and tensor ops, in .pxi parts.
from nntile._core.starpu cimport *

include "runtime.pxi"
include "traits.pxi"
include "tensor.pxi"
include "collective.pxi"
include "mask.pxi"
_BEFORE_OPS = frozenset(globals())
include "ops.pxi"
include "nn_ops.pxi"
include "norm_ops.pxi"
include "attention.pxi"
include "llama_ops.pxi"
include "flash.pxi"

# The tensor ops, in the order defined: the public names that the op parts define.
# nntile.ops exports them.
OPS = tuple(name for name in globals() if name not in _BEFORE_OPS and not name.startswith("_"))
del _BEFORE_OPS
