# cython: language_level=3
"""Llama with a language-model head on tiled tensors: transformers' LlamaForCausalLM. The shared
skeleton (models/causal_lm.pyx) with Llama's config, its token embedding (positions are rotary,
inside attention), its block and its final RMSNorm. Parameters are named as transformers'
``state_dict`` keys; the linear layers' weights are [in, out] with heads kept apart
(LlamaConfig.name_map).

The rotary frequencies are one constant of the model (``model.rotary_emb``, as in
transformers' LlamaModel), which every block's attention reads.
"""
from nntile._core.core cimport Tensor
from nntile import ops
from nntile.models.causal_lm cimport CausalLM
from nntile.models.llama_config import LlamaConfig
from nntile.nn.layers cimport (Attention, Embedding, Linear, MLP, Module, PreNormBlock, RMSNorm,
                               Rotary)


cdef class LlamaMLP(MLP):
    """down_proj(silu(gate_proj(x)) * up_proj(x)): transformers' LlamaMLP."""
    cdef readonly Linear gate_proj, up_proj, down_proj
    cdef Tensor gate, up

    def __init__(self, config, dict tiles, str dtype):
        super().__init__(dtype)
        cdef int E = config.hidden_size, I = config.intermediate_size
        cdef int e = tiles["embd"], i = tiles["inner"]
        cdef bint bias = config.mlp_bias
        self.gate_proj = self.add_child("gate_proj", Linear((E,), (e,), (I,), (i,), dtype, bias))
        self.up_proj = self.add_child("up_proj", Linear((E,), (e,), (I,), (i,), dtype, bias))
        self.down_proj = self.add_child("down_proj", Linear((I,), (i,), (E,), (e,), dtype, bias,
                                                            residual=True))
        self._out = self.down_proj

    def declare(self, tuple lead, tuple tiles):
        """Forward keeps h = silu(gate) * up (gate and up are the projections' y); backward
        needs the gradients of h, gate and up."""
        cdef tuple inner = lead + self.up_proj.out_shape
        cdef tuple inner_tiles = tiles + self.up_proj.out_tiles
        return [self.buffer_spec("h", inner, inner_tiles),
                self.scratch_spec("mlp.dh", inner, inner_tiles),
                self.scratch_spec("mlp.dgate", inner, inner_tiles),
                self.scratch_spec("mlp.dup", inner, inner_tiles)]

    cdef Tensor _hidden(self, Tensor x):
        """h = silu(gate_proj(x)) * up_proj(x), down_proj's input."""
        cdef Tensor h = self.buffers(x)["h"]
        self.gate, self.up = self.gate_proj.forward(x), self.up_proj.forward(x)
        ops.swiglu_forward(self.gate, self.up, h)
        return h

    cpdef backward(self, Tensor dy, Tensor dx, double beta):
        cdef dict scratch = self.scratch()
        cdef Tensor dh = scratch["mlp.dh"], dgate = scratch["mlp.dgate"], dup = scratch["mlp.dup"]
        self.down_proj.backward(dy, dh)
        ops.swiglu_backward(self.gate, self.up, dh, dgate, dup)
        self.gate_proj.backward(dgate, dx, beta)
        return self.up_proj.backward(dup, dx, 1.0)


cdef class LlamaBlock(PreNormBlock):
    """x + self_attn(input_layernorm(x)), then + mlp(post_attention_layernorm(.)):
    transformers' LlamaDecoderLayer. ``rotary``: the model's rotary frequencies (Rotary); a
    block built alone makes its own."""
    cdef readonly RMSNorm input_layernorm, post_attention_layernorm
    cdef readonly Attention self_attn
    cdef readonly LlamaMLP mlp

    def __init__(self, config, dict tiles, str dtype, Rotary rotary=None):
        super().__init__(dtype)
        cdef int E = config.hidden_size, e = tiles["embd"]
        eps = config.rms_norm_eps
        if rotary is None:
            rotary = self.add_child("rotary_emb", rotary_of(config, dtype))
        self.input_layernorm = self.add_child("input_layernorm", RMSNorm(E, e, eps, dtype))
        self.self_attn = self.add_child("self_attn", self.attention(config, tiles, dtype, rotary))
        self.post_attention_layernorm = self.add_child("post_attention_layernorm",
                                                       RMSNorm(E, e, eps, dtype))
        self.mlp = self.add_child("mlp", LlamaMLP(config, tiles, dtype))
        self._branches(E, e, self.input_layernorm, self.self_attn,
                       self.post_attention_layernorm, self.mlp)

    def attention(self, config, dict tiles, str dtype, Rotary rotary):
        """The block's self_attn (a family whose attention differs overrides this)."""
        return Attention(*self.attention_args(config, tiles, dtype, rotary))

    def attention_args(self, config, dict tiles, str dtype, Rotary rotary):
        """The arguments of Attention for this config: Llama's names, the config's biases."""
        return (config.hidden_size, config.num_attention_heads, config.num_key_value_heads,
                config.head_dim, tiles, dtype, config.attention == "fused", config.qkv_bias,
                config.o_bias, ("q_proj", "k_proj", "v_proj", "o_proj"), rotary,
                config.attention_mask())


def rotary_of(config, str dtype):
    """The rotary frequencies of a Llama config (Rotary)."""
    return Rotary(config.head_dim, config.rope_theta, config.rope_scaling, dtype)


cdef class LlamaLM(CausalLM):
    """Llama language model over tiles (CausalLM says what the arguments are)."""
    config_type = LlamaConfig
    block_type = LlamaBlock
    norm_type = RMSNorm
    block_prefix = "model.layers"
    norm_name = "model.norm"
    cdef readonly Embedding embed_tokens
    cdef readonly Rotary rotary_emb

    cdef Embedding _build_embeddings(self):
        c, t = self.config, self.tiles
        self.embed_tokens = self.add_child("model.embed_tokens", Embedding(
            c.vocab_size, t["vocab"], c.hidden_size, t["embd"], self.dtype,
            gemm=c.tie_word_embeddings))
        self.rotary_emb = self.add_child("model.rotary_emb", rotary_of(c, self.dtype))
        return self.embed_tokens

    cdef Module _build_block(self):
        return self.block_type(self.config, self.tiles, self.dtype, self.rotary_emb)

    cdef Tensor _embed(self, dict ws):
        cdef Tensor x = ws["x0"]
        x.clear()
        self.embed_tokens.forward(ws["ids"], x)
        return x

    cdef _embed_backward(self, Tensor dx, Tensor table_into=None):
        self.embed_tokens.backward(dx, table_into)
