# Typed layer classes, for other Cython modules (models) to cimport.
from nntile._core.core cimport Tensor
from nntile.nn.attention cimport CoreAttention
from nntile.nn.module cimport Module, Parameter


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
    cpdef keep_input(self, Tensor x)
    cdef Tensor _in_compute(self, Tensor dy)


cdef class MLP(Module):
    cdef Linear _out
    cpdef Tensor forward(self, Tensor x)
    cpdef recompute(self, Tensor x)
    cdef Tensor _hidden(self, Tensor x)


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
    cpdef backward(self, Tensor dy, Tensor into=*)


cdef class Attention(Module):
    cdef readonly int n_head, n_kv_head, head_dim, head_tile, kv_tile
    cdef readonly Linear q, k, v, out
    cdef readonly CoreAttention core
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
    cpdef recompute(self, Tensor x, Tensor positions=*)
    cdef Tensor _attention_branch(self, Tensor x, Tensor positions)
    cpdef backward(self, Tensor dy, Tensor dx)
