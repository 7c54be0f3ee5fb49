"""Tests of the pure-C CPU kernels (nntile/_core/kernels) through ctypes,
against float64 numpy references (and torch for the optimizers).

A session fixture (conftest.py) compiles every kernels/*.c file with the system
C compiler into a temporary shared library.  The args structs and each op's buffers are
read from kernels.h itself (tests/kernel_header.py, as the build does).
Tests marked for_all_dtypes run for fp32, fp64 and bf16 (bf16 storage as
uint16 bits: inputs rounded to bf16, references computed from the rounded
values)."""
import ctypes
import os

import numpy as np

from tests.kernel_header import activations, args_structs, op_buffers, op_table, value_structs
from tests.unary_refs import ACTIVATIONS
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
KERNEL_DIR = os.path.join(ROOT, "nntile", "_core", "kernels")

I, D = "int64", "double"
A8 = "int64[8]"
_CTYPE = {I: ctypes.c_int64, D: ctypes.c_double, A8: ctypes.c_int64 * 8}
# the structs that args structs hold by value (nntile_mask), given as dicts of their fields
for _name, _fields in value_structs().items():
    _CTYPE[f"struct {_name}"] = type(_name, (ctypes.Structure,),
                                     {"_fields_": [(n, _CTYPE[t]) for n, t in _fields]})

# op -> its args struct (ctypes) and its number of buffers, from kernels.h
STRUCTS = {
    op: type(f"nntile_{op}_args", (ctypes.Structure,),
             {"_fields_": [(name, _CTYPE[t]) for name, t in fields]})
    for op, fields in args_structs().items()
}
NBUF = {op: len(buffers) for op, buffers in op_buffers().items()}

DTYPES = {"fp32": np.float32, "fp64": np.float64}

CFLAGS = ["-std=c11", "-O2", "-march=x86-64-v2", "-fno-math-errno", "-fPIC", "-Wall",
          "-Wextra"]


class Kernels:
    def __init__(self, lib):
        self.lib = lib

    def __call__(self, op, dtype, args, *bufs):
        assert len(bufs) == NBUF[op], (op, len(bufs), NBUF[op])
        kw = {}
        for name, t in STRUCTS[op]._fields_:
            val = args.get(name, 0)
            if t is _CTYPE[A8]:
                val = list(val) + [0] * (8 - len(val))
                val = (ctypes.c_int64 * 8)(*val)
            elif issubclass(t, ctypes.Structure):
                val = t(**(val or {}))
            kw[name] = val
        unknown = set(args) - {f for f, _ in STRUCTS[op]._fields_}
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
RTOL = {"fp32": 1e-5, "fp64": 1e-12, "bf16": 1e-2}
# the dtype as a test axis (CuPy's for_all_dtypes): tests that take dt and move their
# arrays through run() run for every dtype the plain kernels have
for_all_dtypes = pytest.mark.parametrize("dt", ["fp32", "fp64", "bf16"])

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


def to_storage(a, dt):
    """float values -> the dtype's storage (bf16: bits in uint16, rounded to nearest even)"""
    if dt == "bf16":
        return bf16_ref_bits(np.asarray(a, np.float32))
    return np.array(a, dtype=DTYPES[dt], order="C")  # a copy: kernels write in place


def from_storage(b, dt):
    return (from_bf16(b) if dt == "bf16" else b).astype(np.float64)


def rounded(a, dt):
    """the values a dtype stores for a (what its kernels see), in float64"""
    return from_storage(to_storage(a, dt), dt)


def run(K, op, dt, args, *arrays):
    """op's dt kernel on float arrays (stored in dt; int64 arrays and None as they are);
    returns every buffer afterwards, floats in float64."""
    bufs = [a if a is None or a.dtype == np.int64 else to_storage(a, dt) for a in arrays]
    K(op, dt, args, *bufs)
    return [b if b is None or b.dtype == np.int64 else from_storage(b, dt) for b in bufs]


# ---------------------------------------------------------------- contract

