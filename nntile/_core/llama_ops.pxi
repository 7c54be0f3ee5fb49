# Tensor ops of the Llama family: RMSNorm over the last axis (tiled like the layer norm:
# statistics, forward, and a backward with a reduction over the row's tiles), rotary
# positions on [batch, seq, heads, head_dim] tensors, in place, and the SwiGLU product.
# Same pattern as nn_ops.pxi: every check first, then one task per tile.
from libc.math cimport isfinite


cdef int _check_rmsnorm(str op, Tensor x, Tensor stats, list vectors) except -1:
    """x is [..., e] (at least 2 dimensions), stats x's shape and tiling without the last
    axis (one value per row), vectors fibers along it."""
    if x.traits.ndim < 2:
        raise ValueError(f"{op}: x must have at least 2 dimensions [..., embed], got shape "
                         f"{x.traits.shape}")
    cdef Py_ssize_t last = x.traits.ndim - 1
    _check_slice(op, x, "x", stats, "stats", last)
    for t, role in vectors:
        _check_fiber(op, x, "x", t, role, last)
    return 0


cdef int _check_eps(str op, eps) except -1:
    if not eps >= 0:
        raise ValueError(f"{op}: eps={eps} must be >= 0")
    return 0


def rmsnorm_forward(Tensor x, Tensor weight, eps, Tensor stats, Tensor y):
    """y = weight * x / sqrt(mean(x**2) + eps) over the last axis of x (transformers'
    LlamaRMSNorm: x normalised in the compute type, rounded to x's dtype, then times the
    weight).

    stats (x's shape and tiling without the last axis) receives each row's sum of x**2,
    reused by rmsnorm_backward. y may be bf16 where x, weight and stats are fp32 (the cast
    to the next GEMM's input fused into the norm).
    """
    ts = [(x, "x"), (weight, "weight"), (stats, "stats"), (y, "y")]
    cdef int column = _column("rmsnorm_forward", [(y, "y")], ts[:3])
    _check_rmsnorm("rmsnorm_forward", x, stats, [(weight, "weight")])
    _same_traits("rmsnorm_forward", x, "x", y, "y")
    _distinct("rmsnorm_forward", ts)
    _check_eps("rmsnorm_forward", eps)
    cdef nntile_rmsnorm_stats_args sargs
    cdef nntile_rmsnorm_forward_args fargs
    cdef starpu_data_handle_t h[4]
    cdef Py_ssize_t coords[MAX_NDIM]
    cdef Py_ssize_t i, last = x.traits.ndim - 1
    for i in range(x.traits.ntiles):
        x.traits.tile_coords(i, coords)
        sargs.rows = _rows(x.traits, coords)
        sargs.e = x.traits.tile_dim(last, coords[last])
        sargs.init = coords[last] == 0
        h[0] = x.handles[i]
        h[1] = stats.handles[_drop_axis_tile(stats.traits, coords, x.traits.ndim, last, False)]
        submit(NNTILE_OP_rmsnorm_stats, stats.dtype_id, 2, h, &sargs, sizeof(sargs),
               not sargs.init)
    fargs.e_total = x.traits.shape[last]
    fargs.eps = eps
    for i in range(x.traits.ntiles):
        x.traits.tile_coords(i, coords)
        fargs.rows = _rows(x.traits, coords)
        fargs.e = x.traits.tile_dim(last, coords[last])
        h[0] = x.handles[i]
        h[1] = stats.handles[_drop_axis_tile(stats.traits, coords, x.traits.ndim, last, False)]
        h[2] = weight.handles[coords[last]]
        h[3] = y.handles[i]
        submit(NNTILE_OP_rmsnorm_forward, column, 4, h, &fargs, sizeof(fargs))


