"""Tests of the pure-C CPU kernels (nntile/_core/kernels) through ctypes,
against float64 numpy references (and torch for the optimizers).

A session fixture (conftest.py) compiles every kernels/*.c file with the system
C compiler into a temporary shared library.  The args structs are mirrored here from the
kernel contract (FIELDS); test_header_matches_contract checks that kernels.h
declares exactly these fields in this order."""
import ctypes
import os

import numpy as np

from tests.kernel_header import args_structs, op_buffers, op_table, unary_ops
from tests.unary_refs import UNARY
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
KERNEL_DIR = os.path.join(ROOT, "nntile", "_core", "kernels")

I, D = "int64", "double"
A8 = "int64[8]"

# op -> (struct fields in order, number of buffers)
FIELDS = {
    "fill": ([("n", I), ("value", D)], 1),
    "copy": ([("n", I)], 2),
    "cast": ([("n", I)], 2),
    "subcopy": ([("ndim", I), ("src_shape", A8), ("dst_shape", A8),
                 ("copy_shape", A8), ("src_offset", A8),
                 ("dst_offset", A8)], 2),
    "add": ([("n", I), ("alpha", D), ("beta", D)], 2),
    "scal": ([("n", I), ("alpha", D)], 1),
    "prod": ([("n", I), ("alpha", D)], 3),
    "gelu_backward": ([("n", I), ("beta", D)], 3),
    "gelutanh_backward": ([("n", I), ("beta", D)], 3),
    "add_fiber": ([("m", I), ("k", I), ("n", I), ("alpha", D),
                   ("beta", D)], 2),
    "prod_fiber": ([("m", I), ("k", I), ("n", I), ("alpha", D)], 2),
    "sum_fiber": ([("m", I), ("k", I), ("n", I), ("alpha", D),
                   ("beta", D)], 2),
    "sumprod_fiber": ([("m", I), ("k", I), ("n", I), ("alpha", D),
                       ("beta", D)], 3),
    "sum_slice": ([("m", I), ("k", I), ("n", I), ("alpha", D),
                   ("beta", D)], 2),
    "sumprod_slice": ([("m", I), ("k", I), ("n", I), ("alpha", D),
                       ("beta", D)], 3),
    "add_slice": ([("m", I), ("k", I), ("n", I), ("alpha", D),
                   ("beta", D)], 2),
    "prod_slice": ([("m", I), ("k", I), ("n", I), ("alpha", D)], 2),
    "maxsumexp": ([("m", I), ("k", I), ("n", I), ("init", I)], 2),
    "softmax_inplace": ([("m", I), ("k", I), ("n", I)], 2),
    "softmax_backward": ([("m", I), ("k", I), ("n", I), ("alpha", D)], 3),
    "mask_causal": ([("batch", I), ("tq", I), ("tk", I), ("q_offset", I),
                     ("k_offset", I)], 1),
    "logsumexp": ([("n", I)], 2),
    "xent_picked": ([("rows", I), ("v", I), ("v_offset", I)], 3),
    "xent_loss": ([("rows", I), ("alpha", D), ("beta", D)], 3),
    "xent_grad_inplace": ([("rows", I), ("v", I), ("v_offset", I),
                           ("alpha", D)], 3),
    "embedding": ([("rows", I), ("e", I), ("v_offset", I), ("v", I)], 3),
    "embedding_backward": ([("rows", I), ("e", I), ("v_offset", I),
                            ("v", I)], 3),
    "layernorm_stats": ([("rows", I), ("e", I), ("e_offset", I)], 2),
    "layernorm_forward": ([("rows", I), ("e", I), ("e_total", I),
                           ("eps", D)], 5),
    "layernorm_backward_reduce": ([("rows", I), ("e", I), ("e_total", I),
                                   ("eps", D), ("init", I)], 7),
    "layernorm_backward": ([("rows", I), ("e", I), ("e_total", I),
                            ("eps", D), ("beta", D)], 6),
    "gemm": ([("transA", I), ("transB", I), ("M", I), ("N", I), ("K", I),
              ("alpha", D), ("beta", D), ("batch1", I), ("batch2", I),
              ("lda", I), ("ldb", I), ("ldc", I), ("strideA1", I),
              ("strideA2", I), ("strideB1", I), ("strideB2", I),
              ("strideC1", I), ("strideC2", I)], 3),
    "sumsq": ([("n", I), ("beta", D)], 2),
    "adam_step": ([("n", I), ("step", I), ("lr", D), ("beta1", D),
                   ("beta2", D), ("eps", D), ("weight_decay", D),
                   ("decoupled", I), ("max_norm", D)], 5),
    "sgd_step": ([("n", I), ("step", I), ("lr", D), ("momentum", D),
                  ("dampening", D), ("weight_decay", D), ("nesterov", I),
                  ("max_norm", D)], 4),
}
_FLASH = [("batch", I), ("tq", I), ("tk", I), ("hq", I), ("hkv", I), ("d", I),
          ("q_offset", I), ("k_offset", I), ("causal", I), ("accumulate", I), ("scale", D)]
FIELDS.update({"flash_forward": (_FLASH, 5), "flash_backward": (_FLASH, 9)})
# ops whose args struct is another's (kernels.h: #define nntile_<op>_args nntile_<other>_args)
SHARED_ARGS = {"flash_forward": "flash", "flash_backward": "flash"}
# the unary ops (gelu, gelutanh, ...): args {n}, buffers src and dst
FIELDS.update({op: ([("n", I)], 2) for op in UNARY})

_CTYPE = {I: ctypes.c_int64, D: ctypes.c_double, A8: ctypes.c_int64 * 8}

STRUCTS = {
    op: type(f"nntile_{op}_args", (ctypes.Structure,),
             {"_fields_": [(name, _CTYPE[t]) for name, t in fields]})
    for op, (fields, _) in FIELDS.items()
}

DTYPES = {"fp32": np.float32, "fp64": np.float64}

CFLAGS = ["-std=c11", "-O2", "-march=x86-64-v2", "-fno-math-errno", "-fPIC", "-Wall",
          "-Wextra"]


class Kernels:
    def __init__(self, lib):
        self.lib = lib

    def __call__(self, op, dtype, args, *bufs):
        fields, nbuf = FIELDS[op]
        assert len(bufs) == nbuf, (op, len(bufs), nbuf)
        kw = {}
        for name, t in fields:
            val = args.get(name, 0)
            if t == A8:
                val = list(val) + [0] * (8 - len(val))
                val = (ctypes.c_int64 * 8)(*val)
            kw[name] = val
        unknown = set(args) - {f for f, _ in fields}
        assert not unknown, unknown
        st = STRUCTS[op](**kw)
        ptrs = []
        for b in bufs:
            if b is None:
                ptrs.append(None)
                continue
            assert isinstance(b, np.ndarray) and b.flags.c_contiguous
            assert b.dtype in (np.float32, np.float64, np.int64, np.uint16)
            ptrs.append(ctypes.c_void_p(b.ctypes.data))
        fn = getattr(self.lib, f"nntile_kernel_{op}_{dtype}")
        fn.restype = None
        fn(ctypes.byref(st), *ptrs)


# NNTILE_KERNEL_EXAMPLES: hypothesis examples per test (more for soak runs)
SETTINGS = settings(
    max_examples=int(os.environ.get("NNTILE_KERNEL_EXAMPLES", "25")),
    deadline=None, database=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture])
DT = ["fp32", "fp64"]
RTOL = {"fp32": 1e-5, "fp64": 1e-12}

dims = st.integers(1, 6)
seeds = st.integers(0, 2**32 - 1)


def rnd(rng, shape, dtype, scale=1.0):
    return np.asarray(scale * rng.standard_normal(shape)).astype(DTYPES[dtype])


def nans(shape, dtype):
    return np.full(shape, np.nan, dtype=DTYPES[dtype])


def close(out, ref, dtype, rtol_mult=1.0, scale=None):
    """rtol-relative comparison; atol scaled by the reference magnitude so
    that cancellation in sums does not produce spurious failures."""
    ref = np.asarray(ref, dtype=np.float64)
    out = np.asarray(out, dtype=np.float64)
    ref = np.broadcast_to(ref, out.shape)  # refs like alpha*fiber[None,:,None]
    rtol = RTOL[dtype] * rtol_mult
    if scale is None:
        finite = ref[np.isfinite(ref)]
        scale = max(1.0, float(np.abs(finite).max())) if finite.size else 1.0
    np.testing.assert_allclose(out, ref, rtol=rtol, atol=rtol * scale)


# ---------------------------------------------------------------- contract

def test_header_matches_contract():
    structs = args_structs()
    assert set(structs) == {SHARED_ARGS.get(op, op) for op in FIELDS}
    for op, (fields, _) in FIELDS.items():
        assert structs[SHARED_ARGS.get(op, op)] == fields, op


