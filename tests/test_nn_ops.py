"""Neural-network tensor ops against numpy float64, on partial and one-per-dimension tilings."""
import math

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

import nntile
from nntile import ops
from tests.unary_refs import ACTIVATIONS

DTYPES = [("fp32", np.float32, 1e-5), ("fp64", np.float64, 1e-12)]


def T(array, tiles, dtype=None):
    return nntile.Tensor.from_array(array, tiles, dtype)


def check(got, ref, tol, magnitude=None):
    """Relative error against the largest reference entry, or, where the result is a sum that
    may cancel, against the largest sum of its terms' magnitudes (what rounding scales with)."""
    got = np.asarray(got, dtype=np.float64)
    ref = np.asarray(ref, dtype=np.float64)
    assert got.shape == ref.shape
    scale = np.abs(ref) if magnitude is None else np.asarray(magnitude, dtype=np.float64)
    scale = max(np.max(scale, initial=0.0), 1e-30)
    err = np.max(np.abs(got - ref), initial=0.0) / scale
    assert err < tol, f"relative error {err:.3g} >= {tol}"


def rand(rng, shape, npdt):
    return rng.standard_normal(shape).astype(npdt)


# ---- elementwise ---------------------------------------------------------------------------

ELEMENTWISE_TILINGS = [((7, 5), (3, 2)), ((7, 5), (7, 5)), ((11,), (4,))]


@pytest.mark.parametrize("dtype, npdt, tol", DTYPES)
@pytest.mark.parametrize("shape, tiles", ELEMENTWISE_TILINGS)
@pytest.mark.parametrize("act", list(ACTIVATIONS))
def test_activation(ctx, rng, dtype, npdt, tol, shape, tiles, act):
    """Every activation of the op table (tests/unary_refs.py) and its backward against the
    float64 references."""
    value, deriv = ACTIVATIONS[act]
    a, b, c = (rand(rng, shape, npdt) for _ in range(3))
    a = a * 3
    x = a.astype(np.float64)
    A, B, C = T(a, tiles), T(b, tiles), T(c, tiles)
    D = nntile.Tensor(shape, tiles, dtype)
    getattr(ops, act)(A, D)
    check(D.to_array(), value(x), tol)
    getattr(ops, act + "_backward")(A, B, 0.0, D)
    check(D.to_array(), b * deriv(x), tol)
    getattr(ops, act + "_backward")(A, B, 0.5, C)
    check(C.to_array(), b * deriv(x) + 0.5 * c, tol)


@pytest.mark.parametrize("dtype, npdt, tol", DTYPES)
@pytest.mark.parametrize("shape, tiles", ELEMENTWISE_TILINGS)
def test_elementwise(ctx, rng, dtype, npdt, tol, shape, tiles):
    a, b, c = (rand(rng, shape, npdt) for _ in range(3))
    x = a.astype(np.float64)
    A, B, C = T(a, tiles), T(b, tiles), T(c, tiles)
    D = nntile.Tensor(shape, tiles, dtype)
    ops.prod(-1.5, A, B, D)
    check(D.to_array(), -1.5 * x * b, tol)


# ---- fibers, slices and softmax on random shapes / tilings / axes ---------------------------

@st.composite
def axis_case(draw):
    ndim = draw(st.integers(1, 4))
    shape = tuple(draw(st.integers(1, 6)) for _ in range(ndim))
    tiles = tuple(draw(st.integers(1, n)) for n in shape)
    axis = draw(st.integers(-ndim, ndim - 1))
    dtype = draw(st.sampled_from([0, 1]))
    seed = draw(st.integers(0, 2**32 - 1))
    return seed, shape, tiles, axis, dtype


def expand(arr, axis, ndim):
    """Broadcast a fiber (1-D along axis) against an ndim tensor."""
    shape = [1] * ndim
    shape[axis] = -1
    return arr.reshape(shape)


