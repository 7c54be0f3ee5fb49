# Neural-network tensor ops (elementwise, fiber/slice reductions and broadcasts, softmax,
# masks, embedding, layer norm, cross entropy, optimizer steps).
#
# Same pattern as ops.pxi: every op validates all its operands first (usable, dtypes,
# shapes, tilings, axis), then loops over tiles and submits one task per tile piece.
# Kernels view a tile in "axis layout [m, k, n]" (k = the tile's extent along the axis,
# m = product of the tile's extents before it, n = after it); a slice tile is the tile
# with the axis removed, a fiber tile is the 1-D piece along the axis.


# ---- validation helpers --------------------------------------------------------------------

cdef Py_ssize_t _norm_axis(str op, object axis, Py_ssize_t ndim) except -1:
    if isinstance(axis, bool) or not hasattr(axis, "__index__"):
        raise TypeError(f"{op}: axis must be an integer, got {axis!r}")
    cdef Py_ssize_t a = int(axis)
    if ndim == 0:
        raise ValueError(f"{op}: axis={axis} is out of range for a 0-dimensional tensor")
    if a < -ndim or a >= ndim:
        raise ValueError(f"{op}: axis={axis} is out of range for a tensor of {ndim} "
                         f"dimensions (valid: {-ndim} .. {ndim - 1})")
    return a + ndim if a < 0 else a


cdef int _float_same(str op, list tensors) except -1:
    """All (tensor, role) pairs usable, floating-point and of one dtype."""
    cdef Tensor first = None
    cdef str first_role = None
    for t, role in tensors:
        _usable(t, role)
    for t, role in tensors:
        _float_dtype(op, t, role)
        if first is None:
            first = t
            first_role = role
        else:
            _same_dtype(op, first, first_role, t, role)
    return 0


cdef int _int64(str op, Tensor t, str role) except -1:
    if t.dtype != "int64":
        raise TypeError(f"{op}: {role} must be an int64 tensor, got {t.dtype}")
    return 0


cdef int _distinct(str op, list tensors) except -1:
    """Kernels require buffers that never alias: reject one tensor passed in two roles."""
    cdef Py_ssize_t i, j
    for i in range(len(tensors)):
        for j in range(i + 1, len(tensors)):
            if tensors[i][0] is tensors[j][0]:
                raise ValueError(f"{op}: {tensors[i][1]} and {tensors[j][1]} are the same "
                                 "tensor; they must be distinct")
    return 0


cdef int _expect_traits(str op, Tensor t, str role, tuple shape, tuple basetile,
                        str what) except -1:
    """t must have exactly this shape and tiling (``what`` says where they come from)."""
    if t.traits.shape != shape:
        raise ValueError(f"{op}: {role} has shape {t.traits.shape} but must have shape "
                         f"{shape} ({what})")
    if t.traits.basetile != basetile:
        raise ValueError(f"{op}: {role} is tiled {t.traits.basetile} but must be tiled "
                         f"{basetile} ({what}); tilings must match")
    return 0


cdef int _check_slice(str op, Tensor big, str brole, Tensor sl, str srole,
                      Py_ssize_t axis) except -1:
    shape = big.traits.shape[:axis] + big.traits.shape[axis + 1:]
    tiles = big.traits.basetile[:axis] + big.traits.basetile[axis + 1:]
    return _expect_traits(op, sl, srole, shape, tiles, f"{brole} without axis {axis}")


cdef int _check_fiber(str op, Tensor big, str brole, Tensor fiber, str frole,
                      Py_ssize_t axis) except -1:
    return _expect_traits(op, fiber, frole, (big.traits.shape[axis],),
                          (big.traits.basetile[axis],), f"axis {axis} of {brole}")


cdef int _check_stats(str op, Tensor big, str brole, Tensor stats, str srole,
                      Py_ssize_t axis) except -1:
    """stats: big's shape without axis, plus a last dimension of 2 held in one tile."""
    shape = big.traits.shape[:axis] + big.traits.shape[axis + 1:] + (2,)
    tiles = big.traits.basetile[:axis] + big.traits.basetile[axis + 1:] + (2,)
    return _expect_traits(op, stats, srole, shape, tiles,
                          f"{brole} without axis {axis}, plus a last dimension of 2 in one tile")


cdef int _check_scalar(str op, Tensor t, str role) except -1:
    if t.traits.size != 1:
        raise ValueError(f"{op}: {role} must hold exactly one element, got shape "
                         f"{t.traits.shape}")
    return 0


cdef inline void _mkn(TensorTraits t, const Py_ssize_t *coords, Py_ssize_t axis,
                      Py_ssize_t *m, Py_ssize_t *k, Py_ssize_t *n) noexcept:
    cdef Py_ssize_t d
    m[0] = 1
    n[0] = 1
    for d in range(axis):
        m[0] *= t.tile_dim(d, coords[d])
    k[0] = t.tile_dim(axis, coords[axis])
    for d in range(axis + 1, t.ndim):
        n[0] *= t.tile_dim(d, coords[d])


