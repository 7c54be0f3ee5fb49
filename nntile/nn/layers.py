"""GPT-2 building blocks over tiled tensors.

Every layer keeps what its backward pass needs from the forward pass, and allocates its
activation tensors once per input shape, so repeated steps register no new StarPU data.
Parameter gradients accumulate (``+=``) until ``zero_grad``; activations are [batch, seq, ...].
"""
import math

import numpy as np

from nntile import Tensor, ops


class Parameter:
    """A trainable tensor and its gradient (same shape and tiling)."""

    def __init__(self, shape, basetile, dtype):
        self.value = Tensor(shape, basetile, dtype)
        self.grad = Tensor(shape, basetile, dtype)
        self.value.clear()
        self.grad.clear()  # gradients accumulate, so they start at zero

    def unregister(self):
        self.value.unregister()
        self.grad.unregister()


class Module:
    """Holds named parameters and sub-modules; names follow transformers' GPT-2 where they can."""

    def __init__(self):
        self._params = {}
        self._children = {}
        self._buffers = {}

    def add_param(self, name, shape, basetile, dtype):
        param = Parameter(shape, basetile, dtype)
        self._params[name] = param
        return param

    def add_child(self, name, module):
        self._children[name] = module
        return module

    def named_parameters(self, prefix=""):
        for name, param in self._params.items():
            yield prefix + name, param
        for name, child in self._children.items():
            yield from child.named_parameters(f"{prefix}{name}.")

    def zero_grad(self):
        for _, param in self.named_parameters():
            param.grad.clear()

    def buffer(self, key, shape, basetile, dtype):
        """An activation tensor reused across calls with the same key and shape."""
        tensor = self._buffers.get(key)
        if tensor is None or tensor.shape != tuple(shape) or tensor.basetile != tuple(basetile):
            if tensor is not None:
                tensor.unregister()
            tensor = Tensor(shape, basetile, dtype)
            self._buffers[key] = tensor
        return tensor

    def unregister(self):
        for tensor in self._buffers.values():
            tensor.unregister()
        self._buffers.clear()
        for param in self._params.values():
            param.unregister()
        for child in self._children.values():
            child.unregister()


class Linear(Module):
    """y = x @ weight + bias over the last ``in_ndim`` dims of x (transformers' Conv1D layout:
    weight is [in..., out...])."""

    def __init__(self, in_shape, in_tiles, out_shape, out_tiles, dtype, bias=True):
        super().__init__()
        self.in_ndim = len(in_shape)
        self.out_shape = tuple(out_shape)
        self.out_tiles = tuple(out_tiles)
        self.dtype = dtype
        self.weight = self.add_param("weight", tuple(in_shape) + self.out_shape,
                                     tuple(in_tiles) + self.out_tiles, dtype)
        self.bias = self.add_param("bias", self.out_shape, self.out_tiles, dtype) if bias else None

    def forward(self, x, y=None):
        lead = x.shape[:x.ndim - self.in_ndim]
        lead_tiles = x.basetile[:x.ndim - self.in_ndim]
        if y is None:
            y = self.buffer("y", lead + self.out_shape, lead_tiles + self.out_tiles, self.dtype)
        ops.gemm(1.0, x, "N", self.weight.value, "N", 0.0, y, ndim=self.in_ndim)
        if self.bias is not None:
            ops.add_bias(1.0, self.bias.value, 1.0, y)
        self.x = x
        return y

    def backward(self, dy, dx=None, beta=0.0):
        """Accumulate parameter gradients; dx = dy @ weight^T + beta*dx (dx may be None)."""
        lead_ndim = dy.ndim - len(self.out_shape)
        ops.gemm(1.0, self.x, "T", dy, "N", 1.0, self.weight.grad, ndim=lead_ndim)
        if self.bias is not None:
            ops.sum_bias(1.0, dy, 1.0, self.bias.grad)
        if dx is not None:
            ops.gemm(1.0, dy, "N", self.weight.value, "T", beta, dx, ndim=len(self.out_shape))
        return dx