def run_axis_case(rng, shape, tiles, axis, dtype_index):
    dtype, npdt, tol = DTYPES[dtype_index]
    ndim = len(shape)
    ax = axis % ndim
    others = tuple(d for d in range(ndim) if d != ax)
    sl_shape = shape[:ax] + shape[ax + 1:]
    sl_tiles = tiles[:ax] + tiles[ax + 1:]
    a, b, c = (rand(rng, shape, npdt) for _ in range(3))
    fib = rand(rng, (shape[ax],), npdt)
    sl = rand(rng, sl_shape, npdt)
    A, B = T(a, tiles), T(b, tiles)
    x, y = a.astype(np.float64), b.astype(np.float64)
    f64, s64 = fib.astype(np.float64), sl.astype(np.float64)

    # Each reference comes with the magnitude its rounding scales with (the same expression on
    # absolute values), so a sum that happens to cancel to near zero is judged fairly.
    # fibers
    D = T(c, tiles)
    F = T(fib, (tiles[ax],))
    f_ex = expand(f64, ax, ndim)
    ops.add_fiber(0.5, F, -2.0, D, axis)
    ref = 0.5 * f_ex - 2.0 * c
    mag = 0.5 * np.abs(f_ex) + 2.0 * np.abs(c)
    check(D.to_array(), ref, tol, mag)
    ops.prod_fiber(-1.25, F, D, axis)
    ref = ref * -1.25 * f_ex
    mag = mag * 1.25 * np.abs(f_ex)
    check(D.to_array(), ref, tol, mag)
    ops.add_fiber(1.0, F, 0.0, D, axis)
    check(D.to_array(), np.broadcast_to(f_ex, shape), tol)
    ops.sum_fiber(0.75, A, 0.5, F, axis)
    fref = 0.75 * x.sum(axis=others) + 0.5 * f64
    fmag = 0.75 * np.abs(x).sum(axis=others) + 0.5 * np.abs(f64)
    check(F.to_array(), fref, tol, fmag)
    ops.sumprod_fiber(2.0, A, B, 1.0, F, axis)
    fref = 2.0 * (x * y).sum(axis=others) + fref
    fmag = 2.0 * np.abs(x * y).sum(axis=others) + fmag
    check(F.to_array(), fref, tol, fmag)
    ops.sum_fiber(1.0, B, 0.0, F, axis)
    check(F.to_array(), y.sum(axis=others), tol, np.abs(y).sum(axis=others))

    # slices
    S = T(sl, sl_tiles)
    ops.sum_slice(0.5, A, -1.0, S, axis)
    sref = 0.5 * x.sum(axis=ax) - s64
    smag = 0.5 * np.abs(x).sum(axis=ax) + np.abs(s64)
    check(S.to_array(), sref, tol, smag)
    ops.sumprod_slice(1.5, A, B, 1.0, S, axis)
    sref = 1.5 * (x * y).sum(axis=ax) + sref
    smag = 1.5 * np.abs(x * y).sum(axis=ax) + smag
    check(S.to_array(), sref, tol, smag)
    s_ex, smag_ex = np.expand_dims(sref, ax), np.expand_dims(smag, ax)
    D = T(c, tiles)
    ops.add_slice(-0.5, S, 2.0, D, axis)
    ref = -0.5 * s_ex + 2.0 * c
    mag = 0.5 * smag_ex + 2.0 * np.abs(c)
    check(D.to_array(), ref, tol, mag)
    ops.prod_slice(3.0, S, D, axis)
    check(D.to_array(), ref * 3.0 * s_ex, tol, mag * 3.0 * smag_ex)
    ops.add_slice(1.0, S, 0.0, D, axis)
    check(D.to_array(), np.broadcast_to(s_ex, shape), tol, np.broadcast_to(smag_ex, shape))

    # softmax: stats, softmax in place, backward
    stats = nntile.Tensor(sl_shape + (2,), sl_tiles + (2,), dtype)
    ops.maxsumexp(A, stats, axis)
    mx = x.max(axis=ax)
    se = np.exp(x - np.expand_dims(mx, ax)).sum(axis=ax)
    st_got = stats.to_array()
    check(st_got[..., 0], mx, tol)
    check(st_got[..., 1], se, tol)
    P = T(a, tiles)
    ops.softmax_inplace(stats, P, axis)
    p = np.exp(x - np.expand_dims(mx, ax)) / np.expand_dims(se, ax)
    check(P.to_array(), p, tol)
    dP = T(b, tiles)
    sums = nntile.Tensor(sl_shape, sl_tiles, dtype)
    ops.sumprod_slice(1.0, P, dP, 0.0, sums, axis)
    ops.softmax_backward(0.5, P, sums, dP, axis)
    pd = P.to_array().astype(np.float64)
    ref = 0.5 * pd * (y - np.expand_dims((pd * y).sum(axis=ax), ax))
    mag = 0.5 * pd * (np.abs(y) + np.expand_dims((pd * np.abs(y)).sum(axis=ax), ax))
    check(dP.to_array(), ref, tol, mag)
    # logsumexp of those stats
    L = nntile.Tensor(sl_shape, sl_tiles, dtype)
    ops.logsumexp(stats, L)
    check(L.to_array(), mx + np.log(se), tol, np.abs(mx) + np.abs(np.log(se)))


