# LayerNorm and RMSNorm over the last axis: one design with two statistics (kernels/norm.inc).
# LayerNorm's stats are each row's (mean, M2): x's shape and tiling without the last axis,
# and an axis of 2 in one tile. RMSNorm's are each row's sum of x**2: x's shape and tiling
# without the last axis. Both submit a statistics task per tile (merged over the row's tiles)
# then a forward task per tile; backward a task per tile that sums each row's terms into
# rowacc and the weights' gradients, then a task per tile for dx, or, where a row is one
# tile, one task per tile for both (backward_whole: each row read once). Every check comes
# first.


cdef struct _Norm:
    int stats, forward, backward_reduce, backward, backward_whole
    bint pair  # LayerNorm's (mean, M2): stats have a last axis of 2


cdef _Norm _LAYERNORM = _Norm(
    stats=NNTILE_OP_layernorm_stats, forward=NNTILE_OP_layernorm_forward,
    backward_reduce=NNTILE_OP_layernorm_backward_reduce, backward=NNTILE_OP_layernorm_backward,
    backward_whole=NNTILE_OP_layernorm_backward_whole, pair=True)
cdef _Norm _RMSNORM = _Norm(
    stats=NNTILE_OP_rmsnorm_stats, forward=NNTILE_OP_rmsnorm_forward,
    backward_reduce=NNTILE_OP_rmsnorm_backward_reduce, backward=NNTILE_OP_rmsnorm_backward,
    backward_whole=NNTILE_OP_rmsnorm_backward_whole, pair=False)


cdef int _check_norm(str op, _Norm n, Tensor x, Tensor stats, list vectors) except -1:
    """x is [..., e] (LayerNorm: at least 1 dimension; RMSNorm: 2), stats as the statistic
    says, vectors fibers along the last axis."""
    if n.pair and x.traits.ndim < 1:
        raise ValueError(f"{op}: x must have at least 1 dimension")
    if not n.pair and x.traits.ndim < 2:
        raise ValueError(f"{op}: x must have at least 2 dimensions [..., embed], got shape "
                         f"{x.traits.shape}")
    cdef Py_ssize_t last = x.traits.ndim - 1
    if n.pair:
        _check_stats(op, x, "x", stats, "stats", last)
    else:
        _check_slice(op, x, "x", stats, "stats", last)
    for t, role in vectors:
        _check_fiber(op, x, "x", t, role, last)
    return 0


cdef int _check_eps(str op, eps) except -1:
    if not eps >= 0:
        raise ValueError(f"{op}: eps={eps} must be >= 0")
    return 0


cdef inline Py_ssize_t _stats_tile(_Norm n, Tensor x, Tensor stats,
                                   const Py_ssize_t *coords) noexcept:
    return _drop_axis_tile(stats.traits, coords, x.traits.ndim, x.traits.ndim - 1, n.pair)


cdef _norm_stats(_Norm n, Tensor x, Tensor stats):
    """One statistics task per tile of x; a row's later tiles merge into its stats."""
    cdef nntile_layernorm_stats_args ln
    cdef nntile_rmsnorm_stats_args rms
    cdef void *args = &rms
    cdef size_t size = sizeof(rms)
    if n.pair:
        args, size = &ln, sizeof(ln)
    cdef starpu_data_handle_t h[2]
    cdef Py_ssize_t coords[MAX_NDIM]
    cdef Py_ssize_t i, last = x.traits.ndim - 1
    for i in range(x.traits.ntiles):
        x.traits.tile_coords(i, coords)
        ln.rows = rms.rows = _rows(x.traits, coords)
        ln.e = rms.e = x.traits.tile_dim(last, coords[last])
        ln.e_offset = coords[last] * x.traits._basetile[last]
        rms.init = coords[last] == 0
        h[BUF_norm_stats_x] = x.handles[i]
        h[BUF_norm_stats_stats] = stats.handles[_stats_tile(n, x, stats, coords)]
        submit(n.stats, stats.dtype_id, 2, h, args, size)