cdef inline Py_ssize_t _drop_axis_tile(TensorTraits small, const Py_ssize_t *coords,
                                       Py_ssize_t ndim, Py_ssize_t axis,
                                       bint append_zero) noexcept:
    """Linear index in ``small`` of the tile at ``coords`` with ``axis`` removed
    (and a trailing 0 coordinate appended for stats tensors)."""
    cdef Py_ssize_t buf[MAX_NDIM + 1]
    cdef Py_ssize_t d, j = 0
    for d in range(ndim):
        if d != axis:
            buf[j] = coords[d]
            j += 1
    if append_zero:
        buf[j] = 0
    return small.tile_linear(buf)


cdef inline bint _others_zero(const Py_ssize_t *coords, Py_ssize_t ndim,
                              Py_ssize_t axis) noexcept:
    cdef Py_ssize_t d
    for d in range(ndim):
        if d != axis and coords[d] != 0:
            return False
    return True


# ---- elementwise ---------------------------------------------------------------------------

def prod(alpha, Tensor src1, Tensor src2, Tensor dst):
    """dst = alpha * src1 * src2 (elementwise)."""
    ts = [(src1, "src1"), (src2, "src2"), (dst, "dst")]
    _float_same("prod", ts)
    _same_traits("prod", src1, "src1", dst, "dst")
    _same_traits("prod", src2, "src2", dst, "dst")
    _distinct("prod", [(src1, "src1"), (dst, "dst")])
    _distinct("prod", [(src2, "src2"), (dst, "dst")])
    cdef nntile_prod_args args
    cdef starpu_data_handle_t h[3]
    args.alpha = alpha
    cdef Py_ssize_t i
    for i in range(dst.traits.ntiles):
        args.n = _tile_nelems(dst, i)
        h[BUF_prod_src1] = src1.handles[i]
        h[BUF_prod_src2] = src2.handles[i]
        h[BUF_prod_dst] = dst.handles[i]
        submit(NNTILE_OP_prod, dst.dtype_id, 3, h, &args, sizeof(args))


cdef _unary(str name, int op, Tensor src, Tensor dst):
    _float_same(name, [(src, "src"), (dst, "dst")])
    _same_traits(name, src, "src", dst, "dst")
    _distinct(name, [(src, "src"), (dst, "dst")])
    cdef nntile_gelu_args args  # every activation's args are {n} (NNTILE_ACT_ARGS)
    cdef starpu_data_handle_t h[2]
    cdef Py_ssize_t i
    for i in range(dst.traits.ntiles):
        args.n = _tile_nelems(dst, i)
        h[BUF_act_src] = src.handles[i]
        h[BUF_act_dst] = dst.handles[i]
        submit(op, dst.dtype_id, 2, h, &args, sizeof(args))


cdef _unary_backward(str name, int op, Tensor x, Tensor dy, beta, Tensor dx):
    _float_same(name, [(x, "x"), (dy, "dy"), (dx, "dx")])
    _same_traits(name, x, "x", dx, "dx")
    _same_traits(name, dy, "dy", dx, "dx")
    _distinct(name, [(x, "x"), (dx, "dx")])
    _distinct(name, [(dy, "dy"), (dx, "dx")])
    cdef nntile_gelu_backward_args args  # every activation's backward: {n, beta}
    cdef starpu_data_handle_t h[3]
    args.beta = beta
    cdef Py_ssize_t i
    for i in range(dx.traits.ntiles):
        args.n = _tile_nelems(dx, i)
        h[BUF_act_backward_x] = x.handles[i]
        h[BUF_act_backward_dy] = dy.handles[i]
        h[BUF_act_backward_dx] = dx.handles[i]
        submit(op, dx.dtype_id, 3, h, &args, sizeof(args))


# The tensor ops of the op table's activations (gelu, gelutanh, silu, ...: def act(Tensor
# src, Tensor dst) calling _unary, def act_backward(x, dy, beta, dx) calling
# _unary_backward), written by setup.py from kernels.h.
include "activations.pxi"


# ---- fibers: 1-D tensors along one axis ------------------------------------------------------

def add_fiber(alpha, Tensor fiber, beta, Tensor dst, axis):
    """dst[..., j, ...] = alpha * fiber[j] + beta * dst[..., j, ...] (j along ``axis``)."""
    cdef int column = _column("add_fiber", [(dst, "dst")], [(fiber, "fiber")])
    cdef Py_ssize_t ax = _norm_axis("add_fiber", axis, dst.traits.ndim)
    _check_fiber("add_fiber", dst, "dst", fiber, "fiber", ax)
    _distinct("add_fiber", [(fiber, "fiber"), (dst, "dst")])
    cdef nntile_add_fiber_args args
    cdef starpu_data_handle_t h[2]
    cdef Py_ssize_t coords[MAX_NDIM]
    cdef Py_ssize_t i, mm, kk, nn
    args.alpha = alpha
    args.beta = beta
    for i in range(dst.traits.ntiles):
        dst.traits.tile_coords(i, coords)
        _mkn(dst.traits, coords, ax, &mm, &kk, &nn)
        args.m = mm
        args.k = kk
        args.n = nn
        h[BUF_add_fiber_fiber] = fiber.handles[coords[ax]]
        h[BUF_add_fiber_dst] = dst.handles[i]
        submit(NNTILE_OP_add_fiber, column, 2, h, &args, sizeof(args))


