"""Run under mpirun with nntile's defaults: which cores this rank, its StarPU workers and
StarPU-MPI's progress thread run on, and a matrix product through those workers checked
against numpy. Prints one JSON line per rank."""
import json
import os

import numpy as np

import nntile
from nntile import ops
from nntile.distributed import rank_cores, thread_cores

with nntile.Context(mpi=True) as ctx:
    rng = np.random.default_rng(7)  # the same on every rank: same tensors, same order
    a, b = rng.standard_normal((40, 30)), rng.standard_normal((30, 20))
    A = nntile.Tensor.from_array(a, (20, 15))
    B = nntile.Tensor.from_array(b, (15, 10))
    C = nntile.Tensor((40, 20), (20, 10), "fp64")
    ops.gemm(1.0, A, "N", B, "N", 0.0, C)
    error = float(np.abs(C.to_array() - a @ b).max())
    threads = thread_cores()
    print(json.dumps(dict(
        rank=ctx.rank, size=ctx.world_size, cores=rank_cores(), ncpu=ctx.ncpu_workers,
        workers={n: c for n, c in threads.items() if n != "MPI"}, mpi=threads.get("MPI"),
        error=error, yield_when_idle=os.environ.get("OMPI_MCA_mpi_yield_when_idle"),
        described="cores: " in ctx.describe())), flush=True)
