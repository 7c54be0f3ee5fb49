import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from nntile import TensorTraits


@st.composite
def shape_and_tiles(draw, max_ndim=4, max_dim=9):
    ndim = draw(st.integers(0, max_ndim))
    shape = tuple(draw(st.integers(1, max_dim)) for _ in range(ndim))
    tiles = tuple(draw(st.integers(1, n)) for n in shape)
    return shape, tiles


@settings(max_examples=150, deadline=None)
@given(shape_and_tiles())
def test_tiles_cover_every_element_once(st_case):
    shape, tiles = st_case
    traits = TensorTraits(shape, tiles)
    assert traits.grid == tuple(-(-n // b) for n, b in zip(shape, tiles))
    assert traits.ntiles == int(np.prod(traits.grid))
    hits = np.zeros(shape, dtype=int)
    for linear in range(traits.ntiles):
        index = traits.linear_to_index(linear)
        assert traits.index_to_linear(index) == linear
        # row-major numbering of the grid, as numpy's ravel_multi_index
        assert linear == np.ravel_multi_index(index, traits.grid) if traits.ndim else linear == 0
        tile_shape = traits.tile_shape(index)
        offset = traits.tile_offset(index)
        assert all(1 <= t <= b for t, b in zip(tile_shape, tiles))
        assert offset == tuple(i * b for i, b in zip(index, tiles))
        hits[traits.tile_slices(index)] += 1
    assert (hits == 1).all()
    assert traits.leftover() == tuple(n - (g - 1) * b for n, g, b in zip(shape, traits.grid, tiles))


@settings(max_examples=100, deadline=None)
@given(shape_and_tiles(max_ndim=3), st.data())
def test_element_to_tile(st_case, data):
    shape, tiles = st_case
    traits = TensorTraits(shape, tiles)
    element = tuple(data.draw(st.integers(0, n - 1)) for n in shape)
    index, inner = traits.element_tile(element)
    offset = traits.tile_offset(index)
    assert tuple(o + i for o, i in zip(offset, inner)) == element
    assert all(0 <= i < s for i, s in zip(inner, traits.tile_shape(index)))


def test_partial_edge_tiles():
    traits = TensorTraits((10, 7), (4, 7))
    assert traits.grid == (3, 1)
    assert [traits.tile_shape(i) for i in range(3)] == [(4, 7), (4, 7), (2, 7)]
    assert traits.leftover() == (2, 7)


@pytest.mark.parametrize("shape, tiles, message", [
    ((4, 5), (2,), "dimensions"),
    ((4, 5), (0, 5), "between 1"),
    ((4, 5), (5, 5), "between 1"),
    ((4, 0), (1, 1), ">= 1"),
    ((4, 2.5), (1, 1), "integers"),
])
def test_bad_traits(shape, tiles, message):
    with pytest.raises((ValueError, TypeError), match=message):
        TensorTraits(shape, tiles)


def test_bad_tile_index():
    traits = TensorTraits((4, 5), (2, 2))
    with pytest.raises(IndexError):
        traits.tile_shape((2, 0))
    with pytest.raises(IndexError):
        traits.linear_to_index(6)