def prod_fiber(alpha, Tensor fiber, Tensor dst, axis):
    """dst[..., j, ...] *= alpha * fiber[j] (j along ``axis``)."""
    cdef int column = _column("prod_fiber", [(dst, "dst")], [(fiber, "fiber")])
    cdef Py_ssize_t ax = _norm_axis("prod_fiber", axis, dst.traits.ndim)
    _check_fiber("prod_fiber", dst, "dst", fiber, "fiber", ax)
    _distinct("prod_fiber", [(fiber, "fiber"), (dst, "dst")])
    cdef nntile_prod_fiber_args args
    cdef starpu_data_handle_t h[2]
    cdef Py_ssize_t coords[MAX_NDIM]
    cdef Py_ssize_t i, mm, kk, nn
    args.alpha = alpha
    for i in range(dst.traits.ntiles):
        dst.traits.tile_coords(i, coords)
        _mkn(dst.traits, coords, ax, &mm, &kk, &nn)
        args.m = mm
        args.k = kk
        args.n = nn
        h[BUF_prod_fiber_fiber] = fiber.handles[coords[ax]]
        h[BUF_prod_fiber_dst] = dst.handles[i]
        submit(NNTILE_OP_prod_fiber, column, 2, h, &args, sizeof(args))


cdef _fiber_reduce(str name, int op, alpha, Tensor src1, Tensor src2, beta, Tensor fiber,
                   axis):
    ts = [(src1, "src1" if src2 is not None else "src")]
    if src2 is not None:
        ts.append((src2, "src2"))
    cdef int column = _column(name, ts, [(fiber, "fiber")])
    ts.append((fiber, "fiber"))
    cdef Py_ssize_t ax = _norm_axis(name, axis, src1.traits.ndim)
    if src2 is not None:
        _same_traits(name, src1, "src1", src2, "src2")
    _check_fiber(name, src1, ts[0][1], fiber, "fiber", ax)
    _distinct(name, ts)
    # nntile_sum_fiber_args and nntile_sumprod_fiber_args share one layout.
    cdef nntile_sumprod_fiber_args args
    cdef starpu_data_handle_t h[3]
    cdef Py_ssize_t coords[MAX_NDIM]
    cdef Py_ssize_t i, mm, kk, nn
    cdef int nbuf = 3 if src2 is not None else 2
    cdef double beta_value = beta
    args.alpha = alpha
    for i in range(src1.traits.ntiles):
        src1.traits.tile_coords(i, coords)
        _mkn(src1.traits, coords, ax, &mm, &kk, &nn)
        args.m = mm
        args.k = kk
        args.n = nn
        # The first tile (in submission order) sharing this fiber tile applies the user's
        # beta; later ones accumulate onto it.
        args.beta = beta_value if _others_zero(coords, src1.traits.ndim, ax) else 1.0
        if src2 is None:
            h[BUF_sum_fiber_src] = src1.handles[i]
            h[BUF_sum_fiber_fiber] = fiber.handles[coords[ax]]
        else:
            h[BUF_sumprod_fiber_src1] = src1.handles[i]
            h[BUF_sumprod_fiber_src2] = src2.handles[i]
            h[BUF_sumprod_fiber_fiber] = fiber.handles[coords[ax]]
        submit(op, column, nbuf, h, &args, sizeof(args))


def sum_fiber(alpha, Tensor src, beta, Tensor fiber, axis):
    """fiber[j] = alpha * (sum of src over every axis but ``axis``) + beta * fiber[j]."""
    _fiber_reduce("sum_fiber", NNTILE_OP_sum_fiber, alpha, src, None, beta, fiber, axis)


def sumprod_fiber(alpha, Tensor src1, Tensor src2, beta, Tensor fiber, axis):
    """fiber[j] = alpha * (sum of src1*src2 over every axis but ``axis``) + beta * fiber[j]."""
    if src2 is None:
        raise TypeError("sumprod_fiber: src2 must be an nntile.Tensor, got None")
    _fiber_reduce("sumprod_fiber", NNTILE_OP_sumprod_fiber, alpha, src1, src2, beta, fiber,
                  axis)


# ---- slices: tensors with one axis removed ------------------------------------------------

