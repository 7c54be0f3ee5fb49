"""Fused attention, the op alone, on one GPU: forward and forward + backward TFLOP/s of
nntile's kernels (bf16 through cuDNN's SDPA, our bf16 and TF32 tensor-core kernels, and at
the shortest sequence the plain fp32 ones) beside PyTorch's scaled_dot_product_attention
(bf16, and fp32 with TF32 allowed), causal.

    python3 bench/attention_op.py [--dims 64,128] [--seqs 2048,4096,8192,16384]

The kernels are called directly, through ctypes, on torch tensors [batch, seq, heads,
head_dim], one call per direction with every sequence in one tile (the default tiling): this
measures the kernels, not StarPU. They come from the nntile core module where it is built with
CUDA, else from the library tests/cuda builds (which needs cupy). As in FlashAttention's
benchmarks, batch * seq = 16384 tokens and heads * head_dim = 2048, which fills an H100.
FLOPs: 4 B H T^2 D forward, halved for causal, and 2.5 times that for the backward (our
backward recomputes the scores; that work is not counted). CUDA events, warm-up, median of
repeats. Each case checks its outputs against PyTorch's (err_vs_torch: largest difference
over the largest magnitude, o and dq). One RESULT line per case and a table at the end; first,
GPT-2 124M's shape (batch 8 x 1024, 12 heads of 64) prints the cuDNN workspace it takes."""
import os

# cuDNN's path is opt-in in training (cudnn_attention.cpp); here it is what is measured
os.environ.setdefault("NNTILE_CUDNN_ATTENTION", "1")
import argparse
import ctypes
import json
import os
import statistics
import sys
import tempfile

import torch
import torch.nn.functional as F

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, HERE)
from harness import RESULT_PREFIX  # noqa: E402

# (name, nntile column or torch dtype, storage dtype, lse dtype)
OURS = [("cudnn-bf16", "bf16_fp32", torch.bfloat16, torch.float32),
        ("ours-bf16", "bf16", torch.bfloat16, torch.bfloat16),
        ("ours-tf32", "tf32", torch.float32, torch.float32)]
# the fp32 column (plain kernels, no tensor cores) at the shortest sequence only: it is slow
PLAIN = ("ours-fp32", "fp32", torch.float32, torch.float32)
PLAIN_MAX_SEQ = 2048
TORCH = [("torch-bf16", torch.bfloat16), ("torch-tf32", torch.float32)]
BASELINE = {"cudnn-bf16": "torch-bf16", "ours-bf16": "torch-bf16", "ours-tf32": "torch-tf32",
            "ours-fp32": "torch-tf32"}


def flash_args_type():
    """The ctypes struct of nntile_flash_args, read from kernels.h."""
    import importlib.util
    spec = importlib.util.spec_from_file_location(
        "nntile_kernel_header", os.path.join(ROOT, "nntile", "_core", "kernels",
                                             "kernel_header.py"))
    header = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(header)
    kinds = {"int64": ctypes.c_int64, "double": ctypes.c_double}
    return type("nntile_flash_args", (ctypes.Structure,),
                {"_fields_": [(n, kinds[k]) for n, k in header.args_structs()["flash"]]})


def load_library():
    """(library with the nntile_cuda_flash_* symbols, where it came from)."""
    try:
        from nntile._core import core
        lib = ctypes.CDLL(core.__file__)
        lib.nntile_cuda_flash_forward_bf16_fp32  # AttributeError: built without CUDA
        return lib, "the nntile core module"
    except (ImportError, OSError, AttributeError):
        sys.path[:0] = [os.path.join(ROOT, "tests", "cuda"), ROOT]
        import test_cuda_kernels as T  # builds with nvcc: needs cupy
        env = T.Env(tempfile.mkdtemp(prefix="nntile_attention_bench_"))
        return env.cuda, "the library tests/cuda builds"


