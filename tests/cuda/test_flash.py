"""Fused attention on the GPU (nntile/cuda/flash.cu, flash_mma.cu, cudnn_attention.cpp) against
float64 numpy: tests/attention_refs.py for the forward, and for the backward the function the
kernels define (probabilities recomputed from the lse and o they are given, delta = rowsum(dout
* o)), which is the exact gradient when those are exact.

Every column runs every case: fp64 and fp32 (the plain kernels), tf32 and bf16 (the tensor-core
kernels; the plain ones where the head dimension does not suit them: 20, 160), bf16_fp32
(cuDNN's SDPA where it applies, our bf16 kernels elsewhere). A case is run tile by tile as the
tensor op runs it: one call per (batch tile, head tile, query tile, key tile), key tiles that
causality masks out entirely skipped, the accumulate flags set as the contract says, and every
output a call writes without reading poisoned with NaN first.

Tolerances, on the largest error over the largest reference magnitude of each output:
fp64 1e-12 (double throughout); fp32 1e-5 (float arithmetic, sums of a few hundred terms);
tf32 3e-3 forward, 5e-3 backward (q, k, v, dout, P and dS rounded to 10-bit mantissas: 2.4e-4
each; numpy emulation of these kernels gives up to 1.2e-3 on such inputs, the backward's two
chained roundings the most); bf16 2e-2 (inputs are bf16 already and the reference takes them
as stored; P and dS rounded to bf16 for the products and outputs rounded to bf16: 4e-3 emulated).
"""
import os

# cuDNN's path is what bf16_fp32 measures here, whatever the caller's environment says
os.environ["NNTILE_CUDNN_ATTENTION"] = "1"
import ctypes

import numpy as np
import pytest

import test_cuda_kernels as K  # the shared build; skips this module without a device
from tests.attention_refs import reference, visible

pytestmark = pytest.mark.gpu
cp = K.cp

COLUMNS = ["fp64", "fp32", "tf32", "bf16", "bf16_fp32"]
TOL_FWD = {"fp64": 1e-12, "fp32": 1e-5, "tf32": 3e-3, "bf16": 2e-2, "bf16_fp32": 2e-2}
TOL_BWD = {"fp64": 1e-12, "fp32": 1e-5, "tf32": 5e-3, "bf16": 2e-2, "bf16_fp32": 2e-2}


@pytest.fixture(scope="session")
def env(tmp_path_factory):
    return K.shared_env(tmp_path_factory)


# ---------------------------------------------------------------- storage

def data_dtype(col):
    return {"fp64": np.float64, "fp32": np.float32, "tf32": np.float32}.get(col, np.uint16)


def lse_dtype(col):
    return {"fp64": np.float64, "bf16": np.uint16}.get(col, np.float32)


def stored(x, dtype):
    """x as the kernels store it (bf16 bits for uint16)."""
    if dtype == np.uint16:
        return K.bf16_bits(x).reshape(np.shape(x))
    return np.ascontiguousarray(x, dtype=dtype)


def value(a):
    """Stored values as float64."""
    a = np.asarray(a)
    if a.dtype == np.uint16:
        return K.bf16_to_f32(a).reshape(a.shape).astype(np.float64)
    return a.astype(np.float64)


def flash_args(batch, tq, tk, hq, hkv, d, q_offset, k_offset, causal, accumulate, scale,
               offset=0, window=0):
    return K.make_args("flash", dict(batch=batch, tq=tq, tk=tk, hq=hq, hkv=hkv, d=d,
                                     q_offset=q_offset, k_offset=k_offset,
                                     mask=dict(causal=int(causal), offset=offset,
                                               window=window),
                                     accumulate=accumulate, scale=scale))