def test_op_table_matches_contract():
    """kernels.h's op table and buffer lines name every op of the contract once, with its
    number of buffers (an X_OPT op's count in the table leaves its optional last one out)."""
    table = op_table()
    buffers = op_buffers()
    ops = [op for op, _, _, _ in table]
    assert len(ops) == len(set(ops)), ops
    # adam_step_refresh takes adam_step's args struct
    assert set(ops) == set(buffers) == set(FIELDS) | {"adam_step_refresh"}
    for op, nbuf, kind, columns in table:
        assert columns in ("PLAIN", "MIXED", "MIXED_ONLY"), op
        assert nbuf + (kind == "X_OPT") == len(buffers[op]), op
        if op in FIELDS:
            assert len(buffers[op]) == FIELDS[op][1], op


def test_unary_ops_match_the_table():
    """The ops marked "unary:" in the op table are those of tests/unary_refs.py, each with
    its float64 reference."""
    assert list(unary_ops()) == list(UNARY)


def test_all_symbols_and_clean_build(kernel_lib):
    lib, stderr = kernel_lib
    assert "warning" not in stderr, stderr
    for op in FIELDS:
        for dt in DT + ["bf16"]:
            getattr(lib, f"nntile_kernel_{op}_{dt}")


# ---------------------------------------------------------------- elementwise

@pytest.mark.parametrize("dt", DT)
@pytest.mark.parametrize("n", [0, 1, 7, 8, 33, 1000])
def test_fill_copy_scal_prod(K, dt, n):
    rng = np.random.default_rng(n)
    dst = nans(n, dt)
    K("fill", dt, dict(n=n, value=-2.5), dst)
    assert np.all(dst == -2.5)
    src = rnd(rng, n, dt)
    dst = nans(n, dt)
    K("copy", dt, dict(n=n), src, dst)
    np.testing.assert_array_equal(src, dst)
    ref = 1.7 * src.astype(np.float64)
    K("scal", dt, dict(n=n, alpha=1.7), src)
    close(src, ref, dt)
    a, b = rnd(rng, n, dt), rnd(rng, n, dt)
    dst = nans(n, dt)
    K("prod", dt, dict(n=n, alpha=-0.5), a, b, dst)
    close(dst, -0.5 * a.astype(np.float64) * b, dt)


@pytest.mark.parametrize("dt", DT)
@pytest.mark.parametrize("beta", [0.0, 1.0, -0.75])
@pytest.mark.parametrize("n", [1, 5, 64, 1001])
def test_add_sumsq(K, dt, beta, n):
    rng = np.random.default_rng(n)
    src = rnd(rng, n, dt)
    dst = nans(n, dt) if beta == 0 else rnd(rng, n, dt)
    ref = 0.3 * src.astype(np.float64) + (beta * dst if beta else 0)
    K("add", dt, dict(n=n, alpha=0.3, beta=beta), src, dst)
    close(dst, ref, dt)
    out = nans(1, dt) if beta == 0 else rnd(rng, 1, dt)
    ref = np.sum(src.astype(np.float64) ** 2) + (beta * out if beta else 0)
    K("sumsq", dt, dict(n=n, beta=beta), src, out)
    close(out, ref, dt)


@pytest.mark.parametrize("dt", DT)
@pytest.mark.parametrize("name", list(UNARY))
def test_unary(K, dt, name):
    rng = np.random.default_rng(1)
    n = 257
    x = rnd(rng, n, dt, 3.0)
    x[:3] = [0.0, -12.0, 12.0]
    y = nans(n, dt)
    K(name, dt, dict(n=n), x, y)
    close(y, UNARY[name](x.astype(np.float64)), dt, rtol_mult=4)


@pytest.mark.parametrize("dt", DT)
@pytest.mark.parametrize("beta", [0.0, 0.6])
@pytest.mark.parametrize("name", ["gelu", "gelutanh"])
def test_gelu_backward(K, dt, beta, name):
    """backward vs. central finite differences of the float64 reference"""
    fref = UNARY[name]
    rng = np.random.default_rng(1)
    n = 257
    x = rnd(rng, n, dt, 3.0)
    x[:3] = [0.0, -12.0, 12.0]
    x64 = x.astype(np.float64)
    h = 1e-5
    deriv = (fref(x64 + h) - fref(x64 - h)) / (2 * h)
    dy = rnd(rng, n, dt)
    dx = nans(n, dt) if beta == 0 else rnd(rng, n, dt)
    ref = dy * deriv + (beta * dx.astype(np.float64) if beta else 0)
    K(name + "_backward", dt, dict(n=n, beta=beta), x, dy, dx)
    np.testing.assert_allclose(dx, ref, rtol=1e-5, atol=1e-8 if dt == "fp64"
                               else 1e-5)


# ---------------------------------------------------------------- fiber / slice

def mkn(rng, m, k, n, dt):
    return rnd(rng, (m, k, n), dt)


def check_broadcasts(K, dt, rng, kind, a, small, small64):
    """add_<kind> and prod_<kind> of a fiber or slice ``small`` (``small64``: it in float64,
    shaped to broadcast over [m, k, n]) against numpy."""
    m, k, n, alpha, beta = a["m"], a["k"], a["n"], a["alpha"], a["beta"]
    dst = nans((m, k, n), dt) if beta == 0 else mkn(rng, m, k, n, dt)
    ref = alpha * small64 + (beta * dst.astype(np.float64) if beta else 0)
    K(f"add_{kind}", dt, a, small, dst)
    close(dst, ref, dt)
    dst = mkn(rng, m, k, n, dt)
    ref = dst.astype(np.float64) * alpha * small64
    K(f"prod_{kind}", dt, dict(m=m, k=k, n=n, alpha=alpha), small, dst)
    close(dst, ref, dt)


def check_reductions(K, dt, rng, kind, a, axis, out_shape):
    """sum_<kind> and sumprod_<kind> over ``axis`` of [m, k, n] against numpy."""
    m, k, n, alpha, beta = a["m"], a["k"], a["n"], a["alpha"], a["beta"]
    s1, s2 = mkn(rng, m, k, n, dt), mkn(rng, m, k, n, dt)
    for op, srcs, red in ((f"sum_{kind}", (s1,), s1.astype(np.float64)),
                          (f"sumprod_{kind}", (s1, s2), s1.astype(np.float64) * s2)):
        out = nans(out_shape, dt) if beta == 0 else rnd(rng, out_shape, dt)
        ref = alpha * red.sum(axis=axis) + (beta * out.astype(np.float64) if beta else 0)
        K(op, dt, a, *srcs, out)
        close(out, ref, dt, scale=max(1.0, np.abs(red).sum(axis=axis).max()))


@pytest.mark.parametrize("dt", DT)
@SETTINGS
@given(m=dims, k=st.integers(1, 40), n=dims, seed=seeds,
       beta=st.sampled_from([0.0, 1.0, -0.3]))
def test_fiber_kernels(K, dt, m, k, n, seed, beta):
    rng = np.random.default_rng(seed)
    alpha = 1.3
    a = dict(m=m, k=k, n=n, alpha=alpha, beta=beta)
    fib = rnd(rng, k, dt)
    check_broadcasts(K, dt, rng, "fiber", a, fib, fib.astype(np.float64)[None, :, None])
    check_reductions(K, dt, rng, "fiber", a, (0, 2), k)


@pytest.mark.parametrize("dt", DT)
@SETTINGS
@given(m=dims, k=st.integers(1, 40), n=st.integers(1, 12), seed=seeds,
       beta=st.sampled_from([0.0, 1.0, 0.4]))
def test_slice_kernels(K, dt, m, k, n, seed, beta):
    rng = np.random.default_rng(seed)
    alpha = -0.7
    a = dict(m=m, k=k, n=n, alpha=alpha, beta=beta)
    check_reductions(K, dt, rng, "slice", a, 1, (m, n))
    sl = rnd(rng, (m, n), dt)
    check_broadcasts(K, dt, rng, "slice", a, sl, sl.astype(np.float64)[:, None, :])


# ---------------------------------------------------------------- softmax

def split_k(x, cuts):
    """split [m,k,n] along axis 1 into contiguous tiles"""
    return [np.ascontiguousarray(t) for t in np.split(x, cuts, axis=1)]


@pytest.mark.parametrize("dt", DT)
@SETTINGS
@given(m=dims, k=st.integers(1, 30), n=st.sampled_from([1, 1, 2, 5]),
       seed=seeds, ntiles=st.integers(1, 4))
