# The attention core, for the layers and models that cimport it.
from nntile._core.core cimport Tensor
from nntile.nn.module cimport Module


cdef class CoreAttention(Module):
    cdef readonly int n_head, n_kv_head, head_dim, head_tile, group
    cdef readonly bint fused
    cdef readonly object mask  # an AttentionMask (nntile._core), query 0 at key position 0
    cdef readonly double scale
    cdef readonly str lse_dtype
    cdef Tensor q, k, v, o, lse, p
    cdef public object kv_cache  # None, or a KVCache (nntile.models.kv_cache) while generating
    cpdef Tensor forward(self, Tensor q, Tensor k, Tensor v)
    cpdef backward(self, Tensor do, Tensor dq, Tensor dk, Tensor dv)
