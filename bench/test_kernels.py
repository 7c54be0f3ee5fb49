"""Our tiled ops against the reference library on the same data, in the same run.

CPU: GEMM (fp32, several tile counts) against numpy's matmul, softmax, layer norm and the
tanh GELU against numpy. GPU (needs nntile built with CUDA and CuPy): GEMM in fp32, tf32 and
bf16 against one cuBLAS call through CuPy. The ratios (>1: ours faster) are reported, never
asserted; results are checked against the reference so that a fast wrong kernel cannot pass.
NNTILE_BENCH_QUICK=1 shrinks the CPU cases.
"""
import math

import numpy as np
import pytest

import nntile
from harness import QUICK, interleaved, paused
from nntile import Tensor, ops
from nntile._core.core import bf16_bits_to_float, float_to_bf16_bits

ROUNDS = 15  # milliseconds each: the best of 15 sees past a loaded machine's time slices
GEMM_N = 512 if QUICK else 1024
GEMM_SPLITS = (1, 2) if QUICK else (1, 2, 4)  # tiles per matrix dimension
ROWS, COLS = (1024, 512) if QUICK else (4096, 1024)
ROW_SPLIT = 4


def _cupy():
    """CuPy when nntile was built with CUDA and a CUDA device answers, else None."""
    if not nntile.HAVE_CUDA:
        return None
    try:
        import cupy
        return cupy if cupy.cuda.runtime.getDeviceCount() > 0 else None
    except Exception:  # no CuPy, no driver or no device: the GPU benches are skipped
        return None


cp = _cupy()


def assert_close(ours, ref, rel):
    """Against the result's scale, not elementwise: long sums cancel."""
    err = float(np.max(np.abs(ours.astype(np.float64) - ref)))
    assert err <= rel * float(np.max(np.abs(ref))), f"max error {err:.3g}"


def compare(benchmark, report, ctx, name, ours, reference, work, unit, detail="",
            blas_threads=None):
    """Time ours and the reference side by side, report the throughput ratio (numpy's BLAS
    on ``blas_threads``: see harness.paused)."""
    ours()
    with paused(ctx, blas_threads):
        reference()
    t_ours, t_ref = interleaved(ctx, ours, reference, ROUNDS, blas_threads)
    benchmark.pedantic(ours, rounds=1, iterations=1)
    ours_rate, ref_rate = work / min(t_ours), work / min(t_ref)
    benchmark.extra_info.update(ours=ours_rate, reference=ref_rate, unit=unit)
    report(f"{name} ours / reference", ours_rate / ref_rate,
           f"({ours_rate:.3g} vs {ref_rate:.3g} {unit}{detail})")


# ---- CPU ----------------------------------------------------------------------------------

@pytest.mark.parametrize("split", GEMM_SPLITS)
def test_gemm_fp32_vs_numpy(benchmark, ctx, report, split):
    n, tile = GEMM_N, GEMM_N // split
    rng = np.random.default_rng(0)
    a, b = (rng.standard_normal((n, n), dtype=np.float32) for _ in range(2))
    A, B = Tensor.from_array(a, (tile, tile)), Tensor.from_array(b, (tile, tile))
    C = Tensor((n, n), (tile, tile), "fp32")
    out = np.empty_like(a)

    def ours():
        ops.gemm(1.0, A, "N", B, "N", 0.0, C)
        ctx.wait()

    # as many BLAS threads for numpy as our workers that have a tile of C to compute
    threads = min(len(ctx.workers), split ** 2)
    compare(benchmark, report, ctx, f"CPU gemm fp32 {n}^3, {split ** 3} tasks (tile {tile})",
            ours, lambda: np.matmul(a, b, out=out), 2e-9 * n ** 3, "GFLOP/s",
            f", numpy's OpenBLAS on {threads} thread{'s' if threads > 1 else ''}",
            blas_threads=threads)
    assert_close(C.to_array(), a.astype(np.float64) @ b, 1e-5)
    for t in (A, B, C):
        t.unregister()


