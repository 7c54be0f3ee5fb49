import gc
import zlib

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

import nntile
from nntile._core import core


@st.composite
def array_and_tiles(draw):
    ndim = draw(st.integers(0, 3))
    shape = tuple(draw(st.integers(1, 8)) for _ in range(ndim))
    tiles = tuple(draw(st.integers(1, n)) for n in shape)
    dtype = draw(st.sampled_from([np.float32, np.float64, np.int64]))
    return shape, tiles, dtype


@settings(max_examples=60, deadline=None)
@given(array_and_tiles())
def test_round_trip(ctx, case):
    shape, tiles, dtype = case
    array = (np.random.default_rng(zlib.crc32(repr((shape, tiles)).encode())).standard_normal(shape) * 100).astype(dtype)
    t = nntile.Tensor.from_array(array, tiles)
    assert t.dtype == {np.float32: "fp32", np.float64: "fp64", np.int64: "int64"}[dtype]
    out = t.to_array()
    assert out.dtype == array.dtype and np.array_equal(out, array)
    for i in range(t.ntiles):
        assert np.array_equal(t.tile_to_array(i), array[t.traits.tile_slices(i)])
    t.unregister()


@settings(max_examples=40, deadline=None)
@given(array_and_tiles(), st.data())
def test_copy_between_tilings(ctx, case, data):
    shape, tiles, dtype = case
    if dtype == np.int64:
        dtype = np.float64
    other = tuple(data.draw(st.integers(1, n)) for n in shape)
    array = np.random.default_rng(zlib.crc32(repr((shape, tiles)).encode())).standard_normal(shape).astype(dtype)
    src = nntile.Tensor.from_array(array, tiles)
    dst = src.copy(basetile=other)
    assert dst.basetile == other
    assert np.array_equal(dst.to_array(), array)
    same = src.copy()
    assert np.array_equal(same.to_array(), array)


@pytest.mark.parametrize("dtype", ["fp32", "fp64", "int64"])
def test_fill_and_clear(ctx, dtype):
    t = nntile.Tensor((5, 7), (2, 3), dtype)
    t.fill(3)
    assert (t.to_array() == 3).all()
    t.clear()
    assert (t.to_array() == 0).all()


def test_add_and_scal(ctx, rng):
    a = rng.standard_normal((9, 4))
    b = rng.standard_normal((9, 4))
    ta = nntile.Tensor.from_array(a, (4, 3))
    tb = nntile.Tensor.from_array(b, (4, 3))
    nntile.ops.add(2.0, ta, -0.5, tb)
    ref = 2 * a - 0.5 * b  # the kernel may fuse into an FMA: allow rounding of the inputs' size
    np.testing.assert_allclose(tb.to_array(), ref, rtol=0, atol=1e-15 * (2 * abs(a) + abs(b)).max())
    nntile.ops.scal(3.0, tb)
    np.testing.assert_allclose(tb.to_array(), 3 * ref, rtol=0, atol=4e-15 * (2 * abs(a) + abs(b)).max())
    # beta == 0 must not read dst: NaN in dst does not leak into the result
    tb.write(np.full((9, 4), np.nan))
    nntile.ops.add(1.0, ta, 0.0, tb)
    np.testing.assert_array_equal(tb.to_array(), a)


@settings(max_examples=30, deadline=None)
@given(array_and_tiles())
def test_add_out_keeps_its_inputs(ctx, case):
    """dst = alpha*src + beta*base over any tiling, dst poisoned with NaN first: no tile of
    dst is read, and src and base stay as they were."""
    shape, tiles, _ = case
    rng = np.random.default_rng(zlib.crc32(repr((shape, tiles)).encode()))
    a, b = rng.standard_normal(shape), rng.standard_normal(shape)
    ta, tb = nntile.Tensor.from_array(a, tiles), nntile.Tensor.from_array(b, tiles)
    out = nntile.Tensor.from_array(np.full(shape, np.nan), tiles)
    nntile.ops.add_out(0.75, ta, -1.5, tb, out)
    np.testing.assert_allclose(out.to_array(), 0.75 * a - 1.5 * b, rtol=0,
                               atol=1e-15 * (abs(a) + 2 * abs(b) + 1).max())
    assert np.array_equal(ta.to_array(), a) and np.array_equal(tb.to_array(), b)
    for t in (ta, tb, out):
        t.unregister()