class LayerNorm(Module):
    def __init__(self, n_embd, embd_tile, eps, dtype):
        super().__init__()
        self.eps = eps
        self.dtype = dtype
        self.weight = self.add_param("weight", (n_embd,), (embd_tile,), dtype)
        self.bias = self.add_param("bias", (n_embd,), (embd_tile,), dtype)

    def forward(self, x):
        stats_shape = x.shape[:-1] + (2,)
        stats_tiles = x.basetile[:-1] + (2,)
        self.stats = self.buffer("stats", stats_shape, stats_tiles, self.dtype)
        y = self.buffer("y", x.shape, x.basetile, self.dtype)
        ops.layernorm_forward(x, self.weight.value, self.bias.value, self.eps, self.stats, y)
        self.x = x
        return y

    def backward(self, dy, dx, beta):
        """dx = layer-norm backward of dy + beta*dx; accumulates weight and bias gradients."""
        rowacc = self.buffer("rowacc", self.stats.shape, self.stats.basetile, self.dtype)
        ops.layernorm_backward(self.x, dy, self.stats, self.weight.value, self.eps, rowacc,
                               self.weight.grad, self.bias.grad, beta, dx)
        return dx


class Embedding(Module):
    """Rows of a [num, n_embd] table picked by integer ids; the result is accumulated into
    the destination, so token and position embeddings sum into one tensor."""

    def __init__(self, num, num_tile, n_embd, embd_tile, dtype):
        super().__init__()
        self.weight = self.add_param("weight", (num, n_embd), (num_tile, embd_tile), dtype)

    def forward(self, ids, dst):
        ops.embedding(ids, self.weight.value, dst)
        self.ids = ids

    def backward(self, dy):
        ops.embedding_backward(self.ids, dy, self.weight.grad)


class Attention(Module):
    """Causal multi-head self-attention, heads tiled ``head_tile`` per tile.

    Queries, keys and values are [batch, seq, heads, head_dim]; scores [batch, heads, seq, seq].
    The fused c_attn of transformers is kept as three projections (q, k, v) so that heads can
    be tiled; conversion splits and joins the weight.
    """

    def __init__(self, n_embd, n_head, tiles, dtype):
        super().__init__()
        self.n_head = n_head
        self.head_dim = n_embd // n_head
        self.dtype = dtype
        e, h, d = tiles["embd"], tiles["head"], self.head_dim
        heads = (n_head, self.head_dim)
        self.q = self.add_child("q", Linear((n_embd,), (e,), heads, (h, d), dtype))
        self.k = self.add_child("k", Linear((n_embd,), (e,), heads, (h, d), dtype))
        self.v = self.add_child("v", Linear((n_embd,), (e,), heads, (h, d), dtype))
        self.c_proj = self.add_child("c_proj", Linear(heads, (h, d), (n_embd,), (e,), dtype))

    def forward(self, x):
        B, T = x.shape[:2]
        bt, tt = x.basetile[:2]
        q = self.q.forward(x)
        k = self.k.forward(x)
        v = self.v.forward(x)
        scores_shape = (B, self.n_head, T, T)
        scores_tiles = (bt, q.basetile[2], tt, tt)
        p = self.buffer("p", scores_shape, scores_tiles, self.dtype)
        stats = self.buffer("stats", scores_shape[:3] + (2,), scores_tiles[:3] + (2,), self.dtype)
        ops.attn_qk(1.0 / math.sqrt(self.head_dim), q, k, p)
        ops.mask_causal(p)
        ops.maxsumexp(p, stats, 3)
        ops.softmax_inplace(stats, p, 3)
        o = self.buffer("o", q.shape, q.basetile, self.dtype)
        ops.attn_pv(1.0, p, v, o)
        self.q_out, self.k_out, self.v_out, self.p, self.o = q, k, v, p, o
        return self.c_proj.forward(o)

    def backward(self, dy, dx, beta):
        q, k, v, p, o = self.q_out, self.k_out, self.v_out, self.p, self.o
        do = self.buffer("do", o.shape, o.basetile, self.dtype)
        self.c_proj.backward(dy, do)
        dp = self.buffer("dp", p.shape, p.basetile, self.dtype)
        dv = self.buffer("dv", v.shape, v.basetile, self.dtype)
        ops.attn_qk(1.0, do, v, dp, masked_value=0.0)
        ops.attn_ptv(1.0, p, do, dv)
        sums = self.buffer("sums", p.shape[:3], p.basetile[:3], self.dtype)
        ops.sumprod_slice(1.0, p, dp, 0.0, sums, 3)
        ops.softmax_backward(1.0 / math.sqrt(self.head_dim), p, sums, dp, 3)
        dq = self.buffer("dq", q.shape, q.basetile, self.dtype)
        dk = self.buffer("dk", k.shape, k.basetile, self.dtype)
        ops.attn_pv(1.0, dp, k, dq)
        ops.attn_ptv(1.0, dp, q, dk)
        self.q.backward(dq, dx, beta)
        self.k.backward(dk, dx, 1.0)
        self.v.backward(dv, dx, 1.0)
        return dx