def test_op_table_matches_the_buffers():
    """kernels.h's op table, buffer lines and structs name every op once, with its number of
    buffers (an X_OPT op's count in the table leaves its optional last one out)."""
    table = op_table()
    ops = [op for op, _, _, _ in table]
    assert len(ops) == len(set(ops)), ops
    assert set(ops) == set(NBUF)
    shared = set(STRUCTS) - set(ops)  # structs that ops share under their own names
    assert set(ops) <= set(STRUCTS)
    fields = args_structs()
    assert all(any(fields[op] is fields[s] for op in ops) for s in shared), shared
    for op, nbuf, kind, columns in table:
        assert columns in ("PLAIN", "MIXED", "MIXED_ONLY"), op
        assert kind in ("X", "X_OPT", "X_BLAS", "X_TF32"), op
        assert nbuf + (kind == "X_OPT") == NBUF[op], op


def test_activations_match_the_table():
    """The table's activations (X_ACT) are those of tests/unary_refs.py, each with its
    float64 reference and derivative."""
    assert list(activations()) == list(ACTIVATIONS)


def test_all_symbols_and_clean_build(kernel_lib):
    lib, stderr = kernel_lib
    assert "warning" not in stderr, stderr
    for op in NBUF:
        for dt in DT + ["bf16", "bf16_fp32"]:
            getattr(lib, f"nntile_kernel_{op}_{dt}")


# ---------------------------------------------------------------- elementwise

@for_all_dtypes
@pytest.mark.parametrize("n", [0, 1, 7, 8, 33, 1000])
def test_fill_copy_scal_prod(K, dt, n):
    rng = np.random.default_rng(n)
    (dst,) = run(K, "fill", dt, dict(n=n, value=-2.5), np.full(n, np.nan))
    assert np.all(dst == -2.5)
    src = rounded(rng.standard_normal(n), dt)
    _, dst = run(K, "copy", dt, dict(n=n), src, np.full(n, np.nan))
    np.testing.assert_array_equal(src, dst)
    (out,) = run(K, "scal", dt, dict(n=n, alpha=1.7), src)
    close(out, 1.7 * src, dt)
    a, b = rounded(rng.standard_normal(n), dt), rounded(rng.standard_normal(n), dt)
    *_, dst = run(K, "prod", dt, dict(n=n, alpha=-0.5), a, b, np.full(n, np.nan))
    close(dst, -0.5 * a * b, dt)


@for_all_dtypes
@pytest.mark.parametrize("beta", [0.0, 1.0, -0.75])
@pytest.mark.parametrize("n", [1, 5, 64, 1001])
def test_add_sumsq(K, dt, beta, n):
    rng = np.random.default_rng(n)
    src = rounded(rng.standard_normal(n), dt)
    dst = np.full(n, np.nan) if beta == 0 else rounded(rng.standard_normal(n), dt)
    _, out = run(K, "add", dt, dict(n=n, alpha=0.3, beta=beta), src, dst)
    close(out, 0.3 * src + (beta * dst if beta else 0), dt)
    base = rounded(rng.standard_normal(n), dt)
    *_, out = run(K, "add_out", dt, dict(n=n, alpha=0.3, beta=beta), src, base,
                  np.full(n, np.nan))
    close(out, 0.3 * src + beta * base, dt)
    dst = np.full(1, np.nan) if beta == 0 else rounded(rng.standard_normal(1), dt)
    _, out = run(K, "sumsq", dt, dict(n=n, beta=beta), src, dst)
    close(out, np.sum(src ** 2) + (beta * dst if beta else 0), dt)


def _activation_input(dt, n=257):
    x = 3.0 * np.random.default_rng(1).standard_normal(n)
    x[:3] = [0.0, -12.0, 12.0]
    return rounded(x, dt)


@for_all_dtypes
@pytest.mark.parametrize("act", list(ACTIVATIONS))
def test_activation(K, dt, act):
    x = _activation_input(dt)
    _, y = run(K, act, dt, dict(n=x.size), x, np.full(x.size, np.nan))
    close(y, ACTIVATIONS[act][0](x), dt, rtol_mult=4)


