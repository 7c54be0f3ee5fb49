# cython: language_level=3
"""The layers every family draws on, over tiled tensors, as typed Cython classes (their base,
``Module``, is nntile.nn.module's).

Every layer declares the tensors it holds as data (nntile.declare.TensorSpec) and creates them
from that declaration only: its parameters with ``add_param`` in its constructor, and what it
creates while running in ``declare``: the buffers forward keeps for backward, one set per
input shape (so repeated steps register no new StarPU data), and backward's scratch. The model
creates them (``create``, ``buffers``, ``scratch``), and nntile.memory reads the same
declarations (``declaration``) to estimate a run without creating anything. Parameter
gradients accumulate (``+=``) until ``zero_grad``; activations are [batch, seq, ...].

A module's ``dtype`` is a precision (nntile.precision): its ``master`` dtype holds parameters,
gradients, the residual stream and statistics, its ``compute`` dtype the GEMM operands and the
activations between GEMMs. Under bf16-mixed the ops that join the two (a bf16 branch added
to the fp32 stream, a layer norm writing bf16, GEMMs accumulating into fp32 gradients) run
kernels with bf16 data and fp32 accumulators.
"""

from nntile._core.core cimport Tensor
from nntile._core.core import AttentionMask
from nntile import ops
from nntile.nn.attention cimport CoreAttention
from nntile.nn.module cimport Module, Parameter


cdef class Linear(Module):
    """y = x @ weight + bias over the last ``len(in_shape)`` dims of x (transformers' Conv1D
    layout: weight is [in..., out...]). ``residual``: y is added to the residual stream, so
    the gradient of y arrives in the master dtype."""

    def __init__(self, tuple in_shape, tuple in_tiles, tuple out_shape, tuple out_tiles,
                 str dtype, bint bias=True, bint residual=False):
        super().__init__(dtype)
        self.in_ndim = len(in_shape)
        self.out_shape = out_shape
        self.out_tiles = out_tiles
        self.residual = residual
        self.weight = self.add_param("weight", in_shape + out_shape, in_tiles + out_tiles,
                                     gemm=True)
        self.bias = self.add_param("bias", out_shape, out_tiles) if bias else None

    def declare(self, tuple lead, tuple tiles):
        """Forward keeps y. With two dtypes a residual layer's backward casts dy to the
        compute dtype (the GEMMs need both operands in it)."""
        cdef tuple y = lead + self.out_shape, y_tiles = tiles + self.out_tiles
        specs = [self.buffer_spec("y", y, y_tiles)]
        if self.residual and self.compute != self.master:
            specs.append(self.scratch_spec("linear.dy", y, y_tiles))
        return specs

    cpdef Tensor forward(self, Tensor x):
        """y (compute dtype) = x @ weight + bias; x is in the compute dtype."""
        cdef Tensor y = self.buffers(x)["y"]
        ops.gemm(1.0, x, "N", self.weight.compute, "N", 0.0, y, ndim=self.in_ndim)
        if self.bias is not None:
            ops.add_bias(1.0, self.bias.value, 1.0, y)
        self.x = x
        return y

    cpdef keep_input(self, Tensor x):
        """What forward keeps for backward, without computing y: a forward again whose y no
        one reads (the MLP's output projection in a recomputed block, PreNormBlock.recompute)."""
        self.buffers(x)  # backward's scratch follows this input's shape
        self.x = x

    cdef Tensor _in_compute(self, Tensor dy):
        """dy itself, or its copy in the compute dtype."""
        if dy.dtype == self.compute:
            return dy
        cdef Tensor cast = self.scratch()["linear.dy"]
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


cdef class MLP(Module):
    """The MLP of a block: a family's ``_hidden(x)``, then the Linear output projection
    ``_out`` that the family's __init__ names. ``recompute`` keeps what backward reads, the
    projection's input, and computes not its output (PreNormBlock.recompute)."""

    cpdef Tensor forward(self, Tensor x):
        return self._out.forward(self._hidden(x))

    cpdef recompute(self, Tensor x):
        self._out.keep_input(self._hidden(x))

    cdef Tensor _hidden(self, Tensor x):
        raise NotImplementedError(f"{type(self).__name__} gives no _hidden")


