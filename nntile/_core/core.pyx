# cython: language_level=3, boundscheck=False, wraparound=False
# The core extension module: runtime, tiled tensors and tensor ops, in .pxi parts.
from nntile._core.starpu cimport *

include "runtime.pxi"
include "traits.pxi"
include "tensor.pxi"
include "ops.pxi"
include "nn_ops.pxi"
include "attention.pxi"