def test_add_some_tiles_then_swap_them(ctx, rng):
    a, b = rng.standard_normal((9, 4)), rng.standard_normal((9, 4))
    ta, tb = nntile.Tensor.from_array(a, (4, 3)), nntile.Tensor.from_array(b, (4, 3))
    nntile.ops.add(1.0, ta, 1.0, tb, tiles=[1, 4])  # tiles (0, 1) and (2, 0): rows 0-3 / 8
    summed = b.copy()
    summed[0:4, 3:4] += a[0:4, 3:4]
    summed[8:9, 0:3] += a[8:9, 0:3]
    np.testing.assert_array_equal(tb.to_array(), summed)
    ta.swap_tiles(tb, [1, 4])  # each takes the other's tiles there, with what they hold
    swapped_a, swapped_b = a.copy(), summed.copy()
    for rows, cols in ((slice(0, 4), slice(3, 4)), (slice(8, 9), slice(0, 3))):
        swapped_a[rows, cols], swapped_b[rows, cols] = summed[rows, cols], a[rows, cols]
    nntile.ops.scal(2.0, ta)  # tasks after the swap follow the new tiles
    np.testing.assert_array_equal(ta.to_array(), 2 * swapped_a)
    np.testing.assert_array_equal(tb.to_array(), swapped_b)
    with pytest.raises(ValueError, match="not tiled as"):
        ta.swap_tiles(nntile.Tensor.from_array(a, (3, 3)), [0])
    with pytest.raises(IndexError, match="tile 12"):
        ta.swap_tiles(tb, [12])


@pytest.mark.parametrize("dtype", ["fp32", "bf16"])
def test_dropped_tiles_read_as_zeros_where_told(ctx, rng, dtype):
    """Tiles marked zero_when_dropped and invalidated hold nothing until a task reads them,
    which finds zeros (a sharded gradient accumulates so); the others keep their contents."""
    a = rng.standard_normal((6, 4)).astype(np.float32)
    src = nntile.Tensor.from_array(a, (2, 4), dtype=dtype)
    dst = nntile.Tensor.from_array(np.full((6, 4), 7.0, np.float32), (2, 4), dtype=dtype)
    dst.zero_when_dropped([0, 2])
    dst.invalidate([0, 2])
    ctx.wait()
    assert dst.valid_tiles() == 1
    nntile.ops.add(1.0, src, 1.0, dst)  # dst += src
    ours, theirs = dst.to_array(), src.to_array()
    dropped = np.r_[0:2, 4:6]
    np.testing.assert_array_equal(ours[dropped], theirs[dropped])
    np.testing.assert_allclose(ours[2:4], theirs[2:4] + 7.0, rtol=1e-2 if dtype == "bf16" else 1e-6)
    assert dst.valid_tiles() == 3


