"""bf16 tensors: bfloat16 bits stored in uint16, arithmetic in fp32.

Host conversion (round to nearest even), tensor ops on bf16 tiles, and a small GPT-2 in bf16
against the same model in fp32 on the same weights."""
from fractions import Fraction

import numpy as np
import pytest

import nntile
from nntile import ops
from nntile._core.core import bf16_bits_to_float, float_to_bf16_bits


# ---- an independent reference rounding ---------------------------------------------------

def _bits_value(bits):
    """Exact magnitude of bf16 bits (sign ignored); the infinity counts as 2**128, which is
    where IEEE rounding puts the overflow threshold."""
    bits &= 0x7FFF
    if bits == 0x7F80:
        return Fraction(2) ** 128
    return Fraction(float(bf16_bits_to_float(np.array([bits], np.uint16))[0]))


def ref_bits(x):
    """bf16 bits of the real x (a python float), rounded to nearest even with exact
    rational arithmetic."""
    if np.isnan(x):
        return None
    sign = 0x8000 if np.signbit(x) else 0
    if np.isinf(x):
        return sign | 0x7F80
    ax = Fraction(abs(x))
    with np.errstate(over="ignore"):
        f = np.float32(abs(x))
    guess = int(np.array([f]).view(np.uint32)[0]) >> 16
    best = None
    for c in range(max(guess - 2, 0), min(guess + 3, 0x7F81)):
        d = abs(_bits_value(c) - ax)
        if best is None or d < best[0] or (d == best[0] and c % 2 == 0):
            best = (d, c)
    return sign | best[1]


def check_rounding(values, bits):
    with np.errstate(invalid="ignore"):  # float32 signalling NaNs
        values = np.asarray(values, np.float64).ravel()
    for x, b in zip(values, np.asarray(bits).ravel()):
        want = ref_bits(float(x))
        if want is None:  # NaN: a NaN of the same sign
            assert (b & 0x7F80) == 0x7F80 and (b & 0x7F) != 0 and (b >> 15) == np.signbit(x)
        else:
            assert b == want, (x, hex(b), hex(want))


