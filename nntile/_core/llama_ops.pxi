# Tensor ops of the Llama family: rotary positions on [batch, seq, heads, head_dim] tensors,
# in place, and the SwiGLU product (RMSNorm is in norm_ops.pxi, beside LayerNorm).
# Same pattern as nn_ops.pxi: every check first, then one task per tile.
from libc.math cimport isfinite


cdef _rope(str name, int op, Tensor x, Tensor pos, Tensor inv_freq, scale):
    cdef int column = _column(name, [(x, "x")], [(inv_freq, "inv_freq")])
    _usable(pos, "pos")
    _int64(name, pos, "pos")
    if x.traits.ndim != 4:
        raise ValueError(f"{name}: x must be [batch, seq, heads, head_dim], got shape "
                         f"{x.traits.shape}")
    cdef Py_ssize_t d = x.traits.shape[3]
    if d % 2 or x.traits.basetile[3] != d:
        raise ValueError(f"{name}: the head dimension of x ({d}) must be even and one tile, "
                         f"got tiles {x.traits.basetile}")
    _expect_traits(name, pos, "pos", x.traits.shape[:2], x.traits.basetile[:2],
                   "x's batch and sequence dimensions")
    _expect_traits(name, inv_freq, "inv_freq", (d // 2,), (d // 2,),
                   "half the head dimension, in one tile")
    if not isfinite(scale):
        raise ValueError(f"{name}: scale={scale} must be finite")
    cdef nntile_rope_forward_args args  # rope_backward's args have the same layout
    cdef starpu_data_handle_t h[3]
    cdef Py_ssize_t coords[MAX_NDIM]
    cdef Py_ssize_t i
    args.head_dim = d
    args.scale = scale
    h[BUF_rope_inv_freq] = inv_freq.handles[0]
    for i in range(x.traits.ntiles):
        x.traits.tile_coords(i, coords)
        args.rows = x.traits.tile_dim(0, coords[0]) * x.traits.tile_dim(1, coords[1])
        args.heads = x.traits.tile_dim(2, coords[2])
        h[BUF_rope_pos] = pos.handles[pos.traits.tile_linear(coords)]
        h[BUF_rope_x] = x.handles[i]
        submit(op, column, 3, h, &args, sizeof(args))


def rope_forward(Tensor x, Tensor pos, Tensor inv_freq, scale=1.0):
    """Rotary positions in place, as transformers' apply_rotary_pos_emb (rotate_half layout):
    x[b, t, h, :] = scale * (x * cos + rotate_half(x) * sin), i.e. for j < D/2

        x[..., j]       = scale * (x1 * cos(a) - x2 * sin(a)),
        x[..., j + D/2] = scale * (x2 * cos(a) + x1 * sin(a)),  a = pos[b, t] * inv_freq[j]

    (x1, x2 the old x[..., j], x[..., j + D/2]). x is [batch, seq, heads, head_dim] with the
    head dimension (even) in one tile; pos int64 [batch, seq], tiled like x; inv_freq
    [head_dim/2] in one tile (rope_inv_freq in nntile.nn.rope), fp32 where x is bf16. The
    angle and its cos and sin are computed in fp32 (fp64 for fp64 tensors); scale is the
    attention scaling of some rope types (1.0 for none, linear and llama3).
    """
    _rope("rope_forward", NNTILE_OP_rope_forward, x, pos, inv_freq, scale)


def rope_backward(Tensor dx, Tensor pos, Tensor inv_freq, scale=1.0):
    """Backward of rope_forward, in place: dx turned by the opposite angle (the transpose of
    the rotation), times scale; the same checks as rope_forward."""
    _rope("rope_backward", NNTILE_OP_rope_backward, dx, pos, inv_freq, scale)


def swiglu_forward(Tensor gate, Tensor up, Tensor h):
    """h = silu(gate) * up elementwise (transformers' LlamaMLP before down_proj), silu(gate)
    rounded to the dtype first as there."""
    ts = [(gate, "gate"), (up, "up"), (h, "h")]
    _float_same("swiglu_forward", ts)
    _same_traits("swiglu_forward", gate, "gate", h, "h")
    _same_traits("swiglu_forward", up, "up", h, "h")
    _distinct("swiglu_forward", ts)
    cdef nntile_swiglu_forward_args args
    cdef starpu_data_handle_t hd[3]
    cdef Py_ssize_t i
    for i in range(h.traits.ntiles):
        args.n = _tile_nelems(h, i)
        hd[BUF_swiglu_forward_gate] = gate.handles[i]
        hd[BUF_swiglu_forward_up] = up.handles[i]
        hd[BUF_swiglu_forward_h] = h.handles[i]
        submit(NNTILE_OP_swiglu_forward, h.dtype_id, 3, hd, &args, sizeof(args))


def swiglu_backward(Tensor gate, Tensor up, Tensor dh, Tensor dgate, Tensor dup):
    """The gradients of swiglu_forward, overwritten: dgate = dh * up * silu'(gate), dup =
    dh * silu(gate)."""
    ts = [(gate, "gate"), (up, "up"), (dh, "dh"), (dgate, "dgate"), (dup, "dup")]
    _float_same("swiglu_backward", ts)
    for t, role in ts[1:]:
        _same_traits("swiglu_backward", gate, "gate", t, role)
    _distinct("swiglu_backward", ts)
    cdef nntile_swiglu_backward_args args
    cdef starpu_data_handle_t hd[5]
    cdef Py_ssize_t i
    for i in range(gate.traits.ntiles):
        args.n = _tile_nelems(gate, i)
        hd[BUF_swiglu_backward_gate] = gate.handles[i]
        hd[BUF_swiglu_backward_up] = up.handles[i]
        hd[BUF_swiglu_backward_dh] = dh.handles[i]
        hd[BUF_swiglu_backward_dgate] = dgate.handles[i]
        hd[BUF_swiglu_backward_dup] = dup.handles[i]
        submit(NNTILE_OP_swiglu_backward, gate.dtype_id, 5, hd, &args, sizeof(args))