def case_args(case, bs, hs, ks_h, qs, ks, accumulate):
    """The args of a case's call on a (batch, head, query, key) span."""
    return flash_args(bs[1] - bs[0], qs[1] - qs[0], ks[1] - ks[0], hs[1] - hs[0],
                      ks_h[1] - ks_h[0], case["D"], case["q_off"] + qs[0],
                      case["k_off"] + ks[0], case["causal"], accumulate, case["scale"],
                      case["offset"], case["window"])


def case_visible(case):
    """The case's mask over its whole queries and keys (tests/attention_refs.py)."""
    return visible(case["T"], case["Tk"], case["causal"], case["q_off"], case["k_off"],
                   case["offset"], case["window"])


def call(env, op, col, args, bufs, stream=None):
    """nntile_cuda_<op>_<col>(args, stream, bufs...) on ``stream`` (default: the test's)."""
    fn = getattr(env.cuda, f"nntile_cuda_{op}_{col}")
    fn.restype = None
    fn(ctypes.byref(args), ctypes.c_void_p((stream or env.stream).ptr),
       *[ctypes.c_void_p(b.data.ptr) for b in bufs])


def to_device(env, x):
    with env.stream:
        return cp.asarray(np.ascontiguousarray(x))


def to_host(env, a):
    out = cp.asnumpy(a, stream=env.stream)
    env.stream.synchronize()
    return out


# ---------------------------------------------------------------- tiles

def spans(n, size):
    return [(a, min(a + size, n)) for a in range(0, n, size)] or [(0, 0)]


