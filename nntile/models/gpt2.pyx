# cython: language_level=3
"""GPT-2 with a language-model head on tiled tensors: transformers' GPT2LMHeadModel without
dropout. The shared skeleton (models/causal_lm.pyx) with GPT-2's config, block (the layers'
``Block``), final layer norm, and embeddings: tokens plus learned positions. Parameters are
named as transformers' ``state_dict`` keys, except inside attention, whose fused c_attn is kept
as q, k, v so that heads can be tiled (GPT2Config.name_map)."""
from nntile._core.core cimport Tensor
from nntile.models.causal_lm cimport CausalLM
from nntile.models.gpt2_config import GPT2Config
from nntile.nn.layers cimport Embedding
from nntile.nn.layers import Block, LayerNorm


cdef class GPT2LMHead(CausalLM):
    """GPT-2 language model over tiles (CausalLM says what the arguments are). ``block_type``
    is the class of the transformer blocks (a subclass may change it)."""
    config_type = GPT2Config
    block_type = Block
    norm_type = LayerNorm
    block_prefix = "transformer.h"
    norm_name = "transformer.ln_f"
    cdef readonly Embedding wte, wpe

    cdef Embedding _build_embeddings(self):
        c, t = self.config, self.tiles
        self.wte = self.add_child("transformer.wte", Embedding(
            c.vocab_size, t["vocab"], c.n_embd, t["embd"], self.dtype,
            gemm=c.tie_word_embeddings))
        self.wpe = self.add_child("transformer.wpe", Embedding(
            c.n_positions, min(t["seq"], c.n_positions), c.n_embd, t["embd"], self.dtype))
        return self.wte

    cdef Tensor _embed(self, dict ws):
        cdef Tensor x = ws["x0"]
        x.clear()
        self.wte.forward(ws["ids"], x)
        self.wpe.forward(ws["positions"], x)
        return x

    cdef _embed_backward(self, Tensor dx):
        self.wte.backward(dx)
        self.wpe.backward(dx)

    @property
    def ln_f(self):
        return self.norm