@settings(max_examples=40, deadline=None)
@given(axis_case())
def test_axis_ops_random(ctx, case):
    seed, *rest = case
    run_axis_case(np.random.default_rng(seed), *rest)


@pytest.mark.parametrize("dtype_index", [0, 1])
@pytest.mark.parametrize("axis", [0, 1, -1])
@pytest.mark.parametrize("tiles", [(3, 2, 4), (7, 5, 6)])  # partial everywhere / one tile
def test_axis_ops_fixed(ctx, rng, tiles, axis, dtype_index):
    run_axis_case(rng, (7, 5, 6), tiles, axis, dtype_index)


def test_axis_ops_1d(ctx, rng):
    for dtype_index in (0, 1):
        run_axis_case(rng, (9,), (4,), 0, dtype_index)  # slices are 0-dimensional
        run_axis_case(rng, (9,), (9,), -1, dtype_index)


def test_softmax_masked_rows(ctx):
    """-inf entries get probability 0; a fully masked row gives all zeros."""
    ninf = -np.inf
    x = np.array([[0.5, ninf, 1.0, ninf, 2.0], [ninf] * 5, [1.0, 2.0, ninf, ninf, ninf]])
    X = T(x, (2, 2))
    stats = nntile.Tensor((3, 2), (2, 2), "fp64")
    ops.maxsumexp(X, stats, 1)
    ops.softmax_inplace(stats, X, 1)
    ref = np.zeros_like(x)
    for r in (0, 2):
        e = np.exp(x[r] - x[r].max())
        ref[r] = e / e.sum()
    np.testing.assert_allclose(X.to_array(), ref, rtol=1e-12, atol=0)


# ---- mask, logsumexp ---------------------------------------------------------------------

@pytest.mark.parametrize("shape, tiles", [((2, 7, 9), (1, 3, 4)), ((5, 5), (5, 5)),
                                          ((3, 2, 6, 6), (2, 2, 4, 5)), ((4, 9), (3, 2))])
@pytest.mark.parametrize("offset, window", [(0, 0), (3, 0), (0, 2), (1, 5)])
def test_mask_scores(ctx, rng, shape, tiles, offset, window):
    x = rng.standard_normal(shape)
    X = T(x, tiles)
    ops.mask_scores(X, nntile.AttentionMask(offset=offset, window=window))
    q = np.arange(shape[-2])[:, None] + offset
    k = np.arange(shape[-1])[None, :]
    ref = np.where((k > q) | (window > 0) & (k <= q - window), -np.inf, x)
    assert np.array_equal(X.to_array(), ref)


# ---- embedding -----------------------------------------------------------------------------

