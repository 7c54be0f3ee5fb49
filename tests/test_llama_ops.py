"""The Llama family's tensor ops (RMSNorm, rotary positions, SwiGLU) against numpy float64
on random shapes and tilings (partial tiles), and the rotary inverse frequencies against
transformers."""
import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

import nntile
from nntile import ops
from nntile.nn.rope import rope_inv_freq
from tests.unary_refs import ACTIVATIONS

DTYPES = {"fp32": (np.float32, 1e-5), "fp64": (np.float64, 1e-12)}
SETTINGS = settings(max_examples=12, deadline=None)


def T(array, tiles, dtype=None):
    return nntile.Tensor.from_array(np.ascontiguousarray(array), tiles, dtype)


def ids(array, tiles):
    t = nntile.Tensor(array.shape, tiles, "int64")
    t.write(np.asarray(array, dtype=np.int64))
    return t


def check(got, ref, tol, magnitude=None):
    """relative error against the largest reference entry (or the given magnitude)"""
    got, ref = np.asarray(got, np.float64), np.asarray(ref, np.float64)
    assert got.shape == ref.shape
    scale = max(float(np.max(np.abs(ref) if magnitude is None else magnitude, initial=0)),
                1e-30)
    err = float(np.max(np.abs(got - ref), initial=0)) / scale
    assert err < tol, f"relative error {err:.3g} >= {tol}"


@st.composite
def rows_case(draw, even_last=False):
    """[B, T, E] with a tiling of each dimension (partial tiles) and a seed"""
    shape = (draw(st.integers(1, 3)), draw(st.integers(1, 5)),
             2 * draw(st.integers(1, 6)) if even_last else draw(st.integers(1, 12)))
    tiles = tuple(draw(st.integers(1, n)) for n in shape)
    return shape, tiles, draw(st.integers(0, 2**32 - 1)), draw(st.sampled_from(list(DTYPES)))


# ---- RMSNorm -------------------------------------------------------------------------------

def rmsnorm_ref(x, w, eps):
    rstd = 1 / np.sqrt((x ** 2).mean(-1, keepdims=True) + eps)
    return w * x * rstd, x * rstd, rstd


@SETTINGS
@given(case=rows_case(), beta=st.sampled_from([0.0, 1.0]))
def test_rmsnorm(ctx, case, beta):
    shape, tiles, seed, dtype = case
    npdt, tol = DTYPES[dtype]
    rng = np.random.default_rng(seed)
    eps = 1e-5
    x, dy, dx0 = (rng.standard_normal(shape).astype(npdt) for _ in range(3))
    w, dw0 = (rng.standard_normal(shape[-1]).astype(npdt) for _ in range(2))
    X, DY, DX = T(x, tiles), T(dy, tiles), T(dx0, tiles)
    W, DW = T(w, tiles[-1:]), T(dw0, tiles[-1:])
    stats, rowacc = (nntile.Tensor(shape[:-1], tiles[:-1], dtype) for _ in range(2))
    Y = nntile.Tensor(shape, tiles, dtype)
    ops.rmsnorm_forward(X, W, eps, stats, Y)
    x64, w64, dy64 = (a.astype(np.float64) for a in (x, w, dy))
    y, xhat, rstd = rmsnorm_ref(x64, w64, eps)
    check(stats.to_array(), (x64 ** 2).sum(-1), 10 * tol)
    check(Y.to_array(), y, 10 * tol)
    ops.rmsnorm_backward(X, DY, stats, W, eps, rowacc, DW, beta, DX)
    g = dy64 * w64
    c = (g * xhat).mean(-1, keepdims=True)
    dx = rstd * (g - xhat * c) + beta * dx0
    check(DX.to_array(), dx, 50 * tol, magnitude=rstd * (np.abs(g) + np.abs(xhat * c))
          + np.abs(beta * dx0))
    check(DW.to_array(), dw0 + (dy64 * xhat).reshape(-1, shape[-1]).sum(0), 50 * tol,
          magnitude=1 + np.abs(dy64 * xhat).reshape(-1, shape[-1]).sum(0))