class Ours:
    """One of our columns on one shape: forward, forward + backward, outputs."""

    def __init__(self, lib, args_type, col, dtype, lse_dtype, q, k, v, do):
        B, T, H, D = q.shape
        self.fwd = getattr(lib, f"nntile_cuda_flash_forward_{col}")
        self.bwd = getattr(lib, f"nntile_cuda_flash_backward_{col}")
        self.fwd.restype = self.bwd.restype = None
        self.args = args_type(batch=B, tq=T, tk=T, hq=H, hkv=k.shape[2], d=D, q_offset=0,
                              k_offset=0, causal=1, accumulate=0, scale=D ** -0.5)
        self.q, self.k, self.v, self.do = (x.to(dtype) for x in (q, k, v, do))
        self.o = torch.empty_like(self.q)
        self.lse = torch.empty((B, T, H), dtype=lse_dtype, device=q.device)
        self.dq, self.dk, self.dv = (torch.empty_like(x) for x in (self.q, self.k, self.v))

    def _ptrs(self, *xs):
        return [ctypes.c_void_p(x.data_ptr()) for x in xs]

    def forward(self):
        stream = ctypes.c_void_p(torch.cuda.current_stream().cuda_stream)
        self.fwd(ctypes.byref(self.args), stream,
                 *self._ptrs(self.q, self.k, self.v, self.o, self.lse))

    def forward_backward(self):
        self.forward()
        stream = ctypes.c_void_p(torch.cuda.current_stream().cuda_stream)
        self.bwd(ctypes.byref(self.args), stream,
                 *self._ptrs(self.q, self.k, self.v, self.o, self.do, self.lse, self.dq,
                             self.dk, self.dv))

    def outputs(self):
        return self.o.float(), self.dq.float()


class Torch:
    """PyTorch's scaled_dot_product_attention on the same [B, T, H, D] tensors (viewed as
    [B, H, T, D])."""

    def __init__(self, dtype, q, k, v, do):
        self.q, self.k, self.v = (x.to(dtype).requires_grad_() for x in (q, k, v))
        self.do = do.to(dtype).transpose(1, 2)
        self.o = None
        self.gqa = q.shape[2] != k.shape[2]

    def _attention(self):
        return F.scaled_dot_product_attention(
            self.q.transpose(1, 2), self.k.transpose(1, 2), self.v.transpose(1, 2),
            is_causal=True, enable_gqa=self.gqa)

    def forward(self):
        with torch.no_grad():
            self.o = self._attention()

    def forward_backward(self):
        for x in (self.q, self.k, self.v):
            x.grad = None
        self.o = self._attention()
        self.o.backward(self.do)

    def outputs(self):
        return self.o.detach().transpose(1, 2).float(), self.q.grad.float()


def milliseconds(fn, seconds=0.4):
    """Median of CUDA-event times of fn after warm-up (the first calls build cuDNN's
    graphs), repeated for about `seconds`."""
    for _ in range(2):
        fn()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    fn()
    end.record()
    end.synchronize()
    reps = max(3, min(25, int(seconds * 1e3 / max(start.elapsed_time(end), 1e-3))))
    times = []
    for _ in range(reps):
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    return statistics.median(times)


def relative_error(got, ref):
    return float((got - ref).abs().max() / ref.abs().max().clamp_min(1e-30))