@pytest.mark.parametrize("dtype, npdt, tol", DTYPES)
@pytest.mark.parametrize("ids_tiles, vt, et", [((2, 3), 4, 3), ((3, 7), 11, 5)])
def test_embedding(ctx, rng, dtype, npdt, tol, ids_tiles, vt, et):
    B, Tn, V, E = 3, 7, 11, 5
    ids = rng.integers(0, V, (B, Tn))
    table = rand(rng, (V, E), npdt)
    base = rand(rng, (B, Tn, E), npdt)
    Ids = T(ids, ids_tiles)
    Table = T(table, (vt, et))
    Dst = T(base, ids_tiles + (et,))
    ops.embedding(Ids, Table, Dst)
    check(Dst.to_array(), base + table.astype(np.float64)[ids], tol)
    dy = rand(rng, (B, Tn, E), npdt)
    dt0 = rand(rng, (V, E), npdt)
    dTable = T(dt0, (vt, et))
    ops.embedding_backward(Ids, T(dy, ids_tiles + (et,)), dTable)
    ref = dt0.astype(np.float64)
    np.add.at(ref, ids, dy.astype(np.float64))
    check(dTable.to_array(), ref, tol)


# ---- layer norm ----------------------------------------------------------------------------

@pytest.mark.parametrize("dtype, npdt, tol", DTYPES)
@pytest.mark.parametrize("shape, tiles", [((3, 4, 10), (2, 3, 4)), ((3, 4, 10), (3, 4, 10)),
                                          ((9,), (4,))])
def test_layernorm(ctx, rng, dtype, npdt, tol, shape, tiles):
    eps = 1e-5
    E = shape[-1]
    x = (rand(rng, shape, npdt) * 2 + 0.7).astype(npdt)
    gamma, beta = rand(rng, (E,), npdt), rand(rng, (E,), npdt)
    X, G, Bt = T(x, tiles), T(gamma, tiles[-1:]), T(beta, tiles[-1:])
    stats = nntile.Tensor(shape[:-1] + (2,), tiles[:-1] + (2,), dtype)
    Y = nntile.Tensor(shape, tiles, dtype)
    ops.layernorm_forward(X, G, Bt, eps, stats, Y)
    xd, g64 = x.astype(np.float64), gamma.astype(np.float64)
    mean = xd.mean(-1, keepdims=True)
    rstd = 1 / np.sqrt(((xd - mean) ** 2).mean(-1, keepdims=True) + eps)
    xhat = (xd - mean) * rstd
    check(Y.to_array(), xhat * g64 + beta, tol)
    st = stats.to_array()
    check(st[..., 0], mean[..., 0], tol)
    check(st[..., 1], ((xd - mean) ** 2).sum(-1), tol)

    dy = rand(rng, shape, npdt)
    dx0 = rand(rng, shape, npdt)
    dgamma0, dbeta0 = rand(rng, (E,), npdt), rand(rng, (E,), npdt)
    dY, dX = T(dy, tiles), T(dx0, tiles)
    dG, dB = T(dgamma0, tiles[-1:]), T(dbeta0, tiles[-1:])
    rowacc = nntile.Tensor(shape[:-1] + (2,), tiles[:-1] + (2,), dtype)
    ops.layernorm_backward(X, dY, stats, G, eps, rowacc, dG, dB, 0.5, dX)
    dyd = dy.astype(np.float64)
    gg = dyd * g64
    dx_ref = rstd * (gg - gg.mean(-1, keepdims=True) - xhat * (gg * xhat).mean(-1, keepdims=True))
    lead = tuple(range(len(shape) - 1))
    check(dX.to_array(), dx_ref + 0.5 * dx0, 5 * tol)
    check(dG.to_array(), dgamma0 + (dyd * xhat).sum(lead), 5 * tol)
    check(dB.to_array(), dbeta0 + dyd.sum(lead), tol)


# ---- cross entropy -------------------------------------------------------------------------

@pytest.mark.parametrize("dtype, npdt, tol", DTYPES)
@pytest.mark.parametrize("shape, tiles", [((3, 5, 13), (2, 2, 4)), ((3, 5, 13), (3, 5, 13)),
                                          ((6, 10), (4, 3))])