cdef _slice_reduce(str name, int op, alpha, Tensor src1, Tensor src2, beta, Tensor dst, axis):
    ts = [(src1, "src1" if src2 is not None else "src")]
    if src2 is not None:
        ts.append((src2, "src2"))
    cdef int column = _column(name, ts, [(dst, "dst")])
    ts.append((dst, "dst"))
    cdef Py_ssize_t ax = _norm_axis(name, axis, src1.traits.ndim)
    if src2 is not None:
        _same_traits(name, src1, "src1", src2, "src2")
    _check_slice(name, src1, ts[0][1], dst, "dst", ax)
    _distinct(name, ts)
    # nntile_sum_slice_args and nntile_sumprod_slice_args share one layout.
    cdef nntile_sumprod_slice_args args
    cdef starpu_data_handle_t h[3]
    cdef starpu_data_handle_t out
    cdef Py_ssize_t coords[MAX_NDIM]
    cdef Py_ssize_t i, mm, kk, nn
    cdef int nbuf = 3 if src2 is not None else 2
    cdef double beta_value = beta
    args.alpha = alpha
    for i in range(src1.traits.ntiles):
        src1.traits.tile_coords(i, coords)
        _mkn(src1.traits, coords, ax, &mm, &kk, &nn)
        args.m = mm
        args.k = kk
        args.n = nn
        args.beta = beta_value if coords[ax] == 0 else 1.0
        out = dst.handles[_drop_axis_tile(dst.traits, coords, src1.traits.ndim, ax, False)]
        if src2 is None:
            h[BUF_sum_slice_src] = src1.handles[i]
            h[BUF_sum_slice_dst] = out
        else:
            h[BUF_sumprod_slice_src1] = src1.handles[i]
            h[BUF_sumprod_slice_src2] = src2.handles[i]
            h[BUF_sumprod_slice_dst] = out
        submit(op, column, nbuf, h, &args, sizeof(args))


def sum_slice(alpha, Tensor src, beta, Tensor dst, axis):
    """dst = alpha * src.sum(axis) + beta * dst."""
    _slice_reduce("sum_slice", NNTILE_OP_sum_slice, alpha, src, None, beta, dst, axis)


def sumprod_slice(alpha, Tensor src1, Tensor src2, beta, Tensor dst, axis):
    """dst = alpha * (src1*src2).sum(axis) + beta * dst."""
    if src2 is None:
        raise TypeError("sumprod_slice: src2 must be an nntile.Tensor, got None")
    _slice_reduce("sumprod_slice", NNTILE_OP_sumprod_slice, alpha, src1, src2, beta, dst,
                  axis)


cdef _slice_broadcast(str name, int op, alpha, Tensor src, beta, Tensor dst, axis,
                      bint has_beta):
    cdef int column = _column(name, [(dst, "dst")], [(src, "src")])
    cdef Py_ssize_t ax = _norm_axis(name, axis, dst.traits.ndim)
    _check_slice(name, dst, "dst", src, "src", ax)
    _distinct(name, [(src, "src"), (dst, "dst")])
    cdef nntile_add_slice_args args
    cdef nntile_prod_slice_args pargs
    cdef starpu_data_handle_t h[2]
    cdef Py_ssize_t coords[MAX_NDIM]
    cdef Py_ssize_t i, mm, kk, nn
    if has_beta:
        args.alpha = alpha
        args.beta = beta
    else:
        pargs.alpha = alpha
    for i in range(dst.traits.ntiles):
        dst.traits.tile_coords(i, coords)
        _mkn(dst.traits, coords, ax, &mm, &kk, &nn)
        # add_slice's and prod_slice's buffers are (src, dst)
        h[BUF_add_slice_src] = src.handles[_drop_axis_tile(src.traits, coords, dst.traits.ndim,
                                                           ax, False)]
        h[BUF_add_slice_dst] = dst.handles[i]
        if has_beta:
            args.m = mm
            args.k = kk
            args.n = nn
            submit(op, column, 2, h, &args, sizeof(args))
        else:
            pargs.m = mm
            pargs.k = kk
            pargs.n = nn
            submit(op, column, 2, h, &pargs, sizeof(pargs))


def add_slice(alpha, Tensor src, beta, Tensor dst, axis):
    """dst = alpha * expand_dims(src, axis) + beta * dst (src is dst without ``axis``)."""
    _slice_broadcast("add_slice", NNTILE_OP_add_slice, alpha, src, beta, dst, axis, True)


def prod_slice(alpha, Tensor src, Tensor dst, axis):
    """dst *= alpha * expand_dims(src, axis) (src is dst without ``axis``)."""
    _slice_broadcast("prod_slice", NNTILE_OP_prod_slice, alpha, src, 0.0, dst, axis, False)


# ---- softmax family ------------------------------------------------------------------------

def maxsumexp(Tensor src, Tensor stats, axis):
    """stats[..., 0] = max of src along ``axis``, stats[..., 1] = sum of exp(src - max).

    stats has src's shape without ``axis`` plus a last dimension of 2 (in one tile); the
    running (max, sumexp) pair is merged over the tiles along the axis. stats may be fp32
    where src is bf16.
    """
    cdef int column = _column("maxsumexp", [(src, "src")], [(stats, "stats")])
    cdef Py_ssize_t ax = _norm_axis("maxsumexp", axis, src.traits.ndim)
    _check_stats("maxsumexp", src, "src", stats, "stats", ax)
    _maxsumexp(column, src, stats, ax)


cdef _maxsumexp(int column, Tensor src, Tensor stats, Py_ssize_t ax):
    cdef nntile_maxsumexp_args args
    cdef starpu_data_handle_t h[2]
    cdef Py_ssize_t coords[MAX_NDIM]
    cdef Py_ssize_t i, mm, kk, nn
    for i in range(src.traits.ntiles):
        src.traits.tile_coords(i, coords)
        _mkn(src.traits, coords, ax, &mm, &kk, &nn)
        args.m = mm
        args.k = kk
        args.n = nn
        args.init = 1 if coords[ax] == 0 else 0
        h[BUF_maxsumexp_src] = src.handles[i]
        h[BUF_maxsumexp_stats] = stats.handles[_drop_axis_tile(stats.traits, coords,
                                                                src.traits.ndim, ax, True)]
        submit(NNTILE_OP_maxsumexp, column, 2, h, &args, sizeof(args))