@for_all_dtypes
@pytest.mark.parametrize("beta", [0.0, 0.6])
@pytest.mark.parametrize("act", list(ACTIVATIONS))
def test_activation_backward(K, dt, beta, act):
    """dx = dy * f'(x) + beta * dx against the reference derivative, which central finite
    differences of the reference value confirm"""
    value, deriv = ACTIVATIONS[act]
    x = _activation_input(dt)
    h = 1e-5
    np.testing.assert_allclose(deriv(x), (value(x + h) - value(x - h)) / (2 * h), rtol=1e-6,
                               atol=1e-8)
    rng = np.random.default_rng(2)
    dy = rounded(rng.standard_normal(x.size), dt)
    dx = np.full(x.size, np.nan) if beta == 0 else rounded(rng.standard_normal(x.size), dt)
    *_, out = run(K, act + "_backward", dt, dict(n=x.size, beta=beta), x, dy, dx)
    close(out, dy * deriv(x) + (beta * dx if beta else 0), dt, rtol_mult=4)


# ---------------------------------------------------------------- fiber / slice

def mkn(rng, m, k, n, dt):
    return rnd(rng, (m, k, n), dt)


def check_broadcasts(K, dt, rng, kind, a, small):
    """add_<kind> and prod_<kind> of a fiber [k] or slice [m, n] ``small`` (stored in dt)
    against numpy"""
    m, k, n, alpha, beta = a["m"], a["k"], a["n"], a["alpha"], a["beta"]
    small = rounded(small, dt)
    bcast = small[None, :, None] if kind == "fiber" else small[:, None, :]
    dst = np.full((m, k, n), np.nan) if beta == 0 else rounded(rng.standard_normal((m, k, n)),
                                                                dt)
    _, out = run(K, f"add_{kind}", dt, a, small, dst)
    close(out, alpha * bcast + (beta * dst if beta else 0), dt)
    dst = rounded(rng.standard_normal((m, k, n)), dt)
    _, out = run(K, f"prod_{kind}", dt, dict(m=m, k=k, n=n, alpha=alpha), small, dst)
    close(out, dst * alpha * bcast, dt)


def check_reductions(K, dt, rng, kind, a, axis, out_shape):
    """sum_<kind> and sumprod_<kind> over ``axis`` of [m, k, n] against numpy"""
    m, k, n, alpha, beta = a["m"], a["k"], a["n"], a["alpha"], a["beta"]
    s1, s2 = (rounded(rng.standard_normal((m, k, n)), dt) for _ in range(2))
    for op, srcs, red in ((f"sum_{kind}", (s1,), s1), (f"sumprod_{kind}", (s1, s2), s1 * s2)):
        out = np.full(out_shape, np.nan) if beta == 0 else rounded(
            rng.standard_normal(out_shape), dt)
        *_, got = run(K, op, dt, a, *srcs, out)
        close(got, alpha * red.sum(axis=axis) + (beta * out if beta else 0), dt,
              scale=max(1.0, np.abs(red).sum(axis=axis).max()))


@for_all_dtypes
@SETTINGS
@given(m=dims, k=st.integers(1, 40), n=dims, seed=seeds,
       beta=st.sampled_from([0.0, 1.0, -0.3]))
def test_fiber_kernels(K, dt, m, k, n, seed, beta):
    rng = np.random.default_rng(seed)
    a = dict(m=m, k=k, n=n, alpha=1.3, beta=beta)
    check_broadcasts(K, dt, rng, "fiber", a, rng.standard_normal(k))
    check_reductions(K, dt, rng, "fiber", a, (0, 2), k)


@for_all_dtypes
@SETTINGS
@given(m=dims, k=st.integers(1, 40), n=st.integers(1, 12), seed=seeds,
       beta=st.sampled_from([0.0, 1.0, 0.4]))