cdef class Norm(Module):
    """A normalisation over the last axis, y (compute dtype) of x (master dtype) with each
    row's statistics kept in the master dtype for backward: LayerNorm and RMSNorm, tiled
    alike. A family's norm writes ``declare``, ``normalize`` and ``backward``."""

    def __init__(self, int n_embd, int embd_tile, double eps, str dtype):
        super().__init__(dtype)
        self.n_embd, self.embd_tile, self.eps = n_embd, embd_tile, eps
        self.weight = self.add_param("weight", (n_embd,), (embd_tile,))

    cdef normalize(self, Tensor x, Tensor y):
        raise NotImplementedError

    cpdef Tensor forward(self, Tensor x):
        cdef dict buffers = self.buffers(x)
        self.stats = buffers["stats"]
        cdef Tensor y = buffers["y"]
        self.normalize(x, y)
        self.x = x
        return y

    cpdef backward(self, Tensor dy, Tensor dx, double beta):
        raise NotImplementedError


cdef class LayerNorm(Norm):
    """transformers' LayerNorm: weight and bias."""

    def __init__(self, int n_embd, int embd_tile, double eps, str dtype):
        super().__init__(n_embd, embd_tile, eps, dtype)
        self.bias = self.add_param("bias", (n_embd,), (embd_tile,))

    def declare(self, tuple lead, tuple tiles):
        """Forward keeps each row's mean and deviation and y; backward accumulates per-row
        sums in ``rowacc``."""
        cdef tuple rows = lead + (2,), row_tiles = tiles + (2,)
        return [self.buffer_spec("stats", rows, row_tiles, self.master),
                self.buffer_spec("y", lead + (self.n_embd,), tiles + (self.embd_tile,)),
                self.scratch_spec("rowacc", rows, row_tiles, self.master)]

    cdef normalize(self, Tensor x, Tensor y):
        ops.layernorm_forward(x, self.weight.value, self.bias.value, self.eps, self.stats, y)

    cpdef backward(self, Tensor dy, Tensor dx, double beta):
        """dx = layer-norm backward of dy + beta*dx; accumulates weight and bias gradients (all
        in the master dtype)."""
        ops.layernorm_backward(self.x, dy, self.stats, self.weight.value, self.eps,
                               self.scratch()["rowacc"], self.weight.grad, self.bias.grad,
                               beta, dx)
        return dx


cdef class RMSNorm(Norm):
    """y = weight * x / sqrt(mean(x**2) + eps) over the last axis: transformers'
    LlamaRMSNorm (one parameter, ``weight``)."""

    def declare(self, tuple lead, tuple tiles):
        """Forward keeps each row's sum of squares and y; backward accumulates per-row sums
        in ``rmsnorm.rowacc``."""
        return [self.buffer_spec("stats", lead, tiles, self.master),
                self.buffer_spec("y", lead + (self.n_embd,), tiles + (self.embd_tile,)),
                self.scratch_spec("rmsnorm.rowacc", lead, tiles, self.master)]

    cdef normalize(self, Tensor x, Tensor y):
        ops.rmsnorm_forward(x, self.weight.value, self.eps, self.stats, y)

    cpdef backward(self, Tensor dy, Tensor dx, double beta):
        """dx = RMSNorm backward of dy + beta*dx; accumulates the weight's gradient (all in
        the master dtype)."""
        ops.rmsnorm_backward(self.x, dy, self.stats, self.weight.value, self.eps,
                             self.scratch()["rmsnorm.rowacc"], self.weight.grad, beta, dx)
        return dx


cdef class Rotary(Module):
    """Rotary positions (RoPE) of queries or keys [batch, seq, heads, head_dim], in place:
    the constant ``inv_freq`` [head_dim/2] from ``rope_theta`` and ``rope_scaling``
    (nntile.nn.rope), in fp64 for fp64 and in fp32 otherwise (the rotation of bf16 data is
    computed in fp32, as transformers computes its cos and sin). No parameters; one module
    serves every attention layer of a model."""

    def __init__(self, int head_dim, double rope_theta, rope_scaling, str dtype):
        from nntile.nn.rope import rope_inv_freq
        super().__init__(dtype)
        inv_freq, self.scale = rope_inv_freq(head_dim, rope_theta, rope_scaling)
        self.add_constant("inv_freq", inv_freq, "fp32" if self.master == "bf16" else self.master)

    cpdef forward(self, Tensor x, Tensor positions):
        """x turned by the angles of its positions (int64 [batch, seq], tiled as x)."""
        ops.rope_forward(x, positions, self.constant("inv_freq"), self.scale)

    cpdef backward(self, Tensor dx, Tensor positions):
        """The gradient of forward's input from its output's, dx, in place."""
        ops.rope_backward(dx, positions, self.constant("inv_freq"), self.scale)


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

    cpdef backward(self, Tensor dy, Tensor into=None):
        """Add the table's gradient from the output's, ``dy``, into the weight's gradient, or
        into ``into``, a tensor tiled as it (several replicas' summed gradient of a tied
        table, nntile.parallel.DeviceReplicas) by tasks that run where its tiles are homed
        (Tensor.set_homes), so that ``dy`` moves there rather than the table's tiles."""
        if into is None:
            ops.embedding_backward(self.ids, dy, self.weight.grad)
            return
        with ops.task_device(None):
            ops.embedding_backward(self.ids, dy, into)


