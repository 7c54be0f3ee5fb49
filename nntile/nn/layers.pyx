# cython: language_level=3
"""GPT-2 building blocks over tiled tensors, as typed Cython classes.

Every layer keeps what its backward pass needs from the forward pass, and allocates its
activation tensors once per input shape, so repeated steps register no new StarPU data.
Parameter gradients accumulate (``+=``) until ``zero_grad``; activations are [batch, seq, ...].

A module's ``dtype`` is a precision (nntile.precision): its ``master`` dtype holds parameters,
gradients, the residual stream and statistics, its ``compute`` dtype the GEMM operands and the
activations between GEMMs. Under bf16-mixed the ops that join the two (a bf16 branch added
to the fp32 stream, a layer norm writing bf16, GEMMs accumulating into fp32 gradients) run
kernels with bf16 data and fp32 accumulators.
"""
import math

from nntile._core.core cimport Tensor
from nntile import ops
from nntile.precision import precision_dtypes


cdef class Parameter:
    """A trainable tensor and its gradient (same shape and tiling), both starting at zero.

    ``value`` and ``grad`` are in the master dtype. A GEMM operand whose compute dtype differs
    (bf16-mixed) also has ``copy``, the value in the compute dtype, which the GEMMs read;
    ``compute`` is the tensor GEMMs read: ``copy``, or ``value`` itself.
    """

    def __init__(self, tuple shape, tuple basetile, str master, str compute, bint gemm=False):
        self.value = Tensor(shape, basetile, master)
        self.grad = Tensor(shape, basetile, master, owners=self.value.owners)
        self.copy = (Tensor(shape, basetile, compute, owners=self.value.owners)
                     if gemm and compute != master else None)
        self.compute = self.value if self.copy is None else self.copy

    def refresh(self):
        """Bring the compute copy up to date with the value (one task per tile); to be
        called after writing the value directly (optimizers refresh it themselves)."""
        if self.copy is not None:
            ops.cast(self.value, self.copy)

    def write(self, array):
        """Write the value from a numpy array, and refresh the compute copy."""
        self.value.write(array)
        self.refresh()

    def unregister(self):
        self.value.unregister()
        self.grad.unregister()
        if self.copy is not None:
            self.copy.unregister()


cdef class Module:
    """Named parameters and sub-modules; names follow transformers' GPT-2 where they can."""

    def __init__(self, str dtype):
        try:
            self.master, self.compute = precision_dtypes(dtype)
        except ValueError as exc:
            raise ValueError(f"layers: {exc}") from None
        self.dtype = dtype
        self._params = {}
        self._children = {}
        self._buffers = {}
        self._scratch = {}

    cpdef Parameter add_param(self, str name, tuple shape, tuple basetile, bint gemm=False):
        """A new parameter; ``gemm``: GEMMs read it (it gets a copy in the compute dtype
        where that differs from the master dtype)."""
        cdef Parameter param = Parameter(shape, basetile, self.master, self.compute, gemm)
        self._params[name] = param
        return param

    cpdef Module add_child(self, str name, Module module):
        self._children[name] = module
        module._use_scratch(self._scratch)
        return module

    cdef _use_scratch(self, dict pool):
        """Share one pool of backward temporaries across the whole model."""
        pool.update(self._scratch)
        self._scratch = pool
        for child in self._children.values():
            (<Module> child)._use_scratch(pool)

    def named_parameters(self, prefix=""):
        for name, param in self._params.items():
            yield prefix + name, param
        for name, child in self._children.items():
            yield from (<Module> child).named_parameters(f"{prefix}{name}.")

    def zero_grad(self):
        for _, param in self.named_parameters():
            (<Parameter> param).grad.clear()

    def refresh_copies(self):
        """Refresh every parameter's compute copy (after writing values directly)."""
        for _, param in self.named_parameters():
            (<Parameter> param).refresh()

    cdef Tensor _pooled(self, dict pool, tuple full_key, tuple shape, tuple basetile,
                        str dtype):
        """The activation tensor of ``pool`` under ``full_key``, created on first use."""
        cdef Tensor tensor = pool.get(full_key)
        if tensor is None:
            tensor = Tensor(shape, basetile, dtype, owners="batch")
            pool[full_key] = tensor
        return tensor

    cpdef Tensor buffer(self, str key, tuple shape, tuple basetile, str dtype=None):
        """An activation tensor (in the compute dtype unless told), one per (key, shape,
        tiling), reused across calls."""
        dtype = dtype or self.compute
        return self._pooled(self._buffers, (key, shape, basetile), shape, basetile, dtype)

    cpdef Tensor scratch(self, str key, tuple shape, tuple basetile, str dtype=None):
        """A temporary of backward (in the compute dtype unless told), shared by every module
        of the model under the same key, shape, tiling and dtype: layers run backward one
        after another, so layer i-1 may reuse layer i's buffers (StarPU orders the reuse
        after the last read). Saves one set of backward buffers per layer but one."""
        dtype = dtype or self.compute
        return self._pooled(self._scratch, (key, shape, basetile, dtype), shape, basetile,
                            dtype)

    def unregister(self):
        for tensor in self._buffers.values():
            (<Tensor> tensor).unregister()
        self._buffers.clear()
        for tensor in self._scratch.values():
            (<Tensor> tensor).unregister()
        self._scratch.clear()
        for param in self._params.values():
            (<Parameter> param).unregister()
        for child in self._children.values():
            (<Module> child).unregister()