def softmax_inplace(Tensor stats, Tensor dst, axis):
    """dst = exp(dst - max) / sumexp along ``axis``, with stats from maxsumexp."""
    cdef int column = _column("softmax_inplace", [(dst, "dst")], [(stats, "stats")])
    cdef Py_ssize_t ax = _norm_axis("softmax_inplace", axis, dst.traits.ndim)
    _check_stats("softmax_inplace", dst, "dst", stats, "stats", ax)
    cdef nntile_softmax_inplace_args args
    cdef starpu_data_handle_t h[2]
    cdef Py_ssize_t coords[MAX_NDIM]
    cdef Py_ssize_t i, mm, kk, nn
    for i in range(dst.traits.ntiles):
        dst.traits.tile_coords(i, coords)
        _mkn(dst.traits, coords, ax, &mm, &kk, &nn)
        args.m = mm
        args.k = kk
        args.n = nn
        h[BUF_softmax_inplace_stats] = stats.handles[_drop_axis_tile(stats.traits, coords,
                                                                      dst.traits.ndim, ax, True)]
        h[BUF_softmax_inplace_dst] = dst.handles[i]
        submit(NNTILE_OP_softmax_inplace, column, 2, h, &args, sizeof(args))


def softmax_backward(alpha, Tensor p, Tensor sums, Tensor dp, axis):
    """dp = alpha * p * (dp - sums), sums = (p*dp).sum(axis) (from sumprod_slice)."""
    cdef int column = _column("softmax_backward", [(p, "p"), (dp, "dp")], [(sums, "sums")])
    cdef Py_ssize_t ax = _norm_axis("softmax_backward", axis, dp.traits.ndim)
    _same_traits("softmax_backward", p, "p", dp, "dp")
    _check_slice("softmax_backward", dp, "dp", sums, "sums", ax)
    _distinct("softmax_backward", [(p, "p"), (dp, "dp")])
    cdef nntile_softmax_backward_args args
    cdef starpu_data_handle_t h[3]
    cdef Py_ssize_t coords[MAX_NDIM]
    cdef Py_ssize_t i, mm, kk, nn
    args.alpha = alpha
    for i in range(dp.traits.ntiles):
        dp.traits.tile_coords(i, coords)
        _mkn(dp.traits, coords, ax, &mm, &kk, &nn)
        args.m = mm
        args.k = kk
        args.n = nn
        h[BUF_softmax_backward_p] = p.handles[i]
        h[BUF_softmax_backward_sums] = sums.handles[_drop_axis_tile(sums.traits, coords,
                                                                     dp.traits.ndim, ax, False)]
        h[BUF_softmax_backward_dp] = dp.handles[i]
        submit(NNTILE_OP_softmax_backward, column, 3, h, &args, sizeof(args))


def logsumexp(Tensor stats, Tensor dst):
    """dst = max + log(sumexp) from stats [..., 2] (stats' last dimension in one tile)."""
    _float_same("logsumexp", [(stats, "stats"), (dst, "dst")])
    _check_lse(stats, dst, "logsumexp")
    _logsumexp(stats, dst)


cdef int _check_lse(Tensor stats, Tensor dst, str op) except -1:
    return _expect_traits(op, stats, "stats", dst.traits.shape + (2,),
                          dst.traits.basetile + (2,),
                          "dst's shape plus a last dimension of 2 in one tile")


cdef _logsumexp(Tensor stats, Tensor dst):
    cdef nntile_logsumexp_args args
    cdef starpu_data_handle_t h[2]
    cdef Py_ssize_t i
    for i in range(dst.traits.ntiles):
        args.n = _tile_nelems(dst, i)
        # stats' tile grid is dst's grid with a trailing dimension of one tile.
        h[BUF_logsumexp_stats] = stats.handles[i]
        h[BUF_logsumexp_dst] = dst.handles[i]
        submit(NNTILE_OP_logsumexp, dst.dtype_id, 2, h, &args, sizeof(args))


# ---- embedding -----------------------------------------------------------------------------

cdef int _check_embedding(str op, Tensor ids, Tensor table, str trole, Tensor dst,
                          str drole) except -1:
    _usable(ids, "ids")
    _float_same(op, [(table, trole), (dst, drole)])
    _int64(op, ids, "ids")
    if table.traits.ndim != 2:
        raise ValueError(f"{op}: {trole} must have 2 dimensions [vocab, embed], got shape "
                         f"{table.traits.shape}")
    _expect_traits(op, dst, drole, ids.traits.shape + (table.traits.shape[1],),
                   ids.traits.basetile + (table.traits.basetile[1],),
                   f"ids' shape and tiling plus those of {trole}'s embedding dimension")
    _distinct(op, [(table, trole), (dst, drole)])
    return 0


