# cython: language_level=3
"""GPT-2 with a language-model head on tiled tensors: transformers' GPT2LMHeadModel without
dropout. The shared skeleton (models/causal_lm.pyx) with GPT-2's config, its block
(``GPT2Block``: layer norms, attention, the GELU ``GPT2MLP``), its final layer norm, and
embeddings: tokens plus learned positions. Parameters are named as transformers'
``state_dict`` keys, except inside attention, whose fused c_attn is kept as q, k, v so that
heads can be tiled (GPT2Config.name_map)."""
from nntile._core.core cimport Tensor
from nntile import ops
from nntile.models.causal_lm cimport CausalLM
from nntile.models.gpt2_config import GPT2Config
from nntile.nn.layers cimport Attention, Embedding, LayerNorm, Linear, MLP, PreNormBlock


cdef class GPT2MLP(MLP):
    """c_proj(gelu_tanh(c_fc(x))): transformers' GPT2MLP without dropout."""
    cdef readonly Linear c_fc, c_proj
    cdef Tensor a

    def __init__(self, int n_embd, int n_inner, dict tiles, str dtype):
        super().__init__(dtype)
        self.c_fc = self.add_child("c_fc", Linear((n_embd,), (tiles["embd"],), (n_inner,),
                                                  (tiles["inner"],), dtype))
        self.c_proj = self.add_child("c_proj", Linear((n_inner,), (tiles["inner"],), (n_embd,),
                                                      (tiles["embd"],), dtype, residual=True))
        self._out = self.c_proj

    def declare(self, tuple lead, tuple tiles):
        """Forward keeps g = gelu(a), a being c_fc's y; backward needs the gradients of g
        and a."""
        cdef tuple inner = lead + self.c_fc.out_shape, inner_tiles = tiles + self.c_fc.out_tiles
        return [self.buffer_spec("g", inner, inner_tiles),
                self.scratch_spec("mlp.dg", inner, inner_tiles),
                self.scratch_spec("mlp.da", inner, inner_tiles)]

    cdef Tensor _hidden(self, Tensor x):
        """g = gelu(c_fc(x)), c_proj's input."""
        cdef Tensor g = self.buffers(x)["g"]
        cdef Tensor a = self.c_fc.forward(x)
        ops.gelutanh(a, g)
        self.a = a
        return g

    cpdef backward(self, Tensor dy, Tensor dx, double beta):
        cdef dict scratch = self.scratch()
        cdef Tensor dg = scratch["mlp.dg"], da = scratch["mlp.da"]
        self.c_proj.backward(dy, dg)
        ops.gelutanh_backward(self.a, dg, 0.0, da)
        return self.c_fc.backward(da, dx, beta)


cdef class GPT2Block(PreNormBlock):
    """x + attn(ln_1(x)), then + mlp(ln_2(.)): transformers' GPT2Block without dropout."""
    cdef readonly LayerNorm ln_1, ln_2
    cdef readonly Attention attn
    cdef readonly GPT2MLP mlp

    def __init__(self, config, dict tiles, str dtype):
        super().__init__(dtype)
        cdef int E = config.n_embd
        eps = config.layer_norm_epsilon
        self.ln_1 = self.add_child("ln_1", LayerNorm(E, tiles["embd"], eps, dtype))
        self.attn = self.add_child("attn", Attention(E, config.n_head, config.n_head,
                                                     config.head_dim, tiles, dtype,
                                                     config.attention == "fused"))
        self.ln_2 = self.add_child("ln_2", LayerNorm(E, tiles["embd"], eps, dtype))
        self.mlp = self.add_child("mlp", GPT2MLP(E, config.inner, tiles, dtype))
        self._branches(E, tiles["embd"], self.ln_1, self.attn, self.ln_2, self.mlp)


cdef class GPT2LMHead(CausalLM):
    """GPT-2 language model over tiles (CausalLM says what the arguments are). ``block_type``
    is the class of the transformer blocks (a subclass may change it)."""
    config_type = GPT2Config
    block_type = GPT2Block
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

    cdef _embed_backward(self, Tensor dx, Tensor table_into=None):
        self.wte.backward(dx, table_into)
        self.wpe.backward(dx)

    @property
    def ln_f(self):
        return self.norm
