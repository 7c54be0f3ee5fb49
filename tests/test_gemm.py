import itertools
import os
import time

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

import nntile


def reference(alpha, a, ta, b, tb, beta, c, ndim, batch_ndim):
    """numpy float64 GEMM with the same shape conventions as nntile.ops.gemm."""
    a = a.astype(np.float64)
    b = b.astype(np.float64)
    nb = batch_ndim
    if ta:  # stored batch + K + M -> batch + M + K
        a = np.transpose(a, list(range(nb)) + list(range(nb + ndim, a.ndim)) + list(range(nb, nb + ndim)))
    if tb:  # stored batch + N + K -> batch + K + N
        n_ndim = b.ndim - nb - ndim
        b = np.transpose(b, list(range(nb)) + list(range(nb + n_ndim, b.ndim)) + list(range(nb, nb + n_ndim)))
    batch = a.shape[:nb]
    M = a.shape[nb:a.ndim - ndim]
    K = a.shape[a.ndim - ndim:]
    N = b.shape[nb + ndim:]
    a2 = a.reshape(batch + (int(np.prod(M)), int(np.prod(K))))
    b2 = b.reshape(batch + (int(np.prod(K)), int(np.prod(N))))
    return alpha * np.matmul(a2, b2).reshape(batch + M + N) + beta * c


def tiled(shape, rng, full=False):
    return tuple(n if full else int(rng.integers(1, n + 1)) for n in shape)


@pytest.mark.parametrize("ta, tb", list(itertools.product([False, True], repeat=2)))
@pytest.mark.parametrize("dtype, tol", [("fp32", 2e-6), ("fp64", 1e-13)])
def test_gemm_transposes_partial_tiles(ctx, rng, ta, tb, dtype, tol):
    npdt = np.float32 if dtype == "fp32" else np.float64
    M, N, K = 13, 11, 17
    mt, nt, kt = 5, 4, 6  # partial tiles along every dimension
    a = rng.standard_normal((K, M) if ta else (M, K)).astype(npdt)
    b = rng.standard_normal((N, K) if tb else (K, N)).astype(npdt)
    c = rng.standard_normal((M, N)).astype(npdt)
    A = nntile.Tensor.from_array(a, (kt, mt) if ta else (mt, kt))
    B = nntile.Tensor.from_array(b, (nt, kt) if tb else (kt, nt))
    C = nntile.Tensor.from_array(c, (mt, nt))
    nntile.ops.gemm(0.7, A, "T" if ta else "N", B, tb, -1.3, C)
    ref = reference(0.7, a, ta, b, tb, -1.3, c, 1, 0)
    err = np.linalg.norm(C.to_array() - ref) / np.linalg.norm(ref)
    assert err < tol


def test_gemm_beta_zero_ignores_garbage(ctx, rng):
    a = rng.standard_normal((6, 5))
    b = rng.standard_normal((5, 4))
    C = nntile.Tensor.from_array(np.full((6, 4), np.nan), (3, 3))
    nntile.ops.gemm(1.0, nntile.Tensor.from_array(a, (3, 2)), "N",
                    nntile.Tensor.from_array(b, (2, 3)), "N", 0.0, C)
    ref = a @ b
    # elementwise relative error is meaningless where sums cancel: compare against the norm
    np.testing.assert_allclose(C.to_array(), ref, rtol=0, atol=1e-13 * np.abs(ref).max())


@st.composite
def gemm_case(draw):
    nb = draw(st.integers(0, 2))
    m_ndim = draw(st.integers(0, 2))
    n_ndim = draw(st.integers(0, 2))
    k_ndim = draw(st.integers(1, 2))
    dim = st.integers(1, 6)
    batch = tuple(draw(dim) for _ in range(nb))
    M = tuple(draw(dim) for _ in range(m_ndim))
    N = tuple(draw(dim) for _ in range(n_ndim))
    K = tuple(draw(dim) for _ in range(k_ndim))
    tiles = {name: tuple(draw(st.integers(1, n)) for n in dims)
             for name, dims in (("batch", batch), ("M", M), ("N", N), ("K", K))}
    ta = draw(st.booleans())
    tb = draw(st.booleans())
    seed = draw(st.integers(0, 2**32 - 1))
    return batch, M, N, K, tiles, ta, tb, seed