cdef _embedding(int op, Tensor ids, Tensor table, Tensor big, bint backward):
    # nntile_embedding_args and nntile_embedding_backward_args share one layout.
    cdef nntile_embedding_args args
    cdef starpu_data_handle_t h[3]
    cdef Py_ssize_t coords[MAX_NDIM]
    cdef Py_ssize_t tcoords[2]
    cdef Py_ssize_t i, vt, nd = big.traits.ndim
    for i in range(big.traits.ntiles):
        big.traits.tile_coords(i, coords)
        args.e = big.traits.tile_dim(nd - 1, coords[nd - 1])
        args.rows = ids.traits.tile_nelems_c(coords)
        h[BUF_embedding_ids] = ids.handles[ids.traits.tile_linear(coords)]  # both ops' first
        tcoords[1] = coords[nd - 1]
        for vt in range(table.traits._grid[0]):
            tcoords[0] = vt
            args.v_offset = vt * table.traits._basetile[0]
            args.v = table.traits.tile_dim(0, vt)
            if backward:
                h[BUF_embedding_backward_dy] = big.handles[i]
                h[BUF_embedding_backward_dtable] = table.handles[table.traits.tile_linear(tcoords)]
            else:
                h[BUF_embedding_table] = table.handles[table.traits.tile_linear(tcoords)]
                h[BUF_embedding_dst] = big.handles[i]
            submit(op, big.dtype_id, 3, h, &args, sizeof(args))


def embedding(Tensor ids, Tensor table, Tensor dst):
    """dst[..., :] += table[ids[...], :]; ids int64 of shape S, table [V, E], dst S + [E].

    dst accumulates: the caller clears or initialises it first. Ids outside [0, V) add
    nothing.
    """
    _check_embedding("embedding", ids, table, "table", dst, "dst")
    _embedding(NNTILE_OP_embedding, ids, table, dst, False)


def embedding_backward(Tensor ids, Tensor dy, Tensor dtable):
    """dtable[ids[...], :] += dy[..., :] (accumulates; the caller zeroes dtable first)."""
    _check_embedding("embedding_backward", ids, dtable, "dtable", dy, "dy")
    _embedding(NNTILE_OP_embedding_backward, ids, dtable, dy, True)


# ---- the rows of a tile: the product of its dimensions but the last -------------------

cdef inline Py_ssize_t _rows(TensorTraits t, const Py_ssize_t *coords) noexcept:
    cdef Py_ssize_t d, r = 1
    for d in range(t.ndim - 1):
        r *= t.tile_dim(d, coords[d])
    return r


# ---- cross entropy over the last axis ------------------------------------------------------

cdef Py_ssize_t _check_xent(str op, Tensor logits, Tensor labels, Tensor stats) except -1:
    _usable(labels, "labels")
    _int64(op, labels, "labels")
    if logits.traits.ndim < 1:
        raise ValueError(f"{op}: logits must have at least 1 dimension [..., vocab]")
    cdef Py_ssize_t last = logits.traits.ndim - 1
    _expect_traits(op, labels, "labels", logits.traits.shape[:last],
                   logits.traits.basetile[:last], "logits without the vocabulary axis")
    _check_stats(op, logits, "logits", stats, "stats", last)
    return last


def cross_entropy(Tensor logits, Tensor labels, Tensor stats, Tensor lse, Tensor picked,
                  Tensor loss, scale=1.0):
    """loss = scale * sum over rows of (logsumexp(logits[row]) - logits[row, labels[row]]).

    logits [..., V], labels int64 [...], stats [..., 2], lse and picked [...] are
    workspaces (stats is reused by cross_entropy_backward); loss holds one element and is
    overwritten.
    """
    ts = [(logits, "logits"), (stats, "stats"), (lse, "lse"), (picked, "picked"),
          (loss, "loss")]
    # stats, lse, picked and loss are accumulators: fp32 where the logits are bf16
    cdef int column = _column("cross_entropy", ts[:1], ts[1:])
    cdef Py_ssize_t last = _check_xent("cross_entropy", logits, labels, stats)
    _expect_traits("cross_entropy", lse, "lse", labels.traits.shape, labels.traits.basetile,
                   "the shape and tiling of labels")
    _expect_traits("cross_entropy", picked, "picked", labels.traits.shape,
                   labels.traits.basetile, "the shape and tiling of labels")
    _check_scalar("cross_entropy", loss, "loss")
    _distinct("cross_entropy", ts)
    cdef nntile_xent_picked_args pargs
    cdef nntile_xent_loss_args largs
    cdef starpu_data_handle_t h[3]
    cdef Py_ssize_t coords[MAX_NDIM]
    cdef Py_ssize_t i, r_lin
    # Row statistics (max, sumexp) over the vocabulary tiles, then lse = max + log(sumexp).
    _maxsumexp(column, logits, stats, last)
    _logsumexp(stats, lse)
    # picked[row] = logits[row, label]: each vocabulary tile writes the rows whose label
    # it holds. The first vocabulary tile opens the picked tile write-only (StarPU refuses
    # to read a never-written tile); later ones keep what earlier ones wrote (RW). Rows
    # whose label is outside [0, V) are left undefined.
    for i in range(logits.traits.ntiles):
        logits.traits.tile_coords(i, coords)
        pargs.rows = _rows(logits.traits, coords)
        pargs.v = logits.traits.tile_dim(last, coords[last])
        pargs.v_offset = coords[last] * logits.traits._basetile[last]
        r_lin = labels.traits.tile_linear(coords)
        h[BUF_xent_picked_logits] = logits.handles[i]
        h[BUF_xent_picked_labels] = labels.handles[r_lin]
        h[BUF_xent_picked_picked] = picked.handles[r_lin]
        submit(NNTILE_OP_xent_picked, column, 3, h, &pargs, sizeof(pargs))
    # loss = scale * sum (lse - picked), accumulated over the row tiles.
    largs.alpha = scale
    for i in range(lse.traits.ntiles):
        largs.rows = _tile_nelems(lse, i)
        largs.beta = 0.0 if i == 0 else 1.0
        h[BUF_xent_loss_lse] = lse.handles[i]
        h[BUF_xent_loss_picked] = picked.handles[i]
        h[BUF_xent_loss_loss] = loss.handles[0]
        submit(NNTILE_OP_xent_loss, loss.dtype_id, 3, h, &largs, sizeof(largs))