def test_slice_kernels(K, dt, m, k, n, seed, beta):
    rng = np.random.default_rng(seed)
    a = dict(m=m, k=k, n=n, alpha=-0.7, beta=beta)
    check_reductions(K, dt, rng, "slice", a, 1, (m, n))
    check_broadcasts(K, dt, rng, "slice", a, rng.standard_normal((m, n)))


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
@pytest.mark.parametrize("batch,tq,tk,qo,ko,causal,offset,window", [
    (1, 1, 1, 0, 0, 1, 0, 0), (2, 4, 4, 0, 0, 1, 0, 0), (3, 5, 7, 4, 0, 1, 0, 0),
    (1, 6, 3, 0, 3, 1, 0, 0), (2, 3, 8, 10, 2, 1, 0, 0), (1, 4, 4, 0, 8, 1, 0, 0),
    (2, 3, 9, 0, 0, 1, 5, 0), (1, 4, 4, 0, 0, 0, 0, 0), (2, 7, 9, 3, 1, 1, 2, 3),
    (1, 5, 12, 0, 0, 1, 6, 1)])
def test_mask_scores(K, dt, batch, tq, tk, qo, ko, causal, offset, window):
    rng = np.random.default_rng(0)
    x = rnd(rng, (batch, tq, tk), dt)
    ref = x.copy()
    qi = qo + offset + np.arange(tq)[:, None]
    kj = ko + np.arange(tk)[None, :]
    if causal:
        ref[:, kj > qi] = -np.inf
    if window:
        ref[:, kj <= qi - window] = -np.inf
    K("mask_scores", dt, dict(batch=batch, tq=tq, tk=tk, q_offset=qo, k_offset=ko,
                              mask=dict(causal=causal, offset=offset, window=window)), x)
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

@for_all_dtypes
@pytest.mark.parametrize("rows,e,voff,v", [(1, 1, 0, 1), (7, 5, 3, 4),
                                           (16, 33, 0, 10), (9, 8, 10, 6)])
def test_embedding(K, dt, rows, e, voff, v):
    rng = np.random.default_rng(rows)
    ids = rng.integers(-1, voff + v + 3, rows).astype(np.int64)
    ids[0] = voff  # at least one hit, duplicates likely
    table, dst = rounded(rng.standard_normal((v, e)), dt), rounded(
        rng.standard_normal((rows, e)), dt)
    ref = dst.copy()
    for r, i in enumerate(ids):
        if voff <= i < voff + v:
            ref[r] += table[i - voff]
    *_, out = run(K, "embedding", dt, dict(rows=rows, e=e, v_offset=voff, v=v), ids, table,
                  dst)
    close(out, ref, dt)
    dy, dtab = rounded(rng.standard_normal((rows, e)), dt), rounded(
        rng.standard_normal((v, e)), dt)
    ref = dtab.copy()
    for r, i in enumerate(ids):
        if voff <= i < voff + v:
            ref[i - voff] += dy[r]
    *_, out = run(K, "embedding_backward", dt, dict(rows=rows, e=e, v_offset=voff, v=v), ids,
                  dy, dtab)
    close(out, ref, dt, rtol_mult=2)


# ---------------------------------------------------------------- layernorm

def norm_dx_by_tiles(K, op, dt, tiles, eps, beta, x, dy, stats, weight, rowacc, dx0):
    """A norm's dx, one call per column tile (``tiles``: slices of the row) with the row sums
    of the whole row; dx starts as NaN where beta is 0 (it must be overwritten)."""
    rows, e_total = x.shape
    c = np.ascontiguousarray
    return np.concatenate([run(K, op, dt, dict(rows=rows, e=s.stop - s.start, e_total=e_total,
                                               eps=eps, beta=beta),
                               c(x[:, s]), c(dy[:, s]), stats, c(weight[s]), rowacc,
                               np.full((rows, s.stop - s.start), np.nan) if beta == 0
                               else c(dx0[:, s]))[-1] for s in tiles], axis=1)


@for_all_dtypes
@SETTINGS
@given(rows=st.integers(1, 6), e_total=st.integers(1, 70), seed=seeds,
       ntiles=st.integers(1, 4), beta=st.sampled_from([0.0, 1.0]))
