"""Rough timings of the CUDA kernels at GPT-2-small tile sizes, then at the tiles of
Llama-3.2-1B in bf16-mixed (not a test).

    python3 tests/cuda/bench_cuda_kernels.py [WORD ...]

(with words, only the kernels whose name holds one of them).
Builds the library like the tests do, times each call with CUDA events on
one stream (median of 20 after warm-up) and prints the effective bandwidth
(bytes that must be read and written / time) or TFLOP/s for GEMM."""
import ctypes
import os
import sys
import tempfile

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:0] = [HERE, os.path.dirname(os.path.dirname(HERE))]  # test_cuda_kernels, tests.*
import test_cuda_kernels as T  # noqa: E402

cp = T.cp


def main(words):
    env = T.Env(tempfile.mkdtemp(prefix="nntile_cuda_bench_"))
    s = env.stream
    rng = np.random.default_rng(0)

    def arr(*shape, dtype=np.float32, fill=None):
        with s:
            if fill is not None:
                return cp.full(shape, fill, dtype=dtype)
            return cp.asarray(rng.standard_normal(shape).astype(dtype))

    def set_stats(stats):
        """Softmax statistics (max 5, sum 1000) in every row of stats, for the kernels that
        read them."""
        with s:
            stats[:, 0] = 5.0
            stats[:, 1] = 1000.0

    def bench(name, op, dt, args, bufs, nbytes=None, flops=None):
        if words and not any(w in name for w in words):
            return
        st_ = T.make_args(op, args)
        fn = getattr(env.cuda, f"nntile_cuda_{op}_{dt}")
        first = env.handle if op == "gemm" else ctypes.c_void_p(s.ptr)
        ptrs = [None if b is None else ctypes.c_void_p(b.data.ptr) for b in bufs]
        for _ in range(3):
            fn(ctypes.byref(st_), first, *ptrs)
        times = []
        for _ in range(20):
            e0, e1 = cp.cuda.Event(), cp.cuda.Event()
            e0.record(s)
            fn(ctypes.byref(st_), first, *ptrs)
            e1.record(s)
            e1.synchronize()
            times.append(cp.cuda.get_elapsed_time(e0, e1) * 1e-3)
        t = float(np.median(times))
        extra = ""
        if nbytes:
            extra = f"{nbytes / t / 1e9:8.0f} GB/s"
        if flops:
            extra = f"{flops / t / 1e12:8.1f} TFLOP/s"
        print(f"{name:48s} {t * 1e6:9.1f} us {extra}")

    tok, e, ff, vocab = 8192, 768, 3072, 50257
    x = arr(tok, ff)
    y = arr(tok, ff)
    b = arr(ff)
    n = tok * ff
    bench("add (beta=1) [8192x3072]", "add", "fp32",
          dict(n=n, alpha=1.0, beta=1.0), [x, y], 12 * n)
    bench("gelutanh [8192x3072]", "gelutanh", "fp32", dict(n=n), [x, y], 8 * n)
    bench("gelutanh_backward [8192x3072]", "gelutanh_backward", "fp32",
          dict(n=n, beta=0.0), [x, y, arr(tok, ff)], 12 * n)
    bench("add_fiber bias [8192x3072]", "add_fiber", "fp32",
          dict(m=tok, k=ff, n=1, alpha=1.0, beta=1.0), [b, x], 8 * n)
    bench("sum_fiber bias grad [8192x3072]", "sum_fiber", "fp32",
          dict(m=tok, k=ff, n=1, alpha=1.0, beta=0.0), [x, b], 4 * n)
    bench("sum_fiber n>1 [64x768x128]", "sum_fiber", "fp32",
          dict(m=64, k=768, n=128, alpha=1.0, beta=0.0), [x, b], 4 * 64 * 768 * 128)
    bench("sum_slice rows [8192x3072]", "sum_slice", "fp32",
          dict(m=tok, k=ff, n=1, alpha=1.0, beta=0.0), [x, arr(tok)], 4 * n)
    bench("sumprod_slice cols [64x3072x128]", "sumprod_slice", "fp32",
          dict(m=64, k=3072, n=128, alpha=1.0, beta=0.0), [x, y, arr(64, 128)],
          8 * 64 * 3072 * 128)
    bench("sumsq [25M]", "sumsq", "fp32", dict(n=n, beta=0.0), [x, arr(1)], 4 * n)
    # attention scores: [batch*heads*tq, tk] rows, softmax over tk
    rows, tk = 8 * 12 * 1024, 1024
    sc = arr(rows, tk)
    stt = arr(rows, 2)
    bench("maxsumexp attn [98304x1024]", "maxsumexp", "fp32",
          dict(m=rows, k=tk, n=1, init=1), [sc, stt], 4 * rows * tk)
    set_stats(stt)
    bench("softmax_inplace attn [98304x1024]", "softmax_inplace", "fp32",
          dict(m=rows, k=tk, n=1), [stt, sc], 8 * rows * tk)
    bench("maxsumexp cols [96x1024x1024] n>1", "maxsumexp", "fp32",
          dict(m=96, k=1024, n=1024, init=1), [sc, arr(96, 1024, 2)],
          4 * 96 * 1024 * 1024)
    bench("mask_scores [96x1024x1024]", "mask_scores", "fp32",
          dict(batch=96, tq=1024, tk=1024, q_offset=0, k_offset=0, mask=dict(causal=1)), [sc],
          2 * 96 * 1024 * 1024)
    # logits: [tokens, vocab tile]
    lrows, vt = 2048, vocab
    lg = arr(lrows, vt)
    lst = arr(lrows, 2)
    labels = None
    with s:
        labels = cp.asarray(rng.integers(0, vt, lrows).astype(np.int64))
    bench("maxsumexp logits [2048x50257]", "maxsumexp", "fp32",
          dict(m=lrows, k=vt, n=1, init=1), [lg, lst], 4 * lrows * vt)
    set_stats(lst)
    bench("xent_grad_inplace [2048x50257]", "xent_grad_inplace", "fp32",
          dict(rows=lrows, v=vt, v_offset=0, alpha=1.0), [lst, labels, lg],
          8 * lrows * vt)
    xe = arr(tok, e)
    lst2 = arr(tok, 2)
    g, be = arr(e), arr(e)
    bench("layernorm_stats [8192x768]", "layernorm_stats", "fp32",
          dict(rows=tok, e=e, e_offset=0), [xe, lst2], 4 * tok * e)
    with s:
        lst2[:, 0] = 0.0
        lst2[:, 1] = float(e)
    bench("layernorm_forward [8192x768]", "layernorm_forward", "fp32",
          dict(rows=tok, e=e, e_total=e, eps=1e-5),
          [xe, lst2, g, be, arr(tok, e)], 8 * tok * e)
    bench("layernorm_backward_reduce [8192x768]", "layernorm_backward_reduce",
          "fp32", dict(rows=tok, e=e, e_total=e, eps=1e-5, init=1),
          [xe, arr(tok, e), lst2, g, arr(tok, 2), arr(e), arr(e)], 8 * tok * e)
    bench("layernorm_backward [8192x768]", "layernorm_backward", "fp32",
          dict(rows=tok, e=e, e_total=e, eps=1e-5, beta=0.0),
          [xe, arr(tok, e), lst2, g, arr(tok, 2), arr(tok, e)], 12 * tok * e)
    bench("layernorm_backward_whole [8192x768]", "layernorm_backward_whole", "fp32",
          dict(rows=tok, e=e, e_total=e, eps=1e-5, beta=0.0),
          [xe, arr(tok, e), lst2, g, arr(e), arr(e), arr(tok, e)], 12 * tok * e)
    # Llama at 8 x 1024 tokens, hidden 2048, 16 heads of 128
    lt, le = 8192, 2048
    xl, wl, sumsq = arr(lt, le), arr(le), arr(lt, fill=float(le))
    bench("rmsnorm_stats [8192x2048]", "rmsnorm_stats", "fp32",
          dict(rows=lt, e=le, init=1), [xl, arr(lt)], 4 * lt * le)
    bench("rmsnorm_forward [8192x2048]", "rmsnorm_forward", "fp32",
          dict(rows=lt, e=le, e_total=le, eps=1e-5), [xl, sumsq, wl, arr(lt, le)], 8 * lt * le)
    bench("rmsnorm_backward_reduce [8192x2048]", "rmsnorm_backward_reduce", "fp32",
          dict(rows=lt, e=le, e_total=le, eps=1e-5, init=1),
          [xl, arr(lt, le), sumsq, wl, arr(lt), arr(le)], 8 * lt * le)
    bench("rmsnorm_backward [8192x2048]", "rmsnorm_backward", "fp32",
          dict(rows=lt, e=le, e_total=le, eps=1e-5, beta=0.0),
          [xl, arr(lt, le), sumsq, wl, arr(lt), arr(lt, le)], 12 * lt * le)
    # the two above in one op, a row in one tile: x and dy read once, dx written
    bench("rmsnorm_backward_whole [8192x2048]", "rmsnorm_backward_whole", "fp32",
          dict(rows=lt, e=le, e_total=le, eps=1e-5, beta=0.0),
          [xl, arr(lt, le), sumsq, wl, arr(le), arr(lt, le)], 12 * lt * le)
    xw, ww = arr(lt, 2 * le), arr(2 * le)  # Llama-3.1-8B's rows
    bench("rmsnorm_backward_whole [8192x4096]", "rmsnorm_backward_whole", "fp32",
          dict(rows=lt, e=2 * le, e_total=2 * le, eps=1e-5, beta=0.0),
          [xw, arr(lt, 2 * le), arr(lt, fill=2.0 * le), ww, arr(2 * le), arr(lt, 2 * le)],
          24 * lt * le)
    with s:
        pos = cp.asarray(np.tile(np.arange(1024), 8).astype(np.int64))
    bench("rope_forward [8x1024x16x128]", "rope_forward", "fp32",
          dict(rows=lt, heads=16, head_dim=128, scale=1.0),
          [pos, arr(64, fill=0.01), xl], 8 * lt * le)
    bench("swiglu_forward [8192x5632]", "swiglu_forward", "fp32", dict(n=lt * 5632),
          [arr(lt, 5632), arr(lt, 5632), arr(lt, 5632)], 12 * lt * 5632)
    bench("swiglu_backward [8192x5632]", "swiglu_backward", "fp32", dict(n=lt * 5632),
          [arr(lt, 5632), arr(lt, 5632), arr(lt, 5632), arr(lt, 5632), arr(lt, 5632)],
          20 * lt * 5632)
    with s:
        ids = cp.asarray(rng.integers(0, vocab, tok).astype(np.int64))
    tab = arr(vocab, e)
    bench("embedding [8192x768]", "embedding", "fp32",
          dict(rows=tok, e=e, v_offset=0, v=vocab), [ids, tab, xe], 12 * tok * e)
    bench("embedding_backward [8192x768]", "embedding_backward", "fp32",
          dict(rows=tok, e=e, v_offset=0, v=vocab), [ids, xe, tab], 12 * tok * e)
    npar = vocab * e
    p, gg, m, v = arr(npar), arr(npar), arr(npar, fill=0.0), arr(npar, fill=0.0)
    bench("adam_step [38.6M]", "adam_step", "fp32",
          dict(n=npar, step=3, lr=1e-3, beta1=0.9, beta2=0.95, eps=1e-8,
               weight_decay=0.1, decoupled=1, max_norm=1.0),
          [p, gg, m, v, arr(1, fill=4.0)], 28 * npar)
    # subcopy: a [4096, 768] block out of [8192, 3072]
    bench("subcopy 2-D [4096x768 of 8192x3072]", "subcopy", "fp32",
          dict(ndim=2, src_shape=[tok, ff], dst_shape=[4096, 768],
               copy_shape=[4096, 768], src_offset=[7, 100], dst_offset=[0, 0]),
          [x, arr(4096, 768)], 8 * 4096 * 768)
    bench("subcopy 3-D [64x64x96 of 128x128x128]", "subcopy", "fp32",
          dict(ndim=3, src_shape=[128, 128, 128], dst_shape=[64, 64, 96],
               copy_shape=[64, 64, 96], src_offset=[1, 2, 3],
               dst_offset=[0, 0, 0]), [x, arr(64, 64, 96)], 8 * 64 * 64 * 96)
    # GEMM: [8192x768] x [768x3072]
    M, N, K = tok, ff, e
    for dt, ty in (("fp32", np.float32), ("tf32", np.float32),
                   ("bf16", np.uint16)):
        A = arr(M, K, dtype=np.float32)
        B = arr(K, N, dtype=np.float32)
        C = arr(M, N, dtype=np.float32)
        if ty is np.uint16:
            with s:
                A = cp.zeros((M, K), dtype=np.uint16) + 0x3F80
                B = cp.zeros((K, N), dtype=np.uint16) + 0x3F80
                C = cp.zeros((M, N), dtype=np.uint16)
        bench(f"gemm {dt} {M}x{N}x{K}", "gemm", dt,
              dict(transA=0, transB=0, M=M, N=N, K=K, alpha=1.0, beta=0.0,
                   batch1=1, batch2=1, lda=K, ldb=N, ldc=N),
              [A, B, C], flops=2.0 * M * N * K)
    llama_mixed(bench, arr, set_stats, rng, s)
    env.close()