class MLP(Module):
    def __init__(self, n_embd, n_inner, tiles, dtype):
        super().__init__()
        self.dtype = dtype
        self.c_fc = self.add_child("c_fc", Linear((n_embd,), (tiles["embd"],), (n_inner,),
                                                  (tiles["inner"],), dtype))
        self.c_proj = self.add_child("c_proj", Linear((n_inner,), (tiles["inner"],), (n_embd,),
                                                      (tiles["embd"],), dtype))

    def forward(self, x):
        a = self.c_fc.forward(x)
        g = self.buffer("g", a.shape, a.basetile, self.dtype)
        ops.gelutanh(a, g)
        self.a = a
        return self.c_proj.forward(g)

    def backward(self, dy, dx, beta):
        dg = self.buffer("dg", self.a.shape, self.a.basetile, self.dtype)
        self.c_proj.backward(dy, dg)
        da = self.buffer("da", self.a.shape, self.a.basetile, self.dtype)
        ops.gelutanh_backward(self.a, dg, 0.0, da)
        return self.c_fc.backward(da, dx, beta)


class Block(Module):
    """x + attn(ln_1(x)), then + mlp(ln_2(.)) — transformers' GPT2Block without dropout."""

    def __init__(self, config, tiles, dtype):
        super().__init__()
        self.dtype = dtype
        E = config.n_embd
        self.ln_1 = self.add_child("ln_1", LayerNorm(E, tiles["embd"], config.layer_norm_epsilon, dtype))
        self.attn = self.add_child("attn", Attention(E, config.n_head, tiles, dtype))
        self.ln_2 = self.add_child("ln_2", LayerNorm(E, tiles["embd"], config.layer_norm_epsilon, dtype))
        self.mlp = self.add_child("mlp", MLP(E, config.inner, tiles, dtype))

    def forward(self, x):
        h = self.attn.forward(self.ln_1.forward(x))
        x1 = self.buffer("x1", x.shape, x.basetile, self.dtype)
        ops.copy(x, x1)
        ops.add(1.0, h, 1.0, x1)
        m = self.mlp.forward(self.ln_2.forward(x1))
        out = self.buffer("out", x.shape, x.basetile, self.dtype)
        ops.copy(x1, out)
        ops.add(1.0, m, 1.0, out)
        return out

    def backward(self, dy, dx):
        """dx = gradient with respect to the block's input (dy is not modified)."""
        dx1 = self.buffer("dx1", dy.shape, dy.basetile, self.dtype)
        dh = self.buffer("dh", dy.shape, dy.basetile, self.dtype)
        ops.copy(dy, dx1)
        self.mlp.backward(dy, dh, 0.0)
        self.ln_2.backward(dh, dx1, 1.0)
        self.attn.backward(dx1, dh, 0.0)
        ops.copy(dx1, dx)
        self.ln_1.backward(dh, dx, 1.0)
        return dx