def test_layernorm(K, dt, rows, e_total, seed, ntiles, beta):
    """stats, forward and backward tile by tile along the row against float64 numpy (the
    references from the statistics as stored, which bf16 rounds)"""
    rng = np.random.default_rng(seed)
    eps = 1e-5
    x = rounded(rng.standard_normal((rows, e_total)) * 2 + 3, dt)
    gamma, bet = (rounded(rng.standard_normal(e_total), dt) for _ in range(2))
    dy = rounded(rng.standard_normal((rows, e_total)), dt)
    c = np.ascontiguousarray
    sl = _column_tiles(rng, e_total, ntiles)
    stats = np.full((rows, 2), np.nan)
    for s in sl:
        _, stats = run(K, "layernorm_stats", dt, dict(rows=rows, e=s.stop - s.start,
                                                      e_offset=s.start), c(x[:, s]), stats)
    mean = x.mean(1)
    m2 = ((x - mean[:, None]) ** 2).sum(1)
    close(stats[:, 0], mean, dt, rtol_mult=4)
    close(stats[:, 1], m2, dt, rtol_mult=10, scale=max(1.0, m2.max()))
    mean, rstd = stats[:, 0], 1 / np.sqrt(stats[:, 1] / e_total + eps)
    xhat = (x - mean[:, None]) * rstd[:, None]
    y = np.concatenate([run(K, "layernorm_forward", dt,
                            dict(rows=rows, e=s.stop - s.start, e_total=e_total, eps=eps),
                            c(x[:, s]), stats, c(gamma[s]), c(bet[s]),
                            np.full((rows, s.stop - s.start), np.nan))[-1] for s in sl],
                       axis=1)
    close(y, xhat * gamma + bet, dt, rtol_mult=10,
          scale=max(1.0, float(np.abs(xhat * gamma).max() + np.abs(bet).max())))
    # backward
    rowacc = np.full((rows, 2), np.nan)
    dgamma0, dbeta0 = (rounded(rng.standard_normal(e_total), dt) for _ in range(2))
    dgamma, dbeta = dgamma0.copy(), dbeta0.copy()
    for t, s in enumerate(sl):
        *_, rowacc, dgamma[s], dbeta[s] = run(
            K, "layernorm_backward_reduce", dt,
            dict(rows=rows, e=s.stop - s.start, e_total=e_total, eps=eps, init=int(t == 0)),
            c(x[:, s]), c(dy[:, s]), stats, c(gamma[s]), rowacc, c(dgamma[s]), c(dbeta[s]))
    g = dy * gamma
    close(rowacc[:, 0], g.sum(1), dt, rtol_mult=10, scale=max(1.0, np.abs(g).sum(1).max()))
    close(rowacc[:, 1], (g * xhat).sum(1), dt, rtol_mult=10,
          scale=max(1.0, np.abs(g * xhat).sum(1).max()))
    close(dgamma, dgamma0 + (dy * xhat).sum(0), dt, rtol_mult=10,
          scale=max(1.0, np.abs(dy * xhat).sum(0).max()))
    close(dbeta, dbeta0 + dy.sum(0), dt, rtol_mult=10, scale=max(1.0, np.abs(dy).sum(0).max()))
    dx0 = rounded(rng.standard_normal((rows, e_total)), dt)
    c0, c1 = rowacc[:, :1] / e_total, rowacc[:, 1:] / e_total  # the sums as stored
    ref = rstd[:, None] * (g - c0 - xhat * c1) + (beta * dx0 if beta else 0)
    dx = norm_dx_by_tiles(K, "layernorm_backward", dt, sl, eps, beta, x, dy, stats, gamma,
                          rowacc, dx0)
    close(dx, ref, dt, rtol_mult=50 if dt != "bf16" else 3,
          scale=max(1.0, float((rstd[:, None] * (np.abs(g) + np.abs(c0)
                                                 + np.abs(xhat * c1))).max())))


def test_layernorm_against_torch(K):
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(5)
    x = rng.standard_normal((4, 24))
    w, b = rng.standard_normal(24), rng.standard_normal(24)
    _, stats = run(K, "layernorm_stats", "fp64", dict(rows=4, e=24, e_offset=0), x,
                   np.zeros((4, 2)))
    y = run(K, "layernorm_forward", "fp64", dict(rows=4, e=24, e_total=24, eps=1e-5), x,
            stats, w, b, np.zeros((4, 24)))[-1]
    ref = torch.nn.functional.layer_norm(torch.from_numpy(x), (24,), torch.from_numpy(w),
                                         torch.from_numpy(b), 1e-5).numpy()
    close(y, ref, "fp64", rtol_mult=10)