def tile_calls(case):
    """(batch span, query head span, kv head span, query span, key span) of every call the
    tensor op makes, in its order; the key tiles the mask hides entirely left out."""
    B, T, Tk, H, Hkv = case["B"], case["T"], case["Tk"], case["H"], case["Hkv"]
    bt, ht, tt, kt = case.get("bt", B), case.get("ht", H), case.get("tt", T), case.get("kt", Tk)
    g = H // Hkv
    calls, keep = [], case_visible(case)
    for bs in spans(B, bt):
        for h0, h1 in spans(H, ht):
            for qs in spans(T, tt):
                for ks in spans(Tk, kt):
                    if not keep[qs[0]:qs[1], ks[0]:ks[1]].any():
                        continue
                    calls.append((bs, (h0, h1), (h0 // g, h1 // g), qs, ks))
    return calls


def sub(x, bs, hs, ts):
    return np.ascontiguousarray(x[bs[0]:bs[1], ts[0]:ts[1], hs[0]:hs[1]])


def inputs(case, col, seed):
    rng = np.random.default_rng(seed)
    B, T, Tk, H, Hkv, D = (case[k] for k in ("B", "T", "Tk", "H", "Hkv", "D"))
    dt = data_dtype(col)
    q, do = (stored(rng.standard_normal((B, T, H, D)), dt) for _ in range(2))
    k, v = (stored(rng.standard_normal((B, Tk, Hkv, D)), dt) for _ in range(2))
    return q, k, v, do


def run_forward(env, col, case, q, k, v):
    """o, lse of the tiled forward, as stored."""
    B, T, H, D = q.shape
    o = np.full(q.shape, np.nan)
    lse = np.full((B, T, H), np.nan)
    o, lse = stored(o, data_dtype(col)), stored(lse, lse_dtype(col))
    seen = set()
    for bs, hs, ks_h, qs, ks in tile_calls(case):
        key = (bs, hs, qs)
        acc = int(key in seen)
        seen.add(key)
        dq_, dk_, dv_ = (to_device(env, sub(x, bs, h, t)) for x, h, t in
                         ((q, hs, qs), (k, ks_h, ks), (v, ks_h, ks)))
        do_ = to_device(env, sub(o, bs, hs, qs))
        dl_ = to_device(env, np.ascontiguousarray(lse[bs[0]:bs[1], qs[0]:qs[1], hs[0]:hs[1]]))
        args = case_args(case, bs, hs, ks_h, qs, ks, acc)
        call(env, "flash_forward", col, args, [dq_, dk_, dv_, do_, dl_])
        o[bs[0]:bs[1], qs[0]:qs[1], hs[0]:hs[1]] = to_host(env, do_)
        lse[bs[0]:bs[1], qs[0]:qs[1], hs[0]:hs[1]] = to_host(env, dl_)
    return o, lse


def run_backward(env, col, case, q, k, v, o, do, lse):
    """dq, dk, dv of the tiled backward, as stored."""
    dt = data_dtype(col)
    dq = stored(np.full(q.shape, np.nan), dt)
    dk = stored(np.full(k.shape, np.nan), dt)
    dv = stored(np.full(v.shape, np.nan), dt)
    seen_q, seen_k = set(), set()
    for bs, hs, ks_h, qs, ks in tile_calls(case):
        kq, kk = (bs, hs, qs), (bs, ks_h, ks)
        acc = int(kq in seen_q) | 2 * int(kk in seen_k)
        seen_q.add(kq)
        seen_k.add(kk)
        bufs = [to_device(env, sub(x, bs, h, t)) for x, h, t in
                ((q, hs, qs), (k, ks_h, ks), (v, ks_h, ks), (o, hs, qs), (do, hs, qs))]
        bufs.append(to_device(env, np.ascontiguousarray(
            lse[bs[0]:bs[1], qs[0]:qs[1], hs[0]:hs[1]])))
        outs = [to_device(env, sub(x, bs, h, t)) for x, h, t in
                ((dq, hs, qs), (dk, ks_h, ks), (dv, ks_h, ks))]
        args = case_args(case, bs, hs, ks_h, qs, ks, acc)
        call(env, "flash_backward", col, args, bufs + outs)
        for x, h, t, a in ((dq, hs, qs, outs[0]), (dk, ks_h, ks, outs[1]),
                           (dv, ks_h, ks, outs[2])):
            x[bs[0]:bs[1], t[0]:t[1], h[0]:h[1]] = to_host(env, a)
    return dq, dk, dv


# ---------------------------------------------------------------- references

def backward_given(q, k, v, o, do, lse, scale, keep):
    """dq, dk, dv as the kernels compute them from the lse and o they are given (float64):
    P = exp(scale q.k - lse) on the keys ``keep`` shows (0 where lse is -inf), delta = rowsum(dout * o),
    dS = P (dout v^T - delta), dq = scale dS k, dk = scale dS^T q, dv = P^T dout, the heads
    of a group summed into their kv head."""
    B, Tk, Hkv, D = k.shape
    g = q.shape[2] // Hkv
    kk, vv = np.repeat(k, g, axis=2), np.repeat(v, g, axis=2)
    s = scale * np.einsum("bqhd,bkhd->bhqk", q, kk)
    lse_t = lse.transpose(0, 2, 1)[..., None]
    with np.errstate(invalid="ignore", over="ignore"):
        p = np.where(keep & np.isfinite(lse_t), np.exp(s - np.where(np.isfinite(lse_t), lse_t, 0)),
                     0.0)
    delta = (do * o).sum(axis=-1).transpose(0, 2, 1)[..., None]
    ds = p * (np.einsum("bqhd,bkhd->bhqk", do, vv) - delta)
    fold = lambda x: x.reshape(B, Tk, Hkv, g, D).sum(axis=3)  # noqa: E731
    return (scale * np.einsum("bhqk,bkhd->bqhd", ds, kk),
            fold(scale * np.einsum("bhqk,bqhd->bkhd", ds, q)),
            fold(np.einsum("bhqk,bqhd->bkhd", p, do)))


def assert_close(got, ref, tol, what, floor=0.0):
    """Error relative to the largest magnitude of ref (or ``floor``, where ref is rounding
    noise: a query with one key has dq = dk = 0, exactly, in real numbers)."""
    got, ref = value(got), np.asarray(ref, dtype=np.float64)
    np.testing.assert_array_equal(np.isneginf(got), np.isneginf(ref), err_msg=what)
    fin = np.isfinite(ref)
    assert np.isfinite(got[fin]).all(), f"{what}: NaN or inf where the reference is finite"
    scale = max(float(np.abs(ref[fin]).max()), floor, 1e-30) if fin.any() else 1.0
    err = float(np.abs(got[fin] - ref[fin]).max()) / scale if fin.any() else 0.0
    assert err <= tol, f"{what}: max error {err:.3g} of the largest magnitude (tolerance {tol})"


# ---------------------------------------------------------------- cases

def case(B, T, Tk, H, Hkv, D, causal=True, **kw):
    return dict(B=B, T=T, Tk=Tk, H=H, Hkv=Hkv, D=D, causal=causal,
                q_off=kw.pop("q_off", 0), k_off=kw.pop("k_off", 0), offset=kw.pop("offset", 0),
                window=kw.pop("window", 0),
                scale=kw.pop("scale", D ** -0.5), **kw)


CASES = {
    "d64": case(2, 64, 64, 2, 2, 64),
    "d128-gqa-partial": case(1, 100, 100, 4, 2, 128),
    "d80-noncausal-gqa3": case(2, 37, 53, 6, 2, 80, causal=False),
    "d96-tiled-gqa4": case(1, 130, 130, 4, 1, 96, tt=70, kt=48),
    "d64-tiles-4x4": case(1, 200, 200, 2, 2, 64, tt=64, kt=64),
    "d64-batch-head-tiles": case(3, 90, 90, 4, 2, 64, bt=2, ht=2, tt=45, kt=30),
    "d20-plain": case(3, 17, 17, 3, 3, 20),
    "d160-plain": case(1, 33, 33, 2, 1, 160),
    "one": case(1, 1, 1, 1, 1, 64),
    "d64-long-gqa": case(2, 300, 300, 2, 1, 64),
    # a single call whose first rows see no key (k_offset > q_offset): o 0, lse -inf there
    "no-key-rows": case(1, 32, 32, 2, 2, 64, q_off=0, k_off=16),
    # a query tile below the diagonal: cuDNN's band key - query > q_offset - k_offset
    "band": case(1, 32, 64, 2, 2, 64, q_off=32, k_off=0),
    # keys longer than queries (a prefill after 40 cached keys), tiled
    "offset-prefill": case(1, 24, 64, 4, 2, 64, offset=40, tt=16, kt=32),
    # one new query against a cache of 77 keys
    "offset-one-query": case(2, 1, 77, 4, 1, 64, offset=76),
    # sliding windows: in one call (cuDNN's left bound), tiled with key tiles skipped, a
    # window not a multiple of the tiles or the kernels' blocks, and with an offset
    "window-one-call": case(2, 130, 130, 2, 1, 128, window=17),
    "window-tiled": case(1, 200, 200, 4, 2, 64, window=70, tt=64, kt=64),
    "window-plain-d20": case(1, 90, 90, 3, 3, 20, window=33, tt=45, kt=30),
    "window-offset": case(1, 24, 100, 4, 2, 64, offset=76, window=50, tt=16, kt=32),
}


@pytest.mark.parametrize("col", COLUMNS)
@pytest.mark.parametrize("name", list(CASES))
def test_flash_forward(env, col, name):
    c = CASES[name]
    q, k, v, _ = inputs(c, col, seed=len(name))
    o, lse = run_forward(env, col, c, q, k, v)
    ref_o, ref_lse, _ = reference(value(q), value(k), value(v), c["scale"], c["causal"],
                                  c["q_off"], c["k_off"], c["offset"], c["window"])
    assert_close(o, ref_o, TOL_FWD[col], f"{name} {col} o")
    assert_close(lse, ref_lse, TOL_FWD[col], f"{name} {col} lse")
    if name == "no-key-rows":
        assert (value(o)[:, :16] == 0).all() and np.isneginf(value(lse)[:, :16]).all()


@pytest.mark.parametrize("col", COLUMNS)
@pytest.mark.parametrize("name", list(CASES))
def test_flash_backward(env, col, name):
    c = CASES[name]
    q, k, v, do = inputs(c, col, seed=len(name) + 1)
    ref_o, ref_lse, _ = reference(value(q), value(k), value(v), c["scale"], c["causal"],
                                  c["q_off"], c["k_off"], c["offset"], c["window"])
    o, lse = stored(ref_o, data_dtype(col)), stored(ref_lse, lse_dtype(col))
    dq, dk, dv = run_backward(env, col, c, q, k, v, o, do, lse)
    refs = backward_given(value(q), value(k), value(v), value(o), value(do), value(lse),
                          c["scale"], case_visible(c))
    largest = max(float(np.abs(r).max()) for r in refs)  # the gradients' common scale
    for got, ref, what in zip((dq, dk, dv), refs, ("dq", "dk", "dv")):
        assert_close(got, ref, TOL_BWD[col], f"{name} {col} {what}", floor=largest)


def test_backward_reference_is_the_gradient():
    """backward_given with the exact o and lse is the gradient of tests/attention_refs.py."""
    from tests.attention_refs import reference_backward
    c = CASES["d96-tiled-gqa4"]
    q, k, v, do = (value(x) for x in inputs(c, "fp64", seed=3))
    o, lse, _ = reference(q, k, v, c["scale"], True)
    for a, b in zip(backward_given(q, k, v, o, do, lse, c["scale"], case_visible(c)),
                    reference_backward(q, k, v, do, c["scale"], True)):
        np.testing.assert_allclose(a, b, rtol=1e-10, atol=1e-12)


def cudnn_counts(env):
    out = (ctypes.c_int64 * 5)()
    env.cuda.nntile_cuda_flash_cudnn_counts(out)
    return list(out)


def test_cudnn_runs_what_it_applies_to(env):
    """bf16_fp32 calls that write their outputs with a mask cuDNN states run on cuDNN (it
    fails here when cuDNN refused them: its message is on stderr); merges run ours."""
    c = CASES["d64-tiles-4x4"]
    q, k, v, do = inputs(c, "bf16_fp32", seed=5)
    calls = tile_calls(c)
    first_key_tiles = len({(qs, bs, hs) for bs, hs, _, qs, _ in calls})
    before = cudnn_counts(env)
    o, lse = run_forward(env, "bf16_fp32", c, q, k, v)
    mid = cudnn_counts(env)
    assert mid[0] - before[0] == first_key_tiles, (before, mid)
    assert mid[2] - before[2] == len(calls) - first_key_tiles, (before, mid)
    one = CASES["d64"]
    q, k, v, do = inputs(one, "bf16_fp32", seed=6)
    o, lse = run_forward(env, "bf16_fp32", one, q, k, v)
    run_backward(env, "bf16_fp32", one, q, k, v, o, do, lse)
    after = cudnn_counts(env)
    assert after[1] - mid[1] == 1, (mid, after)
    assert after[4] > 0  # the largest workspace a call took, bytes


def test_cudnn_calls_overlapping_on_two_streams(env):
    """One thread, two streams, no synchronisation between the calls: as StarPU drives two
    workers of a GPU from one thread. Each call's results are its own (a workspace kept per
    thread mixed them up: Llama-1B and GPT-2 124M trained wrong in bf16-mixed). GQA backward,
    whose cuDNN workspace holds the fp32 dk and dv of every query head, then forward."""
    c = case(2, 512, 512, 16, 4, 64)
    col = "bf16_fp32"
    D, scale = c["D"], c["scale"]
    streams = [cp.cuda.Stream(non_blocking=True) for _ in range(4)]
    args = flash_args(2, 512, 512, 16, 4, D, 0, 0, True, 0, scale)
    before = cudnn_counts(env)
    runs = []
    for i, stream in enumerate(streams):  # each input set on a stream of its own
        q, k, v, do = inputs(c, col, seed=100 + i)
        ref_o, ref_lse, _ = reference(value(q), value(k), value(v), scale, True)
        o_s, lse_s = stored(ref_o, data_dtype(col)), stored(ref_lse, lse_dtype(col))
        with stream:
            dev = [cp.asarray(x) for x in (q, k, v, o_s, do, lse_s)]
            grads = [cp.full(x.shape, 0x7FC0, dtype=cp.uint16) for x in (q, k, v)]  # NaN
            o = cp.full(q.shape, 0x7FC0, dtype=cp.uint16)
            lse = cp.full(lse_s.shape, np.nan, dtype=cp.float32)
        stream.synchronize()  # inputs in place; from here on the calls overlap
        call(env, "flash_backward", col, args, dev + grads, stream)
        call(env, "flash_forward", col, args, dev[:3] + [o, lse], stream)
        runs.append((q, k, v, o_s, do, lse_s, ref_o, ref_lse, grads, o, lse, stream))
    after = cudnn_counts(env)
    assert after[0] - before[0] == 4 and after[1] - before[1] == 4, (before, after)
    for i, (q, k, v, o_s, do, lse_s, ref_o, ref_lse, grads, o, lse, stream) in enumerate(runs):
        stream.synchronize()
        refs = backward_given(value(q), value(k), value(v), value(o_s), value(do), value(lse_s),
                              scale, visible(512, 512, True))
        largest = max(float(np.abs(r).max()) for r in refs)
        for got, ref, what in zip(grads, refs, ("dq", "dk", "dv")):
            assert_close(cp.asnumpy(got), ref, TOL_BWD[col], f"stream {i} {what}", largest)
        assert_close(cp.asnumpy(o), ref_o, TOL_FWD[col], f"stream {i} o")
        assert_close(cp.asnumpy(lse), ref_lse, TOL_FWD[col], f"stream {i} lse")


@pytest.mark.parametrize("col", ["fp32", "fp64"])
def test_flash_matches_the_cpu_kernels(env, col):
    """The CPU twin (nntile/_core/kernels/flash.inc), where this build has it, from the same
    inputs and tiles."""
    cpu_fwd = getattr(env.cpu, f"nntile_kernel_flash_forward_{col}", None)
    if cpu_fwd is None:
        pytest.skip("the CPU library has no flash kernels")
    c = CASES["d96-tiled-gqa4"]
    q, k, v, do = inputs(c, col, seed=7)
    o, lse = run_forward(env, col, c, q, k, v)
    args = flash_args(1, c["T"], c["Tk"], c["H"], c["Hkv"], c["D"], 0, 0, True, 0, c["scale"])
    o_cpu, lse_cpu = np.full_like(o, np.nan), np.full_like(lse, np.nan)
    cpu_fwd.restype = None
    cpu_fwd(ctypes.byref(args), *[K._ptr(x) for x in (q, k, v, o_cpu, lse_cpu)])
    assert_close(o, o_cpu, 10 * TOL_FWD[col], "o against the CPU")
    assert_close(lse, lse_cpu, 10 * TOL_FWD[col], "lse against the CPU")
    dq, dk, dv = run_backward(env, col, c, q, k, v, o, do, lse)
    grads = [np.full_like(x, np.nan) for x in (q, k, v)]
    cpu_bwd = getattr(env.cpu, f"nntile_kernel_flash_backward_{col}")
    cpu_bwd.restype = None
    cpu_bwd(ctypes.byref(args), *[K._ptr(x) for x in (q, k, v, o, do, lse, *grads)])
    for got, ref, what in zip((dq, dk, dv), grads, ("dq", "dk", "dv")):
        assert_close(got, ref, 10 * TOL_BWD[col], f"{what} against the CPU")