@settings(max_examples=60, deadline=None)
@given(gemm_case())
def test_gemm_random_shapes_and_tilings(ctx, case):
    batch, M, N, K, tiles, ta, tb, seed = case
    rng = np.random.default_rng(seed)
    nb, nk = len(batch), len(K)
    a_shape = batch + (K + M if ta else M + K)
    a_tiles = tiles["batch"] + (tiles["K"] + tiles["M"] if ta else tiles["M"] + tiles["K"])
    b_shape = batch + (N + K if tb else K + N)
    b_tiles = tiles["batch"] + (tiles["N"] + tiles["K"] if tb else tiles["K"] + tiles["N"])
    a = rng.standard_normal(a_shape)
    b = rng.standard_normal(b_shape)
    c = rng.standard_normal(batch + M + N)
    C = nntile.Tensor.from_array(c, tiles["batch"] + tiles["M"] + tiles["N"])
    nntile.ops.gemm(1.5, nntile.Tensor.from_array(a, a_tiles), ta,
                    nntile.Tensor.from_array(b, b_tiles), tb, 0.5, C, ndim=nk, batch_ndim=nb)
    ref = reference(1.5, a, ta, b, tb, 0.5, c, nk, nb)
    np.testing.assert_allclose(C.to_array(), ref, rtol=1e-11, atol=1e-11)


# ---- the CPU's BLAS -------------------------------------------------------------------------

def test_blas_is_the_wheel_with_kernels_for_this_cpu(ctx):
    """The CPU kernels call the OpenBLAS the build links (the scipy-openblas32 wheel, the
    version installed), one thread per call (each CPU worker is one thread), and it runs
    kernels for this CPU: on a CPU with AVX2, not the SSE3 "Prescott" ones that an OpenBLAS
    which does not recognise the CPU falls back to."""
    from importlib.metadata import version
    from nntile._core.core import blas
    info = blas()
    assert info["config"].split()[:2] == ["OpenBLAS", version("scipy-openblas32")]
    assert info["threads"] == 1
    if not os.path.exists("/proc/cpuinfo"):
        return
    with open("/proc/cpuinfo") as f:
        avx2 = "avx2" in f.read().split()
    assert not avx2 or info["core"] != "Prescott", info


def test_cpu_gemm_runs_near_numpy(ctx):
    """One task's GEMM against numpy's on one thread, best of several interleaved rounds: at
    least half its rate, a bound a loaded machine passes while SSE3 kernels fail it (a third
    of the AVX-512 ones' rate on the 2-core development machine; bench/test_kernels.py
    reports the ratio itself)."""
    from threadpoolctl import threadpool_limits
    M, K, N = 512, 768, 1024
    rng = np.random.default_rng(0)
    a = rng.standard_normal((M, K), dtype=np.float32)
    b = rng.standard_normal((K, N), dtype=np.float32)
    A, B = nntile.Tensor.from_array(a, a.shape), nntile.Tensor.from_array(b, b.shape)
    C = nntile.Tensor((M, N), (M, N), "fp32")
    out = np.empty((M, N), np.float32)
    ours, numpy = [], []
    for _ in range(8):
        start = time.perf_counter()
        nntile.ops.gemm(1.0, A, "N", B, "N", 0.0, C)
        ctx.wait()
        ours.append(time.perf_counter() - start)
        ctx.pause()  # StarPU's idle workers would take the cores
        with threadpool_limits(1, user_api="blas"):
            start = time.perf_counter()
            np.matmul(a, b, out=out)
            numpy.append(time.perf_counter() - start)
        ctx.resume()
    np.testing.assert_allclose(C.to_array(), out, rtol=1e-4, atol=1e-3)
    for t in (A, B, C):
        t.unregister()
    assert min(numpy) / min(ours) >= 0.5, (min(ours), min(numpy))