# ---------------------------------------------------------------- Llama: RMSNorm, RoPE, SwiGLU

def _column_tiles(rng, e_total, ntiles):
    """slices of [0, e_total) into at most ntiles contiguous tiles"""
    cuts = sorted(rng.choice(np.arange(1, e_total), size=min(ntiles - 1, e_total - 1),
                             replace=False)) if e_total > 1 else []
    bounds = [0, *cuts, e_total]
    return [slice(a, b) for a, b in zip(bounds[:-1], bounds[1:])]


@for_all_dtypes
@SETTINGS
@given(rows=st.integers(1, 6), e_total=st.integers(1, 70), seed=seeds,
       ntiles=st.integers(1, 4), beta=st.sampled_from([0.0, 1.0]))
def test_rmsnorm(K, dt, rows, e_total, seed, ntiles, beta):
    """stats, forward and backward tile by tile along the row against float64 numpy: y =
    weight * x / sqrt(mean(x^2) + eps), and its gradients"""
    rng = np.random.default_rng(seed)
    eps = 1e-5
    x = rounded(rng.standard_normal((rows, e_total)) * 2 + 0.5, dt)
    w = rounded(rng.standard_normal(e_total), dt)
    dy = rounded(rng.standard_normal((rows, e_total)), dt)
    c = np.ascontiguousarray
    sl = _column_tiles(rng, e_total, ntiles)
    stats = np.full(rows, np.nan)
    for t, s in enumerate(sl):
        _, stats = run(K, "rmsnorm_stats", dt, dict(rows=rows, e=s.stop - s.start,
                                                    init=int(t == 0)), c(x[:, s]), stats)
    sumsq = (x ** 2).sum(1)
    close(stats, sumsq, dt, rtol_mult=4)
    rstd = 1 / np.sqrt(stats / e_total + eps)  # from the stored statistics
    xhat = x * rstd[:, None]
    y = np.concatenate([run(K, "rmsnorm_forward", dt,
                            dict(rows=rows, e=s.stop - s.start, e_total=e_total, eps=eps),
                            c(x[:, s]), stats, c(w[s]), np.full((rows, s.stop - s.start),
                                                                np.nan))[-1]
                        for s in sl], axis=1)
    close(y, w * xhat, dt, rtol_mult=4)
    # backward
    g = dy * w
    rowacc = np.full(rows, np.nan)
    dw0 = rounded(rng.standard_normal(e_total), dt)
    dw = dw0.copy()
    for t, s in enumerate(sl):
        *_, rowacc, dws = run(K, "rmsnorm_backward_reduce", dt,
                              dict(rows=rows, e=s.stop - s.start, e_total=e_total, eps=eps,
                                   init=int(t == 0)),
                              c(x[:, s]), c(dy[:, s]), stats, c(w[s]), rowacc, c(dw[s]))
        dw[s] = dws
    close(rowacc, (g * xhat).sum(1), dt, rtol_mult=10,
          scale=max(1.0, np.abs(g * xhat).sum(1).max()))
    close(dw, dw0 + (dy * xhat).sum(0), dt, rtol_mult=10,
          scale=max(1.0, np.abs(dy * xhat).sum(0).max()))
    dx0 = rounded(rng.standard_normal((rows, e_total)), dt)
    ref = rstd[:, None] * (g - xhat * (g * xhat).mean(1, keepdims=True))
    ref = ref + (beta * dx0 if beta else 0)
    dx = norm_dx_by_tiles(K, "rmsnorm_backward", dt, sl, eps, beta, x, dy, stats, w, rowacc,
                          dx0)
    close(dx, ref, dt, rtol_mult=50 if dt != "bf16" else 3,
          scale=max(1.0, float(np.abs(rstd[:, None] * (np.abs(g) + np.abs(
              xhat * (g * xhat).mean(1, keepdims=True)))).max())))


