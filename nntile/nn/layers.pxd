# Typed layer classes, for other Cython modules (models) to cimport.
from nntile._core.core cimport Tensor


cdef class Parameter:
    cdef readonly list specs
    cdef readonly Tensor value
    cdef readonly Tensor grad
    cdef readonly Tensor copy
    cdef readonly Tensor compute


cdef class Module:
    cdef dict _params
    cdef dict _children
    cdef dict _scratch
    cdef dict _constants
    cdef dict _declared
    cdef dict _buffers
    cdef tuple _lead
    cdef str _pool_as
    cdef tuple _own
    cdef readonly str dtype
    cdef readonly str master
    cdef readonly str compute
    cpdef Parameter add_param(self, str name, tuple shape, tuple basetile, bint gemm=*)
    cpdef Module add_child(self, str name, Module module)
    cpdef dict buffers(self, Tensor x)
    cpdef dict scratch(self)
    cdef dict _buffers_for(self, tuple lead)
    cdef list _declared_for(self, tuple lead)
    cdef object _pooled(self, spec)
    cdef Tensor _from_pool(self, spec)
    cdef _use_scratch(self, dict pool)


cdef class Linear(Module):
    cdef readonly int in_ndim
    cdef readonly tuple out_shape
    cdef readonly tuple out_tiles
    cdef readonly bint residual
    cdef readonly Parameter weight
    cdef readonly Parameter bias
    cdef Tensor x
    cpdef Tensor forward(self, Tensor x)
    cpdef backward(self, Tensor dy, Tensor dx=*, double beta=*)
    cdef Tensor _in_compute(self, Tensor dy)


cdef class Norm(Module):
    cdef readonly int n_embd, embd_tile
    cdef readonly double eps
    cdef readonly Parameter weight
    cdef Tensor x
    cdef Tensor stats
    cdef normalize(self, Tensor x, Tensor y)
    cpdef Tensor forward(self, Tensor x)
    cpdef backward(self, Tensor dy, Tensor dx, double beta)


cdef class LayerNorm(Norm):
    cdef readonly Parameter bias


cdef class RMSNorm(Norm):
    pass


cdef class Rotary(Module):
    cdef readonly double scale
    cpdef forward(self, Tensor x, Tensor positions)
    cpdef backward(self, Tensor dx, Tensor positions)


cdef class Embedding(Module):
    cdef readonly Parameter weight
    cdef Tensor ids
    cpdef forward(self, Tensor ids, Tensor dst)
    cpdef backward(self, Tensor dy)


cdef class Attention(Module):
    cdef readonly int n_head, n_kv_head, head_dim, head_tile, kv_tile
    cdef readonly Linear q, k, v, out
    cdef readonly Module core  # nntile.nn.attention.CoreAttention
    cdef readonly Rotary rotary  # None: the positions were added to the embeddings
    cdef Tensor positions
    cpdef tuple _shape_qk(self, Tensor q, Tensor k)
    cpdef tuple _shape_qk_backward(self, Tensor dq, Tensor dk)
    cpdef Tensor forward(self, Tensor x, Tensor positions=*)
    cpdef backward(self, Tensor dy, Tensor dx, double beta)


cdef class PreNormBlock(Module):
    cdef tuple _stream  # (n_embd, embd_tile)
    cdef Module _norm_1, _attn, _norm_2, _mlp
    cdef _branches(self, int n_embd, int embd_tile, Module norm_1, Module attn, Module norm_2,
                   Module mlp)
    cpdef Tensor forward(self, Tensor x, Tensor positions=*)
    cpdef backward(self, Tensor dy, Tensor dx)
