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
from nntile.nn.attention cimport CoreAttention
from nntile.nn.layers cimport Embedding, Linear, Module, PreNormBlock, RMSNorm, Rotary


cdef class LlamaAttention(Module):
    """Causal self-attention with rotary positions and grouped-query attention: q_proj, k_proj
    and v_proj, the rotation of q and k (in place: the attention core keeps them turned, and
    backward turns their gradients back), the attention core (fused or not), o_proj.

    Queries are [batch, seq, heads, head_dim], tiled ``tiles['head']`` heads per tile (whole
    groups); keys and values [batch, seq, kv heads, head_dim], tiled by the head tile divided
    by the group, so that a query tile and the key/value tile it reads cover the same groups.
    """
    cdef readonly int n_head, n_kv_head, head_dim, head_tile, kv_tile
    cdef readonly Linear q_proj, k_proj, v_proj, o_proj
    cdef readonly CoreAttention core
    cdef readonly Rotary rotary
    cdef Tensor positions

    def __init__(self, config, dict tiles, str dtype, Rotary rotary):
        super().__init__(dtype)
        cdef int E = config.hidden_size, H = config.num_attention_heads
        cdef int Hkv = config.num_key_value_heads, D = config.head_dim
        cdef int e = tiles["embd"], h = tiles["head"], group = H // Hkv
        cdef bint bias = config.attention_bias
        self.n_head, self.n_kv_head, self.head_dim = H, Hkv, D
        self.head_tile, self.kv_tile = h, h // group
        self.rotary = rotary
        self.q_proj = self.add_child("q_proj", Linear((E,), (e,), (H, D), (h, D), dtype, bias))
        self.k_proj = self.add_child("k_proj", Linear((E,), (e,), (Hkv, D), (self.kv_tile, D),
                                                      dtype, bias))
        self.v_proj = self.add_child("v_proj", Linear((E,), (e,), (Hkv, D), (self.kv_tile, D),
                                                      dtype, bias))
        self.core = self.add_child("core", CoreAttention(H, Hkv, D, h, dtype,
                                                         config.attention == "fused"))
        self.o_proj = self.add_child("o_proj", Linear((H, D), (h, D), (E,), (e,), dtype, bias,
                                                      residual=True))

    def declare(self, tuple lead, tuple tiles):
        """Backward needs the gradients of o and q ([.., heads, head_dim]), and of k and v
        ([.., kv heads, head_dim])."""
        cdef int D = self.head_dim
        cdef tuple heads = lead + (self.n_head, D), heads_tiles = tiles + (self.head_tile, D)
        cdef tuple kv = lead + (self.n_kv_head, D), kv_tiles = tiles + (self.kv_tile, D)
        return [self.scratch_spec("attn.do", heads, heads_tiles),
                self.scratch_spec("attn.dq", heads, heads_tiles),
                self.scratch_spec("attn.dk", kv, kv_tiles),
                self.scratch_spec("attn.dv", kv, kv_tiles)]

    cpdef Tensor forward(self, Tensor x, Tensor positions):
        self.buffers(x)  # none, but backward's scratch follows this input's shape
        cdef Tensor q = self.q_proj.forward(x), k = self.k_proj.forward(x)
        self.rotary.forward(q, positions)
        self.rotary.forward(k, positions)
        self.positions = positions
        return self.o_proj.forward(self.core.forward(q, k, self.v_proj.forward(x)))

    cpdef backward(self, Tensor dy, Tensor dx, double beta):
        """dx (master dtype) = gradient of the input + beta*dx, from dy (master dtype)."""
        cdef dict scratch = self.scratch()
        cdef Tensor do = scratch["attn.do"], dq = scratch["attn.dq"]
        cdef Tensor dk = scratch["attn.dk"], dv = scratch["attn.dv"]
        self.o_proj.backward(dy, do)
        self.core.backward(do, dq, dk, dv)
        self.rotary.backward(dq, self.positions)
        self.rotary.backward(dk, self.positions)
        self.q_proj.backward(dq, dx, beta)
        self.k_proj.backward(dk, dx, 1.0)
        self.v_proj.backward(dv, dx, 1.0)
        return dx


cdef class LlamaMLP(Module):
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

    def declare(self, tuple lead, tuple tiles):
        """Forward keeps h = silu(gate) * up (gate and up are the projections' y); backward
        needs the gradients of h, gate and up."""
        cdef tuple inner = lead + self.up_proj.out_shape
        cdef tuple inner_tiles = tiles + self.up_proj.out_tiles
        return [self.buffer_spec("h", inner, inner_tiles),
                self.scratch_spec("mlp.dh", inner, inner_tiles),
                self.scratch_spec("mlp.dgate", inner, inner_tiles),
                self.scratch_spec("mlp.dup", inner, inner_tiles)]

    cpdef Tensor forward(self, Tensor x):
        cdef Tensor h = self.buffers(x)["h"]
        self.gate, self.up = self.gate_proj.forward(x), self.up_proj.forward(x)
        ops.swiglu_forward(self.gate, self.up, h)
        return self.down_proj.forward(h)

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
    cdef readonly LlamaAttention self_attn
    cdef readonly LlamaMLP mlp

    def __init__(self, config, dict tiles, str dtype, Rotary rotary=None):
        super().__init__(dtype)
        cdef int E = config.hidden_size, e = tiles["embd"]
        eps = config.rms_norm_eps
        if rotary is None:
            rotary = self.add_child("rotary_emb", rotary_of(config, dtype))
        self.input_layernorm = self.add_child("input_layernorm", RMSNorm(E, e, eps, dtype))
        self.self_attn = self.add_child("self_attn", LlamaAttention(config, tiles, dtype,
                                                                    rotary))
        self.post_attention_layernorm = self.add_child("post_attention_layernorm",
                                                       RMSNorm(E, e, eps, dtype))
        self.mlp = self.add_child("mlp", LlamaMLP(config, tiles, dtype))
        self._branches(E, e, self.input_layernorm, self.self_attn,
                       self.post_attention_layernorm, self.mlp)


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

    cdef _embed_backward(self, Tensor dx):
        self.embed_tokens.backward(dx)