cdef class Attention(Module):
    """Causal self-attention of every family: the projections q, k, v (children named
    ``names``: GPT-2's q, k, v, c_proj; Llama's q_proj, k_proj, v_proj, o_proj), with biases
    where ``qkv_bias`` says and on the output projection where ``o_bias`` says (Qwen2 has the
    first, not the second), rotary positions on q and k where the family has them (in place:
    the core keeps them turned, and backward turns their gradients back), the attention core
    (nntile.nn.attention, fused or not, under ``mask``, an AttentionMask), the output
    projection.

    A family that transforms q and k between their projections and the rotation (Qwen3's
    per-head norms) overrides ``_shape_qk`` and ``_shape_qk_backward``.

    Queries are [batch, seq, heads, head_dim], tiled ``tiles['head']`` heads per tile (whole
    groups); keys and values [batch, seq, kv heads, head_dim] (grouped-query attention: never
    repeated), tiled by the head tile divided by the group, so that a query tile and the
    key/value tile it reads cover the same groups. transformers' fused c_attn (GPT-2) is kept
    as three projections so that heads can be tiled; conversion splits and joins the weight.
    """

    def __init__(self, int n_embd, int n_head, int n_kv_head, int head_dim, dict tiles,
                 str dtype, bint fused=True, bint qkv_bias=True, bint o_bias=True,
                 tuple names=("q", "k", "v", "c_proj"), Rotary rotary=None, mask=AttentionMask()):
        # imported here: nntile.nn.attention cimports this module
        super().__init__(dtype)
        cdef int e = tiles["embd"], h = tiles["head"], d = head_dim
        self.n_head, self.n_kv_head, self.head_dim = n_head, n_kv_head, head_dim
        self.head_tile, self.kv_tile = h, h // (n_head // n_kv_head)
        self.rotary = rotary
        cdef tuple heads = (n_head, d), kv = (n_kv_head, d)
        self.q = self.add_child(names[0], Linear((n_embd,), (e,), heads, (h, d), dtype,
                                                 qkv_bias))
        self.k = self.add_child(names[1], Linear((n_embd,), (e,), kv, (self.kv_tile, d), dtype,
                                                 qkv_bias))
        self.v = self.add_child(names[2], Linear((n_embd,), (e,), kv, (self.kv_tile, d), dtype,
                                                 qkv_bias))
        self.core = self.add_child("core", CoreAttention(n_head, n_kv_head, d, h, dtype, fused,
                                                         mask=mask))
        self.out = self.add_child(names[3], Linear(heads, (h, d), (n_embd,), (e,), dtype, o_bias,
                                                   residual=True))

    def declare(self, tuple lead, tuple tiles):
        """Backward needs the gradients of o and q ([.., heads, head_dim]), and of k and v
        ([.., kv heads, head_dim])."""
        cdef tuple heads, heads_tiles, kv, kv_tiles
        heads, heads_tiles, kv, kv_tiles = self.head_shapes(lead, tiles)
        return [self.scratch_spec("attn.do", heads, heads_tiles),
                self.scratch_spec("attn.dq", heads, heads_tiles),
                self.scratch_spec("attn.dk", kv, kv_tiles),
                self.scratch_spec("attn.dv", kv, kv_tiles)]

    def head_shapes(self, tuple lead, tuple tiles):
        """(shape, tiles) of the queries, then of the keys, for an input of ``lead``, tiled
        ``tiles``."""
        cdef int d = self.head_dim
        return (lead + (self.n_head, d), tiles + (self.head_tile, d),
                lead + (self.n_kv_head, d), tiles + (self.kv_tile, d))

    cpdef tuple _shape_qk(self, Tensor q, Tensor k):
        """q and k as the rotation takes them: the projections' outputs themselves."""
        return q, k

    cpdef tuple _shape_qk_backward(self, Tensor dq, Tensor dk):
        """The gradients of the projections' outputs from those of ``_shape_qk``'s."""
        return dq, dk

    cpdef Tensor forward(self, Tensor x, Tensor positions=None):
        """``positions``: the tokens' positions, for rotary families (GPT-2's embeddings
        added them)."""
        self.buffers(x)  # none, but backward's scratch follows this input's shape
        cdef Tensor q = self.q.forward(x), k = self.k.forward(x), v = self.v.forward(x)
        q, k = self._shape_qk(q, k)
        if self.rotary is not None:
            self.rotary.forward(q, positions)
            self.rotary.forward(k, positions)
            self.positions = positions
        return self.out.forward(self.core.forward(q, k, v))

    cpdef backward(self, Tensor dy, Tensor dx, double beta):
        """dx (master dtype) = gradient of the input + beta*dx, from dy (master dtype)."""
        cdef dict scratch = self.scratch()
        cdef Tensor do = scratch["attn.do"], dq = scratch["attn.dq"]
        cdef Tensor dk = scratch["attn.dk"], dv = scratch["attn.dv"]
        self.out.backward(dy, do)
        self.core.backward(do, dq, dk, dv)
        if self.rotary is not None:
            self.rotary.backward(dq, self.positions)
            self.rotary.backward(dk, self.positions)
        dq, dk = self._shape_qk_backward(dq, dk)
        self.q.backward(dq, dx, beta)
        self.k.backward(dk, dx, 1.0)
        self.v.backward(dv, dx, 1.0)
        return dx