def cross_entropy_backward(Tensor logits, Tensor labels, Tensor stats, scale=1.0):
    """logits = scale * (softmax(logits) - onehot(labels)) in place, using the stats that
    cross_entropy computed from these logits."""
    cdef int column = _column("cross_entropy_backward", [(logits, "logits")],
                              [(stats, "stats")])
    cdef Py_ssize_t last = _check_xent("cross_entropy_backward", logits, labels, stats)
    cdef nntile_xent_grad_inplace_args args
    cdef starpu_data_handle_t h[3]
    cdef Py_ssize_t coords[MAX_NDIM]
    cdef Py_ssize_t i, r_lin
    args.alpha = scale
    for i in range(logits.traits.ntiles):
        logits.traits.tile_coords(i, coords)
        args.rows = _rows(logits.traits, coords)
        args.v = logits.traits.tile_dim(last, coords[last])
        args.v_offset = coords[last] * logits.traits._basetile[last]
        r_lin = labels.traits.tile_linear(coords)
        h[BUF_xent_grad_inplace_stats] = stats.handles[
            _drop_axis_tile(stats.traits, coords, logits.traits.ndim, last, True)]
        h[BUF_xent_grad_inplace_labels] = labels.handles[r_lin]
        h[BUF_xent_grad_inplace_logits] = logits.handles[i]
        submit(NNTILE_OP_xent_grad_inplace, column, 3, h, &args, sizeof(args))


# ---- norms and optimizer steps -------------------------------------------------------------

def _sumsq_partials(Tensor src, Tensor dst):
    """For sumsq: the partial of dst each src tile goes to (None: dst is one number)."""
    if dst.traits.ntiles == 1:
        _check_scalar("sumsq", dst, "dst")
        return None
    if dst.traits.size == dst.traits.ntiles:
        if dst.owners is not None and tuple(dst.owners) == tuple(range(_mpi_size)):
            return src.owners
        if dst.homes == list(range(dst.traits.ntiles)):
            return src.homes
    raise ValueError("sumsq: dst must hold one element, or one one-element tile per rank owned "
                     f"by that rank, or per CUDA device at home there (got {dst!r})")


def sumsq(Tensor src, beta, Tensor dst, tiles=None):
    """dst = sum of src**2 + beta * dst; dst holds one element (chain tensors with beta=1).
    ``tiles``: the linear indices of the src tiles summed (default all).

    dst may instead hold one one-element partial per rank (under StarPU-MPI, tile r owned by
    rank r) or per device (tile d at home on CUDA device d, Tensor.set_homes): the squares of
    each src tile go into the partial of its owner or home, so no src tile leaves its rank or
    device, and the devices sum at once (sum the partials afterwards, e.g. with sum_slice)."""
    _float_same("sumsq", [(src, "src"), (dst, "dst")])
    _distinct("sumsq", [(src, "src"), (dst, "dst")])
    partials = _sumsq_partials(src, dst)
    if partials is not None and beta != 0 and beta != 1:
        raise ValueError(f"sumsq: with partials, beta must be 0 or 1, got {beta}")
    cdef nntile_sumsq_args args
    cdef nntile_fill_args fill_args
    cdef starpu_data_handle_t h[2]
    cdef double beta_value = beta
    cdef Py_ssize_t i, target
    started = [False] * dst.traits.ntiles
    for i in _tile_range(src, tiles):
        target = partials[i] if partials is not None and partials[i] is not None else 0
        args.n = _tile_nelems(src, i)
        args.beta = 1.0 if started[target] else beta_value
        started[target] = True
        h[BUF_sumsq_src] = src.handles[i]
        h[BUF_sumsq_dst] = dst.handles[target]
        submit(NNTILE_OP_sumsq, dst.dtype_id, 2, h, &args, sizeof(args))
    # a rank or device with no tile of src still has to reset its partial
    fill_args.value = 0.0
    fill_args.n = 1
    for i in range(dst.traits.ntiles):
        if beta_value == 0 and not started[i]:
            h[BUF_fill_dst] = dst.handles[i]
            submit(NNTILE_OP_fill, dst.dtype_id, 1, h, &fill_args, sizeof(fill_args))