cdef class Linear(Module):
    """y = x @ weight + bias over the last ``len(in_shape)`` dims of x (transformers' Conv1D
    layout: weight is [in..., out...])."""

    def __init__(self, tuple in_shape, tuple in_tiles, tuple out_shape, tuple out_tiles,
                 str dtype, bint bias=True):
        super().__init__(dtype)
        self.in_ndim = len(in_shape)
        self.out_shape = out_shape
        self.out_tiles = out_tiles
        self.weight = self.add_param("weight", in_shape + out_shape, in_tiles + out_tiles,
                                     gemm=True)
        self.bias = self.add_param("bias", out_shape, out_tiles) if bias else None

    cpdef Tensor forward(self, Tensor x):
        """y (compute dtype) = x @ weight + bias; x is in the compute dtype."""
        cdef tuple lead = x.shape[:x.ndim - self.in_ndim]
        cdef tuple lead_tiles = x.basetile[:x.ndim - self.in_ndim]
        cdef Tensor y = self.buffer("y", lead + self.out_shape, lead_tiles + self.out_tiles)
        ops.gemm(1.0, x, "N", self.weight.compute, "N", 0.0, y, ndim=self.in_ndim)
        if self.bias is not None:
            ops.add_bias(1.0, self.bias.value, 1.0, y)
        self.x = x
        return y

    cdef Tensor _in_compute(self, Tensor dy):
        """dy itself, or a copy in the compute dtype (the GEMMs need both operands in it)."""
        if dy.dtype == self.compute:
            return dy
        cdef Tensor cast = self.scratch("dy", dy.shape, dy.basetile)
        ops.cast(dy, cast)
        return cast

    cpdef backward(self, Tensor dy, Tensor dx=None, double beta=0.0):
        """Accumulate parameter gradients; dx = dy @ weight^T + beta*dx (when dx is given).
        dy and dx may be in either dtype of the precision."""
        dy = self._in_compute(dy)
        cdef int lead_ndim = dy.ndim - len(self.out_shape)
        ops.gemm(1.0, self.x, "T", dy, "N", 1.0, self.weight.grad, ndim=lead_ndim)
        if self.bias is not None:
            ops.sum_bias(1.0, dy, 1.0, self.bias.grad)
        if dx is not None:
            ops.gemm(1.0, dy, "N", self.weight.compute, "T", beta, dx, ndim=len(self.out_shape))
        return dx