@pytest.mark.parametrize("loss_shape", [(), (1,)])
def test_cross_entropy(ctx, rng, dtype, npdt, tol, shape, tiles, loss_shape):
    V = shape[-1]
    logits = (rand(rng, shape, npdt) * 3).astype(npdt)
    labels = rng.integers(0, V, shape[:-1])
    L = T(logits, tiles)
    Lab = T(labels, tiles[:-1])
    stats = nntile.Tensor(shape[:-1] + (2,), tiles[:-1] + (2,), dtype)
    lse = nntile.Tensor(shape[:-1], tiles[:-1], dtype)
    picked = nntile.Tensor(shape[:-1], tiles[:-1], dtype)
    loss = T(np.full(loss_shape, np.nan, npdt), loss_shape)
    scale = 1.0 / labels.size
    ops.cross_entropy(L, Lab, stats, lse, picked, loss, scale)
    x = logits.astype(np.float64)
    lse_ref = np.log(np.exp(x - x.max(-1, keepdims=True)).sum(-1)) + x.max(-1)
    pick_ref = np.take_along_axis(x, labels[..., None], -1)[..., 0]
    check(loss.to_array().reshape(()), scale * (lse_ref - pick_ref).sum(), 10 * tol)
    check(lse.to_array(), lse_ref, tol)
    check(picked.to_array(), pick_ref, tol)
    ops.cross_entropy_backward(L, Lab, stats, scale)
    p = np.exp(x - lse_ref[..., None])
    onehot = np.zeros_like(p)
    np.put_along_axis(onehot, labels[..., None], 1.0, -1)
    check(L.to_array(), scale * (p - onehot), tol)


# ---- sumsq and optimizer steps ------------------------------------------------------------

@pytest.mark.parametrize("dtype, npdt, tol", DTYPES)
def test_sumsq_chain(ctx, rng, dtype, npdt, tol):
    a, b = rand(rng, (7, 5), npdt), rand(rng, (13,), npdt)
    sa = np.sum(a.astype(np.float64) ** 2)
    sb = np.sum(b.astype(np.float64) ** 2)
    dst = T(np.array([np.nan], npdt), (1,))
    ops.sumsq(T(a, (3, 2)), 0.0, dst)
    ops.sumsq(T(b, (4,)), 1.0, dst)
    check(dst.to_array(), [sa + sb], tol)
    ops.sumsq(T(b, (13,)), 2.0, dst)
    check(dst.to_array(), [2 * (sa + sb) + sb], tol)


def adam_ref(step, lr, b1, b2, eps, wd, decoupled, p, g, m, v, coef):
    g = g * coef
    if decoupled:
        p = p * (1 - lr * wd)
    else:
        g = g + wd * p
    m = m + (1 - b1) * (g - m)
    v = b2 * v + (1 - b2) * g * g
    denom = np.sqrt(v) / math.sqrt(1 - b2 ** step) + eps
    return p - lr / (1 - b1 ** step) * m / denom, m, v


def sgd_ref(step, lr, mom, damp, wd, nesterov, p, g, buf, coef):
    g = g * coef + wd * p
    if mom:
        buf = g if step == 1 else mom * buf + (1 - damp) * g
        g = g + mom * buf if nesterov else buf
    return p - lr * g, buf


@pytest.mark.parametrize("dtype, npdt, tol", DTYPES)
@pytest.mark.parametrize("decoupled", [False, True])
@pytest.mark.parametrize("clip", [False, True])
def test_adam_step(ctx, rng, dtype, npdt, tol, decoupled, clip):
    shape, tiles = (7, 5), (3, 2)
    p, g = rand(rng, shape, npdt), rand(rng, shape, npdt)
    P, G = T(p, tiles), T(g, tiles)
    M = T(np.zeros(shape, npdt), tiles)
    Vv = T(np.zeros(shape, npdt), tiles)
    normsq = None
    coef = 1.0
    max_norm = 0.0
    if clip:
        normsq = nntile.Tensor((1,), (1,), dtype)
        ops.sumsq(G, 0.0, normsq)
        max_norm = 0.5
        coef = min(max_norm / (math.sqrt(float(np.sum(g.astype(np.float64) ** 2))) + 1e-6), 1.0)
    pr, mr, vr = p.astype(np.float64), np.zeros(shape), np.zeros(shape)
    for step in (1, 2, 3):
        ops.adam_step(step, 1e-2, 0.9, 0.999, 1e-8, 0.1, decoupled, P, G, M, Vv,
                      normsq=normsq, max_norm=max_norm)
        pr, mr, vr = adam_ref(step, 1e-2, 0.9, 0.999, 1e-8, 0.1, decoupled, pr,
                              g.astype(np.float64), mr, vr, coef)
    check(P.to_array(), pr, tol * 10)
    check(M.to_array(), mr, tol * 10)
    check(Vv.to_array(), vr, tol * 10)