cdef _norm_forward(str op, _Norm n, Tensor x, list weights, eps, Tensor stats, Tensor y):
    """weights: [(gamma, "gamma"), (beta, "beta")] or [(weight, "weight")]."""
    sources = [(x, "x")] + weights + [(stats, "stats")]
    ts = sources + [(y, "y")]
    cdef int column = _column(op, [(y, "y")], sources)
    _check_norm(op, n, x, stats, weights)
    _same_traits(op, x, "x", y, "y")
    _distinct(op, ts)
    _check_eps(op, eps)
    _norm_stats(n, x, stats)
    cdef nntile_norm_forward_args fargs
    cdef starpu_data_handle_t h[5]
    cdef Py_ssize_t coords[MAX_NDIM]
    cdef Py_ssize_t i, k, nw = len(weights), last = x.traits.ndim - 1
    fargs.e_total = x.traits.shape[last]
    fargs.eps = eps
    for i in range(x.traits.ntiles):
        x.traits.tile_coords(i, coords)
        fargs.rows = _rows(x.traits, coords)
        fargs.e = x.traits.tile_dim(last, coords[last])
        # x, stats, the weights, y: LayerNorm's two weights, RMSNorm's one
        h[BUF_layernorm_forward_x] = x.handles[i]
        h[BUF_layernorm_forward_stats] = stats.handles[_stats_tile(n, x, stats, coords)]
        for k in range(nw):
            h[BUF_layernorm_forward_gamma + k] = (<Tensor>weights[k][0]).handles[coords[last]]
        h[BUF_layernorm_forward_gamma + nw] = y.handles[i]
        submit(n.forward, column, 3 + nw, h, &fargs, sizeof(fargs))


cdef _norm_backward(str op, _Norm n, Tensor x, Tensor dy, Tensor stats, Tensor weight, eps,
                    Tensor rowacc, list dweights, beta, Tensor dx):
    """dweights: [(dgamma, "dgamma"), (dbeta, "dbeta")] or [(dweight, "dweight")]."""
    ts = ([(x, "x"), (dy, "dy"), (stats, "stats"), (weight, "weight"), (rowacc, "rowacc")]
          + dweights + [(dx, "dx")])
    _float_same(op, ts)
    _check_norm(op, n, x, stats, [(weight, "weight")] + dweights)
    _same_traits(op, x, "x", dy, "dy")
    _same_traits(op, x, "x", dx, "dx")
    _same_traits(op, stats, "stats", rowacc, "rowacc")
    _distinct(op, ts)
    _check_eps(op, eps)
    if x.traits.grid[x.traits.ndim - 1] == 1:
        _norm_backward_whole(n, x, dy, stats, weight, eps, dweights, beta, dx)
        return
    cdef nntile_norm_backward_reduce_args rargs
    cdef nntile_norm_backward_args bargs
    cdef starpu_data_handle_t h[7]
    cdef Py_ssize_t coords[MAX_NDIM]
    cdef Py_ssize_t i, k, s_lin, nw = len(dweights), last = x.traits.ndim - 1
    rargs.e_total = bargs.e_total = x.traits.shape[last]
    rargs.eps = bargs.eps = eps
    bargs.beta = beta
    for i in range(x.traits.ntiles):
        x.traits.tile_coords(i, coords)
        rargs.rows = _rows(x.traits, coords)
        rargs.e = x.traits.tile_dim(last, coords[last])
        rargs.init = coords[last] == 0
        s_lin = _stats_tile(n, x, stats, coords)
        # the same buffers as backward's but for dx, then the weights' gradients
        h[BUF_layernorm_backward_reduce_x] = x.handles[i]
        h[BUF_layernorm_backward_reduce_dy] = dy.handles[i]
        h[BUF_layernorm_backward_reduce_stats] = stats.handles[s_lin]
        h[BUF_layernorm_backward_reduce_gamma] = weight.handles[coords[last]]
        h[BUF_layernorm_backward_reduce_rowacc] = rowacc.handles[s_lin]
        for k in range(nw):
            h[BUF_layernorm_backward_reduce_dgamma + k] = \
                (<Tensor>dweights[k][0]).handles[coords[last]]
        submit(n.backward_reduce, x.dtype_id, 5 + nw, h, &rargs, sizeof(rargs))
    for i in range(x.traits.ntiles):
        x.traits.tile_coords(i, coords)
        bargs.rows = _rows(x.traits, coords)
        bargs.e = x.traits.tile_dim(last, coords[last])
        s_lin = _stats_tile(n, x, stats, coords)
        h[BUF_norm_backward_x] = x.handles[i]
        h[BUF_norm_backward_dy] = dy.handles[i]
        h[BUF_norm_backward_stats] = stats.handles[s_lin]
        h[BUF_norm_backward_weight] = weight.handles[coords[last]]
        h[BUF_norm_backward_rowacc] = rowacc.handles[s_lin]
        h[BUF_norm_backward_dx] = dx.handles[i]
        submit(n.backward, x.dtype_id, 6, h, &bargs, sizeof(bargs))


