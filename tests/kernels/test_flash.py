"""The fused-attention CPU kernels (flash_forward, flash_backward) through ctypes, against a
float64 numpy reference that builds the whole [T, T] score matrix: causal and not, GQA,
sequence offsets, several query and key tiles merged with the accumulate flags, blocks of the
kernel cut unevenly (query blocks of 64 rows, key blocks of 128)."""
import numpy as np
import pytest
from hypothesis import given, strategies as st

from tests.attention_refs import reference, reference_backward
from tests.kernels.test_cpu_kernels import SETTINGS, bf16_ref_bits, from_bf16


STORE = {"fp32": (np.float32, np.float32), "fp64": (np.float64, np.float64),
         "bf16_fp32": (np.uint16, np.float32)}


def to_buf(x, column):
    data = STORE[column][0]
    if data is np.uint16:
        return bf16_ref_bits(x)
    return np.ascontiguousarray(x, dtype=data)


def from_buf(x):
    return from_bf16(x).astype(np.float64) if x.dtype == np.uint16 else x.astype(np.float64)


def cuts(n, first):
    """Tile boundaries of a sequence of n cut at ``first`` and every ``first`` after."""
    edges = list(range(0, n, first)) + [n]
    return list(zip(edges[:-1], edges[1:]))


def run_tiles(K, column, q, k, v, do, scale, causal, qtile, ktile, offset=0, window=0):
    """Forward and backward tile by tile, as the tensor op submits them (every key tile, masked
    or not, so that the kernels' handling of fully masked rows is exercised). Buffers that a
    kernel must write without reading start as NaN."""
    B, T, H, D = q.shape
    Hkv = k.shape[2]
    acc = STORE[column][1]
    qb, kb, vb, dob = (to_buf(x, column) for x in (q, k, v, do))
    o = np.full(qb.shape, np.nan).astype(qb.dtype) if qb.dtype != np.uint16 else \
        np.full(qb.shape, 0x7FC0, np.uint16)
    lse = np.full((B, T, H), np.nan, acc)
    dq, dk, dv = o.copy(), np.empty_like(kb), np.empty_like(kb)
    dk[...] = o.flat[0]
    dv[...] = o.flat[0]
    qs, ks = cuts(T, qtile), cuts(k.shape[1], ktile)
    tile = lambda x, a, b: np.ascontiguousarray(x[:, a:b])  # noqa: E731
    for q0, q1 in qs:
        ot, lt = tile(o, q0, q1), tile(lse, q0, q1)
        for n, (k0, k1) in enumerate(ks):
            args = dict(batch=B, tq=q1 - q0, tk=k1 - k0, hq=H, hkv=Hkv, d=D,
                        q_offset=q0, k_offset=k0, mask=dict(causal=int(causal), offset=offset,
                                                               window=window),
                        accumulate=int(n > 0), scale=scale)
            K("flash_forward", column, args, tile(qb, q0, q1), tile(kb, k0, k1),
              tile(vb, k0, k1), ot, lt)
        o[:, q0:q1], lse[:, q0:q1] = ot, lt
    for m, (q0, q1) in enumerate(qs):
        dqt = tile(dq, q0, q1)
        for n, (k0, k1) in enumerate(ks):
            dkt, dvt = tile(dk, k0, k1), tile(dv, k0, k1)
            args = dict(batch=B, tq=q1 - q0, tk=k1 - k0, hq=H, hkv=Hkv, d=D,
                        q_offset=q0, k_offset=k0, mask=dict(causal=int(causal), offset=offset,
                                                               window=window),
                        accumulate=int(n > 0) | 2 * int(m > 0), scale=scale)
            K("flash_backward", column, args, tile(qb, q0, q1), tile(kb, k0, k1),
              tile(vb, k0, k1), tile(o, q0, q1), tile(dob, q0, q1), tile(lse, q0, q1), dqt,
              dkt, dvt)
            dk[:, k0:k1], dv[:, k0:k1] = dkt, dvt
        dq[:, q0:q1] = dqt
    return [from_buf(x) for x in (o, lse, dq, dk, dv)]


def check(got, want, rtol):
    for name, g, w in zip(("o", "lse", "dq", "dk", "dv"), got, want):
        np.testing.assert_array_equal(np.isneginf(g), np.isneginf(w), err_msg=name)
        fin = np.isfinite(w)
        scale = max(1.0, float(np.abs(w[fin]).max())) if fin.any() else 1.0
        np.testing.assert_allclose(g[fin], w[fin], rtol=rtol, atol=rtol * scale, err_msg=name)


def case(K, rng, column, B, T, H, Hkv, D, causal, qtile, ktile, offset=0, window=0):
    g = H // Hkv
    q, do = rng.standard_normal((B, T, H, D)), rng.standard_normal((B, T, H, D))
    Tk = T + offset  # query i sits at key position i + offset
    k, v = rng.standard_normal((B, Tk, Hkv, D)), rng.standard_normal((B, Tk, Hkv, D))
    if column == "bf16_fp32":  # the reference gets the values the kernel reads
        q, k, v, do = (from_buf(bf16_ref_bits(x)) for x in (q, k, v, do))
    scale = 1.0 / np.sqrt(D)
    got = run_tiles(K, column, q, k, v, do, scale, causal, qtile, ktile, offset, window)
    o, lse, _ = reference(q, k, v, scale, causal, offset=offset, window=window)
    want = [o, lse, *reference_backward(q, k, v, do, scale, causal, offset=offset,
                                        window=window)]
    assert g * Hkv == H
    return got, want


