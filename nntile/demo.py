"""What `make train` runs until the training program exists: a tiled GEMM workload on StarPU,
checked against numpy, with the runtime's workers and the achieved rate reported."""
import time

import numpy as np

import nntile


def main():
    rng = np.random.default_rng(0)
    m = n = k = 1024
    tile = 256
    with nntile.Context(verbose=True) as ctx:
        a = rng.standard_normal((m, k), dtype=np.float32)
        b = rng.standard_normal((k, n), dtype=np.float32)
        A = nntile.Tensor.from_array(a, (tile, tile))
        B = nntile.Tensor.from_array(b, (tile, tile))
        C = nntile.Tensor((m, n), (tile, tile), "fp32")
        nntile.ops.gemm(1.0, A, "N", B, "N", 0.0, C)  # warm-up: buffers and perf models
        ctx.wait()
        repeats = 5
        start = time.perf_counter()
        for _ in range(repeats):
            nntile.ops.gemm(1.0, A, "N", B, "N", 0.0, C)
        ctx.wait()
        seconds = (time.perf_counter() - start) / repeats
        err = np.linalg.norm(C.to_array() - a.astype(np.float64) @ b) / np.linalg.norm(a @ b)
        ntasks = (m // tile) * (n // tile) * (k // tile)
        print(f"demo: C = A @ B with {m}x{k}x{n} fp32 matrices cut into {tile}x{tile} tiles, "
              f"{ntasks} StarPU tasks per product on {len(ctx.workers)} workers: "
              f"{2 * m * n * k / seconds / 1e9:.1f} GFLOP/s, relative error vs numpy "
              f"float64 {err:.1e}")


if __name__ == "__main__":
    main()