cdef class LayerNorm(Module):
    def __init__(self, int n_embd, int embd_tile, double eps, str dtype):
        super().__init__(dtype)
        self.eps = eps
        self.weight = self.add_param("weight", (n_embd,), (embd_tile,))
        self.bias = self.add_param("bias", (n_embd,), (embd_tile,))

    cpdef Tensor forward(self, Tensor x):
        """y (compute dtype) = layer norm of x (master dtype), statistics in the master dtype."""
        self.stats = self.buffer("stats", x.shape[:-1] + (2,), x.basetile[:-1] + (2,),
                                 self.master)
        cdef Tensor y = self.buffer("y", x.shape, x.basetile)
        ops.layernorm_forward(x, self.weight.value, self.bias.value, self.eps, self.stats, y)
        self.x = x
        return y

    cpdef backward(self, Tensor dy, Tensor dx, double beta):
        """dx = layer-norm backward of dy + beta*dx; accumulates weight and bias gradients (all
        in the master dtype)."""
        cdef Tensor rowacc = self.scratch("rowacc", self.stats.shape, self.stats.basetile,
                                          self.master)
        ops.layernorm_backward(self.x, dy, self.stats, self.weight.value, self.eps, rowacc,
                               self.weight.grad, self.bias.grad, beta, dx)
        return dx


cdef class Embedding(Module):
    """Rows of a [num, n_embd] table picked by integer ids, accumulated into the destination
    (token and position embeddings sum into one tensor, in the master dtype). ``gemm``: the
    table is also a GEMM operand (tied to the language-model head)."""

    def __init__(self, int num, int num_tile, int n_embd, int embd_tile, str dtype,
                 bint gemm=False):
        super().__init__(dtype)
        self.weight = self.add_param("weight", (num, n_embd), (num_tile, embd_tile), gemm)

    cpdef forward(self, Tensor ids, Tensor dst):
        ops.embedding(ids, self.weight.value, dst)
        self.ids = ids

    cpdef backward(self, Tensor dy):
        ops.embedding_backward(self.ids, dy, self.weight.grad)


cdef class Attention(Module):
    """Causal multi-head self-attention, heads tiled ``tiles['head']`` per tile.

    Queries, keys and values are [batch, seq, heads, head_dim]; scores [batch, heads, seq, seq].
    transformers' fused c_attn is kept as three projections (q, k, v) so that heads can be
    tiled; conversion splits and joins the weight.
    """

    def __init__(self, int n_embd, int n_head, dict tiles, str dtype):
        super().__init__(dtype)
        self.n_head = n_head
        self.head_dim = n_embd // n_head
        cdef int e = tiles["embd"], h = tiles["head"], d = self.head_dim
        cdef tuple heads = (n_head, self.head_dim)
        self.q = self.add_child("q", Linear((n_embd,), (e,), heads, (h, d), dtype))
        self.k = self.add_child("k", Linear((n_embd,), (e,), heads, (h, d), dtype))
        self.v = self.add_child("v", Linear((n_embd,), (e,), heads, (h, d), dtype))
        self.c_proj = self.add_child("c_proj", Linear(heads, (h, d), (n_embd,), (e,), dtype))

    cpdef Tensor forward(self, Tensor x):
        cdef Tensor q = self.q.forward(x)
        cdef Tensor k = self.k.forward(x)
        cdef Tensor v = self.v.forward(x)
        B, T = x.shape[:2]
        bt, tt = x.basetile[:2]
        cdef tuple scores_shape = (B, self.n_head, T, T)
        cdef tuple scores_tiles = (bt, q.basetile[2], tt, tt)
        cdef Tensor p = self.buffer("p", scores_shape, scores_tiles)
        cdef Tensor stats = self.buffer("stats", scores_shape[:3] + (2,), scores_tiles[:3] + (2,),
                                        self.master)
        ops.attn_qk(1.0 / math.sqrt(self.head_dim), q, k, p)
        ops.mask_causal(p)
        ops.maxsumexp(p, stats, 3)
        ops.softmax_inplace(stats, p, 3)
        cdef Tensor o = self.buffer("o", q.shape, q.basetile)
        ops.attn_pv(1.0, p, v, o)
        self.q_out, self.k_out, self.v_out, self.p, self.o = q, k, v, p, o
        return self.c_proj.forward(o)

    cpdef backward(self, Tensor dy, Tensor dx, double beta):
        """dx (master dtype) = gradient of the input + beta*dx, from dy (master dtype)."""
        cdef Tensor q = self.q_out, k = self.k_out, v = self.v_out, p = self.p, o = self.o
        cdef Tensor do = self.scratch("do", o.shape, o.basetile)
        self.c_proj.backward(dy, do)
        cdef Tensor dp = self.scratch("dp", p.shape, p.basetile)
        cdef Tensor dv = self.scratch("dv", v.shape, v.basetile)
        # tiles above the diagonal hold zero probabilities: their gradient is never needed
        ops.attn_qk(1.0, do, v, dp, masked_value=0.0)
        ops.attn_ptv(1.0, p, do, dv)
        cdef Tensor sums = self.scratch("sums", p.shape[:3], p.basetile[:3], self.master)
        ops.sumprod_slice(1.0, p, dp, 0.0, sums, 3)
        ops.softmax_backward(1.0 / math.sqrt(self.head_dim), p, sums, dp, 3)
        cdef Tensor dq = self.scratch("dq", q.shape, q.basetile)
        cdef Tensor dk = self.scratch("dk", k.shape, k.basetile)
        ops.attn_pv(1.0, dp, k, dq)
        ops.attn_ptv(1.0, dp, q, dk)
        self.q.backward(dq, dx, beta)
        self.k.backward(dk, dx, 1.0)
        self.v.backward(dv, dx, 1.0)
        return dx