def test_maxsumexp_softmax(K, dt, m, k, n, seed, ntiles):
    rng = np.random.default_rng(seed)
    x = mkn(rng, m, k, n, dt) * 4
    mask = rng.random((m, k, n)) < 0.3
    x[mask] = -np.inf
    x[0, :, 0] = -np.inf                   # one fully masked row
    if m > 1:
        x[1, : (k + 1) // 2, :] = -np.inf  # masked in the first tile(s)
    cuts = sorted(rng.choice(np.arange(1, k), size=min(ntiles - 1, k - 1),
                             replace=False)) if k > 1 else []
    stats = nans((m, n, 2), dt)
    for t, tile in enumerate(split_k(x, cuts)):
        K("maxsumexp", dt, dict(m=m, k=tile.shape[1], n=n, init=int(t == 0)),
          tile, stats)
    x64 = x.astype(np.float64)
    mx = x64.max(axis=1)
    with np.errstate(invalid="ignore"):
        e = np.exp(x64 - np.where(np.isinf(mx), 0, mx)[:, None, :])
    ssum = e.sum(axis=1)
    assert not np.isnan(stats).any()
    np.testing.assert_array_equal(stats[..., 0], mx.astype(DTYPES[dt]))
    close(stats[..., 1], ssum, dt, rtol_mult=2)
    assert stats[0, 0, 0] == -np.inf and stats[0, 0, 1] == 0
    # softmax_inplace with the global stats, tile by tile
    ref = np.where(ssum[:, None, :] > 0, e / np.where(ssum > 0, ssum, 1)[:, None, :], 0)
    outs = []
    for tile in split_k(x, cuts):
        K("softmax_inplace", dt, dict(m=m, k=tile.shape[1], n=n), stats, tile)
        outs.append(tile)
    close(np.concatenate(outs, axis=1), ref, dt, rtol_mult=4)
    # logsumexp
    st2 = np.ascontiguousarray(stats.reshape(-1, 2))
    lse = nans(m * n, dt)
    K("logsumexp", dt, dict(n=m * n), st2, lse)
    with np.errstate(divide="ignore"):
        lref = st2[:, 0].astype(np.float64) + np.log(st2[:, 1].astype(np.float64))
    np.testing.assert_array_equal(np.isinf(lse), np.isinf(lref))
    fin = np.isfinite(lref)
    close(lse[fin], lref[fin], dt)


@pytest.mark.parametrize("dt", DT)
@SETTINGS
@given(m=dims, k=st.integers(1, 30), n=st.sampled_from([1, 3]), seed=seeds)
def test_softmax_backward(K, dt, m, k, n, seed):
    rng = np.random.default_rng(seed)
    p = np.abs(mkn(rng, m, k, n, dt))
    dp = mkn(rng, m, k, n, dt)
    sums = nans((m, n), dt)
    K("sumprod_slice", dt, dict(m=m, k=k, n=n, alpha=1.0, beta=0.0), p, dp,
      sums)
    p64, dp64 = p.astype(np.float64), dp.astype(np.float64)
    ref = 0.5 * p64 * (dp64 - (p64 * dp64).sum(axis=1)[:, None, :])
    K("softmax_backward", dt, dict(m=m, k=k, n=n, alpha=0.5), p, sums, dp)
    close(dp, ref, dt, scale=max(1.0, float(np.abs(p64).max() * (
        np.abs(dp64).max() + np.abs(p64 * dp64).sum(axis=1).max()))))


@pytest.mark.parametrize("dt", DT)
@pytest.mark.parametrize("batch,tq,tk,qo,ko", [
    (1, 1, 1, 0, 0), (2, 4, 4, 0, 0), (3, 5, 7, 4, 0), (1, 6, 3, 0, 3),
    (2, 3, 8, 10, 2), (1, 4, 4, 0, 8)])
def test_mask_causal(K, dt, batch, tq, tk, qo, ko):
    rng = np.random.default_rng(0)
    x = rnd(rng, (batch, tq, tk), dt)
    ref = x.copy()
    qi = qo + np.arange(tq)[:, None]
    kj = ko + np.arange(tk)[None, :]
    ref[:, kj > qi] = -np.inf
    K("mask_causal", dt, dict(batch=batch, tq=tq, tk=tk, q_offset=qo,
                              k_offset=ko), x)
    np.testing.assert_array_equal(x, ref)


# ---------------------------------------------------------------- cross-entropy

@pytest.mark.parametrize("dt", DT)
@SETTINGS
@given(rows=st.integers(1, 9), vocab=st.integers(1, 50), seed=seeds,
       ntiles=st.integers(1, 4))
def test_xent(K, dt, rows, vocab, seed, ntiles):
    rng = np.random.default_rng(seed)
    logits = rnd(rng, (rows, vocab), dt, 3.0)
    labels = rng.integers(0, vocab, rows).astype(np.int64)
    cuts = sorted(rng.choice(np.arange(1, vocab), size=min(ntiles - 1, vocab - 1),
                             replace=False)) if vocab > 1 else []
    bounds = [0, *cuts, vocab]
    tiles = [np.ascontiguousarray(logits[:, a:b])
             for a, b in zip(bounds[:-1], bounds[1:])]
    # stats via maxsumexp over vocab tiles (layout [rows, v, 1])
    stats = nans((rows, 2), dt)
    picked = np.full(rows, 12345.0, dtype=DTYPES[dt])
    for t, (tile, off) in enumerate(zip(tiles, bounds)):
        v = tile.shape[1]
        K("maxsumexp", dt, dict(m=rows, k=v, n=1, init=int(t == 0)), tile, stats)
        before = picked.copy()
        K("xent_picked", dt, dict(rows=rows, v=v, v_offset=off), tile, labels,
          picked)
        inr = (labels >= off) & (labels < off + v)
        np.testing.assert_array_equal(picked[~inr], before[~inr])
        np.testing.assert_array_equal(picked[inr],
                                      tile[inr, labels[inr] - off])
    l64 = logits.astype(np.float64)
    lse_ref = np.log(np.exp(l64 - l64.max(1, keepdims=True)).sum(1)) + l64.max(1)
    lse = nans(rows, dt)
    K("logsumexp", dt, dict(n=rows), stats, lse)
    close(lse, lse_ref, dt)
    loss = nans(1, dt)
    loss_ref = (lse_ref - l64[np.arange(rows), labels]).sum() / rows
    K("xent_loss", dt, dict(rows=rows, alpha=1.0 / rows, beta=0.0), lse,
      picked, loss)
    close(loss, loss_ref, dt, rtol_mult=2)
    loss2 = np.array([0.5], dtype=DTYPES[dt])
    K("xent_loss", dt, dict(rows=rows, alpha=2.0, beta=1.0), lse, picked, loss2)
    close(loss2, 2 * rows * loss_ref + 0.5, dt, rtol_mult=2,
          scale=max(1.0, 2 * np.abs(lse_ref - l64[np.arange(rows), labels]).sum()))
    # gradient
    sm = np.exp(l64 - lse_ref[:, None])
    onehot = np.zeros_like(sm)
    onehot[np.arange(rows), labels] = 1
    gref = 0.25 * (sm - onehot)
    outs = []
    for tile, off in zip(tiles, bounds):
        K("xent_grad_inplace", dt, dict(rows=rows, v=tile.shape[1], v_offset=off,
                                        alpha=0.25), stats, labels, tile)
        outs.append(tile)
    close(np.concatenate(outs, axis=1), gref, dt, rtol_mult=4)


def test_xent_labels_out_of_range(K):
    dt = "fp64"
    rng = np.random.default_rng(3)
    rows, v = 4, 5
    logits = rnd(rng, (rows, v), dt)
    labels = np.array([-100, 4, 5, 1000], dtype=np.int64)  # tile covers 0..4
    picked = np.full(rows, 7.0)
    K("xent_picked", dt, dict(rows=rows, v=v, v_offset=0), logits, labels,
      picked)
    np.testing.assert_array_equal(picked, [7.0, logits[1, 4], 7.0, 7.0])
    # v_offset shifts the valid range: tile covers 5..9
    picked = np.full(rows, 7.0)
    K("xent_picked", dt, dict(rows=rows, v=v, v_offset=5), logits, labels,
      picked)
    np.testing.assert_array_equal(picked, [7.0, 7.0, logits[2, 0], 7.0])
    stats = np.stack([logits.max(1), np.exp(logits - logits.max(1)[:, None]).sum(1)],
                     axis=1)
    g = logits.copy()
    K("xent_grad_inplace", dt, dict(rows=rows, v=v, v_offset=5, alpha=1.0),
      stats, labels, g)
    ref = np.exp(logits - logits.max(1)[:, None]) / stats[:, 1:2]
    ref[2, 0] -= 1
    close(g, ref, dt)


# ---------------------------------------------------------------- embedding

@pytest.mark.parametrize("dt", DT)
@pytest.mark.parametrize("rows,e,voff,v", [(1, 1, 0, 1), (7, 5, 3, 4),
                                           (16, 33, 0, 10), (9, 8, 10, 6)])
def test_embedding(K, dt, rows, e, voff, v):
    rng = np.random.default_rng(rows)
    ids = rng.integers(-1, voff + v + 3, rows).astype(np.int64)
    ids[0] = voff  # at least one hit, duplicates likely
    table = rnd(rng, (v, e), dt)
    dst = rnd(rng, (rows, e), dt)
    ref = dst.astype(np.float64)
    for r, i in enumerate(ids):
        if voff <= i < voff + v:
            ref[r] += table[i - voff]
    K("embedding", dt, dict(rows=rows, e=e, v_offset=voff, v=v), ids, table, dst)
    close(dst, ref, dt)
    dy = rnd(rng, (rows, e), dt)
    dtab = rnd(rng, (v, e), dt)
    ref = dtab.astype(np.float64)
    for r, i in enumerate(ids):
        if voff <= i < voff + v:
            ref[i - voff] += dy[r]
    K("embedding_backward", dt, dict(rows=rows, e=e, v_offset=voff, v=v), ids,
      dy, dtab)
    close(dtab, ref, dt)


# ---------------------------------------------------------------- layernorm

@pytest.mark.parametrize("dt", DT)
@SETTINGS
@given(rows=st.integers(1, 6), e_total=st.integers(1, 70), seed=seeds,
       ntiles=st.integers(1, 4), beta=st.sampled_from([0.0, 1.0]))
def test_layernorm(K, dt, rows, e_total, seed, ntiles, beta):
    rng = np.random.default_rng(seed)
    eps = 1e-5
    x = rnd(rng, (rows, e_total), dt) * 2 + 3
    gamma = rnd(rng, e_total, dt)
    bet = rnd(rng, e_total, dt)
    dy = rnd(rng, (rows, e_total), dt)
    cuts = sorted(rng.choice(np.arange(1, e_total),
                             size=min(ntiles - 1, e_total - 1),
                             replace=False)) if e_total > 1 else []
    bounds = [0, *cuts, e_total]
    sl = [slice(a, b) for a, b in zip(bounds[:-1], bounds[1:])]
    c = np.ascontiguousarray
    stats = nans((rows, 2), dt)
    for s in sl:
        K("layernorm_stats", dt, dict(rows=rows, e=s.stop - s.start,
                                      e_offset=s.start), c(x[:, s]), stats)
    x64 = x.astype(np.float64)
    mean = x64.mean(1)
    m2 = ((x64 - mean[:, None]) ** 2).sum(1)
    close(stats[:, 0], mean, dt)
    close(stats[:, 1], m2, dt, rtol_mult=10, scale=max(1.0, m2.max()))
    rstd = 1 / np.sqrt(m2 / e_total + eps)
    xhat = (x64 - mean[:, None]) * rstd[:, None]
    yref = xhat * gamma + bet
    y = np.concatenate([_ln_fwd(K, dt, c(x[:, s]), stats, c(gamma[s]), c(bet[s]),
                                e_total, eps) for s in sl], axis=1)
    close(y, yref, dt, rtol_mult=10)
    # backward
    rowacc = nans((rows, 2), dt)
    dgamma = rnd(rng, e_total, dt)
    dbeta = rnd(rng, e_total, dt)
    dg_ref = dgamma.astype(np.float64) + (dy * xhat).sum(0)
    db_ref = dbeta.astype(np.float64) + dy.astype(np.float64).sum(0)
    for t, s in enumerate(sl):
        dgt, dbt = c(dgamma[s]), c(dbeta[s])
        K("layernorm_backward_reduce", dt,
          dict(rows=rows, e=s.stop - s.start, e_total=e_total, eps=eps,
               init=int(t == 0)),
          c(x[:, s]), c(dy[:, s]), stats, c(gamma[s]), rowacc, dgt, dbt)
        dgamma[s], dbeta[s] = dgt, dbt
    g = dy * gamma.astype(np.float64)
    close(rowacc[:, 0], g.sum(1), dt, rtol_mult=10,
          scale=max(1.0, np.abs(g).sum(1).max()))
    close(rowacc[:, 1], (g * xhat).sum(1), dt, rtol_mult=10,
          scale=max(1.0, np.abs(g * xhat).sum(1).max()))
    close(dgamma, dg_ref, dt, rtol_mult=10)
    close(dbeta, db_ref, dt, rtol_mult=10)
    dx0 = rnd(rng, (rows, e_total), dt)
    dxref = rstd[:, None] * (g - g.mean(1, keepdims=True)
                             - xhat * (g * xhat).mean(1, keepdims=True))
    dxref = dxref + (beta * dx0 if beta else 0)
    outs = []
    for s in sl:
        dxt = nans((rows, s.stop - s.start), dt) if beta == 0 else c(dx0[:, s])
        K("layernorm_backward", dt, dict(rows=rows, e=s.stop - s.start,
                                         e_total=e_total, eps=eps, beta=beta),
          c(x[:, s]), c(dy[:, s]), stats, c(gamma[s]), rowacc, dxt)
        outs.append(dxt)
    close(np.concatenate(outs, axis=1), dxref, dt, rtol_mult=50)


def _ln_fwd(K, dt, x, stats, gamma, beta_, e_total, eps):
    y = nans(x.shape, dt)
    K("layernorm_forward", dt, dict(rows=x.shape[0], e=x.shape[1],
                                    e_total=e_total, eps=eps),
      x, stats, gamma, beta_, y)
    return y


def test_layernorm_against_torch(K):
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(5)
    x = rnd(rng, (4, 24), "fp64")
    w, b = rnd(rng, 24, "fp64"), rnd(rng, 24, "fp64")
    stats = nans((4, 2), "fp64")
    K("layernorm_stats", "fp64", dict(rows=4, e=24, e_offset=0), x, stats)
    y = _ln_fwd(K, "fp64", x, stats, w, b, 24, 1e-5)
    ref = torch.nn.functional.layer_norm(torch.from_numpy(x), (24,),
                                         torch.from_numpy(w),
                                         torch.from_numpy(b), 1e-5).numpy()
    close(y, ref, "fp64", rtol_mult=10)


# ---------------------------------------------------------------- subcopy

@pytest.mark.parametrize("dt", DT)
@SETTINGS
@given(data=st.data(), ndim=st.integers(0, 5))
def test_subcopy(K, dt, data, ndim):
    src_shape = [data.draw(st.integers(1, 5)) for _ in range(ndim)]
    dst_shape = [data.draw(st.integers(1, 5)) for _ in range(ndim)]
    copy_shape, so, do = [], [], []
    for a, b in zip(src_shape, dst_shape):
        cs = data.draw(st.integers(1, min(a, b)))
        # sometimes copy a whole axis to exercise dim merging
        copy_shape.append(cs)
        so.append(data.draw(st.integers(0, a - cs)))
        do.append(data.draw(st.integers(0, b - cs)))
    rng = np.random.default_rng(data.draw(seeds))
    src = rnd(rng, src_shape, dt)
    dst = rnd(rng, dst_shape, dt)
    ref = dst.copy()
    ref[tuple(slice(o, o + c) for o, c in zip(do, copy_shape))] = \
        src[tuple(slice(o, o + c) for o, c in zip(so, copy_shape))]
    K("subcopy", dt, dict(ndim=ndim, src_shape=src_shape, dst_shape=dst_shape,
                          copy_shape=copy_shape, src_offset=so, dst_offset=do),
      src, dst)
    np.testing.assert_array_equal(dst, ref)


def test_subcopy_8d_merge(K):
    rng = np.random.default_rng(0)
    src = rnd(rng, (2, 3, 2, 2, 1, 2, 3, 4), "fp32")
    dst = rnd(rng, (3, 3, 2, 2, 1, 2, 3, 4), "fp32")
    ref = dst.copy()
    ref[1:3, 1:3] = src[0:2, 0:2]
    K("subcopy", "fp32", dict(ndim=8, src_shape=src.shape, dst_shape=dst.shape,
                              copy_shape=(2, 2, 2, 2, 1, 2, 3, 4),
                              src_offset=[0] * 8,
                              dst_offset=[1, 1, 0, 0, 0, 0, 0, 0]), src, dst)
    np.testing.assert_array_equal(dst, ref)


# ---------------------------------------------------------------- gemm

@pytest.mark.parametrize("dt", DT)
@SETTINGS
@given(M=st.integers(1, 9), N=st.integers(1, 9), K_=st.integers(0, 9),
       tA=st.booleans(), tB=st.booleans(), b1=st.integers(1, 3),
       b2=st.integers(1, 2), pad=st.integers(0, 2), seed=seeds,
       beta=st.sampled_from([0.0, 1.0, 0.5]))
def test_gemm(K, dt, M, N, K_, tA, tB, b1, b2, pad, seed, beta):
    rng = np.random.default_rng(seed)
    ar, ac = (K_, M) if tA else (M, K_)
    br, bc = (N, K_) if tB else (K_, N)
    lda, ldb, ldc = max(ac, 1) + pad, max(bc, 1) + pad, N + pad
    sA2 = ar * lda + pad
    sB2 = br * ldb
    sC2 = M * ldc + pad
    sA1, sB1, sC1 = b2 * sA2, b2 * sB2, b2 * sC2
    A = rnd(rng, b1 * sA1 + 1, dt)
    B = rnd(rng, b1 * sB1 + 1, dt)
    Cb = rnd(rng, b1 * sC1 + 1, dt)
    if beta == 0:
        Cb[:] = np.nan
    ref = Cb.astype(np.float64)
    for i in range(b1):
        for j in range(b2):
            a = A[i * sA1 + j * sA2:][: ar * lda].reshape(ar, lda)[:, :ac] \
                if ar else np.zeros((ar, ac))
            b = B[i * sB1 + j * sB2:][: br * ldb].reshape(br, ldb)[:, :bc] \
                if br else np.zeros((br, bc))
            a = a.astype(np.float64).T if tA else a.astype(np.float64)
            b = b.astype(np.float64).T if tB else b.astype(np.float64)
            off = i * sC1 + j * sC2
            c = ref[off: off + M * ldc].reshape(M, ldc)
            c[:, :N] = 0.8 * a @ b + (beta * c[:, :N] if beta else 0)
    K("gemm", dt, dict(transA=int(tA), transB=int(tB), M=M, N=N, K=K_,
                       alpha=0.8, beta=beta, batch1=b1, batch2=b2, lda=lda,
                       ldb=ldb, ldc=ldc, strideA1=sA1, strideA2=sA2,
                       strideB1=sB1, strideB2=sB2, strideC1=sC1, strideC2=sC2),
      A, B, Cb)
    # padding entries untouched (NaN stays NaN where beta==0)
    np.testing.assert_array_equal(np.isnan(Cb), np.isnan(ref))
    fin = ~np.isnan(ref)
    close(Cb[fin], ref[fin], dt, rtol_mult=10, scale=max(1.0, K_ * 4.0))


# ---------------------------------------------------------------- optimizers

def torch_steps(torch, rng, n, dt, tp, opt, max_norm):
    """Steps 1 to 5 of torch's optimizer opt on parameter tp, with a random gradient each
    (clipped to max_norm when max_norm > 0); yields (step, gradient, its squared norm) after
    torch's step, for the kernel to take the same one."""
    tdt = torch.float32 if dt == "fp32" else torch.float64
    for step in range(1, 6):
        g = rnd(rng, n, dt)
        normsq = np.array([np.sum(g.astype(np.float64) ** 2)], dtype=DTYPES[dt])
        tp.grad = torch.from_numpy(g.copy()).to(tdt)
        if max_norm > 0:
            torch.nn.utils.clip_grad_norm_([tp], max_norm, foreach=False)
        opt.step()
        yield step, g, normsq


@pytest.mark.parametrize("dt", DT)
@pytest.mark.parametrize("decoupled,wd,max_norm", [
    (0, 0.0, 0.0), (0, 0.1, 0.0), (1, 0.01, 0.0), (1, 0.1, 0.5),
    (0, 0.0, 100.0), (0, 0.05, 0.3)])
def test_adam_vs_torch(K, dt, decoupled, wd, max_norm):
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(11)
    n = 1000
    p = rnd(rng, n, dt)
    tp = torch.nn.Parameter(torch.from_numpy(p.copy()))
    cls = torch.optim.AdamW if decoupled else torch.optim.Adam
    lr, b1, b2, eps = 1e-2, 0.9, 0.95, 1e-8
    opt = cls([tp], lr=lr, betas=(b1, b2), eps=eps, weight_decay=wd,
              foreach=False, fused=False)
    m = nans(n, dt)
    v = nans(n, dt)
    m[:] = 0
    v[:] = 0
    for step, g, normsq in torch_steps(torch, rng, n, dt, tp, opt, max_norm):
        K("adam_step", dt, dict(n=n, step=step, lr=lr, beta1=b1, beta2=b2,
                                eps=eps, weight_decay=wd, decoupled=decoupled,
                                max_norm=max_norm),
          p, g, m, v, normsq if max_norm > 0 else None)
        st_ = opt.state[tp]
        close(m, st_["exp_avg"].numpy(), dt, rtol_mult=10)
        close(v, st_["exp_avg_sq"].numpy(), dt, rtol_mult=10)
        close(p, tp.detach().numpy(), dt, rtol_mult=10)


@pytest.mark.parametrize("dt", DT)
@pytest.mark.parametrize("momentum,dampening,nesterov,wd,max_norm", [
    (0.0, 0.0, 0, 0.0, 0.0), (0.9, 0.0, 0, 0.0, 0.0), (0.9, 0.1, 0, 0.01, 0.0),
    (0.8, 0.0, 1, 0.05, 0.0), (0.0, 0.0, 0, 0.1, 0.7), (0.9, 0.0, 1, 0.0, 0.5)])
def test_sgd_vs_torch(K, dt, momentum, dampening, nesterov, wd, max_norm):
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(12)
    n = 777
    p = rnd(rng, n, dt)
    tp = torch.nn.Parameter(torch.from_numpy(p.copy()))
    opt = torch.optim.SGD([tp], lr=0.05, momentum=momentum, dampening=dampening,
                          nesterov=bool(nesterov), weight_decay=wd,
                          foreach=False, fused=False)
    buf = nans(n, dt) if momentum == 0 else nans(n, dt)
    for step, g, normsq in torch_steps(torch, rng, n, dt, tp, opt, max_norm):
        K("sgd_step", dt, dict(n=n, step=step, lr=0.05, momentum=momentum,
                               dampening=dampening, weight_decay=wd,
                               nesterov=nesterov, max_norm=max_norm),
          p, g, buf, normsq if max_norm > 0 else None)
        close(p, tp.detach().numpy(), dt, rtol_mult=10)
        if momentum != 0:
            close(buf, opt.state[tp]["momentum_buffer"].numpy(), dt,
                  rtol_mult=10)


# ---------------------------------------------------------------- accumulation

def test_fp32_reductions_accumulate_in_double(K):
    """2^20 copies of float32(0.1): a float accumulator would be off by ~1e-3
    relative; a double one matches to float rounding."""
    dt = "fp32"
    x = np.full(1 << 20, 0.1, dtype=np.float32)
    exact = float(np.float32(0.1)) * x.size
    out = nans(1, dt)
    K("sumsq", dt, dict(n=x.size, beta=0.0), x, out)
    assert abs(out[0] / (exact * float(np.float32(0.1))) - 1) < 2e-7
    fib = nans(1, dt)
    K("sum_fiber", dt, dict(m=x.size, k=1, n=1, alpha=1.0, beta=0.0), x, fib)
    assert abs(fib[0] / exact - 1) < 2e-7
    fib = nans(4, dt)
    K("sum_fiber", dt, dict(m=1024, k=4, n=256, alpha=1.0, beta=0.0), x, fib)
    np.testing.assert_allclose(fib, exact / 4, rtol=2e-7)
    sl = nans(1, dt)
    K("sum_slice", dt, dict(m=1, k=x.size, n=1, alpha=1.0, beta=0.0), x, sl)
    assert abs(sl[0] / exact - 1) < 2e-7
    sl = nans(2, dt)
    K("sumprod_slice", dt, dict(m=1, k=x.size // 2, n=2, alpha=1.0, beta=0.0),
      x, x, sl)
    np.testing.assert_allclose(sl, exact * float(np.float32(0.1)) / 2,
                               rtol=2e-7)


@pytest.mark.parametrize("dt", DT)
def test_vectorised_exp_accuracy(K, dt):
    """softmax_inplace with stats (max=0, sum=1) computes exp(x) itself."""
    npdt = DTYPES[dt]
    info = np.finfo(npdt)
    lo, hi = (-87.3, 88.3) if dt == "fp32" else (-708.3, 709.4)
    rng = np.random.default_rng(0)
    x = np.concatenate([np.linspace(lo, hi, 20001), rng.uniform(-1, 1, 5000),
                        [0.0, -0.0, 1e-30, -1e-30]]).astype(npdt)
    y = x.copy()
    K("softmax_inplace", dt, dict(m=1, k=x.size, n=1),
      np.array([0.0, 1.0], dtype=npdt), y)
    ref = np.exp(x.astype(np.longdouble))
    rel = np.abs((y.astype(np.longdouble) - ref) / ref)
    assert float(rel.max()) < 4 * info.eps
    special = np.array([-np.inf, -1e6, 1e6, np.inf, np.nan], dtype=npdt)
    K("softmax_inplace", dt, dict(m=1, k=special.size, n=1),
      np.array([0.0, 1.0], dtype=npdt), special)
    assert special[0] == 0 and special[1] == 0
    assert special[2] == np.inf and special[3] == np.inf
    assert np.isnan(special[4])


# ---------------------------------------------------------------- bf16
# bf16 tiles hold bfloat16 bits (uint16) and compute in float.  Each test runs
# the bf16 kernel and, as the reference, the fp32 kernel on the same
# (bf16-representable) inputs; results must agree to bf16 precision.

def bf16_ref_bits(x):
    """Reference float32 -> bf16 rounding, written independently of the
    kernels: of the two bf16 neighbours of x pick the nearer, ties to the even
    one; past the largest finite value round as if 2**128 were representable
    (IEEE overflow to inf); NaN -> quiet NaN of the same sign."""
    x = np.ascontiguousarray(x, dtype=np.float32)
    u = x.view(np.uint32)
    lo = (u >> 16).astype(np.int64)          # truncation toward zero
    hi = lo + 1                              # next magnitude up
    def mag(b):
        b = b & 0x7FFF
        v = (b.astype(np.uint32) << 16).view(np.float32).astype(np.float64)
        return np.where(b == 0x7F80, 2.0 ** 128, v)
    with np.errstate(invalid="ignore"):
        ax = np.abs(x.astype(np.float64))
        dlo, dhi = ax - mag(lo), mag(hi) - ax
    up = (dhi < dlo) | ((dhi == dlo) & (lo % 2 == 1))
    finite = np.isfinite(x)
    bits = np.where(finite & up, hi, lo)
    bits = np.where(np.isnan(x), lo | 0x40, bits)
    return bits.astype(np.uint16)


def from_bf16(bits):
    return (np.asarray(bits, np.uint16).astype(np.uint32) << 16).view(np.float32)


def bf(x):
    """x rounded to bf16, as float32."""
    return from_bf16(bf16_ref_bits(np.asarray(x, np.float32)))


class Pair:
    """The same values as an fp32 buffer and a bf16 buffer."""

    def __init__(self, x):
        x = bf(x)
        self.f = np.ascontiguousarray(x, dtype=np.float32)
        self.b = bf16_ref_bits(x)

    @classmethod
    def nan(cls, shape):
        return cls(np.full(shape, np.nan, np.float32))

    @property
    def got(self):
        return from_bf16(self.b)


def both(K, op, args, *bufs):
    """Run op in fp32 and bf16; Pair buffers are updated in place."""
    K(op, "fp32", args, *[b.f if isinstance(b, Pair) else b for b in bufs])
    K(op, "bf16", args, *[b.b if isinstance(b, Pair) else b for b in bufs])


def close16(pair, rtol=1e-2, scale=None):
    """bf16 result vs the fp32 one: same NaN/inf pattern, finite values within
    rtol relative plus rtol * (the reference's magnitude) absolute."""
    got = pair.got.astype(np.float64)
    ref = pair.f.astype(np.float64)
    np.testing.assert_array_equal(np.isnan(got), np.isnan(ref))
    fin = np.isfinite(ref)
    np.testing.assert_array_equal(got[~fin & ~np.isnan(ref)], ref[~fin & ~np.isnan(ref)])
    if scale is None:
        scale = float(np.abs(ref[fin]).max()) if fin.any() else 1.0
    np.testing.assert_allclose(got[fin], ref[fin], rtol=rtol, atol=rtol * scale)


def rnd16(rng, shape, scale=1.0):
    return Pair(scale * rng.standard_normal(shape))


def test_bf16_store_rounding(K):
    """fill stores a (float) value: exhaustive over a sample of float32 bit
    patterns (every exponent), ties, subnormals, overflow and NaNs."""
    rng = np.random.default_rng(0)
    pats = rng.integers(0, 2**32, 4000, dtype=np.uint64).astype(np.uint32)
    ties = (rng.integers(0, 2**16, 500).astype(np.uint32) << 16) | 0x8000
    special = np.array([0, 0x80000000, 0x7F800000, 0xFF800000, 0x7FC00000,
                        0xFFC00000, 0x7F800001, 0xFF800001, 0x7F7FFFFF,
                        0x7F7F7FFF, 0x7F7F8000, 0x7F7F8001, 0x00000001,
                        0x00008000, 0x00018000, 0x007FFFFF, 0x3F808000,
                        0x3F818000, 0x3F7FFFFF], dtype=np.uint32)
    vals = np.concatenate([pats, ties, special]).view(np.float32)
    want = bf16_ref_bits(vals)
    got = np.empty_like(want)
    out = np.empty(1, np.uint16)
    for i, v in enumerate(vals):
        K("fill", "bf16", dict(n=1, value=float(v)), out)
        got[i] = out[0]
    nan = np.isnan(vals)
    np.testing.assert_array_equal(got[~nan], want[~nan])
    # NaN: stays NaN, keeps its sign
    g = got[nan]
    assert ((g & 0x7F80) == 0x7F80).all() and ((g & 0x7F) != 0).all()
    np.testing.assert_array_equal(g >> 15, want[nan] >> 15)
    assert from_bf16(want[:4000][~nan[:4000]]).size  # sanity of the sample


def test_bf16_fill_rounds_a_double_once(K):
    """Scalars arrive as double: just above, at and just below a tie between
    two bf16 neighbours (float32 would turn the near values into the tie)."""
    rng = np.random.default_rng(5)
    lo_bits = rng.integers(0, 0x7F7F, 300).astype(np.uint16)
    lo = from_bf16(lo_bits).astype(np.float64)
    hi = from_bf16(lo_bits + 1).astype(np.float64)
    tie, eps = (lo + hi) / 2, (hi - lo) * 2.0 ** -30
    even = np.where(lo_bits % 2 == 0, lo_bits, lo_bits + 1)
    out = np.empty(1, np.uint16)
    for sign in (0, 0x8000):
        s = -1.0 if sign else 1.0
        for vals, want in ((tie + eps, lo_bits + 1), (tie, even), (tie - eps, lo_bits)):
            for v, w in zip(vals, want):
                K("fill", "bf16", dict(n=1, value=s * float(v)), out)
                assert out[0] == (int(w) | sign), (s * v, hex(out[0]), hex(w | sign))
    for v, w in ((1e300, 0x7F80), (-1e300, 0xFF80), (3.3961775e38, 0x7F7F),
                 (1e-300, 0), (-1e-300, 0x8000), (2.0 ** -134 * 1.5, 1)):
        K("fill", "bf16", dict(n=1, value=v), out)
        assert out[0] == w, (v, hex(out[0]))


def test_bf16_copy_subcopy_are_bit_exact(K):
    rng = np.random.default_rng(1)
    src = rng.integers(0, 2**16, (3, 4, 5), dtype=np.uint64).astype(np.uint16)
    dst = np.zeros(src.size, np.uint16)
    K("copy", "bf16", dict(n=src.size), src, dst)
    np.testing.assert_array_equal(dst, src.ravel())   # NaN payloads too
    dst = rng.integers(0, 2**16, (4, 4, 6), dtype=np.uint64).astype(np.uint16)
    ref = dst.copy()
    ref[1:3, 0:3, 2:6] = src[0:2, 1:4, 0:4]
    K("subcopy", "bf16", dict(ndim=3, src_shape=src.shape, dst_shape=dst.shape,
                              copy_shape=(2, 3, 4), src_offset=(0, 1, 0),
                              dst_offset=(1, 0, 2)), src, dst)
    np.testing.assert_array_equal(dst, ref)
    one = np.array([0x7F80], np.uint16)
    K("mask_causal", "bf16", dict(batch=1, tq=1, tk=1, q_offset=0, k_offset=1), one)
    assert one[0] == 0xFF80  # -inf


@pytest.mark.parametrize("beta", [0.0, 1.0, -0.75])
@pytest.mark.parametrize("n", [1, 7, 64, 1001])
def test_bf16_elementwise(K, beta, n):
    rng = np.random.default_rng(n)
    src = rnd16(rng, n)
    dst = Pair.nan(n) if beta == 0 else rnd16(rng, n)
    both(K, "add", dict(n=n, alpha=0.3, beta=beta), src, dst)
    close16(dst)
    out = Pair.nan(1) if beta == 0 else rnd16(rng, 1)
    both(K, "sumsq", dict(n=n, beta=beta), src, out)
    close16(out)
    a, b = rnd16(rng, n), rnd16(rng, n)
    both(K, "scal", dict(n=n, alpha=1.7), a)
    close16(a)
    dst = Pair.nan(n)
    both(K, "prod", dict(n=n, alpha=-0.5), a, b, dst)
    close16(dst)
    x = rnd16(rng, n, 3.0)
    for name in UNARY:
        y = Pair.nan(n)
        both(K, name, dict(n=n), x, y)
        close16(y)
    for name in ("gelu", "gelutanh"):
        dx = Pair.nan(n) if beta == 0 else rnd16(rng, n)
        both(K, name + "_backward", dict(n=n, beta=beta), x, b, dx)
        close16(dx)


@pytest.mark.parametrize("m,k,n", [(3, 17, 1), (2, 5, 4), (1, 40, 3)])
@pytest.mark.parametrize("beta", [0.0, 1.0])
def test_bf16_fiber_slice(K, m, k, n, beta):
    rng = np.random.default_rng(m * k * n)
    a = dict(m=m, k=k, n=n, alpha=1.3, beta=beta)
    fib, s1, s2 = rnd16(rng, k), rnd16(rng, (m, k, n)), rnd16(rng, (m, k, n))
    dst = Pair.nan((m, k, n)) if beta == 0 else rnd16(rng, (m, k, n))
    both(K, "add_fiber", a, fib, dst)
    close16(dst)
    both(K, "prod_fiber", dict(m=m, k=k, n=n, alpha=-0.4), fib, dst)
    close16(dst)
    for op, srcs in (("sum_fiber", (s1,)), ("sumprod_fiber", (s1, s2))):
        out = Pair.nan(k) if beta == 0 else rnd16(rng, k)
        both(K, op, a, *srcs, out)
        close16(out, scale=np.abs(s1.f).max() * m * n)
    for op, srcs in (("sum_slice", (s1,)), ("sumprod_slice", (s1, s2))):
        out = Pair.nan((m, n)) if beta == 0 else rnd16(rng, (m, n))
        both(K, op, a, *srcs, out)
        close16(out, scale=np.abs(s1.f).max() * k)
    sl = rnd16(rng, (m, n))
    dst = Pair.nan((m, k, n)) if beta == 0 else rnd16(rng, (m, k, n))
    both(K, "add_slice", a, sl, dst)
    close16(dst)
    both(K, "prod_slice", dict(m=m, k=k, n=n, alpha=0.7), sl, dst)
    close16(dst)


def _tiles16(x, cuts, axis=1):
    return [Pair(np.ascontiguousarray(t)) for t in np.split(x, cuts, axis=axis)]


@pytest.mark.parametrize("m,k,n,cuts", [(4, 30, 1, [7, 19]), (3, 12, 5, [5]),
                                        (2, 9, 2, [])])
def test_bf16_maxsumexp_softmax(K, m, k, n, cuts):
    rng = np.random.default_rng(k)
    x = bf(4 * rng.standard_normal((m, k, n)))
    x[rng.random((m, k, n)) < 0.3] = -np.inf
    x[0, :, 0] = -np.inf                  # a fully masked row
    x[1, : (k + 1) // 2, :] = -np.inf     # masked in the first tile(s)
    stats = Pair.nan((m, n, 2))
    tiles = _tiles16(x, cuts)
    for t, tile in enumerate(tiles):
        both(K, "maxsumexp", dict(m=m, k=tile.f.shape[1], n=n, init=int(t == 0)),
             tile, stats)
    np.testing.assert_array_equal(stats.got[..., 0], stats.f[..., 0])  # max is exact
    assert stats.got[0, 0, 0] == -np.inf and stats.got[0, 0, 1] == 0
    close16(stats)
    for tile in tiles:
        both(K, "softmax_inplace", dict(m=m, k=tile.f.shape[1], n=n), stats, tile)
        close16(tile, rtol=2e-2)
    lse = Pair.nan(m * n)
    st2 = Pair(stats.got.reshape(-1, 2))
    st2.f = np.ascontiguousarray(stats.f.reshape(-1, 2))
    both(K, "logsumexp", dict(n=m * n), st2, lse)
    close16(lse)
    # softmax backward on the probabilities
    p = Pair(np.concatenate([t.got for t in tiles], axis=1))
    dp = rnd16(rng, (m, k, n))
    sums = Pair.nan((m, n))
    both(K, "sumprod_slice", dict(m=m, k=k, n=n, alpha=1.0, beta=0.0), p, dp, sums)
    dp_scale = 0.5 * np.abs(p.f).max() * (np.abs(dp.f).max() + np.abs(sums.f).max())
    both(K, "softmax_backward", dict(m=m, k=k, n=n, alpha=0.5), p, sums, dp)
    close16(dp, rtol=2e-2, scale=dp_scale)  # dp - sums cancels


@pytest.mark.parametrize("rows,vocab,cuts", [(9, 50, [13, 31]), (4, 7, []),
                                             (6, 33, [32])])
def test_bf16_xent(K, rows, vocab, cuts):
    rng = np.random.default_rng(vocab)
    logits = bf(3 * rng.standard_normal((rows, vocab)))
    labels = rng.integers(0, vocab, rows).astype(np.int64)
    bounds = [0, *cuts, vocab]
    tiles = _tiles16(logits, cuts)
    stats = Pair.nan((rows, 2))
    picked = Pair(np.full(rows, 12345.0))
    for t, (tile, off) in enumerate(zip(tiles, bounds)):
        v = tile.f.shape[1]
        both(K, "maxsumexp", dict(m=rows, k=v, n=1, init=int(t == 0)), tile, stats)
        both(K, "xent_picked", dict(rows=rows, v=v, v_offset=off), tile, labels, picked)
    np.testing.assert_array_equal(picked.got, logits[np.arange(rows), labels])
    lse = Pair.nan(rows)
    both(K, "logsumexp", dict(n=rows), stats, lse)
    close16(lse)
    loss = Pair.nan(1)
    both(K, "xent_loss", dict(rows=rows, alpha=1.0 / rows, beta=0.0), lse, picked, loss)
    close16(loss)
    l64 = logits.astype(np.float64)
    ref = (np.log(np.exp(l64 - l64.max(1, keepdims=True)).sum(1)) + l64.max(1)
           - l64[np.arange(rows), labels]).mean()
    assert abs(loss.got[0] - ref) <= 1e-2 * abs(ref)
    for tile, off in zip(tiles, bounds):
        both(K, "xent_grad_inplace", dict(rows=rows, v=tile.f.shape[1], v_offset=off,
                                          alpha=0.25), stats, labels, tile)
        close16(tile, rtol=2e-2, scale=0.25)


def test_bf16_embedding(K):
    rng = np.random.default_rng(2)
    rows, e, voff, v = 16, 33, 3, 10
    ids = rng.integers(-1, voff + v + 3, rows).astype(np.int64)
    ids[0] = voff
    table, dst = rnd16(rng, (v, e)), rnd16(rng, (rows, e))
    both(K, "embedding", dict(rows=rows, e=e, v_offset=voff, v=v), ids, table, dst)
    close16(dst)
    dy, dtab = rnd16(rng, (rows, e)), rnd16(rng, (v, e))
    both(K, "embedding_backward", dict(rows=rows, e=e, v_offset=voff, v=v), ids, dy, dtab)
    close16(dtab)


@pytest.mark.parametrize("rows,e_total,cuts", [(6, 70, [20, 45]), (3, 24, []),
                                               (5, 9, [4])])
@pytest.mark.parametrize("beta", [0.0, 1.0])
def test_bf16_layernorm(K, rows, e_total, cuts, beta):
    rng = np.random.default_rng(e_total)
    eps = 1e-5
    x = bf(rng.standard_normal((rows, e_total)) * 2 + 0.5)
    gamma, bet = bf(rng.standard_normal(e_total)), bf(rng.standard_normal(e_total))
    dy = bf(rng.standard_normal((rows, e_total)))
    bounds = [0, *cuts, e_total]
    sl = [slice(a, b) for a, b in zip(bounds[:-1], bounds[1:])]
    c = np.ascontiguousarray
    stats = Pair.nan((rows, 2))
    for s in sl:
        both(K, "layernorm_stats", dict(rows=rows, e=s.stop - s.start, e_offset=s.start),
             Pair(c(x[:, s])), stats)
    close16(stats, scale=1.0)
    for s in sl:
        y = Pair.nan((rows, s.stop - s.start))
        both(K, "layernorm_forward", dict(rows=rows, e=s.stop - s.start, e_total=e_total,
                                          eps=eps),
             Pair(c(x[:, s])), stats, Pair(c(gamma[s])), Pair(c(bet[s])), y)
        close16(y, rtol=2e-2)
    rowacc = Pair.nan((rows, 2))
    for t, s in enumerate(sl):
        dg, db = rnd16(rng, s.stop - s.start), rnd16(rng, s.stop - s.start)
        both(K, "layernorm_backward_reduce",
             dict(rows=rows, e=s.stop - s.start, e_total=e_total, eps=eps, init=int(t == 0)),
             Pair(c(x[:, s])), Pair(c(dy[:, s])), stats, Pair(c(gamma[s])), rowacc, dg, db)
        close16(dg, rtol=2e-2)
        close16(db, rtol=2e-2)
    close16(rowacc, rtol=2e-2, scale=np.abs(dy * gamma).sum(1).max())
    for s in sl:
        w = s.stop - s.start
        dx = Pair.nan((rows, w)) if beta == 0 else rnd16(rng, (rows, w))
        both(K, "layernorm_backward", dict(rows=rows, e=w, e_total=e_total, eps=eps,
                                           beta=beta),
             Pair(c(x[:, s])), Pair(c(dy[:, s])), stats, Pair(c(gamma[s])), rowacc, dx)
        close16(dx, rtol=3e-2)


@pytest.mark.parametrize("tA", [0, 1])
@pytest.mark.parametrize("tB", [0, 1])
@pytest.mark.parametrize("beta", [0.0, 1.0, 0.5])
@pytest.mark.parametrize("M,N,K_,b1,b2,pad", [(7, 5, 9, 1, 1, 0), (4, 6, 33, 2, 3, 2),
                                               (65, 70, 40, 1, 2, 1), (3, 2, 0, 2, 1, 1)])
def test_bf16_gemm(K, tA, tB, beta, M, N, K_, b1, b2, pad):
    """bf16 in, float accumulation, bf16 out; padding (and, when beta == 0,
    the old contents of C) never read or written."""
    rng = np.random.default_rng(M * N + K_)
    ar, ac = (K_, M) if tA else (M, K_)
    br, bc = (N, K_) if tB else (K_, N)
    lda, ldb, ldc = max(ac, 1) + pad, max(bc, 1) + pad, N + pad
    sA2, sB2, sC2 = ar * lda + pad, br * ldb, M * ldc + pad
    sA1, sB1, sC1 = b2 * sA2, b2 * sB2, b2 * sC2
    A, B = rnd16(rng, b1 * sA1 + 1), rnd16(rng, b1 * sB1 + 1)
    Cb = rnd16(rng, b1 * sC1 + 1)
    mask = np.zeros(Cb.f.shape, bool)  # entries that are part of some C_b
    for i in range(b1):
        for j in range(b2):
            off = i * sC1 + j * sC2
            mask[off: off + M * ldc].reshape(M, ldc)[:, :N] = True
    if beta == 0:
        Cb.f[mask] = np.nan
        Cb.b[mask] = 0x7FC0
    pad_bits = Cb.b[~mask].copy()
    both(K, "gemm", dict(transA=tA, transB=tB, M=M, N=N, K=K_, alpha=0.8, beta=beta,
                         batch1=b1, batch2=b2, lda=lda, ldb=ldb, ldc=ldc,
                         strideA1=sA1, strideA2=sA2, strideB1=sB1, strideB2=sB2,
                         strideC1=sC1, strideC2=sC2), A, B, Cb)
    np.testing.assert_array_equal(Cb.b[~mask], pad_bits)
    assert not np.isnan(Cb.got[mask]).any()
    # the fp32 kernel on bf16 inputs is the exact-input reference: the only
    # differences are float summation order and the final rounding
    got, ref = Cb.got[mask].astype(np.float64), Cb.f[mask].astype(np.float64)
    np.testing.assert_allclose(got, ref, rtol=2 ** -8, atol=1e-5 * max(1.0, K_))


@pytest.mark.parametrize("decoupled,wd,max_norm", [(0, 0.0, 0.0), (1, 0.1, 0.0),
                                                   (1, 0.01, 0.5), (0, 0.05, 0.3)])
def test_bf16_adam(K, decoupled, wd, max_norm):
    rng = np.random.default_rng(11)
    n = 1000
    p = rnd16(rng, n)
    p0 = p.f.astype(np.float64)
    m, v = Pair(np.zeros(n)), Pair(np.zeros(n))
    for step in range(1, 6):
        g = rnd16(rng, n)
        normsq = Pair([np.sum(g.f.astype(np.float64) ** 2)])
        both(K, "adam_step", dict(n=n, step=step, lr=1e-2, beta1=0.9, beta2=0.95, eps=1e-8,
                                  weight_decay=wd, decoupled=decoupled, max_norm=max_norm),
             p, g, m, v, normsq if max_norm > 0 else None)
        close16(m, rtol=2e-2)
        close16(v, rtol=2e-2)
        close16(p, rtol=2e-2)
    # The update itself (lr = 1e-2 per step) is close to bf16's resolution
    # for |p| ~ 1 (2**-8): p is rounded at every step, which is the one source
    # of difference; each step may add at most about one ulp of p.
    d16, d32 = p.got - p0, p.f - p0
    assert (np.abs(d16 - d32) <= 5 * 2.0 ** -8 * (np.abs(p0) + 0.05)).all()
    assert np.linalg.norm(d16 - d32) < 0.3 * np.linalg.norm(d32)


@pytest.mark.parametrize("momentum,nesterov,wd,max_norm", [(0.0, 0, 0.0, 0.0),
                                                           (0.9, 1, 0.05, 0.0),
                                                           (0.9, 0, 0.0, 0.5)])
def test_bf16_sgd(K, momentum, nesterov, wd, max_norm):
    rng = np.random.default_rng(12)
    n = 777
    p, buf = rnd16(rng, n), Pair.nan(n)
    for step in range(1, 6):
        g = rnd16(rng, n)
        normsq = Pair([np.sum(g.f.astype(np.float64) ** 2)])
        both(K, "sgd_step", dict(n=n, step=step, lr=0.05, momentum=momentum, dampening=0.0,
                                 weight_decay=wd, nesterov=nesterov, max_norm=max_norm),
             p, g, buf, normsq if max_norm > 0 else None)
        close16(p, rtol=2e-2)


# ---------------------------------------------------------------- bf16_fp32
# Mixed precision: bf16 data buffers (T) and float accumulator buffers (A).
# Each kernel computes what the fp32 kernel computes on the same values, then
# stores its data outputs rounded to bf16 once: accumulators must equal the
# fp32 kernel's, data outputs its results rounded to nearest even.

def mixed(K, op, args, roles, *arrays):
    """Run op's bf16_fp32 kernel and the fp32 one on the same values; roles
    gives each buffer's kind (T data, A accumulator, I int64). Returns the
    outputs as (mixed, fp32) pairs of float32 arrays, in buffer order."""
    ref = [np.ascontiguousarray(bf(a) if r == "T" else a,
                                np.int64 if r == "I" else np.float32)
           for r, a in zip(roles, arrays)]
    mix = [bf16_ref_bits(a) if r == "T" else a.copy() for r, a in zip(roles, ref)]
    K(op, "fp32", args, *ref)
    K(op, "bf16_fp32", args, *mix)
    return [(from_bf16(m) if r == "T" else m, f) for r, m, f in zip(roles, mix, ref)
            if r != "I"]


def assert_mixed(pairs, roles):
    """Accumulators as the fp32 kernel's; data outputs its values rounded."""
    for (got, ref), r in zip(pairs, roles.replace("I", "")):
        np.testing.assert_array_equal(got, bf(ref) if r == "T" else ref)


@pytest.mark.parametrize("m,k,n", [(3, 17, 1), (2, 5, 4), (1, 1, 1)])
def test_bf16_fp32_kernels_are_fp32_kernels_rounded_once(K, m, k, n):
    rng = np.random.default_rng(m * k + n)
    x, y = rng.standard_normal((m, k, n)), rng.standard_normal((m, k, n))
    fib, sl = rng.standard_normal(k), rng.standard_normal((m, n))
    mkn = dict(m=m, k=k, n=n)
    cases = [("add", dict(n=x.size, alpha=0.3, beta=1.0), "TA", x, y),
             ("cast", dict(n=x.size), "AT", x, y),
             ("add_fiber", dict(mkn, alpha=1.5, beta=-0.5), "AT", fib, x),
             ("sum_fiber", dict(mkn, alpha=1.5, beta=0.0), "TA", x, fib),
             ("sumprod_slice", dict(mkn, alpha=0.7, beta=1.0), "TTA", x, y, sl),
             ("softmax_backward", dict(mkn, alpha=0.5), "TAT", x, sl, y)]
    stats = np.empty((m, n, 2))
    cases.append(("maxsumexp", dict(mkn, init=1), "TA", x, stats))
    for op, args, roles, *arrays in cases:
        assert_mixed(mixed(K, op, args, roles, *arrays), roles)
    stats = mixed(K, "maxsumexp", dict(mkn, init=1), "TA", x, stats)[1][1]
    assert_mixed(mixed(K, "softmax_inplace", mkn, "AT", stats, x), "AT")
    # rows x vocabulary: cross entropy, layer norm
    rows, v = m * n, k
    logits, labels = x.reshape(rows, v), rng.integers(0, v, rows)
    xstats = mixed(K, "maxsumexp", dict(m=rows, k=v, n=1, init=1), "TA", logits,
                   np.empty((rows, 2)))[1][1]
    assert_mixed(mixed(K, "xent_picked", dict(rows=rows, v=v, v_offset=0), "TIA", logits,
                       labels, np.zeros(rows)), "TIA")
    assert_mixed(mixed(K, "xent_grad_inplace", dict(rows=rows, v=v, v_offset=0, alpha=0.5),
                       "AIT", xstats, labels, logits), "AIT")
    lnx = y.reshape(rows, v)
    lnstats = np.empty((rows, 2), np.float32)
    K("layernorm_stats", "fp32", dict(rows=rows, e=v, e_offset=0),
      np.ascontiguousarray(lnx, np.float32), lnstats)
    assert_mixed(mixed(K, "layernorm_forward", dict(rows=rows, e=v, e_total=v, eps=1e-5),
                       "AAAAT", lnx, lnstats, fib, fib[::-1], x), "AAAAT")


@pytest.mark.parametrize("tA,tB,beta", [(0, 0, 0.0), (1, 0, 1.0), (0, 1, -0.5)])
def test_bf16_fp32_gemm_accumulates_into_float(K, tA, tB, beta):
    rng = np.random.default_rng(3)
    M, N, K_ = 5, 4, 33
    A = rng.standard_normal((K_, M) if tA else (M, K_))
    B = rng.standard_normal((N, K_) if tB else (K_, N))
    C = rng.standard_normal((M, N))
    args = dict(transA=tA, transB=tB, M=M, N=N, K=K_, alpha=0.8, beta=beta, batch1=1,
                batch2=1, lda=A.shape[1], ldb=B.shape[1], ldc=N)
    assert_mixed(mixed(K, "gemm", args, "TTA", A, B, C), "TTA")


@pytest.mark.parametrize("max_norm", [0.0, 0.5])
def test_adam_step_refresh_is_adam_step_and_a_rounded_copy(K, max_norm):
    rng = np.random.default_rng(9)
    n = 257
    p, g = rng.standard_normal(n).astype(np.float32), rng.standard_normal(n).astype(np.float32)
    m, v = np.zeros(n, np.float32), np.zeros(n, np.float32)
    normsq = np.array([float(g.astype(np.float64) @ g)], np.float32)
    ref = [a.copy() for a in (p, m, v)]
    copy = np.zeros(n, np.uint16)
    args = STRUCTS["adam_step"](n=n, step=3, lr=1e-2, beta1=0.9, beta2=0.95, eps=1e-8,
                                weight_decay=0.1, decoupled=1, max_norm=max_norm)
    K("adam_step", "fp32", {f: getattr(args, f) for f, _ in STRUCTS["adam_step"]._fields_},
      ref[0], g, ref[1], ref[2], normsq)
    fn = K.lib.nntile_kernel_adam_step_refresh_bf16_fp32
    fn.restype = None
    ptr = lambda a: ctypes.c_void_p(a.ctypes.data)  # noqa: E731
    fn(ctypes.byref(args), ptr(p), ptr(g), ptr(m), ptr(v), ptr(copy), ptr(normsq))
    for got, want in zip((p, m, v), ref):
        np.testing.assert_array_equal(got, want)
    np.testing.assert_array_equal(copy, bf16_ref_bits(p))