@pytest.mark.parametrize("dtype, npdt, tol", DTYPES)
@pytest.mark.parametrize("momentum, dampening, nesterov", [(0.0, 0.0, False), (0.9, 0.1, False),
                                                          (0.9, 0.0, True)])
def test_sgd_step(ctx, rng, dtype, npdt, tol, momentum, dampening, nesterov):
    shape, tiles = (11,), (4,)
    p, g = rand(rng, shape, npdt), rand(rng, shape, npdt)
    P, G, Buf = T(p, tiles), T(g, tiles), nntile.Tensor(shape, tiles, dtype)
    normsq = T(np.array(float(np.sum(g.astype(np.float64) ** 2)), npdt), ())
    coef = min(0.7 / (math.sqrt(float(np.sum(g.astype(np.float64) ** 2))) + 1e-6), 1.0)
    pr, br = p.astype(np.float64), None
    for step in (1, 2, 3):
        ops.sgd_step(step, 0.05, momentum, dampening, 0.01, nesterov, P, G, Buf, normsq, 0.7)
        pr, br = sgd_ref(step, 0.05, momentum, dampening, 0.01, nesterov, pr,
                         g.astype(np.float64), br, coef)
    check(P.to_array(), pr, tol * 10)
    if momentum:
        check(Buf.to_array(), br, tol * 10)


def test_adam_matches_torch(ctx, rng):
    torch = pytest.importorskip("torch")
    p, g = rng.standard_normal((6, 4)), rng.standard_normal((6, 4))
    P, G = T(p, (4, 3)), T(g, (4, 3))
    M, Vv = T(np.zeros((6, 4)), (4, 3)), T(np.zeros((6, 4)), (4, 3))
    tp = torch.tensor(p, requires_grad=True)
    opt = torch.optim.AdamW([tp], lr=1e-2, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.1)
    for step in (1, 2):
        tp.grad = torch.tensor(g)
        opt.step()
        ops.adam_step(step, 1e-2, 0.9, 0.999, 1e-8, 0.1, True, P, G, M, Vv)
    np.testing.assert_allclose(P.to_array(), tp.detach().numpy(), rtol=1e-12, atol=1e-14)


# ---- bad input -----------------------------------------------------------------------------

def t(shape, tiles, dtype="fp32"):
    return nntile.Tensor(shape, tiles, dtype)


def test_bad_fiber_length(ctx):
    with pytest.raises(ValueError, match="fiber"):
        ops.add_fiber(1.0, t((4,), (2,)), 0.0, t((3, 5), (2, 2)), 1)
    with pytest.raises(ValueError, match="tilings must match"):
        ops.sum_fiber(1.0, t((3, 5), (2, 2)), 0.0, t((5,), (3,)), 1)


def test_bad_slice_tiling(ctx):
    with pytest.raises(ValueError, match="tiled"):
        ops.sum_slice(1.0, t((4, 6, 5), (2, 3, 5)), 0.0, t((4, 5), (4, 5)), 1)
    with pytest.raises(ValueError, match="shape"):
        ops.add_slice(1.0, t((4, 6), (2, 3)), 0.0, t((4, 6, 5), (2, 3, 5)), 1)
    with pytest.raises(ValueError, match="stats"):
        ops.maxsumexp(t((4, 6), (2, 3)), t((4, 2), (2, 1)), 1)