@settings(max_examples=25, deadline=None)
@given(st.integers(1, 6), st.integers(1, 6), st.integers(1, 9), st.data())
def test_a_dropped_tile_is_overwritten_by_the_first_gemm(ctx, m, n, k, data):
    """C += A @ B where C's tiles read as zeros once dropped: a dropped tile's first partial
    product overwrites it (opened write-only, so never read: the poison proves it), later
    ones add; a tile written since its drop, by any path, is added to."""
    tm, tn, tk = (data.draw(st.integers(1, d)) for d in (m, n, k))
    rng = np.random.default_rng(zlib.crc32(repr((m, n, k, tm, tn, tk)).encode()))
    a, b = rng.standard_normal((m, k)), rng.standard_normal((k, n))
    old = rng.standard_normal((m, n))
    A, B = nntile.Tensor.from_array(a, (tm, tk)), nntile.Tensor.from_array(b, (tk, tn))
    C = nntile.Tensor.from_array(old, (tm, tn))
    C.zero_when_dropped()
    dropped = data.draw(st.sets(st.integers(0, C.ntiles - 1)))
    C.invalidate(sorted(dropped))
    rewritten = data.draw(st.sets(st.sampled_from(sorted(dropped)))) if dropped else set()
    C.write_tiles(lambda slices: old[slices], sorted(rewritten))  # written since: old again
    expected = a @ b + old
    for i in dropped - rewritten:
        expected[C.traits.tile_slices(i)] = (a @ b)[C.traits.tile_slices(i)]
    previous = core._poison_written(True)
    core._record_tasks(True)
    try:
        nntile.ops.gemm(1.0, A, "N", B, "N", 1.0, C)
    finally:
        modes = core._record_tasks(False)
        core._poison_written(previous)
    np.testing.assert_allclose(C.to_array(), expected, rtol=1e-12, atol=1e-12)
    overwrites = sum(1 for op, mode in modes if op == "gemm" and mode[-1] == "W")
    assert overwrites == len(dropped - rewritten)
    nntile.ops.gemm(1.0, A, "N", B, "N", 1.0, C)  # written now: every tile adds
    np.testing.assert_allclose(C.to_array(), expected + a @ b, rtol=1e-12, atol=1e-12)


def test_clear_drops_what_reads_as_zeros(ctx, rng):
    """clear() drops a tensor whose tiles all read as zeros once dropped (no task, no
    memory), and fills any other; the model's gradients are such tensors."""
    t = nntile.Tensor.from_array(rng.standard_normal((4, 4)), (2, 2))
    t.zero_when_dropped([0, 1, 2])
    t.clear()  # one tile would keep garbage if dropped: filled
    ctx.wait()
    assert t.valid_tiles() == 4 and not t.to_array().any()
    t.zero_when_dropped()
    t.write(np.ones((4, 4)))
    t.clear()
    ctx.wait()
    assert t.valid_tiles() == 0
    assert not t.to_array().any()
    config = nntile.models.GPT2Config(vocab_size=16, n_positions=8, n_embd=8, n_layer=1,
                                      n_head=2)
    model = nntile.models.GPT2LMHead(config, {}, "fp32")
    ctx.wait()
    assert all(param.grad.valid_tiles() == 0 for _, param in model.named_parameters())


def test_hints_keep_contents(ctx, rng):
    a = rng.standard_normal((6, 6)).astype(np.float32)
    t = nntile.Tensor.from_array(a, (4, 4))
    t.wont_use()
    assert np.array_equal(t.to_array(), a)
    t.invalidate()
    t.fill(1.5)  # an invalidated tensor is still usable once written again
    assert (t.to_array() == 1.5).all()
    # a write-back comes after the writes submitted before it, and holds back none after it
    nntile.ops.scal(2.0, t)
    t.write_back()
    nntile.ops.scal(2.0, t)
    assert (t.to_array() == 6.0).all()


def test_unregister_is_idempotent_and_tracked(ctx):
    before = core.live_tensor_count()
    t = nntile.Tensor((4, 4), (2, 2))
    assert core.live_tensor_count() == before + 1
    t.unregister()
    t.unregister()
    assert core.live_tensor_count() == before
    assert not t.is_registered


def test_garbage_collected_tensors_release_their_tiles(ctx):
    gc.collect()
    before = core.live_tensor_count()
    for _ in range(300):
        t = nntile.Tensor((8, 8), (2, 2))
        t.fill(1.0)
        del t
    gc.collect()
    ctx.wait()
    assert core.live_tensor_count() == before