cdef _norm_backward_whole(_Norm n, Tensor x, Tensor dy, Tensor stats, Tensor weight, eps,
                          list dweights, beta, Tensor dx):
    """_norm_backward where each row is one tile: a task per tile for dx and the weights'
    gradients (checked by _norm_backward)."""
    cdef nntile_norm_backward_args args
    cdef starpu_data_handle_t h[7]
    cdef Py_ssize_t coords[MAX_NDIM]
    cdef Py_ssize_t i, k, nw = len(dweights), last = x.traits.ndim - 1
    args.e = args.e_total = x.traits.shape[last]
    args.eps = eps
    args.beta = beta
    for i in range(x.traits.ntiles):
        x.traits.tile_coords(i, coords)
        args.rows = _rows(x.traits, coords)
        # x, dy, stats, the weight, its gradients (LayerNorm's two, RMSNorm's one), dx
        h[BUF_layernorm_backward_whole_x] = x.handles[i]
        h[BUF_layernorm_backward_whole_dy] = dy.handles[i]
        h[BUF_layernorm_backward_whole_stats] = stats.handles[_stats_tile(n, x, stats, coords)]
        h[BUF_layernorm_backward_whole_gamma] = weight.handles[0]
        for k in range(nw):
            h[BUF_layernorm_backward_whole_dgamma + k] = (<Tensor>dweights[k][0]).handles[0]
        h[BUF_layernorm_backward_whole_dgamma + nw] = dx.handles[i]
        submit(n.backward_whole, x.dtype_id, 5 + nw, h, &args, sizeof(args))


def layernorm_forward(Tensor x, Tensor gamma, Tensor beta, eps, Tensor stats, Tensor y):
    """y = (x - mean) / sqrt(var + eps) * gamma + beta over the last axis of x.

    stats (shape x.shape[:-1] + (2,), last dimension in one tile) receives (mean, M2) per
    row, M2 being the sum of squared deviations; it is reused by layernorm_backward. y may be
    bf16 where the others are fp32 (the cast to the next GEMM's input fused into the norm).
    """
    _norm_forward("layernorm_forward", _LAYERNORM, x, [(gamma, "gamma"), (beta, "beta")], eps,
                  stats, y)


def layernorm_backward(Tensor x, Tensor dy, Tensor stats, Tensor gamma, eps, Tensor rowacc,
                       Tensor dgamma, Tensor dbeta, beta, Tensor dx):
    """Backward of layernorm_forward over the last axis.

    dgamma += sum over rows of dy * xhat, dbeta += sum over rows of dy (the caller zeroes
    them), dx = (input gradient) + beta * dx. rowacc is a workspace shaped like stats.
    """
    _norm_backward("layernorm_backward", _LAYERNORM, x, dy, stats, gamma, eps, rowacc,
                   [(dgamma, "dgamma"), (dbeta, "dbeta")], beta, dx)


def rmsnorm_forward(Tensor x, Tensor weight, eps, Tensor stats, Tensor y):
    """y = weight * x / sqrt(mean(x**2) + eps) over the last axis of x (transformers'
    LlamaRMSNorm: x normalised in the compute type, rounded to x's dtype, then times the
    weight).

    stats (x's shape and tiling without the last axis) receives each row's sum of x**2,
    reused by rmsnorm_backward. y may be bf16 where x, weight and stats are fp32 (the cast
    to the next GEMM's input fused into the norm).
    """
    _norm_forward("rmsnorm_forward", _RMSNORM, x, [(weight, "weight")], eps, stats, y)


def rmsnorm_backward(Tensor x, Tensor dy, Tensor stats, Tensor weight, eps, Tensor rowacc,
                     Tensor dweight, beta, Tensor dx):
    """Backward of rmsnorm_forward over the last axis, with xhat = x / sqrt(mean(x**2) + eps)
    and g = dy * weight:

    dweight += sum over rows of dy * xhat (the caller zeroes it),
    dx = (g - xhat * mean(g * xhat)) / sqrt(mean(x**2) + eps) + beta * dx.

    stats are those of rmsnorm_forward; rowacc is a workspace shaped like stats.
    """
    _norm_backward("rmsnorm_backward", _RMSNORM, x, dy, stats, weight, eps, rowacc,
                   [(dweight, "dweight")], beta, dx)