RTOL = {"fp64": 1e-12, "fp32": 1e-5, "bf16_fp32": 3e-2}


@pytest.mark.parametrize("column", ["fp64", "fp32"])
@SETTINGS
@given(seed=st.integers(0, 2**32 - 1), B=st.integers(1, 2), T=st.integers(1, 80),
       hkv=st.integers(1, 2), g=st.sampled_from([1, 2, 4]), D=st.sampled_from([1, 5, 16]),
       causal=st.booleans(), qtile=st.integers(1, 80), ktile=st.integers(1, 80),
       offset=st.integers(0, 3), window=st.integers(0, 90))
def test_flash_tiles_against_reference(K, column, seed, B, T, hkv, g, D, causal, qtile, ktile,
                                       offset, window):
    """Any tiling of the sequence, keys longer than queries (the mask's offset), sliding
    windows (with causality), tiles that leave query rows without keys (the merge of -inf
    rows), GQA groups of 1, 2 and 4."""
    rng = np.random.default_rng(seed)
    window = window if causal else 0
    got, want = case(K, rng, column, B, T, g * hkv, hkv, D, causal, qtile, ktile, offset,
                     window)
    check(got, want, RTOL[column])


@pytest.mark.parametrize("column", ["fp64", "fp32", "bf16_fp32"])
@pytest.mark.parametrize("T,H,Hkv,D,causal,qtile,ktile,window", [
    (300, 2, 1, 64, True, 300, 300, 0),     # key blocks of 128 and a partial one, query blocks
    (300, 4, 1, 80, True, 130, 300, 0),     # a 4:1 group, head dim 80, two query tiles
    (200, 8, 1, 96, False, 200, 70, 0),     # 8:1, three key tiles merged
    (130, 2, 2, 128, True, 65, 65, 0),      # no group, head dim 128, 2x2 tiles
    (300, 2, 1, 64, True, 300, 300, 100),   # a window: the first key blocks skipped
])
def test_flash_blocks(K, column, T, H, Hkv, D, causal, qtile, ktile, window):
    """The kernel's own blocks (64 queries, 128 keys) cut unevenly, at the head dims of real
    models."""
    rng = np.random.default_rng(T + H + D)
    got, want = case(K, rng, column, 1, T, H, Hkv, D, causal, qtile, ktile, window=window)
    check(got, want, RTOL[column])


def test_flash_rows_without_keys(K):
    """A query tile entirely before a key tile (causal): lse -inf and o 0, written, and a
    merge into it that brings the first keys; backward leaves zeros."""
    rng = np.random.default_rng(0)
    q, k, v = (rng.standard_normal((1, 3, 1, 4)) for _ in range(3))
    o, lse = np.full((1, 3, 1, 4), np.nan), np.full((1, 3, 1), np.nan)
    args = dict(batch=1, tq=3, tk=3, hq=1, hkv=1, d=4, q_offset=0, k_offset=5,
                mask=dict(causal=1), accumulate=0, scale=0.5)
    K("flash_forward", "fp64", args, q, k, v, o, lse)
    assert np.all(o == 0) and np.all(np.isneginf(lse))
    K("flash_forward", "fp64", dict(args, k_offset=1, accumulate=1), q, k, v, o, lse)
    want_o, want_lse, _ = reference(q, k, v, 0.5, True, 0, 1)
    np.testing.assert_allclose(lse, want_lse, rtol=1e-12)
    np.testing.assert_allclose(o, want_o, rtol=1e-12)
    assert np.isneginf(lse[0, 0, 0]) and np.all(o[0, 0] == 0)   # row 0 sees no key at 1..3
    dq, dk, dv = (np.full((1, 3, 1, 4), np.nan) for _ in range(3))
    K("flash_backward", "fp64", dict(args, k_offset=5), q, k, v, o, rng.standard_normal(o.shape),
      lse, dq, dk, dv)
    assert np.all(dq == 0) and np.all(dk == 0) and np.all(dv == 0)


def test_flash_bf16_column_rounds_once(K):
    """The bf16_fp32 kernels compute in fp32: the same numbers as the fp32 kernels on the
    same (bf16-valued) inputs, o rounded once to bf16 and lse kept in fp32."""
    rng = np.random.default_rng(1)
    q, k, v = (from_buf(bf16_ref_bits(rng.standard_normal((2, 70, 4, 16)))) for _ in range(3))
    k, v = k[:, :, :2], v[:, :, :2]
    args = dict(batch=2, tq=70, tk=70, hq=4, hkv=2, d=16, q_offset=0, k_offset=0,
                mask=dict(causal=1), accumulate=0, scale=0.25)
    o32, l32 = np.empty(q.shape, np.float32), np.empty((2, 70, 4), np.float32)
    K("flash_forward", "fp32", args, *(np.ascontiguousarray(x, np.float32) for x in (q, k, v)),
      o32, l32)
    o16, l16 = np.empty(q.shape, np.uint16), np.empty((2, 70, 4), np.float32)
    K("flash_forward", "bf16_fp32", args, *(bf16_ref_bits(x) for x in (q, k, v)), o16, l16)
    np.testing.assert_array_equal(l16, l32)
    np.testing.assert_array_equal(o16, bf16_ref_bits(o32))