def cudnn_counts(lib):
    out = (ctypes.c_int64 * 5)()
    lib.nntile_cuda_flash_cudnn_counts(out)
    return list(out)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dims", default="64,128")
    parser.add_argument("--seqs", default="2048,4096,8192,16384")
    opts = parser.parse_args()
    if not torch.cuda.is_available():
        sys.exit("bench/attention_op.py: no CUDA device")
    torch.backends.cuda.matmul.allow_tf32 = True
    torch.backends.cudnn.allow_tf32 = True
    lib, source = load_library()
    args_type = flash_args_type()
    print(f"kernels from {source}; {torch.cuda.get_device_name()}", flush=True)

    # GPT-2 124M: the cuDNN workspace a call of its shape takes (scratch of the call's stream)
    g = torch.Generator(device="cuda").manual_seed(0)
    shape = (8, 1024, 12, 64)
    q, k, v, do = (torch.randn(shape, device="cuda", generator=g) for _ in range(4))
    gpt2 = Ours(lib, args_type, "bf16_fp32", torch.bfloat16, torch.float32, q, k, v, do)
    gpt2.forward_backward()
    torch.cuda.synchronize()
    counts = cudnn_counts(lib)
    print(f"cuDNN workspace after GPT-2 124M's attention (batch 8 x 1024, 12 heads of 64, "
          f"forward and backward): {counts[4] / 2**20:.1f} MiB at most per call in flight "
          f"(cuDNN ran {counts[0]} forward, {counts[1]} backward calls)", flush=True)

    rows = []
    for d in (int(x) for x in opts.dims.split(",")):
        for t in (int(x) for x in opts.seqs.split(",")):
            b, h = max(1, 16384 // t), 2048 // d
            flops_fwd = 4 * b * h * t * t * d / 2
            q, k, v, do = (torch.randn((b, t, h, d), device="cuda", generator=g)
                           for _ in range(4))
            ours = OURS + ([PLAIN] if t <= PLAIN_MAX_SEQ else [])
            impls = {name: Ours(lib, args_type, col, dt, ldt, q, k, v, do)
                     for name, col, dt, ldt in ours}
            impls.update({name: Torch(dt, q, k, v, do) for name, dt in TORCH})
            outputs = {}
            for name, impl in impls.items():
                fwd_ms = milliseconds(impl.forward)
                both_ms = milliseconds(impl.forward_backward)
                outputs[name] = impl.outputs()
                result = {"bench": "attention_op", "impl": name, "head_dim": d, "seq": t,
                          "batch": b, "heads": h, "causal": True, "fwd_ms": round(fwd_ms, 4),
                          "fwd_tflops": round(flops_fwd / fwd_ms / 1e9, 1),
                          "fwd_bwd_ms": round(both_ms, 4),
                          "fwd_bwd_tflops": round(3.5 * flops_fwd / both_ms / 1e9, 1)}
                rows.append(result)
            for result in rows[-len(impls):]:
                base = BASELINE.get(result["impl"])
                if base:
                    o, dq = outputs[result["impl"]]
                    o_ref, dq_ref = outputs[base]
                    result["err_vs_torch"] = [round(relative_error(o, o_ref), 5),
                                              round(relative_error(dq, dq_ref), 5)]
                print(RESULT_PREFIX + json.dumps(result), flush=True)
            del impls, outputs, q, k, v, do
            torch.cuda.empty_cache()

    counts = cudnn_counts(lib)
    print(f"\ncuDNN ran {counts[0]} forward and {counts[1]} backward calls; nntile's "
          f"kernels ran {counts[2]} and {counts[3]} of the bf16_fp32 column")
    names = [n for n, *_ in OURS] + [n for n, _ in TORCH] + [PLAIN[0]]
    print("\nTFLOP/s, causal, forward / forward+backward (batch*seq = 16384, heads*d = 2048)")
    print(f"{'d':>4} {'seq':>6}  " + "  ".join(f"{n:>17}" for n in names))
    for d in sorted({r["head_dim"] for r in rows}):
        for t in sorted({r["seq"] for r in rows}):
            cells = {r["impl"]: r for r in rows if r["head_dim"] == d and r["seq"] == t}
            print(f"{d:>4} {t:>6}  " + "  ".join(
                f"{cells[n]['fwd_tflops']:>8.1f}/{cells[n]['fwd_bwd_tflops']:<8.1f}"
                if n in cells else f"{'-':>17}" for n in names))


if __name__ == "__main__":
    main()
