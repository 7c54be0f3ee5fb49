"""Run under mpirun: tensor ops on tiles spread over the ranks in random ways give what numpy
gives, and every rank sees the same result. Prints one "ok" line per rank, or raises."""
import sys

import numpy as np

import nntile
from nntile import ops


def random_owners(rng, ntiles, size):
    return rng.integers(0, size, ntiles).tolist()


def main():
    with nntile.Context(ncpu=1, mpi=True) as ctx:
        size = ctx.world_size
        rng = np.random.default_rng(1234)  # the same on every rank: same tensors, same order
        for trial in range(4):
            m, k, n = (int(x) for x in rng.integers(3, 12, 3))
            tm, tk, tn = (int(rng.integers(1, d + 1)) for d in (m, k, n))
            a, b = rng.standard_normal((m, k)), rng.standard_normal((k, n))
            A = nntile.Tensor((m, k), (tm, tk), "fp64",
                              owners=random_owners(rng, -(-m // tm) * -(-k // tk), size))
            B = nntile.Tensor((k, n), (tk, tn), "fp64",
                              owners=random_owners(rng, -(-k // tk) * -(-n // tn), size))
            A.write(a)
            B.write(b)
            C = nntile.Tensor((m, n), (tm, tn), "fp64",
                              owners=random_owners(rng, -(-m // tm) * -(-n // tn), size))
            ops.gemm(1.0, A, "N", B, "N", 0.0, C)
            D = nntile.Tensor((m, n), (tm, tn), "fp64")  # the Context's default spread
            ops.copy(C, D)
            ops.add(2.0, C, 0.5, D)  # D = 2 C + 0.5 C
            got_c, got_d = C.to_array(), D.to_array()
            want = a @ b
            scale = np.abs(want).max()
            assert np.abs(got_c - want).max() <= 1e-12 * scale, (trial, "gemm")
            assert np.abs(got_d - 2.5 * want).max() <= 1e-12 * scale, (trial, "copy/add")
            # a re-tiled copy moves tiles between ranks
            E = C.copy((max(1, tm - 1), min(n, tn + 1)))
            assert np.abs(E.to_array() - got_c).max() == 0, (trial, "retile")
            # only the owner may read a tile on the host
            mine = C.local_tiles()
            for i in mine:
                idx = C.traits.linear_to_index(i)
                np.testing.assert_array_equal(C.tile_to_array(idx),
                                              got_c[C.traits.tile_slices(i)])
            others = [i for i in range(C.ntiles) if i not in mine]
            if others:
                try:
                    C.tile_to_array(C.traits.linear_to_index(others[0]))
                except RuntimeError as exc:
                    assert "owned by rank" in str(exc)
                else:
                    raise AssertionError("tile_to_array read another rank's tile")
            # a rank that does not exist is refused before any task
            try:
                nntile.Tensor((2,), (1,), owners=[0, size])
            except ValueError as exc:
                assert f"rank {size}" in str(exc), exc
            else:
                raise AssertionError("an owner outside the ranks was accepted")
            for t in (A, B, C, D, E):
                t.unregister()
        # the gradient-norm partials: each rank sums its own tiles, then one small reduction
        g = rng.standard_normal((7, 5))
        G = nntile.Tensor.from_array(g, (2, 2), owners=random_owners(rng, 12, size))
        parts = nntile.Tensor((size, 1), (1, 1), "fp64", owners=list(range(size)))
        total = nntile.Tensor((1,), (1,), "fp64")
        ops.sumsq(G, 0.0, parts)
        ops.sum_slice(1.0, parts, 0.0, total, 0)
        assert abs(total.to_array()[0] - (g ** 2).sum()) <= 1e-12 * (g ** 2).sum()
        # the attention warm-up: every rank registers the same tensors, each runs its own
        from nntile._core.core import live_tensor_count
        from nntile.nn.warm_up import run_attention_tiles
        before = live_tensor_count()
        run_attention_tiles([(1, 4, 2, 1, 8, "bf16", nntile.AttentionMask(), 0.5, 2)])
        assert live_tensor_count() == before
        print(f"rank {ctx.rank} of {size}: ok", flush=True)


if __name__ == "__main__":
    sys.exit(main())