def sample_values(rng, n):
    """Random values over the whole range, plus ties and near-ties of bf16."""
    pats = rng.integers(0, 2 ** 32, n, dtype=np.uint64).astype(np.uint32).view(np.float32)
    normal = rng.standard_normal(n) * 10.0 ** rng.integers(-40, 39, n)
    base = bf16_bits_to_float(rng.integers(0, 0x7F80, n // 4, dtype=np.uint64)
                              .astype(np.uint16)).astype(np.float64)
    ulp = np.spacing(base.astype(np.float32)).astype(np.float64) * 2 ** 16
    ties = base + ulp / 2
    near = ties + ulp * 2.0 ** -30  # float32 would round this to the tie: float64 must not
    special = np.array([0.0, -0.0, np.inf, -np.inf, np.nan, -np.nan, 3.3895314e38,
                        3.3961776e38, 3.397e38, 1e39, -1e39, 1e-45, 9.2e-41, 2.0 ** -133,
                        2.0 ** -134, 3 * 2.0 ** -135, 1 + 2.0 ** -8, 1 + 3 * 2.0 ** -8])
    return pats, np.concatenate([normal, ties, near, -near, special])


def test_host_conversion_rounds_to_nearest_even():
    rng = np.random.default_rng(0)
    f32, f64 = sample_values(rng, 800)
    check_rounding(f32, float_to_bf16_bits(f32))
    check_rounding(f64, float_to_bf16_bits(f64))
    # float64 is rounded once, not through float32 (double rounding would go to 1.0)
    assert float_to_bf16_bits(np.array([1 + 2.0 ** -8 + 2.0 ** -40]))[0] == 0x3F81
    assert float_to_bf16_bits(np.array([1 + 2.0 ** -8], np.float32))[0] == 0x3F80
    # exactly representable values survive both ways
    bits = rng.integers(0, 2 ** 16, 5000, dtype=np.uint64).astype(np.uint16)
    bits = bits[(bits & 0x7F80) != 0x7F80]
    vals = bf16_bits_to_float(bits)
    assert vals.dtype == np.float32
    np.testing.assert_array_equal(float_to_bf16_bits(vals), bits)
    np.testing.assert_array_equal(float_to_bf16_bits(vals.astype(np.float64)), bits)
    np.testing.assert_array_equal(float_to_bf16_bits(np.array([3, -7, 257], np.int64)),
                                  float_to_bf16_bits(np.array([3.0, -7.0, 256.0])))


@pytest.mark.parametrize("shape,tiles", [((37,), (10,)), ((5, 7), (2, 3)), ((3, 4, 5), (3, 4, 5)),
                                         ((), ())])
def test_tensor_round_trip(ctx, shape, tiles):
    rng = np.random.default_rng(len(shape))
    # representable values come back exactly, as float32
    exact = bf16_bits_to_float(rng.integers(0, 2 ** 16, shape, dtype=np.uint64).astype(np.uint16))
    exact = np.where(np.isfinite(exact), exact, 1.5).astype(np.float32)
    for source in (exact, exact.astype(np.float64)):
        t = nntile.Tensor.from_array(source, tiles, dtype="bf16")
        assert t.dtype == "bf16" and t.numpy_dtype == np.uint16
        out = t.to_array()
        assert out.dtype == np.float32 and out.shape == shape
        np.testing.assert_array_equal(out, exact)
        for i in range(t.ntiles):
            tile = t.tile_to_array(i)
            assert tile.dtype == np.float32
            np.testing.assert_array_equal(tile, exact[t.traits.tile_slices(i)])
        t.unregister()
    # other values are rounded to nearest even, from float32 or float64
    f32, f64 = sample_values(rng, 200)
    n = int(np.prod(shape))
    for values in (f32, np.concatenate([f64[-18:], rng.permutation(f64)])):
        x = values[:n].reshape(shape)
        t = nntile.Tensor.from_array(x, tiles, dtype="bf16")
        bits = float_to_bf16_bits(t.to_array())
        check_rounding(x, bits)
        t.write(np.zeros(shape))
        assert (t.to_array() == 0).all()
        t.unregister()


def test_write_checks_and_other_dtypes_unchanged(ctx):
    t = nntile.Tensor((2, 3), (1, 2), "bf16")
    assert (t.to_array() == 0).all()
    t.write(np.arange(6).reshape(2, 3))  # integers are values, not bits
    np.testing.assert_array_equal(t.to_array(), np.arange(6).reshape(2, 3))
    with pytest.raises(TypeError):
        t.write(np.array([["a", "b", "c"]] * 2))
    with pytest.raises(ValueError):
        t.write(np.zeros((3, 2)))
    t.fill(-2.5)
    assert (t.to_array() == -2.5).all()
    t.unregister()
    # fp32 and int64 still read back as themselves
    a = nntile.Tensor.from_array(np.arange(4, dtype=np.float32), (3,))
    assert a.dtype == "fp32" and a.to_array().dtype == np.float32
    i = nntile.Tensor.from_array(np.arange(4), (3,))
    assert i.dtype == "int64" and i.to_array().dtype == np.int64
    with pytest.raises(TypeError, match="bf16"):
        ops.add(1.0, a, 1.0, nntile.Tensor((4,), (3,), "bf16"))
    assert "bf16" in nntile.DTYPES


def bf(x):
    return bf16_bits_to_float(float_to_bf16_bits(x))


def test_ops_on_bf16_tensors(ctx):
    rng = np.random.default_rng(3)
    a = bf(rng.standard_normal((13, 30)))
    b = bf(rng.standard_normal((30, 17)))
    A = nntile.Tensor.from_array(a, (5, 7), dtype="bf16")
    B = nntile.Tensor.from_array(b, (7, 6), dtype="bf16")
    C = nntile.Tensor((13, 17), (5, 6), "bf16")
    ops.gemm(1.0, A, "N", B, "N", 0.0, C)
    ref = a.astype(np.float64) @ b
    # exact products, float sums, one bf16 rounding per K tile (5 tiles): each rounding
    # errs by at most 2**-9 of a partial sum
    assert (np.abs(C.to_array() - ref) <= 5 * 2.0 ** -9 * (np.abs(a) @ np.abs(b))).all()
    assert rel(C.to_array(), ref) <= 1e-2
    # re-tiling copies bits
    E = A.copy(basetile=(4, 11))
    np.testing.assert_array_equal(E.to_array(), a)
    D = A.copy()
    ops.add(0.5, A, 1.0, D)
    np.testing.assert_array_equal(D.to_array(), bf(1.5 * a))  # exact in float, rounded once
    ops.scal(2.0, D)
    np.testing.assert_array_equal(D.to_array(), bf(3.0 * a))
    for t in (A, B, C, D, E):
        t.unregister()


# ---- GPT-2 in bf16 -------------------------------------------------------------------------

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
from nntile.models import GPT2Config, GPT2LMHead  # noqa: E402
from nntile.optim import AdamW  # noqa: E402

B, T = 2, 37
CONFIG = dict(vocab_size=1000, n_positions=64, n_embd=96, n_layer=2, n_head=3)
TILING = dict(batch=1, seq=10, embd=40, head=2, inner=100, vocab=300)


def bf16_state(tied, seed=0):
    """transformers GPT-2 weights (larger than default, as in test_gpt2), rounded to bf16."""
    torch.manual_seed(seed)
    config = transformers.GPT2Config(**CONFIG, n_inner=None, resid_pdrop=0.0, embd_pdrop=0.0,
                                     attn_pdrop=0.0, tie_word_embeddings=tied)
    model = transformers.GPT2LMHeadModel(config)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.02 * torch.randn_like(p))
    return {k: bf(v.detach().numpy()) for k, v in model.state_dict().items()}