@for_all_dtypes
@SETTINGS
@given(rows=st.integers(1, 6), e=st.integers(1, 70), seed=seeds,
       beta=st.sampled_from([0.0, 1.0]), norm=st.sampled_from(["layernorm", "rmsnorm"]))
def test_norm_backward_whole_is_reduce_then_backward(K, dt, rows, e, seed, beta, norm):
    """Where a row is one tile, backward_whole gives backward_reduce's weight gradients and
    backward's dx: the same arithmetic, the row sums rounded as rowacc holds them (to
    rounding: the compiler may fuse a multiply-add in one and not the other)."""
    rng = np.random.default_rng(seed)
    x, dy, dx0 = (rounded(rng.standard_normal((rows, e)), dt) for _ in range(3))
    w = rounded(rng.standard_normal(e), dt)
    k = 2 if norm == "layernorm" else 1
    dws = [rounded(rng.standard_normal(e), dt) for _ in range(k)]
    stats_args = dict(rows=rows, e=e, e_offset=0) if k == 2 else dict(rows=rows, e=e, init=1)
    stats = run(K, f"{norm}_stats", dt, stats_args, x,
                np.zeros((rows, 2) if k == 2 else rows))[-1]
    reduced = run(K, f"{norm}_backward_reduce", dt,
                  dict(rows=rows, e=e, e_total=e, eps=1e-5, init=1), x, dy, stats, w,
                  np.full((rows, k) if k == 2 else rows, np.nan), *dws)
    rowacc, two_ops_dws = reduced[4], reduced[5:]
    start = dx0 if beta else np.full((rows, e), np.nan)
    args = dict(rows=rows, e=e, e_total=e, eps=1e-5, beta=beta)
    two_ops_dx = run(K, f"{norm}_backward", dt, args, x, dy, stats, w, rowacc, start)[-1]
    whole = run(K, f"{norm}_backward_whole", dt, args, x, dy, stats, w, *dws, start)
    close(whole[-1], two_ops_dx, dt)
    for got, want in zip(whole[4:4 + k], two_ops_dws):
        close(got, want, dt)


def test_rmsnorm_against_torch(K):
    """the forward against torch's rms_norm (fp64) and transformers' order for bf16: x
    normalised in float, rounded to x's dtype, then times the weight"""
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(5)
    x, w = rng.standard_normal((4, 24)), rng.standard_normal(24)
    stats = run(K, "rmsnorm_stats", "fp64", dict(rows=4, e=24, init=1), x, np.zeros(4))[1]
    y = run(K, "rmsnorm_forward", "fp64", dict(rows=4, e=24, e_total=24, eps=1e-6), x, stats,
            w, np.zeros((4, 24)))[-1]
    ref = torch.nn.functional.rms_norm(torch.from_numpy(x), (24,), torch.from_numpy(w),
                                       1e-6).numpy()
    close(y, ref, "fp64", rtol_mult=10)


def _rope_ref(x, pos, inv_freq, scale, sign=1.0):
    """x [rows, heads, D] turned as transformers' apply_rotary_pos_emb, in float64"""
    half = x.shape[-1] // 2
    angle = pos[:, None].astype(np.float64) * inv_freq[None, :]
    c = np.cos(angle)[:, None, :] * scale
    s = sign * np.sin(angle)[:, None, :] * scale
    x1, x2 = x[..., :half], x[..., half:]
    return np.concatenate([x1 * c - x2 * s, x2 * c + x1 * s], axis=-1)


@for_all_dtypes
@pytest.mark.parametrize("rows,heads,d,scale", [(1, 1, 2, 1.0), (5, 3, 8, 1.0),
                                                (7, 2, 64, 0.7), (3, 4, 130, 1.0)])