def test_rmsnorm_mixed_writes_bf16(ctx, rng):
    """fp32 x, weight and statistics, bf16 y: the fp32 norm rounded once"""
    shape, tiles = (2, 5, 12), (1, 3, 5)
    x = rng.standard_normal(shape).astype(np.float32)
    w = rng.standard_normal(12).astype(np.float32)
    stats = nntile.Tensor(shape[:-1], tiles[:-1], "fp32")
    Y = nntile.Tensor(shape, tiles, "bf16")
    ops.rmsnorm_forward(T(x, tiles), T(w, tiles[-1:]), 1e-6, stats, Y)
    ref = rmsnorm_ref(x.astype(np.float64), w.astype(np.float64), 1e-6)[0]
    check(Y.to_array(), ref, 2 ** -8)


def test_rmsnorm_against_transformers(ctx, rng):
    torch = pytest.importorskip("torch")
    from transformers.models.llama.modeling_llama import LlamaRMSNorm
    norm = LlamaRMSNorm(16, eps=1e-6)
    with torch.no_grad():
        norm.weight.copy_(torch.randn(16, generator=torch.Generator().manual_seed(1)))
    x = rng.standard_normal((3, 4, 16)).astype(np.float32)
    Y = nntile.Tensor((3, 4, 16), (2, 3, 7), "fp32")
    ops.rmsnorm_forward(T(x, (2, 3, 7)), T(norm.weight.detach().numpy(), (7,)), 1e-6,
                        nntile.Tensor((3, 4), (2, 3), "fp32"), Y)
    check(Y.to_array(), norm(torch.from_numpy(x)).detach().numpy(), 1e-5)


# ---- rotary positions ----------------------------------------------------------------------

def rope_ref(x, pos, inv_freq, scale, angle_dtype):
    """x [B, T, H, D] turned as transformers' apply_rotary_pos_emb; the angle rounded to
    angle_dtype (fp32 as transformers for fp32 data), cos and sin in float64"""
    half = x.shape[-1] // 2
    angle = (pos[..., None].astype(angle_dtype) * inv_freq.astype(angle_dtype))
    angle = angle.astype(np.float64)[:, :, None, :]
    c, s = np.cos(angle) * scale, np.sin(angle) * scale
    x1, x2 = x[..., :half], x[..., half:]
    return np.concatenate([x1 * c - x2 * s, x2 * c + x1 * s], axis=-1)


@st.composite
def rope_case(draw):
    shape = (draw(st.integers(1, 3)), draw(st.integers(1, 5)), draw(st.integers(1, 4)),
             2 * draw(st.integers(1, 5)))
    tiles = tuple(draw(st.integers(1, n)) for n in shape[:3]) + (shape[3],)
    return (shape, tiles, draw(st.integers(0, 2**32 - 1)), draw(st.sampled_from(list(DTYPES))),
            draw(st.sampled_from([1.0, 0.8])))


