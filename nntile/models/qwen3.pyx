# cython: language_level=3
"""Qwen3 with a language-model head on tiled tensors: transformers' Qwen3ForCausalLM. Llama's
model (models/llama.pyx) with Qwen3's config and a block whose attention normalises each head
of q and of k (RMSNorm over head_dim, ``q_norm`` and ``k_norm``) before the rotation."""
from nntile._core.core cimport Tensor
from nntile import ops
from nntile.models.llama import LlamaBlock, LlamaLM
from nntile.models.qwen3_config import Qwen3Config
from nntile.nn.layers cimport Attention, RMSNorm


cdef class HeadRMSNorm(RMSNorm):
    """RMSNorm over the last axis of q or k, [batch, seq, heads, head_dim], head_dim in one
    tile: transformers' Qwen3RMSNorm on each head (one weight of head_dim for all heads).

    Its input and its output's gradient are in the compute dtype (q and k come from GEMMs),
    not in the master dtype as a block's norm: with two dtypes (bf16-mixed) they are widened
    to the master dtype, where the norm computes, and the input's gradient rounded back."""
    cdef int heads, head_tile

    def __init__(self, int heads, int head_tile, int head_dim, double eps, str dtype):
        super().__init__(head_dim, head_dim, eps, dtype)
        self.heads, self.head_tile = heads, head_tile

    def declare(self, tuple lead, tuple tiles):
        """RMSNorm's buffers and scratch with a row per head; with two dtypes, the input
        widened (kept) and backward's gradients in the master dtype."""
        cdef tuple rows = lead + (self.heads,), row_tiles = tiles + (self.head_tile,)
        specs = RMSNorm.declare(self, rows, row_tiles)
        if self.compute != self.master:
            x, x_tiles = rows + (self.n_embd,), row_tiles + (self.embd_tile,)
            specs += [self.buffer_spec("x", x, x_tiles, self.master),
                      self.scratch_spec("head_norm.dy", x, x_tiles, self.master),
                      self.scratch_spec("head_norm.dx", x, x_tiles, self.master)]
        return specs

    cpdef Tensor forward(self, Tensor x):
        if self.compute == self.master:
            return RMSNorm.forward(self, x)
        cdef Tensor wide = self.buffers(x)["x"]
        ops.add(1.0, x, 0.0, wide)
        return RMSNorm.forward(self, wide)

    cpdef backward(self, Tensor dy, Tensor dx, double beta):
        """dx = the gradient of the input (beta must be 0 with two dtypes)."""
        if self.compute == self.master:
            return RMSNorm.backward(self, dy, dx, beta)
        cdef dict scratch = self.scratch()
        cdef Tensor dy_wide = scratch["head_norm.dy"], dx_wide = scratch["head_norm.dx"]
        ops.add(1.0, dy, 0.0, dy_wide)
        RMSNorm.backward(self, dy_wide, dx_wide, 0.0)
        ops.cast(dx_wide, dx)
        return dx


cdef class Qwen3Attention(Attention):
    """Llama's attention with q and k normalised per head between their projections and the
    rotation; backward takes the gradients back through the norms."""
    cdef readonly HeadRMSNorm q_norm, k_norm

    def __init__(self, double eps, *args):
        super().__init__(*args)
        self.q_norm = self.add_child("q_norm", HeadRMSNorm(
            self.n_head, self.head_tile, self.head_dim, eps, self.dtype))
        self.k_norm = self.add_child("k_norm", HeadRMSNorm(
            self.n_kv_head, self.kv_tile, self.head_dim, eps, self.dtype))

    def declare(self, tuple lead, tuple tiles):
        """Attention's scratch and the gradients of the projections' q and k."""
        heads, heads_tiles, kv, kv_tiles = self.head_shapes(lead, tiles)
        return Attention.declare(self, lead, tiles) + [
            self.scratch_spec("qk_norm.dq", heads, heads_tiles),
            self.scratch_spec("qk_norm.dk", kv, kv_tiles)]

    cpdef tuple _shape_qk(self, Tensor q, Tensor k):
        return self.q_norm.forward(q), self.k_norm.forward(k)

    cpdef tuple _shape_qk_backward(self, Tensor dq, Tensor dk):
        cdef dict scratch = self.scratch()
        cdef Tensor dq_in = scratch["qk_norm.dq"], dk_in = scratch["qk_norm.dk"]
        self.q_norm.backward(dq, dq_in, 0.0)
        self.k_norm.backward(dk, dk_in, 0.0)
        return dq_in, dk_in


class Qwen3Block(LlamaBlock):
    """transformers' Qwen3DecoderLayer: Llama's block with Qwen3Attention."""

    def attention(self, config, dict tiles, str dtype, rotary):
        return Qwen3Attention(config.rms_norm_eps,
                              *self.attention_args(config, tiles, dtype, rotary))


class Qwen3LM(LlamaLM):
    """Qwen3 language model over tiles (CausalLM says what the arguments are)."""
    config_type = Qwen3Config
    block_type = Qwen3Block
