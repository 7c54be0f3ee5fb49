"""Run under mpirun with replicas: all-reduce of tiles in buckets gives every rank the sum of
what the ranks held, in fp32, fp64 and bf16, with buckets of one tile and of many, and counts
each tile's bytes once. Prints one "ok" line per rank, or raises."""
import numpy as np

import nntile
from nntile._core.core import allreduce_sum, collective_bytes
from nntile.distributed import Distribution, mpi


def main():
    nranks = mpi().COMM_WORLD.Get_size()
    with nntile.Context(ncpu=1, mpi=True, distribution=Distribution.replicated(nranks)) as ctx:
        rank = ctx.rank
        expected_bytes = 0
        for trial, (dtype, bucket) in enumerate([("fp32", 1), ("fp64", 1 << 20), ("bf16", 64),
                                                 ("tf32", 1 << 30)]):
            rng = np.random.default_rng(trial)  # the same on every rank
            shape = tuple(int(n) for n in rng.integers(3, 40, 2))
            tiles = tuple(int(rng.integers(1, n + 1)) for n in shape)
            parts = [rng.integers(-8, 8, shape).astype(np.float64) for _ in range(nranks)]
            tensors = [nntile.Tensor(shape, tiles, dtype) for _ in range(2)]
            for t, sign in zip(tensors, (1, -1)):
                t.write(sign * parts[rank])  # small integers: exact in bf16 too
            allreduce_sum(tensors, bucket)
            want = sum(parts)
            for t, sign in zip(tensors, (1, -1)):
                got = t.to_array()
                assert np.array_equal(got, sign * want), (trial, dtype)
                expected_bytes += t.traits.size * t.numpy_dtype.itemsize
        assert collective_bytes() == expected_bytes, (collective_bytes(), expected_bytes)
    print(f"ok rank {rank} of {nranks}", flush=True)


if __name__ == "__main__":
    main()