@SETTINGS
@given(case=rope_case())
def test_rope(ctx, case):
    shape, tiles, seed, dtype, scale = case
    npdt, tol = DTYPES[dtype]
    rng = np.random.default_rng(seed)
    x = rng.standard_normal(shape).astype(npdt)
    pos = rng.integers(0, 2048, shape[:2])
    inv_freq = rope_inv_freq(shape[3], 10000.0)[0].astype(npdt)
    X, P, F = T(x, tiles), ids(pos, tiles[:2]), T(inv_freq, (shape[3] // 2,))
    ops.rope_forward(X, P, F, scale)
    ref = rope_ref(x.astype(np.float64), pos, inv_freq.astype(np.float64), scale, npdt)
    check(X.to_array(), ref, 10 * tol)
    ops.rope_backward(X, P, F, scale)
    check(X.to_array(), scale * scale * x, 10 * tol)


def test_rope_mixed_and_bf16(ctx, rng):
    """bf16 vectors with fp32 inverse frequencies (mixed precision), and all bf16"""
    shape, tiles = (2, 6, 3, 8), (1, 4, 2, 8)
    x = rng.standard_normal(shape).astype(np.float32)
    pos = rng.integers(0, 500, shape[:2])
    inv_freq = rope_inv_freq(8, 10000.0)[0].astype(np.float32)
    for freq_dtype in ("fp32", "bf16"):
        X, F = T(x, tiles, "bf16"), T(inv_freq, (4,), freq_dtype)
        # the reference from the stored values (bf16 frequencies turn by other angles)
        ref = rope_ref(X.to_array().astype(np.float64), pos, F.to_array(), 1.0, np.float32)
        ops.rope_forward(X, ids(pos, tiles[:2]), F)
        check(X.to_array(), ref, 2 ** -7)


def test_rope_against_transformers(ctx, rng):
    """forward against LlamaRotaryEmbedding and apply_rotary_pos_emb (fp32, llama3 scaling)"""
    torch = pytest.importorskip("torch")
    from transformers import LlamaConfig
    from transformers.models.llama.modeling_llama import (LlamaRotaryEmbedding,
                                                          apply_rotary_pos_emb)
    params = dict(rope_type="llama3", rope_theta=500000.0, factor=32.0, low_freq_factor=1.0,
                  high_freq_factor=4.0, original_max_position_embeddings=64)
    config = LlamaConfig(hidden_size=64, num_attention_heads=4, head_dim=16,
                         max_position_embeddings=128, rope_parameters=params)
    B, S, H, D = 2, 7, 4, 16
    x = rng.standard_normal((B, S, H, D)).astype(np.float32)
    pos = rng.integers(0, 128, (B, S))
    emb = LlamaRotaryEmbedding(config)
    cos, sin = emb(torch.from_numpy(x), torch.from_numpy(pos))
    ref, _ = apply_rotary_pos_emb(torch.from_numpy(x), torch.from_numpy(x), cos, sin,
                                  unsqueeze_dim=2)
    inv_freq, scaling = rope_inv_freq(D, 500000.0, params)
    X = T(x, (1, 4, 3, D))
    ops.rope_forward(X, ids(pos, (1, 4)), T(inv_freq.astype(np.float32), (D // 2,)),
                     scaling)
    check(X.to_array(), ref.numpy(), 1e-5)


@pytest.mark.parametrize("scaling", [
    None, {"rope_type": "default"}, {"rope_type": "linear", "factor": 4.0},
    {"type": "linear", "factor": 2.0},
    {"rope_type": "llama3", "factor": 32.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
     "original_max_position_embeddings": 8192},
    {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 2.0, "high_freq_factor": 6.0,
     "original_max_position_embeddings": 512}])
@pytest.mark.parametrize("head_dim, theta", [(64, 500000.0), (128, 10000.0), (6, 100.0)])
def test_rope_inv_freq_as_transformers(scaling, head_dim, theta):
    pytest.importorskip("torch")
    from transformers import LlamaConfig
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS
    from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding
    params = dict(scaling or {})
    rope_type = params.pop("rope_type", params.pop("type", "default"))
    config = LlamaConfig(hidden_size=4 * head_dim, num_attention_heads=4, head_dim=head_dim,
                         max_position_embeddings=16384,
                         rope_parameters=dict(params, rope_type=rope_type, rope_theta=theta))
    if rope_type == "default":
        ref, ref_scaling = LlamaRotaryEmbedding.compute_default_rope_parameters(config)
    else:
        ref, ref_scaling = ROPE_INIT_FUNCTIONS[rope_type](config)
    inv_freq, scaling_factor = rope_inv_freq(head_dim, theta, scaling)
    assert inv_freq.dtype == np.float64 and inv_freq.shape == (head_dim // 2,)
    # transformers computes in fp32 (its blend rounds several times): a few of its ulps
    np.testing.assert_allclose(inv_freq, ref.double().numpy(), rtol=1e-6)
    assert scaling_factor == ref_scaling == 1.0


@pytest.mark.parametrize("args, match", [
    ((7, 10000.0), "even"), ((0, 10000.0), "even"), ((8, -1.0), "rope_theta"),
    ((8, 10000.0, {"rope_type": "yarn", "factor": 2.0}), "not supported"),
    ((8, 10000.0, {"rope_type": "linear"}), "factor"),
    ((8, 10000.0, {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 4.0,
                   "high_freq_factor": 1.0, "original_max_position_embeddings": 64}),
     "high_freq_factor")])
def test_rope_inv_freq_refuses(args, match):
    with pytest.raises(ValueError, match=match):
        rope_inv_freq(*args)


# ---- SwiGLU --------------------------------------------------------------------------------

@SETTINGS
@given(case=rows_case())
def test_swiglu(ctx, case):
    shape, tiles, seed, dtype = case
    npdt, tol = DTYPES[dtype]
    rng = np.random.default_rng(seed)
    gate, up, dh = (rng.standard_normal(shape).astype(npdt) for _ in range(3))
    G, U, DH = T(3 * gate, tiles), T(up, tiles), T(dh, tiles)
    H, DG, DU = (nntile.Tensor(shape, tiles, dtype) for _ in range(3))
    ops.swiglu_forward(G, U, H)
    value, deriv = ACTIVATIONS["silu"]
    g, u, d = (3 * gate).astype(npdt).astype(np.float64), up.astype(np.float64), \
        dh.astype(np.float64)
    check(H.to_array(), value(g).astype(npdt).astype(np.float64) * u, 4 * tol)
    ops.swiglu_backward(G, U, DH, DG, DU)
    check(DG.to_array(), d * u * deriv(g), 4 * tol)
    check(DU.to_array(), d * value(g), 4 * tol)


def test_swiglu_bf16(ctx, rng):
    shape, tiles = (3, 10), (2, 4)
    gate, up = rng.standard_normal(shape), rng.standard_normal(shape)
    G, U = T(gate, tiles, "bf16"), T(up, tiles, "bf16")
    H = nntile.Tensor(shape, tiles, "bf16")
    ops.swiglu_forward(G, U, H)
    g, u = G.to_array().astype(np.float64), U.to_array().astype(np.float64)
    check(H.to_array(), ACTIVATIONS["silu"][0](g) * u, 2 ** -7)


# ---- bad input: a clear exception before any task ---------------------------------------------

def test_bad_input(ctx):
    x = nntile.Tensor((2, 3, 8), (1, 3, 4), "fp32")
    w = nntile.Tensor((8,), (4,), "fp32")
    stats = nntile.Tensor((2, 3), (1, 3), "fp32")
    with pytest.raises(ValueError, match="stats"):
        ops.rmsnorm_forward(x, w, 1e-5, nntile.Tensor((2, 3), (2, 3), "fp32"),
                            nntile.Tensor((2, 3, 8), (1, 3, 4), "fp32"))
    with pytest.raises(ValueError, match="eps"):
        ops.rmsnorm_forward(x, w, -1.0, stats, nntile.Tensor((2, 3, 8), (1, 3, 4), "fp32"))
    with pytest.raises(ValueError, match="weight"):
        ops.rmsnorm_forward(x, nntile.Tensor((8,), (8,), "fp32"), 1e-5, stats,
                            nntile.Tensor((2, 3, 8), (1, 3, 4), "fp32"))
    with pytest.raises(ValueError, match="same tensor"):
        ops.rmsnorm_forward(x, w, 1e-5, stats, x)
    with pytest.raises(ValueError, match="at least 2"):
        ops.rmsnorm_forward(w, w, 1e-5, stats, w)
    q = nntile.Tensor((2, 3, 2, 8), (1, 3, 1, 8), "fp32")
    pos = ids(np.zeros((2, 3), np.int64), (1, 3))
    freq = nntile.Tensor((4,), (4,), "fp32")
    with pytest.raises(ValueError, match="even and one tile"):
        ops.rope_forward(nntile.Tensor((2, 3, 2, 8), (1, 3, 1, 4), "fp32"), pos, freq)
    with pytest.raises(ValueError, match="even and one tile"):
        ops.rope_forward(nntile.Tensor((2, 3, 2, 7), (1, 3, 1, 7), "fp32"), pos,
                         nntile.Tensor((3,), (3,), "fp32"))
    with pytest.raises(ValueError, match="pos"):
        ops.rope_forward(q, ids(np.zeros((2, 3), np.int64), (2, 3)), freq)
    with pytest.raises(TypeError, match="int64"):
        ops.rope_forward(q, nntile.Tensor((2, 3), (1, 3), "fp32"), freq)
    with pytest.raises(ValueError, match="inv_freq"):
        ops.rope_forward(q, pos, nntile.Tensor((8,), (8,), "fp32"))
    with pytest.raises(ValueError, match="scale"):
        ops.rope_forward(q, pos, freq, float("nan"))
    with pytest.raises(TypeError, match="fp64"):
        ops.rope_forward(q, pos, nntile.Tensor((4,), (4,), "fp64"))
    with pytest.raises(ValueError, match="shape"):
        ops.swiglu_forward(x, nntile.Tensor((2, 3, 4), (1, 3, 4), "fp32"),
                           nntile.Tensor((2, 3, 8), (1, 3, 4), "fp32"))
