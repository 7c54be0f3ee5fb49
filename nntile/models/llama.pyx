# cython: language_level=3
"""Llama with a language-model head on tiled tensors: transformers' LlamaForCausalLM. The shared
skeleton (models/causal_lm.pyx) with Llama's config, its token embedding (positions are rotary,
inside attention), and its block and final RMSNorm, which are not written yet: until they are,
building a ``LlamaLM`` raises NotImplementedError. Parameters are named as transformers'
``state_dict`` keys; the linear layers' weights are [in, out] with heads kept apart
(LlamaConfig.name_map)."""
from nntile._core.core cimport Tensor
from nntile.models.causal_lm cimport CausalLM
from nntile.models.llama_config import LlamaConfig
from nntile.nn.layers cimport Embedding


cdef class LlamaLM(CausalLM):
    """Llama language model over tiles (CausalLM says what the arguments are)."""
    config_type = LlamaConfig
    block_type = None   # LlamaBlock(config, tiles, dtype): the layer named model.layers.{i}
    norm_type = None    # RMSNorm(hidden, hidden_tile, eps, dtype): model.norm
    block_prefix = "model.layers"
    norm_name = "model.norm"
    cdef readonly Embedding embed_tokens

    cdef Embedding _build_embeddings(self):
        c, t = self.config, self.tiles
        self.embed_tokens = self.add_child("model.embed_tokens", Embedding(
            c.vocab_size, t["vocab"], c.hidden_size, t["embd"], self.dtype,
            gemm=c.tie_word_embeddings))
        return self.embed_tokens

    cdef Tensor _embed(self, dict ws):
        cdef Tensor x = ws["x0"]
        x.clear()
        self.embed_tokens.forward(ws["ids"], x)
        return x

    cdef _embed_backward(self, Tensor dx):
        self.embed_tokens.backward(dx)