def llama_mixed(bench, arr, set_stats, rng, s):
    """The bf16-mixed kernels outside GEMM and attention at Llama-3.2-1B's default tiles (4 x
    2048 tokens, hidden 2048, MLP 8192, vocabulary tiles of 8192): bf16 data, fp32 stream,
    statistics and norms."""
    def bf16(*shape):
        with s:
            return arr(*shape).view(np.uint16)[..., 1::2].copy()

    tok, hidden, inner, vt = 8192, 2048, 8192, 8192
    n = tok * inner
    bench("swiglu_forward bf16 [8192x8192]", "swiglu_forward", "bf16", dict(n=n),
          [bf16(tok, inner), bf16(tok, inner), bf16(tok, inner)], 6 * n)
    bench("swiglu_backward bf16 [8192x8192]", "swiglu_backward", "bf16", dict(n=n),
          [bf16(tok, inner) for _ in range(5)], 10 * n)
    m = tok * hidden
    bench("cast fp32->bf16 [8192x2048]", "cast", "bf16_fp32", dict(n=m),
          [arr(tok, hidden), bf16(tok, hidden)], 6 * m)
    bench("add bf16 into fp32 (beta=1) [8192x2048]", "add", "bf16_fp32",
          dict(n=m, alpha=1.0, beta=1.0), [bf16(tok, hidden), arr(tok, hidden)], 10 * m)
    logits, stats = bf16(tok, vt), arr(tok, 2)
    bench("maxsumexp bf16 logits [8192x8192]", "maxsumexp", "bf16_fp32",
          dict(m=tok, k=vt, n=1, init=1), [logits, stats], 2 * tok * vt)
    set_stats(stats)
    with s:
        labels = cp.asarray(rng.integers(0, vt, tok).astype(np.int64))
    bench("xent_grad_inplace bf16 [8192x8192]", "xent_grad_inplace", "bf16_fp32",
          dict(rows=tok, v=vt, v_offset=0, alpha=1.0), [stats, labels, logits], 4 * tok * vt)
    x, w = arr(tok, hidden), arr(hidden)
    sumsq = arr(tok, fill=float(hidden))
    bench("rmsnorm_backward_reduce fp32 [8192x2048]", "rmsnorm_backward_reduce", "fp32",
          dict(rows=tok, e=hidden, e_total=hidden, eps=1e-5, init=1),
          [x, arr(tok, hidden), sumsq, w, arr(tok), arr(hidden)], 8 * m)
    bench("sumsq fp32 [16.8M]", "sumsq", "fp32", dict(n=m, beta=0.0), [x, arr(1)], 4 * m)
    npar = hidden * inner  # an MLP weight tile: fp32 master, gradient and states, bf16 copy
    bench("adam_step_refresh bf16_fp32 [16.8M]", "adam_step_refresh", "bf16_fp32",
          dict(n=npar, step=3, lr=1e-3, beta1=0.9, beta2=0.95, eps=1e-8, weight_decay=0.1,
               decoupled=1, max_norm=1.0),
          [arr(npar), arr(npar), arr(npar, fill=0.0), arr(npar, fill=0.0), bf16(npar),
           arr(1, fill=4.0)], 30 * npar)


if __name__ == "__main__":
    main(sys.argv[1:])
