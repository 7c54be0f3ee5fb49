"""The attention core (nntile.nn.attention.CoreAttention), fused and unfused, against each other
and against a float64 numpy reference, forward and every gradient: causal and not, grouped-query
attention with kv head tiles, partial tiles in every dimension, several (uneven) sequence
tiles, the head dims of real models; and the tensor ops under it (flash_attention and its
backward, repeat_kv, sum_kv) with their checks of bad input."""
import math

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

import nntile
from nntile import ops
from nntile.nn.attention import CoreAttention
from tests.attention_refs import reference, reference_backward, visible
from tests.devices import tf32_tol

# relative error (against the largest reference entry) per precision: bf16 rounds q, k, v, o
# and the gradients to 8 bits; o and the gradients sum many such terms
TOL = {"fp64": 1e-12, "fp32": 1e-5, "tf32": 1e-5, "bf16": 3e-2, "bf16-mixed": 3e-2}


def tol_of(dtype):
    return tf32_tol(TOL[dtype]) if dtype == "tf32" else TOL[dtype]


def bf16_values(x):
    """x rounded to bf16, as float64 (what a bf16 tensor holds)."""
    return nntile.Tensor.from_array(x, None, "bf16").to_array().astype(np.float64)


def run_core(dtype, fused, causal, B, T, H, Hkv, D, tiles, seed, window=0):
    """(inputs, [o, dq, dk, dv]) of the core on random q, k, v, do; ``tiles`` = (batch, seq,
    query heads) per tile."""
    rng = np.random.default_rng(seed)
    x = [rng.standard_normal((B, T, n, D)) for n in (H, Hkv, Hkv, H)]
    core = CoreAttention(H, Hkv, D, tiles[2], dtype, fused,
                         mask=nntile.AttentionMask(causal, window=window))
    g = H // Hkv
    qt, kt = tiles + (D,), (tiles[0], tiles[1], tiles[2] // g, D)
    data = core.compute
    q, k, v, do = (nntile.Tensor.from_array(a, t, data) for a, t in zip(x, (qt, kt, kt, qt)))
    dq, dk, dv = (nntile.Tensor(t.shape, t.basetile, data) for t in (q, k, v))
    o = core.forward(q, k, v)
    core.backward(do, dq, dk, dv)
    out = [t.to_array().astype(np.float64) for t in (o, dq, dk, dv)]
    inputs = [t.to_array().astype(np.float64) for t in (q, k, v, do)]
    core.unregister()
    for t in (q, k, v, do, dq, dk, dv):
        t.unregister()
    return inputs, out


def check(got, want, magnitudes, tol, what):
    """Error relative to the largest reference entry, or where that is smaller, to the
    magnitude of the products the output sums (which rounding scales with: a gradient whose
    terms cancel, as the scores' gradient over a single key does, is rounding noise)."""
    for name, g, w, mag in zip(("o", "dq", "dk", "dv"), got, want, magnitudes):
        err = np.abs(g - w).max() / max(np.abs(w).max(), mag)
        assert err < tol, f"{what}: {name} relative error {err:.3g} >= {tol}"


def fused_unfused_reference(dtype, causal, B, T, H, Hkv, D, tiles, seed=0, window=0):
    """Both paths of the core against the reference and against each other."""
    inputs, fused = run_core(dtype, True, causal, B, T, H, Hkv, D, tiles, seed, window)
    _, unfused = run_core(dtype, False, causal, B, T, H, Hkv, D, tiles, seed, window)
    q, k, v, do = inputs
    scale = 1 / np.sqrt(D)
    want = [reference(q, k, v, scale, causal, window=window)[0],
            *reference_backward(q, k, v, do, scale, causal, window=window)]
    top = {name: np.abs(x).max() for name, x in zip("qkvd", inputs)}
    magnitudes = (top["v"], scale * top["d"] * top["v"] * top["k"],
                  scale * top["d"] * top["v"] * top["q"], top["d"])
    tol = tol_of(dtype)
    check(fused, want, magnitudes, tol, "fused vs reference")
    check(unfused, want, magnitudes, tol, "unfused vs reference")
    check(fused, unfused, magnitudes, 2 * tol, "fused vs unfused")


@pytest.mark.parametrize("dtype, causal, B, T, H, Hkv, D, tiles, window", [
    # head dims of real models; partial tiles in every dimension, uneven sequence tiles
    ("fp64", True, 3, 13, 3, 3, 64, (2, 5, 2), 0),
    ("fp64", False, 2, 11, 8, 2, 80, (1, 4, 4), 0),     # 4:1, a kv head per tile
    ("fp64", True, 1, 9, 8, 1, 96, (1, 9, 8), 0),       # 8:1, one sequence tile
    ("fp64", True, 2, 10, 6, 3, 128, (2, 3, 4), 0),     # 2:1, head tiles of 4 and 2 (kv: 2, 1)
    ("fp32", True, 2, 12, 8, 2, 64, (1, 5, 4), 0),
    ("fp32", False, 1, 7, 4, 4, 80, (1, 3, 3), 0),
    ("tf32", True, 2, 6, 8, 1, 96, (1, 4, 8), 0),
    ("bf16", True, 2, 9, 4, 1, 64, (1, 4, 4), 0),
    ("bf16-mixed", True, 2, 9, 4, 2, 128, (2, 5, 2), 0),
    ("bf16-mixed", False, 1, 6, 2, 2, 64, (1, 6, 1), 0),
    # sliding windows: shorter than a tile, longer, and not a multiple of the tile
    ("fp64", True, 2, 13, 4, 2, 64, (1, 4, 2), 3),
    ("fp32", True, 1, 16, 4, 1, 64, (1, 5, 4), 7),
    ("bf16-mixed", True, 2, 12, 4, 2, 64, (1, 4, 2), 5),
])
def test_core_fused_unfused_reference(ctx, dtype, causal, B, T, H, Hkv, D, tiles, window):
    fused_unfused_reference(dtype, causal, B, T, H, Hkv, D, tiles, window=window)


@settings(max_examples=12, deadline=None)
@given(st.data())
def test_core_any_tiling(ctx, data):
    """Random shapes, groups, tilings (small head dims) and sliding windows, in fp64."""
    draw = data.draw
    hkv, g = draw(st.integers(1, 3)), draw(st.sampled_from([1, 2, 4]))
    B, T, D = draw(st.integers(1, 3)), draw(st.integers(1, 12)), draw(st.integers(1, 8))
    tiles = (draw(st.integers(1, B)), draw(st.integers(1, T)),
             g * draw(st.integers(1, hkv)))
    causal = draw(st.booleans())
    window = draw(st.integers(0, T + 1)) if causal else 0
    fused_unfused_reference("fp64", causal, B, T, g * hkv, hkv, D, tiles,
                            draw(st.integers(0, 2**32 - 1)), window)


def test_core_drops_its_buffers(ctx):
    """What forward keeps is declared, and free_buffers drops it (free_activations)."""
    core = CoreAttention(4, 2, 8, 2, "fp32")
    assert [s.name for s in core.declaration((2, 6), (1, 3))] == ["o", "lse"]
    unfused = CoreAttention(4, 2, 8, 2, "fp32", fused=False)
    assert [(s.name, s.shape) for s in unfused.declaration((2, 6), (1, 3))
            if not s.shared] == [("o", (2, 6, 4, 8)), ("p", (2, 4, 6, 6)),
                                 ("stats", (2, 4, 6, 2)), ("k", (2, 6, 4, 8)),
                                 ("v", (2, 6, 4, 8))]
    q = nntile.Tensor((2, 6, 4, 8), (1, 3, 2, 8))
    k = nntile.Tensor((2, 6, 2, 8), (1, 3, 1, 8))
    core.forward(q, k, k)
    ctx.wait()
    kept = dict(core.kept_buffers())
    assert set(kept) == {"o", "lse"} and kept["lse"].valid_tiles() == kept["lse"].ntiles
    core.free_buffers()
    ctx.wait()
    assert not any(t.valid_tiles() for t in kept.values())
    for t in (core, unfused, q, k):
        t.unregister()


def test_core_bad_arguments():
    with pytest.raises(ValueError, match="groups of equal size"):
        CoreAttention(6, 4, 8, 6, "fp32")
    with pytest.raises(ValueError, match="whole groups of 4"):
        CoreAttention(8, 2, 8, 2, "fp32")
    with pytest.raises(ValueError, match="precision"):
        CoreAttention(8, 2, 8, 4, "fp16")
    with pytest.raises(TypeError, match="AttentionMask"):
        CoreAttention(8, 2, 8, 4, "fp32", mask=True)


# ---- the mask ------------------------------------------------------------------------------

def test_attention_mask_value():
    """An AttentionMask is a value: equal masks are one key, ``at`` moves query 0, pickling
    keeps it; the rules of kernels.h (nntile_mask_error) refuse a bad one when it is made."""
    import pickle
    from nntile import AttentionMask
    mask = AttentionMask(window=4)
    assert mask == AttentionMask(True, window=4) and hash(mask) == hash(AttentionMask(window=4))
    assert mask != AttentionMask() and AttentionMask(causal=False).causal == 0
    assert mask.at(7) == AttentionMask(window=4, offset=7) and mask.offset == 0
    assert mask.fields == {"causal": 1, "window": 4, "offset": 0}
    assert pickle.loads(pickle.dumps(mask.at(3))) == mask.at(3)
    assert repr(mask) == "AttentionMask(causal=1, window=4, offset=0)"
    for fields, match in [(dict(window=-1), "window must be >= 0"),
                          (dict(causal=False, window=3), "window .* needs causal"),
                          (dict(offset=-1), "offset"), (dict(window=2.5), "window must be int"),
                          (dict(causal=2), "causal must be 0 or 1")]:
        with pytest.raises(ValueError, match=match):
            AttentionMask(**fields)
    with pytest.raises(ValueError, match="offset"):
        mask.at(-1)
    with pytest.raises(TypeError, match="no field 'size'"):
        AttentionMask(size=3)


@settings(max_examples=60, deadline=None)
@given(causal=st.booleans(), window=st.integers(0, 9), offset=st.integers(0, 9),
       nq=st.integers(1, 12), nk=st.integers(1, 24), tile=st.integers(1, 7), data=st.data())
def test_attention_mask_tiles(causal, window, offset, nq, nk, tile, data):
    """The key tiles a query range sees (what the ops submit tasks for, and warm_up counts)
    and the blocks the mask leaves whole, against the numpy predicate of the references."""
    mask = nntile.AttentionMask(causal, window=window if causal else 0, offset=offset)
    seen = visible(nq, nk, causal, offset=offset, window=mask.window)
    q0 = data.draw(st.integers(0, nq - 1))
    q1 = data.draw(st.integers(q0 + 1, nq))
    tiles = [ki for ki in range(-(-nk // tile)) if seen[q0:q1, ki * tile:(ki + 1) * tile].any()]
    found = mask.key_tiles(q0, q1, nk, tile)
    assert list(found) == (list(range(tiles[0], tiles[-1] + 1)) if tiles else [])
    for ki in found:
        k0, k1 = ki * tile, min(nk, (ki + 1) * tile)
        assert mask.whole(q0, q1, k0, k1) == seen[q0:q1, k0:k1].all()


# ---- the tensor ops ------------------------------------------------------------------------

def t(shape, tiles, dtype="fp32"):
    return nntile.Tensor(shape, tiles, dtype)


def test_repeat_kv_sum_kv(ctx, rng):
    kv = rng.standard_normal((2, 5, 3, 4))
    K = nntile.Tensor.from_array(kv, (1, 2, 2, 4))
    heads = t((2, 5, 6, 4), (1, 2, 4, 4), "fp64")
    ops.repeat_kv(K, heads)
    np.testing.assert_array_equal(heads.to_array(), np.repeat(kv, 2, axis=2))
    grad = rng.standard_normal((2, 5, 6, 4))
    G = nntile.Tensor.from_array(grad, (1, 2, 4, 4))
    ops.sum_kv(G, K)
    np.testing.assert_allclose(K.to_array(), grad.reshape(2, 5, 3, 2, 4).sum(axis=3),
                               rtol=1e-15)


def test_flash_attention_bad_input(ctx):
    q, o = t((2, 6, 4, 8), (1, 3, 2, 8)), t((2, 6, 4, 8), (1, 3, 2, 8))
    k, v = t((2, 6, 2, 8), (1, 3, 1, 8)), t((2, 6, 2, 8), (1, 3, 1, 8))
    lse = t((2, 6, 4), (1, 3, 2))
    ops.flash_attention(q, k, v, o, lse, 0.5)  # the good call
    cases = [
        ((q, k, v, o, t((2, 6, 4), (1, 3, 2), "fp64"), 0.5), TypeError, "fp64"),
        ((q, t((2, 6, 3, 8), (1, 3, 1, 8)), v, o, lse, 0.5), ValueError, "whole number"),
        ((q, t((2, 6, 2, 8), (1, 2, 1, 8)), v, o, lse, 0.5), ValueError, "tiled"),
        ((q, t((2, 5, 2, 8), (1, 3, 1, 8)), v, o, lse, 0.5), ValueError, "sequence"),
        ((t((2, 6, 4, 8), (1, 3, 2, 4)), k, v, o, lse, 0.5), ValueError, "one tile"),
        ((q, k, v, o, t((2, 6, 4), (1, 3, 4)), 0.5), ValueError, "lse"),
        ((q, k, v, o, t((2, 6, 4, 1), (1, 3, 2, 1)), 0.5), ValueError, "lse"),
        ((q, k, v, q, lse, 0.5), ValueError, "same tensor"),
        ((q, k, v, o, lse, float("nan")), ValueError, "finite"),
        ((q, k, v, o, lse, "1"), ValueError, "finite"),
        ((q, k, v, o, lse, 0.5, nntile.AttentionMask(offset=2)), ValueError, "offset"),
        ((q, k, v, o, lse, 0.5, True), TypeError, "mask"),  # a mask is an AttentionMask
    ]
    for args, exc, match in cases:
        with pytest.raises(exc, match=match):
            ops.flash_attention(*args)
    q4 = t((2, 6, 8, 8), (1, 3, 2, 8))
    with pytest.raises(ValueError, match="whole groups of 4"):
        ops.flash_attention(q4, k, v, t((2, 6, 8, 8), (1, 3, 2, 8)), t((2, 6, 8), (1, 3, 2)),
                            0.5)
    qb, kb = t((2, 6, 4, 8), (1, 3, 2, 8), "bf16"), t((2, 6, 2, 8), (1, 3, 1, 8), "bf16")
    with pytest.raises(TypeError, match="lse must be fp32"):
        ops.flash_attention(qb, kb, kb, t((2, 6, 4, 8), (1, 3, 2, 8), "bf16"),
                            t((2, 6, 4), (1, 3, 2), "bf16"), 0.5)
    dq, dk, dv = t(q.shape, q.basetile), t(k.shape, k.basetile), t(k.shape, k.basetile)
    ops.flash_attention_backward(q, k, v, o, o, lse, dq, dk, dv, 0.5)  # dout may be o
    with pytest.raises(ValueError, match="same tensor"):
        ops.flash_attention_backward(q, k, v, o, o, lse, dq, dk, dk, 0.5)
    with pytest.raises(ValueError, match="same tensor"):
        ops.flash_attention_backward(q, k, v, o, o, lse, q, dk, dv, 0.5)
    with pytest.raises(ValueError, match="dv"):
        ops.flash_attention_backward(q, k, v, o, o, lse, dq, dk, t((2, 6, 2, 8), (2, 3, 1, 8)),
                                     0.5)
    with pytest.raises(ValueError, match="whole number"):
        ops.repeat_kv(t((2, 6, 3, 8), (1, 3, 1, 8)), q)
    with pytest.raises(ValueError, match="same tensor"):
        ops.sum_kv(q, q)


@settings(max_examples=6, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), T=st.integers(1, 9), offset=st.integers(0, 12),
       tt=st.integers(1, 9), causal=st.booleans(), window=st.integers(0, 8),
       dtype=st.sampled_from(["fp64", "fp32"]))
def test_flash_keys_longer_than_queries(ctx, seed, T, offset, tt, causal, window, dtype):
    """flash_attention and its backward with ``offset`` keys before the queries (a prefill
    after cached keys; T = 1: one new token) and a sliding window, tiled, against the float64
    reference; the key tiles no query sees get no task, and their dk and dv are zero."""
    rng = np.random.default_rng(seed)
    window = window if causal else 0
    B, H, Hkv, D = 2, 4, 2, 8
    x = [rng.standard_normal(s) for s in ((B, T, H, D), (B, T + offset, Hkv, D),
                                           (B, T + offset, Hkv, D), (B, T, H, D))]
    tt = min(tt, T)
    qt, kt = (1, tt, 2, D), (1, tt, 1, D)
    q, k, v, do = (nntile.Tensor.from_array(a, b, dtype)
                   for a, b in zip(x, (qt, kt, kt, qt)))
    o, dq = t(q.shape, qt, dtype), t(q.shape, qt, dtype)
    dk, dv, lse = t(k.shape, kt, dtype), t(k.shape, kt, dtype), t((B, T, H), qt[:3], dtype)
    mask = nntile.AttentionMask(causal, window=window, offset=offset)
    ops.flash_attention(q, k, v, o, lse, 0.5, mask)
    ops.flash_attention_backward(q, k, v, o, do, lse, dq, dk, dv, 0.5, mask)
    want_o, want_lse, _ = reference(*x[:3], 0.5, causal, offset=offset, window=window)
    want = [want_o, want_lse, *reference_backward(*x, 0.5, causal, offset=offset,
                                                  window=window)]
    for name, got, w in zip(("o", "lse", "dq", "dk", "dv"), (o, lse, dq, dk, dv), want):
        np.testing.assert_allclose(got.to_array(), w, rtol=tol_of(dtype), atol=tol_of(dtype),
                                   err_msg=name)
    for tensor in (q, k, v, do, o, dq, dk, dv, lse):
        tensor.unregister()


def test_warm_up_runs_each_fused_attention_tile_shape_once(ctx):
    """nntile.nn.warm_up: the fused-attention calls of a bf16 model's input, one per shape (a
    second seq tile adds the tiles off the diagonal), run forward and backward on tensors of
    their own and released; nothing runs on CPU workers only, nor for fp32 attention."""
    from nntile._core.core import live_tensor_count
    from nntile.models import GPT2Config, GPT2LMHead
    from nntile.nn.warm_up import attention_tile_shapes, run_attention_tiles, warm_up_attention
    config = GPT2Config(vocab_size=64, n_positions=16, n_embd=32, n_layer=2, n_head=4)
    model = GPT2LMHead(config, dict(batch=2, seq=8, head=2), "bf16-mixed")
    shapes = attention_tile_shapes(model, 4, 16)
    causal = nntile.AttentionMask()
    assert shapes == [(2, 8, 2, 2, 8, "bf16", causal, 1 / math.sqrt(8), 2)]  # layers alike
    assert attention_tile_shapes(model, 4, 8)[0][-1] == 1  # one seq tile: the diagonal only
    from nntile.models.mistral import MistralLM
    from nntile.models.mistral_config import MistralConfig
    mistral = MistralLM(MistralConfig(  # a window reaching 2 seq tiles back
        vocab_size=64, hidden_size=32, intermediate_size=48, num_hidden_layers=1,
        num_attention_heads=4, num_key_value_heads=2, sliding_window=13),
        dict(batch=2, seq=8, head=2), "bf16-mixed", create=False)
    assert attention_tile_shapes(mistral, 4, 40) == [
        (2, 8, 2, 1, 8, "bf16", nntile.AttentionMask(window=13), 1 / math.sqrt(8), 3)]
    assert attention_tile_shapes(GPT2LMHead(config, dict(batch=2), "fp32"), 4, 16) == []
    before = live_tensor_count()
    run_attention_tiles(shapes)
    assert live_tensor_count() == before
    # runs where a CUDA worker would run the model's attention: one shape here, none on CPUs
    assert warm_up_attention(model, 4, 16) == (len(shapes) if ctx.ncuda_workers else 0)