def test_bad_axis(ctx):
    with pytest.raises(ValueError, match="axis=2"):
        ops.sum_slice(1.0, t((4, 6), (2, 3)), 0.0, t((4,), (2,)), 2)
    with pytest.raises(ValueError, match="axis=-3"):
        ops.prod_fiber(1.0, t((4,), (2,)), t((4, 6), (2, 3)), -3)
    with pytest.raises(TypeError, match="axis"):
        ops.softmax_inplace(t((4, 2), (2, 2)), t((4, 6), (2, 3)), 1.0)


def test_bad_labels_and_ids_dtype(ctx):
    logits = t((4, 10), (2, 5))
    stats, lse, picked = t((4, 2), (2, 2)), t((4,), (2,)), t((4,), (2,))
    with pytest.raises(TypeError, match="labels must be an int64"):
        ops.cross_entropy(logits, t((4,), (2,)), stats, lse, picked, t((1,), (1,)), 1.0)
    with pytest.raises(ValueError, match="labels"):
        ops.cross_entropy(logits, t((4,), (4,), "int64"), stats, lse, picked, t((1,), (1,)))
    with pytest.raises(ValueError, match="loss"):
        ops.cross_entropy(logits, t((4,), (2,), "int64"), stats, lse, picked, t((2,), (2,)))
    with pytest.raises(TypeError, match="ids must be an int64"):
        ops.embedding(t((2, 3), (2, 3)), t((10, 4), (5, 2)), t((2, 3, 4), (2, 3, 2)))
    with pytest.raises(ValueError, match="dst"):
        ops.embedding(t((2, 3), (2, 3), "int64"), t((10, 4), (5, 2)), t((2, 3, 4), (2, 3, 4)))


def test_bad_misc(ctx):
    with pytest.raises(TypeError, match="fp64"):
        ops.prod(1.0, t((3,), (3,)), t((3,), (3,), "fp64"), t((3,), (3,)))
    a = t((3,), (3,))
    with pytest.raises(ValueError, match="same tensor"):
        ops.gelu(a, a)
    with pytest.raises(TypeError, match="None"):
        ops.gelu(None, a)
    with pytest.raises(ValueError, match="at least 2"):
        ops.mask_scores(a)
    with pytest.raises(TypeError, match="mask"):
        ops.mask_scores(t((3, 3), (3, 3)), True)  # a mask is an AttentionMask
    with pytest.raises(ValueError, match="layernorm_forward: gamma"):
        ops.layernorm_forward(t((4, 6), (2, 3)), t((6,), (2,)), t((6,), (3,)), 1e-5,
                              t((4, 2), (2, 2)), t((4, 6), (2, 3)))
    with pytest.raises(ValueError, match="step"):
        ops.adam_step(0, 1e-3, 0.9, 0.999, 1e-8, 0.0, False, a, t((3,), (3,)), t((3,), (3,)),
                      t((3,), (3,)))
    with pytest.raises(ValueError, match="normsq"):
        ops.sgd_step(1, 1e-3, 0.0, 0.0, 0.0, False, a, t((3,), (3,)), t((3,), (3,)),
                     normsq=t((2,), (1,)), max_norm=1.0)
    with pytest.raises(ValueError, match="one element"):
        ops.sumsq(a, 0.0, t((2,), (2,)))


def test_ops_exports_the_tensor_ops_of_core():
    """nntile.ops takes its names from the core module's op parts: every tensor op, and none
    of the runtime's or the tensor's names."""
    from nntile._core import core
    assert {"fill", "add", "gemm", "gelu", "cross_entropy", "sgd_step", "add_bias",
            "attn_ptv", "set_task_priority"} <= set(core.OPS)
    assert not {"Context", "Tensor", "TensorTraits", "DTYPES", "current_context",
                "launcher_rank"} & set(core.OPS)
    assert set(ops.__all__) == set(core.OPS) | {"task_priority", "task_workers", "task_device"}
    for name in core.OPS:
        assert getattr(ops, name) is getattr(core, name), name