cdef class MLP(Module):
    def __init__(self, int n_embd, int n_inner, dict tiles, str dtype):
        super().__init__(dtype)
        self.c_fc = self.add_child("c_fc", Linear((n_embd,), (tiles["embd"],), (n_inner,),
                                                  (tiles["inner"],), dtype))
        self.c_proj = self.add_child("c_proj", Linear((n_inner,), (tiles["inner"],), (n_embd,),
                                                      (tiles["embd"],), dtype))

    cpdef Tensor forward(self, Tensor x):
        cdef Tensor a = self.c_fc.forward(x)
        cdef Tensor g = self.buffer("g", a.shape, a.basetile)
        ops.gelutanh(a, g)
        self.a = a
        return self.c_proj.forward(g)

    cpdef backward(self, Tensor dy, Tensor dx, double beta):
        cdef Tensor dg = self.scratch("dg", self.a.shape, self.a.basetile)
        self.c_proj.backward(dy, dg)
        cdef Tensor da = self.scratch("da", self.a.shape, self.a.basetile)
        ops.gelutanh_backward(self.a, dg, 0.0, da)
        return self.c_fc.backward(da, dx, beta)


cdef class Block(Module):
    """x + attn(ln_1(x)), then + mlp(ln_2(.)): transformers' GPT2Block without dropout. The
    residual stream (x, its gradient) is in the master dtype, the branches in the compute
    dtype."""

    def __init__(self, config, dict tiles, str dtype):
        super().__init__(dtype)
        cdef int E = config.n_embd
        eps = config.layer_norm_epsilon
        self.ln_1 = self.add_child("ln_1", LayerNorm(E, tiles["embd"], eps, dtype))
        self.attn = self.add_child("attn", Attention(E, config.n_head, tiles, dtype))
        self.ln_2 = self.add_child("ln_2", LayerNorm(E, tiles["embd"], eps, dtype))
        self.mlp = self.add_child("mlp", MLP(E, config.inner, tiles, dtype))

    cpdef Tensor forward(self, Tensor x):
        cdef Tensor h = self.attn.forward(self.ln_1.forward(x))
        cdef Tensor x1 = self.buffer("x1", x.shape, x.basetile, self.master)
        ops.copy(x, x1)
        ops.add(1.0, h, 1.0, x1)
        cdef Tensor m = self.mlp.forward(self.ln_2.forward(x1))
        cdef Tensor out = self.buffer("out", x.shape, x.basetile, self.master)
        ops.copy(x1, out)
        ops.add(1.0, m, 1.0, out)
        return out

    cpdef backward(self, Tensor dy, Tensor dx):
        """dx = gradient with respect to the block's input (dy is left as it is)."""
        cdef Tensor dx1 = self.scratch("dx1", dy.shape, dy.basetile, self.master)
        cdef Tensor dh = self.scratch("dh", dy.shape, dy.basetile, self.master)
        ops.copy(dy, dx1)
        self.mlp.backward(dy, dh, 0.0)
        self.ln_2.backward(dh, dx1, 1.0)
        self.attn.backward(dx1, dh, 0.0)
        ops.copy(dx1, dx)
        self.ln_1.backward(dh, dx, 1.0)
        return dx