def test_rope(K, dt, rows, heads, d, scale):
    """forward against float64 numpy, and backward (the opposite turn) undoing it"""
    rng = np.random.default_rng(rows * d)
    x = rounded(rng.standard_normal((rows, heads, d)), dt)
    pos = rng.integers(0, 4096, rows).astype(np.int64)
    inv_freq = rounded(1.0 / 10000.0 ** (np.arange(0, d, 2) / d), dt)
    # the angle is computed in the compute type: float for fp32 and bf16
    angle_dt = np.float64 if dt == "fp64" else np.float32
    args = dict(rows=rows, heads=heads, head_dim=d, scale=scale)
    *_, y = run(K, "rope_forward", dt, args, pos, inv_freq, x)
    ang = (pos[:, None].astype(angle_dt) * inv_freq.astype(angle_dt)[None, :]).astype(
        np.float64)
    half = d // 2
    c, s = np.cos(ang)[:, None, :] * scale, np.sin(ang)[:, None, :] * scale
    ref = np.concatenate([x[..., :half] * c - x[..., half:] * s,
                          x[..., half:] * c + x[..., :half] * s], axis=-1)
    close(y, ref, dt, rtol_mult=4)
    if dt == "fp64":
        close(y, _rope_ref(x, pos, inv_freq, scale), dt, rtol_mult=100)
    *_, back = run(K, "rope_backward", dt, args, pos, inv_freq, rounded(y, dt))
    close(back, scale * scale * x, dt, rtol_mult=4)


@for_all_dtypes
@pytest.mark.parametrize("n", [1, 7, 64, 1001])
def test_swiglu(K, dt, n):
    """h = silu(gate) * up (silu rounded to the dtype first, as transformers), and the
    gradients of gate and up"""
    rng = np.random.default_rng(n)
    value, deriv = ACTIVATIONS["silu"]
    gate = rounded(3 * rng.standard_normal(n), dt)
    up, dh = rounded(rng.standard_normal(n), dt), rounded(rng.standard_normal(n), dt)
    *_, h = run(K, "swiglu_forward", dt, dict(n=n), gate, up, np.full(n, np.nan))
    close(h, rounded(value(gate), dt) * up, dt, rtol_mult=4)
    *_, dgate, dup = run(K, "swiglu_backward", dt, dict(n=n), gate, up, dh,
                         np.full(n, np.nan), np.full(n, np.nan))
    close(dgate, dh * up * deriv(gate), dt, rtol_mult=4)
    close(dup, dh * value(gate), dt, rtol_mult=4)


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
    K("mask_scores", "bf16", dict(batch=1, tq=1, tk=1, q_offset=0, k_offset=1,
                                  mask=dict(causal=1)), one)
    assert one[0] == 0xFF80  # -inf


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


@pytest.mark.parametrize("m,k,n", [(3, 17, 1), (2, 5, 4), (1, 1, 1), (2, 6, 1)])
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
    stats = np.zeros((m, n, 2))  # written (init)
    cases.append(("maxsumexp", dict(mkn, init=1), "TA", x, stats))
    for op, args, roles, *arrays in cases:
        assert_mixed(mixed(K, op, args, roles, *arrays), roles)
    stats = mixed(K, "maxsumexp", dict(mkn, init=1), "TA", x, stats)[1][1]
    assert_mixed(mixed(K, "softmax_inplace", mkn, "AT", stats, x), "AT")
    # rows x vocabulary: cross entropy, layer norm
    rows, v = m * n, k
    logits, labels = x.reshape(rows, v), rng.integers(0, v, rows)
    xstats = mixed(K, "maxsumexp", dict(m=rows, k=v, n=1, init=1), "TA", logits,
                   np.zeros((rows, 2)))[1][1]
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
    sumsq = (lnx.astype(np.float32) ** 2).sum(1)
    assert_mixed(mixed(K, "rmsnorm_forward", dict(rows=rows, e=v, e_total=v, eps=1e-5),
                       "AAAT", lnx, sumsq, fib, x), "AAAT")
    if v % 2 == 0:  # rotary positions: bf16 vectors, fp32 inverse frequencies
        pos = rng.integers(0, 100, m * n)
        assert_mixed(mixed(K, "rope_forward", dict(rows=m * n, heads=1, head_dim=v,
                                                   scale=1.0),
                           "IAT", pos, 1.0 / 500.0 ** (np.arange(0, v, 2) / v), lnx), "IAT")


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