def rmsnorm_backward(Tensor x, Tensor dy, Tensor stats, Tensor weight, eps, Tensor rowacc,
                     Tensor dweight, beta, Tensor dx):
    """Backward of rmsnorm_forward over the last axis, with xhat = x / sqrt(mean(x**2) + eps)
    and g = dy * weight:

    dweight += sum over rows of dy * xhat (the caller zeroes it),
    dx = (g - xhat * mean(g * xhat)) / sqrt(mean(x**2) + eps) + beta * dx.

    stats are those of rmsnorm_forward; rowacc is a workspace shaped like stats.
    """
    ts = [(x, "x"), (dy, "dy"), (stats, "stats"), (weight, "weight"), (rowacc, "rowacc"),
          (dweight, "dweight"), (dx, "dx")]
    _float_same("rmsnorm_backward", ts)
    _check_rmsnorm("rmsnorm_backward", x, stats, [(weight, "weight"), (dweight, "dweight")])
    _same_traits("rmsnorm_backward", x, "x", dy, "dy")
    _same_traits("rmsnorm_backward", x, "x", dx, "dx")
    _same_traits("rmsnorm_backward", stats, "stats", rowacc, "rowacc")
    _distinct("rmsnorm_backward", ts)
    _check_eps("rmsnorm_backward", eps)
    cdef nntile_rmsnorm_backward_reduce_args rargs
    cdef nntile_rmsnorm_backward_args bargs
    cdef starpu_data_handle_t h[6]
    cdef Py_ssize_t coords[MAX_NDIM]
    cdef Py_ssize_t i, s_lin, last = x.traits.ndim - 1
    rargs.e_total = bargs.e_total = x.traits.shape[last]
    rargs.eps = bargs.eps = eps
    bargs.beta = beta
    for i in range(x.traits.ntiles):
        x.traits.tile_coords(i, coords)
        rargs.rows = _rows(x.traits, coords)
        rargs.e = x.traits.tile_dim(last, coords[last])
        rargs.init = coords[last] == 0
        s_lin = _drop_axis_tile(stats.traits, coords, x.traits.ndim, last, False)
        h[0] = x.handles[i]
        h[1] = dy.handles[i]
        h[2] = stats.handles[s_lin]
        h[3] = weight.handles[coords[last]]
        h[4] = rowacc.handles[s_lin]
        h[5] = dweight.handles[coords[last]]
        submit(NNTILE_OP_rmsnorm_backward_reduce, x.dtype_id, 6, h, &rargs, sizeof(rargs),
               not rargs.init)
    for i in range(x.traits.ntiles):
        x.traits.tile_coords(i, coords)
        bargs.rows = _rows(x.traits, coords)
        bargs.e = x.traits.tile_dim(last, coords[last])
        s_lin = _drop_axis_tile(stats.traits, coords, x.traits.ndim, last, False)
        h[0] = x.handles[i]
        h[1] = dy.handles[i]
        h[2] = stats.handles[s_lin]
        h[3] = weight.handles[coords[last]]
        h[4] = rowacc.handles[s_lin]
        h[5] = dx.handles[i]
        submit(NNTILE_OP_rmsnorm_backward, x.dtype_id, 6, h, &bargs, sizeof(bargs),
               bargs.beta != 0)


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
    h[1] = inv_freq.handles[0]
    for i in range(x.traits.ntiles):
        x.traits.tile_coords(i, coords)
        args.rows = x.traits.tile_dim(0, coords[0]) * x.traits.tile_dim(1, coords[1])
        args.heads = x.traits.tile_dim(2, coords[2])
        h[0] = pos.handles[pos.traits.tile_linear(coords)]
        h[2] = x.handles[i]
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
        hd[0] = gate.handles[i]
        hd[1] = up.handles[i]
        hd[2] = h.handles[i]
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
        hd[0] = gate.handles[i]
        hd[1] = up.handles[i]
        hd[2] = dh.handles[i]
        hd[3] = dgate.handles[i]
        hd[4] = dup.handles[i]
        submit(NNTILE_OP_swiglu_backward, gate.dtype_id, 5, hd, &args, sizeof(args))