cdef int _check_optim(str op, list state, Tensor normsq, max_norm, step) except -1:
    """state: [(p, "p"), (g, "g"), ...] all of p's traits and dtype."""
    ts = list(state)
    if normsq is not None:
        ts.append((normsq, "normsq"))
    _float_same(op, ts)
    cdef Tensor p = state[0][0]
    for t, role in state[1:]:
        _same_traits(op, p, "p", t, role)
    if normsq is not None:
        _check_scalar(op, normsq, "normsq")
    _distinct(op, ts)
    if isinstance(step, bool) or not hasattr(step, "__index__"):
        raise TypeError(f"{op}: step must be an integer, got {step!r}")
    if step < 1:
        raise ValueError(f"{op}: step={step} must be >= 1 (the first step is 1)")
    if not max_norm >= 0:
        raise ValueError(f"{op}: max_norm={max_norm} must be >= 0 (0 disables clipping)")
    return 0


def adam_step(step, lr, beta1, beta2, eps, weight_decay, decoupled, Tensor p, Tensor g,
              Tensor m, Tensor v, Tensor normsq=None, max_norm=0.0, Tensor copy=None,
              tiles=None):
    """One Adam (decoupled=False) or AdamW (decoupled=True) step, as torch.optim.

    m and v are the moment buffers (zero before step 1). With normsq (one element holding
    the squared global gradient norm) and max_norm > 0, gradients are first clipped as
    torch.nn.utils.clip_grad_norm_ does. ``copy`` (bf16, of an fp32 p) receives the updated
    parameter in the same task: mixed precision's compute copy, refreshed without reading
    the master again. ``tiles``: the linear indices of the tiles updated (default all; the
    others' m and v are neither read nor written).
    """
    _check_optim("adam_step", [(p, "p"), (g, "g"), (m, "m"), (v, "v")], normsq, max_norm,
                 step)
    cdef int op = NNTILE_OP_adam_step, column = p.dtype_id
    if copy is not None:
        op = NNTILE_OP_adam_step_refresh
        column = _column("adam_step", [(copy, "copy")], [(p, "p")])
        _same_traits("adam_step", p, "p", copy, "copy")
    cdef nntile_adam_step_args args
    cdef starpu_data_handle_t h[6]
    args.step = step
    args.lr = lr
    args.beta1 = beta1
    args.beta2 = beta2
    args.eps = eps
    args.weight_decay = weight_decay
    args.decoupled = 1 if decoupled else 0
    args.max_norm = max_norm
    # p, g, m, v (adam_step_refresh's are adam_step's), then the copy (if any) and normsq
    # (if any)
    cdef int ncopy = 1 if copy is not None else 0
    cdef int nbuf = 4 + ncopy + (1 if normsq is not None else 0)
    cdef Py_ssize_t i
    for i in _tile_range(p, tiles):
        args.n = _tile_nelems(p, i)
        h[BUF_adam_step_p] = p.handles[i]
        h[BUF_adam_step_g] = g.handles[i]
        h[BUF_adam_step_m] = m.handles[i]
        h[BUF_adam_step_v] = v.handles[i]
        if ncopy:
            h[BUF_adam_step_refresh_copy] = copy.handles[i]
        if normsq is not None:
            h[BUF_adam_step_refresh_normsq if ncopy else BUF_adam_step_normsq] = normsq.handles[0]
        submit(op, column, nbuf, h, &args, sizeof(args))


def sgd_step(step, lr, momentum, dampening, weight_decay, nesterov, Tensor p, Tensor g,
             Tensor buf, Tensor normsq=None, max_norm=0.0):
    """One SGD step as torch.optim.SGD (momentum buffer ``buf`` is set at step 1).

    With normsq (one element: the squared global gradient norm) and max_norm > 0,
    gradients are first clipped as torch.nn.utils.clip_grad_norm_ does.
    """
    _check_optim("sgd_step", [(p, "p"), (g, "g"), (buf, "buf")], normsq, max_norm, step)
    if nesterov and (momentum <= 0 or dampening != 0):
        raise ValueError("sgd_step: nesterov needs momentum > 0 and dampening = 0")
    cdef nntile_sgd_step_args args
    cdef starpu_data_handle_t h[4]
    args.step = step
    args.lr = lr
    args.momentum = momentum
    args.dampening = dampening
    args.weight_decay = weight_decay
    args.nesterov = 1 if nesterov else 0
    args.max_norm = max_norm
    # The buffer is set from the gradient at step 1 and unused without momentum, so the op
    # table (NNTILE_ACCUMULATES) reads it only with momentum after step 1.
    cdef int nbuf = 4 if normsq is not None else 3
    cdef Py_ssize_t i
    for i in range(p.traits.ntiles):
        args.n = _tile_nelems(p, i)
        h[BUF_sgd_step_p] = p.handles[i]
        h[BUF_sgd_step_g] = g.handles[i]
        h[BUF_sgd_step_buf] = buf.handles[i]
        if normsq is not None:
            h[BUF_sgd_step_normsq] = normsq.handles[0]
        submit(NNTILE_OP_sgd_step, p.dtype_id, nbuf, h, &args, sizeof(args))