def test_softmax_vs_numpy(benchmark, ctx, report):
    rng = np.random.default_rng(0)
    x = rng.standard_normal((ROWS, COLS), dtype=np.float32)
    # Two tiles along the softmax axis, so the running (max, sum) is merged across tiles.
    tile = (ROWS // ROW_SPLIT, COLS // 2)
    X, Y = Tensor.from_array(x, tile), Tensor(x.shape, tile, "fp32")
    stats = Tensor((ROWS, 2), (tile[0], 2), "fp32")
    y = np.empty_like(x)

    def ours():
        ops.copy(X, Y)
        ops.maxsumexp(Y, stats, 1)
        ops.softmax_inplace(stats, Y, 1)
        ctx.wait()

    def reference():
        np.subtract(x, x.max(axis=1, keepdims=True), out=y)
        np.exp(y, out=y)
        np.divide(y, y.sum(axis=1, keepdims=True), out=y)

    compare(benchmark, report, ctx, f"CPU softmax fp32 {ROWS}x{COLS}", ours, reference,
            ROWS * COLS / 1e6, "Melem/s", ", numpy on one core")
    reference()
    assert_close(Y.to_array(), y, 1e-6)
    for t in (X, Y, stats):
        t.unregister()


def test_layernorm_vs_numpy(benchmark, ctx, report):
    rng = np.random.default_rng(0)
    x = rng.standard_normal((ROWS, COLS), dtype=np.float32)
    gamma, beta = (rng.standard_normal(COLS, dtype=np.float32) for _ in range(2))
    tile = (ROWS // ROW_SPLIT, COLS)
    X, Y = Tensor.from_array(x, tile), Tensor(x.shape, tile, "fp32")
    G, Bt = Tensor.from_array(gamma, (COLS,)), Tensor.from_array(beta, (COLS,))
    stats = Tensor((ROWS, 2), (tile[0], 2), "fp32")
    eps = 1e-5
    y = np.empty_like(x)

    def ours():
        ops.layernorm_forward(X, G, Bt, eps, stats, Y)
        ctx.wait()

    def reference():
        np.subtract(x, x.mean(axis=1, keepdims=True), out=y)
        np.divide(y, np.sqrt((y * y).mean(axis=1, keepdims=True) + eps), out=y)
        np.multiply(y, gamma, out=y)
        np.add(y, beta, out=y)

    compare(benchmark, report, ctx, f"CPU layernorm fp32 {ROWS}x{COLS}", ours, reference,
            ROWS * COLS / 1e6, "Melem/s", ", numpy on one core")
    reference()
    assert_close(Y.to_array(), y, 1e-5)
    for t in (X, Y, G, Bt, stats):
        t.unregister()


def test_gelutanh_vs_numpy(benchmark, ctx, report):
    rng = np.random.default_rng(0)
    x = rng.standard_normal((ROWS, COLS), dtype=np.float32)
    tile = (ROWS // ROW_SPLIT, COLS)
    X, Y = Tensor.from_array(x, tile), Tensor(x.shape, tile, "fp32")
    y, tmp = np.empty_like(x), np.empty_like(x)
    c = np.float32(math.sqrt(2 / math.pi))

    def ours():
        ops.gelutanh(X, Y)
        ctx.wait()

    def reference():
        # 0.5 x (1 + tanh(c (x + 0.044715 x^3))), in place as our kernel writes it
        np.multiply(x, x, out=tmp)
        np.multiply(tmp, np.float32(0.044715) * c, out=tmp)
        np.add(tmp, c, out=tmp)
        np.multiply(tmp, x, out=tmp)
        np.tanh(tmp, out=tmp)
        np.add(tmp, 1, out=tmp)
        np.multiply(x, tmp, out=y)
        np.multiply(y, np.float32(0.5), out=y)

    compare(benchmark, report, ctx, f"CPU gelutanh fp32 {ROWS}x{COLS}", ours, reference,
            ROWS * COLS / 1e6, "Melem/s", ", numpy on one core")
    reference()
    assert_close(Y.to_array(), y, 1e-6)
    for t in (X, Y):
        t.unregister()


# ---- GPU ----------------------------------------------------------------------------------

GPU_N = 8192
GPU_SPLITS = (1, 2, 4)
GPU_ROUNDS = 10
# cuBLAS enums (cublas_api.h, library_types.h), the ones nntile's CUDA GEMM passes.
CUDA_R_32F, CUDA_R_16BF = 0, 14
CUBLAS_COMPUTE_32F, CUBLAS_COMPUTE_32F_FAST_TF32 = 68, 77
CUBLAS_OP_N, CUBLAS_GEMM_DEFAULT = 0, -1
GEMM_TYPES = {"fp32": (CUDA_R_32F, CUBLAS_COMPUTE_32F, 1e-5),
              "tf32": (CUDA_R_32F, CUBLAS_COMPUTE_32F_FAST_TF32, 2e-3),
              "bf16": (CUDA_R_16BF, CUBLAS_COMPUTE_32F, 2e-2)}


@pytest.fixture
def gpu_ctx(runtime):
    # No CPU worker: dmda would otherwise put some GEMMs on a core to calibrate it.
    return runtime(ncpu=0, ncuda=1)


def cublas_gemm(a, b, c, dtype):
    """c = a @ b (row-major) in one cublasGemmEx, as column-major c^T = b^T a^T."""
    from cupy.cuda import cublas, device
    datatype, compute, _ = GEMM_TYPES[dtype]
    m, k = a.shape
    n = b.shape[1]
    one, zero = np.ones(1, np.float32), np.zeros(1, np.float32)
    cublas.gemmEx(device.get_cublas_handle(), CUBLAS_OP_N, CUBLAS_OP_N, n, m, k,
                  one.ctypes.data, b.data.ptr, datatype, n, a.data.ptr, datatype, k,
                  zero.ctypes.data, c.data.ptr, datatype, n, compute, CUBLAS_GEMM_DEFAULT)


@pytest.mark.gpu
@pytest.mark.skipif(cp is None, reason="needs nntile built with CUDA, CuPy and a CUDA device")
@pytest.mark.parametrize("split", GPU_SPLITS)
@pytest.mark.parametrize("dtype", ["fp32", "tf32", "bf16"])
def test_gemm_gpu_vs_cublas(benchmark, gpu_ctx, report, dtype, split):
    ctx = gpu_ctx
    n, tile = GPU_N, GPU_N // split
    rng = np.random.default_rng(0)
    a, b = (rng.standard_normal((n, n), dtype=np.float32) for _ in range(2))
    A, B, C = (Tensor((n, n), (tile, tile), dtype) for _ in range(3))
    A.write(a)
    B.write(b)
    if dtype == "bf16":  # both sides multiply the same bf16 values
        a, b = (bf16_bits_to_float(float_to_bf16_bits(x)) for x in (a, b))
    to_device = (lambda x: cp.asarray(float_to_bf16_bits(x))) if dtype == "bf16" else cp.asarray
    da, db = to_device(a), to_device(b)
    dc = cp.empty_like(da)

    def ours():
        ops.gemm(1.0, A, "N", B, "N", 0.0, C)
        ctx.wait()

    def reference():
        cublas_gemm(da, db, dc, dtype)
        cp.cuda.Device().synchronize()

    for _ in range(2):  # moves the tiles to the GPU, calibrates StarPU's models
        ours()
    with paused(ctx):
        reference()
    t_ours, t_ref = interleaved(ctx, ours, reference, GPU_ROUNDS)
    benchmark.pedantic(ours, rounds=1, iterations=1)
    flops = 2 * n ** 3
    ours_tf, ref_tf = flops / np.median(t_ours) / 1e12, flops / np.median(t_ref) / 1e12
    benchmark.extra_info.update(ours_tflops=ours_tf, cublas_tflops=ref_tf)
    report(f"GPU gemm {dtype} {n}^3, {split ** 3} tasks (tile {tile}) ours / cuBLAS",
           ours_tf / ref_tf, f"({ours_tf:.1f} vs {ref_tf:.1f} TFLOP/s, medians of "
           f"{GPU_ROUNDS})")
    ref = cp.asnumpy(dc)
    ref = bf16_bits_to_float(ref) if dtype == "bf16" else ref
    assert_close(C.to_array(), ref, GEMM_TYPES[dtype][2])
    for t in (A, B, C):
        t.unregister()
