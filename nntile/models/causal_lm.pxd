# The causal-LM skeleton, for the families' model classes to cimport and extend.
from nntile._core.core cimport Tensor
from nntile.nn.layers cimport Embedding, Module, Parameter


cdef class CausalLM(Module):
    cdef readonly object config
    cdef readonly dict tiles
    cdef readonly object name_map
    cdef readonly Embedding embedding
    cdef readonly list blocks
    cdef readonly object norm
    cdef readonly Parameter lm_head
    cdef readonly Tensor loss_value
    cdef object _loss_spec
    cdef dict _ws
    cdef dict _first_positions  # [batch, seq] and tiles -> the position its tokens start at
    cdef Tensor _h
    cdef bint _ready_for_backward
    cdef public bint layer_priorities
    cdef public bint free_activations
    cdef readonly int recompute  # the blocks, the first ones, that recompute in backward
    cdef list _inputs  # the residual stream into each block in the last forward
    cdef readonly int batch_count  # batch tiles where no batch tile size was given
    # the family's embeddings: built, run forward into the residual stream, run backward
    cdef Embedding _build_embeddings(self)
    cdef Module _build_block(self)
    cdef Tensor _embed(self, dict ws)
    cdef _embed_backward(self, Tensor dx, Tensor table_into=*)
    cdef tuple _lead_for(self, int B, int T)
    cdef dict _workspace(self, int B, int T, int start)
    cdef _prioritize(self, int distance)
    cdef Tensor _forward(self, input_ids, int start=*, bint head=*)
    cdef _drop(self, list modules, tuple names, bint scratch=*, Tensor keep=*)