cdef class PreNormBlock(Module):
    """x + attention(norm_1(x)), then + mlp(norm_2(.)): the transformer block of every family,
    whose subclass builds the four branches (``_branches``). The residual stream (x, its
    gradient) is in the master dtype, the branches in the compute dtype. The norms take
    ``forward(x)`` and ``backward(dy, dx, beta)``, the attention ``forward(x, positions)`` and
    the MLP (an ``MLP``) ``forward(x)``, both with ``backward(dy, dx, beta)``; the MLP also
    takes ``recompute(x)``: its forward up to what its backward reads."""

    cdef _branches(self, int n_embd, int embd_tile, Module norm_1, Module attn, Module norm_2,
                   Module mlp):
        self._stream = (n_embd, embd_tile)
        self._norm_1, self._attn, self._norm_2, self._mlp = norm_1, attn, norm_2, mlp

    def declare(self, tuple lead, tuple tiles):
        """Forward keeps the stream after each branch, x1 and out; backward needs a
        branch's gradient (all in the master dtype)."""
        cdef tuple x = lead + self._stream[:1], x_tiles = tiles + self._stream[1:]
        return [self.buffer_spec("x1", x, x_tiles, self.master),
                self.buffer_spec("out", x, x_tiles, self.master),
                self.scratch_spec("dh", x, x_tiles, self.master)]

    def share_buffers(self, str pool_as, tuple own=("out",)):
        """Module.share_buffers, the block keeping its output ``out``: the next block's
        input, and its backward's."""
        Module.share_buffers(self, pool_as, own)

    cpdef Tensor forward(self, Tensor x, Tensor positions=None):
        """The block's output; ``positions`` (int64 [batch, seq]) go to the attention."""
        cdef Tensor x1 = self._attention_branch(x, positions), out = self.buffers(x)["out"]
        ops.add_out(1.0, self._mlp.forward(self._norm_2.forward(x1)), 1.0, x1, out)
        return out

    cpdef recompute(self, Tensor x, Tensor positions=None):
        """Forward again from the kept input ``x``, just before backward (activation
        recomputation), up to what backward reads: not the MLP's output projection nor the
        block's output, which only the next block reads and the stream keeps."""
        self._mlp.recompute(self._norm_2.forward(self._attention_branch(x, positions)))

    cdef Tensor _attention_branch(self, Tensor x, Tensor positions):
        """x1 = x + attention(norm_1(x))."""
        cdef Tensor x1 = self.buffers(x)["x1"]
        ops.add_out(1.0, self._attn.forward(self._norm_1.forward(x), positions), 1.0, x, x1)
        return x1

    cpdef backward(self, Tensor dy, Tensor dx):
        """dx = gradient with respect to the block's input (dy is left as it is). dx first
        holds the gradient at x1, which the attention's backward reads before the first
        norm's adds to it (StarPU orders the write after the reads): no copy of it."""
        cdef Tensor dh = self.scratch()["dh"]
        ops.copy(dy, dx)
        self._mlp.backward(dy, dh, 0.0)
        self._norm_2.backward(dh, dx, 1.0)
        self._attn.backward(dx, dh, 0.0)
        self._norm_1.backward(dh, dx, 1.0)
        return dx