def make_model(state, tied, dtype):
    model = GPT2LMHead(GPT2Config(**CONFIG, tie_word_embeddings=tied), TILING, dtype)
    model.load_state_dict(state)
    return model


def tokens(seed):
    rng = np.random.default_rng(seed)
    return (rng.integers(0, CONFIG["vocab_size"], (B, T)),
            rng.integers(0, CONFIG["vocab_size"], (B, T)))


def rel(a, b):
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return np.linalg.norm(a - b) / np.linalg.norm(b)


@pytest.mark.parametrize("tied", [True, False], ids=["tied", "untied"])
def test_gpt2_bf16_matches_fp32(ctx, tied):
    state = bf16_state(tied)
    ids, targets = tokens(1)
    results = {}
    for dtype in ("fp32", "bf16"):
        model = make_model(state, tied, dtype)
        for p in model.named_parameters():  # parameters are stored in the model's dtype
            assert p[1].value.dtype == dtype and p[1].grad.dtype == dtype
        logits = model.forward(ids)
        model.zero_grad()
        loss = model.loss(ids, targets)
        model.backward()
        results[dtype] = logits, loss, model.gradients()
        model.unregister()
    (logits32, loss32, grads32), (logits16, loss16, grads16) = results["fp32"], results["bf16"]
    assert isinstance(loss16, float) and np.isfinite(loss16)
    assert logits16.dtype == np.float32
    assert rel(logits16, logits32) < 2e-2
    assert abs(loss16 - loss32) / abs(loss32) < 2e-2
    assert set(grads16) == set(grads32)
    E = CONFIG["n_embd"]
    for name, g32 in grads32.items():
        g16 = grads16[name]
        assert np.isfinite(g16).all(), name
        if name.endswith("attn.c_attn.bias"):
            # The key bias adds the same q.b_k to every score of a query, which softmax
            # ignores: its exact gradient is 0 and both models only hold rounding noise
            # there (relative comparison is meaningless). Bound it by the q/v parts.
            key = slice(E, 2 * E)
            qv16, qv32 = np.delete(g16, np.s_[key]), np.delete(g32, np.s_[key])
            assert np.linalg.norm(g16[key]) < 2e-2 * np.linalg.norm(qv32), name
            g16, g32 = qv16, qv32
        assert rel(g16, g32) < 5e-2, (name, rel(g16, g32))


def test_gpt2_bf16_adamw_trains(ctx):
    state = bf16_state(False)
    model = make_model(state, False, "bf16")
    opt = AdamW(model.named_parameters(), lr=3e-3, weight_decay=0.01, max_grad_norm=1.0)
    for m, v in opt.moments.values():
        assert m.dtype == "bf16" and v.dtype == "bf16"
    assert opt.normsq.dtype == "bf16"
    ids, targets = tokens(7)
    losses = []
    for _ in range(5):
        model.zero_grad()
        losses.append(model.loss(ids, targets))
        model.backward()
        opt.step()
        assert np.isfinite(opt.grad_norm())
    model.zero_grad()
    losses.append(model.loss(ids, targets))
    assert all(np.isfinite(losses)), losses
    assert all(b < a for a, b in zip(losses, losses[1:])), losses
    assert losses[-1] < 0.9 * losses[0], losses
    for name, value in model.state_dict().items():
        assert np.isfinite(value).all(), name
    for m, v in opt.moments.values():
        assert np.isfinite(m.to_array()).all() and np.isfinite(v.to_array()).all()
    model.unregister()


def test_layers_dtype_whitelist(ctx):
    with pytest.raises(ValueError, match="bf16"):
        GPT2LMHead(GPT2Config(**CONFIG), TILING, "fp16")
