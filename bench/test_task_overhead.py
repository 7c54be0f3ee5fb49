"""Per-task cost of our Cython submission path against a bare starpu_task_insert loop."""
import time

import numpy as np

import nntile
from nntile._core import core

NTASKS = 100_000


def per_task_seconds(ctx, submit_all):
    ctx.wait()
    start = time.perf_counter()
    submit_all()
    ctx.wait()
    return (time.perf_counter() - start) / NTASKS


def test_task_overhead(benchmark, ctx, report):
    tile = nntile.Tensor.from_array(np.ones(1, dtype=np.float32), (1,))

    def ours():
        for _ in range(NTASKS):
            nntile.ops.scal(1.0, tile)

    def bare():
        core._bench_bare_task_insert(tile, NTASKS)

    bare_times = [per_task_seconds(ctx, bare) for _ in range(3)]
    our_times = benchmark.pedantic(lambda: per_task_seconds(ctx, ours), rounds=3, iterations=1)
    our_times = [per_task_seconds(ctx, ours) for _ in range(2)] + [our_times]
    ours_us, bare_us = 1e6 * min(our_times), 1e6 * min(bare_times)
    benchmark.extra_info.update(ours_us_per_task=ours_us, bare_us_per_task=bare_us)
    report("per-task cost ours / bare starpu_task_insert", ours_us / bare_us,
           f"({ours_us:.2f} us vs {bare_us:.2f} us per dependent task, {NTASKS} tasks)")
    assert np.array_equal(tile.to_array(), [1.0])
