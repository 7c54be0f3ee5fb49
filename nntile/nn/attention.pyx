# cython: language_level=3
"""The core of self-attention, o = softmax(scale q k^T, the keys its mask hides from a query
masked) v per head (``mask``, an AttentionMask: causal by default; a model's config may give
another), as a module with no parameters: the layers of a model family (GPT-2's Attention,
Llama's) project q, k and v and hand them to it.

Queries are [batch, seq, n_head, head_dim], keys and values [batch, seq, n_kv_head, head_dim]:
grouped-query attention when n_kv_head < n_head, each kv head serving a group of n_head /
n_kv_head query heads (query head h reads kv head h // group). Heads are tiled ``head_tile``
per tile, a whole number of groups; the kv heads are tiled ``head_tile // group``.

``fused`` (the default) runs flash attention (ops.flash_attention): forward keeps only o and
each row's log-sum-exp, and backward recomputes the probabilities, so nothing [seq, seq] is
registered. Unfused, the scores become tensors [batch, n_head, seq, seq] (probabilities kept
for backward, their gradient in backward's scratch), with the kv heads copied per query head
first under grouped-query attention: the reference the fused path is tested against.
"""
import math

from nntile._core.core cimport Tensor
from nntile._core.core import AttentionMask
from nntile import ops
from nntile.nn.module cimport Module


cdef class CoreAttention(Module):
    """Attention of q, k, v under ``mask`` (see the module's docstring; ``mask.at(offset)``
    is the mask of queries after ``offset`` keys, as a key/value cache runs them); ``scale``
    defaults to 1 / sqrt(head_dim). The log-sum-exp of the fused path is in fp32 for bf16
    data and in the data's dtype otherwise; the softmax statistics of the unfused path in the
    master dtype."""

    def __init__(self, int n_head, int n_kv_head, int head_dim, int head_tile, str dtype,
                 bint fused=True, scale=None, mask=AttentionMask()):
        super().__init__(dtype)
        if n_head < 1 or n_kv_head < 1 or head_dim < 1 or n_head % n_kv_head:
            raise ValueError(f"CoreAttention: {n_head} query heads cannot share {n_kv_head} kv "
                             f"heads of dim {head_dim} in groups of equal size")
        self.group = n_head // n_kv_head
        if not 1 <= head_tile <= n_head or head_tile % self.group:
            raise ValueError(f"CoreAttention: a head tile of {head_tile} must be between 1 and "
                             f"{n_head} and hold whole groups of {self.group} query heads")
        self.n_head, self.n_kv_head, self.head_dim = n_head, n_kv_head, head_dim
        self.head_tile = head_tile
        self.fused = fused
        if not isinstance(mask, AttentionMask):
            raise TypeError(f"CoreAttention: mask must be an AttentionMask, got {mask!r}")
        self.mask = mask
        self.scale = 1.0 / math.sqrt(head_dim) if scale is None else scale
        self.lse_dtype = "fp32" if self.compute == "bf16" else self.compute

    def declare(self, tuple lead, tuple tiles):
        """Fused: forward keeps o and the log-sum-exp of each row. Unfused: forward keeps the
        probabilities p, their softmax statistics and o, and under grouped-query attention
        the kv heads copied per query head; backward needs the gradient of p, the row sums of
        p * dp and, under grouped-query attention, the per-query-head gradients of k and v."""
        cdef int B = lead[0], T = lead[1], bt = tiles[0], tt = tiles[1]
        cdef int H = self.n_head, D = self.head_dim, h = self.head_tile
        cdef tuple heads = lead + (H, D), heads_tiles = tiles + (h, D)
        specs = [self.buffer_spec("o", heads, heads_tiles)]
        if self.fused:
            return specs + [self.buffer_spec("lse", lead + (H,), tiles + (h,), self.lse_dtype)]
        cdef tuple scores = (B, H, T, T), scores_tiles = (bt, h, tt, tt)
        specs += [self.buffer_spec("p", scores, scores_tiles),
                  self.buffer_spec("stats", scores[:3] + (2,), scores_tiles[:3] + (2,),
                                   self.master),
                  self.scratch_spec("core.dp", scores, scores_tiles),
                  self.scratch_spec("core.sums", scores[:3], scores_tiles[:3], self.master)]
        if self.group > 1:
            specs += [self.buffer_spec("k", heads, heads_tiles),
                      self.buffer_spec("v", heads, heads_tiles),
                      self.scratch_spec("core.dk", heads, heads_tiles),
                      self.scratch_spec("core.dv", heads, heads_tiles)]
        return specs

    cpdef Tensor forward(self, Tensor q, Tensor k, Tensor v):
        """o [batch, seq, n_head, head_dim] (kept until backward). With a ``kv_cache``
        attached (generation), k and v join the cache and q attends to every key cached."""
        if self.kv_cache is not None:
            return self.kv_cache.attend(self, q, k, v)
        cdef dict buffers = self.buffers(q)
        mask = self.mask
        cdef Tensor o = buffers["o"]
        if self.fused:
            self.lse = buffers["lse"]
            ops.flash_attention(q, k, v, o, self.lse, self.scale, mask)
        else:
            if self.group > 1:
                ops.repeat_kv(k, buffers["k"])
                ops.repeat_kv(v, buffers["v"])
                k, v = buffers["k"], buffers["v"]
            self.p = buffers["p"]
            ops.attn_qk(self.scale, q, k, self.p, mask)
            ops.mask_scores(self.p, mask)
            ops.maxsumexp(self.p, buffers["stats"], 3)
            ops.softmax_inplace(buffers["stats"], self.p, 3)
            ops.attn_pv(1.0, self.p, v, o, mask)
        self.q, self.k, self.v, self.o = q, k, v, o
        return o

    cpdef backward(self, Tensor do, Tensor dq, Tensor dk, Tensor dv):
        """dq, dk, dv (overwritten) from do, the gradient of forward's o."""
        mask = self.mask
        if self.fused:
            ops.flash_attention_backward(self.q, self.k, self.v, self.o, do, self.lse, dq, dk,
                                         dv, self.scale, mask)
            return
        cdef dict scratch = self.scratch()
        cdef Tensor p = self.p, dp = scratch["core.dp"], sums = scratch["core.sums"]
        cdef Tensor dk_heads = dk, dv_heads = dv
        if self.group > 1:
            dk_heads, dv_heads = scratch["core.dk"], scratch["core.dv"]
        # tiles above the diagonal hold zero probabilities: their gradient is never needed
        ops.attn_qk(1.0, do, self.v, dp, mask, masked_value=0.0)
        ops.attn_ptv(1.0, p, do, dv_heads, mask)
        ops.sumprod_slice(1.0, p, dp, 0.0, sums, 3)
        ops.softmax_backward(self.scale, p, sums, dp, 3)
        ops.attn_pv(1.0, dp, self.k, dq, mask)
        ops.attn_ptv(1.0, dp, self.q, dk_heads, mask)
        if self.group > 1:
            ops.sum_kv(dk_heads, dk)
            ops.sum_kv(dv_heads, dv)
