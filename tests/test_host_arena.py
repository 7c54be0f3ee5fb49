"""The pinned host arena's allocator (nntile/_core/host_arena.c), on plain memory: what it
hands out never overlaps, stays page-aligned, and merges back into whole chunks; a request
waits for the filler's next chunk, and past the target the arena says no. On a GPU the same
allocator serves StarPU's host copies of tiles (tests/test_gpu.py)."""
import pytest
from hypothesis import given, settings, strategies as st

import nntile
from nntile._core import core
from tests.conftest import run_python

arena = core._host_arena_for_tests
CHUNK = 1 << 20
PAGE = 4096


@pytest.fixture
def started():
    arena("start", CHUNK)
    yield
    arena("stop")


def test_blocks_never_overlap_and_merge_back():
    @settings(max_examples=40, deadline=None)
    @given(st.lists(st.tuples(st.integers(1, CHUNK), st.booleans()), min_size=1, max_size=60),
           st.randoms(use_true_random=False))
    def run(requests, rnd):
        arena("start", CHUNK)
        try:
            check(requests, rnd)
        finally:
            for address in list(live):
                arena("free", address)
            arena("stop")

    live = {}

    def check(requests, rnd):
        live.clear()
        for size, free_one in requests:
            address = arena("alloc", size)
            assert address is not None and address % PAGE == 0
            for other, other_size in live.items():
                assert address + size <= other or other + other_size <= address
            live[address] = size
            if free_one and live:
                victim = rnd.choice(sorted(live))
                assert arena("free", victim)
                assert not arena("free", victim)  # not twice
                del live[victim]
        stats = arena("stats")
        assert stats["in_use"] == sum(-(-s // PAGE) * PAGE for s in live.values())
        for address in list(live):
            assert arena("free", address)
            del live[address]
        count, largest = arena("free_blocks")
        chunks = arena("stats")["pinned"] // CHUNK
        assert (count, largest) == (chunks, CHUNK)  # every chunk whole again
        assert arena("stats")["in_use"] == 0
    run()


def test_waits_for_the_filler_then_refuses_past_the_target(started):
    # the test arena pins one chunk ahead, up to 64: each whole-chunk request waits for the
    # next one, and the 65th finds none
    addresses = [arena("alloc", CHUNK) for _ in range(64)]
    assert None not in addresses and len(set(addresses)) == 64
    assert arena("alloc", 1) is None
    stats = arena("stats")
    assert stats["pinned"] == 64 * CHUNK and stats["served"] == 64 and stats["wait_s"] > 0
    assert arena("alloc", CHUNK + 1) is None  # larger than a chunk: never from the arena
    assert not arena("free", 12345)  # not the arena's
    for address in addresses:
        assert arena("free", address)


def test_pin_all_pins_the_whole_target_before_any_request(started):
    # the test arena keeps one chunk ahead; pin_all lifts that and returns once all 64 are
    # pinned, so that no request waits afterwards
    assert arena("pin_all") >= 0.0
    stats = arena("stats")
    assert stats["pinned"] == 64 * CHUNK and stats["in_use"] == 0
    addresses = [arena("alloc", CHUNK) for _ in range(64)]
    assert None not in addresses
    assert arena("stats")["wait_s"] == 0.0
    assert arena("pin_all") >= 0.0  # nothing left to pin: returns at once
    for address in addresses:
        assert arena("free", address)


def test_a_second_start_is_refused_and_stop_is_idempotent(started):
    with pytest.raises(nntile.StarpuError, match="nntile_host_arena_start"):
        arena("start", CHUNK)
    with pytest.raises(nntile.StarpuError, match="nntile_host_arena_start"):
        arena("start", CHUNK + 1)  # not whole pages


def test_no_arena_without_gpus():
    """On CPU workers StarPU pins nothing, so no arena runs whatever is asked."""
    result = run_python("""
        import nntile
        with nntile.Context(ncpu=1, ncuda=0, pinned_host_mem=1024) as ctx:
            assert ctx.settings()["pinned_host_mem"] == (1024, "argument")
            assert ctx.host_arena_stats() is None
        print("ok")
    """)
    assert result.returncode == 0 and "ok" in result.stdout, result.stderr
