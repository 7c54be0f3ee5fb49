"""GPT-2 124M training on one GPU: ours against PyTorch eager + transformers, same process.

Untied head, batch 8 x 1024, AdamW. tf32 on both sides; bf16 (weights, gradients and Adam
states in bf16) on both; bf16-mixed, ours against PyTorch AMP: fp32 weights and Adam states,
the forward under torch.autocast(bfloat16), fused AdamW. Prints, per precision, tokens/s of
both, their ratio, the CUDA worker's idle share and a per-op table of our step (StarPU's task
profiling). Skipped without a CUDA build.

    python3 -m pytest -q -s -p no:cacheprovider bench/test_gpt2_gpu.py --benchmark-only

NNTILE_BENCH_GPU_BATCH / _SEQ / _LAYERS shrink it for a quick look; NNTILE_BENCH_GPU_DTYPES
picks precisions (comma-separated), NNTILE_BENCH_GPU_TILING our tiles (default: none given,
nntile's choice; "batch=4,vocab=8192" is the hand tiling it replaces).
NNTILE_BENCH_GPU_KERNELS=DIR also runs two steps of each side under PyTorch's profiler and
prints what the GPU ran (every kernel, through CUPTI) against the wall time, and the longest
idle gaps; the traces are written to DIR.
"""
import os

import numpy as np
import pytest

import nntile

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")
pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not nntile.HAVE_CUDA or not torch.cuda.is_available(),
                                 reason="needs nntile built with CUDA and a GPU")]

import torch_reference
from harness import (gpu_time, gpu_time_table, model_flops_per_step, op_table, paused,
                     program_tiling, seconds, train_step)
from nntile.models import GPT2Config, GPT2LMHead
from nntile.optim import AdamW

BATCH = int(os.environ.get("NNTILE_BENCH_GPU_BATCH", "8"))
SEQ = int(os.environ.get("NNTILE_BENCH_GPU_SEQ", "1024"))
CONFIG = dict(vocab_size=50257, n_positions=1024, n_embd=768,
              n_layer=int(os.environ.get("NNTILE_BENCH_GPU_LAYERS", "12")), n_head=12)
# our tiles (GPT2LMHead's tiling keys), e.g. "batch=8,vocab=50257"; the keys not given are
# nntile.policy's (none given: batch 4, vocabulary 8192, the rest whole, the hand tiling of
# docs/performance.md's fastest figures)
TILING = {key: int(value) for key, value in (
    item.split("=") for item in os.environ.get("NNTILE_BENCH_GPU_TILING", "").split(",") if item)}
DTYPES = os.environ.get("NNTILE_BENCH_GPU_DTYPES", "tf32,bf16-mixed,bf16").split(",")
STEPS = 5
KERNELS_DIR = os.environ.get("NNTILE_BENCH_GPU_KERNELS")


def kernel_report(label, step, dtype):
    """What the GPU ran during two steps (see gpu_time), printed; None without
    NNTILE_BENCH_GPU_KERNELS."""
    if not KERNELS_DIR:
        return
    os.makedirs(KERNELS_DIR, exist_ok=True)
    trace = os.path.join(KERNELS_DIR, f"{label}-{dtype}.json")
    print("\n" + gpu_time_table(f"{label} {dtype}", gpu_time(step, 2, trace), steps=2),
          flush=True)


@pytest.fixture
def gpu_ctx(runtime):
    # No CPU workers by default: with history-based models still uncalibrated, dmda would
    # force some large GEMMs onto a CPU core just to measure them.
    return runtime(ncuda=1, ncpu=int(os.environ.get("NNTILE_BENCH_GPU_NCPU", "0")),
                   verbose=True)


@pytest.mark.parametrize("dtype", DTYPES)
def test_gpt2_124m_vs_pytorch(benchmark, gpu_ctx, report, dtype):
    ctx = gpu_ctx
    hf = torch_reference.gpt2(**CONFIG)
    rng = np.random.default_rng(0)
    ids = rng.integers(0, CONFIG["vocab_size"], (BATCH, SEQ))
    targets = rng.integers(0, CONFIG["vocab_size"], (BATCH, SEQ))
    tiling = program_tiling(GPT2LMHead.config_type.from_transformers(hf.config), BATCH, SEQ,
                            TILING, ctx.ncpu, ctx.ncuda, dtype)
    model = GPT2LMHead.from_transformers(hf, tiling, dtype)
    opt = AdamW(model.named_parameters(), lr=1e-4)

    # The first steps calibrate StarPU's performance models and allocate tiles.
    for _ in range(3):
        train_step(ctx, model, opt, ids, targets)
    ctx.profiling(True)
    ctx.worker_stats(), ctx.op_stats()  # both count from here
    t_ours = [seconds(lambda: train_step(ctx, model, opt, ids, targets)) for _ in range(STEPS)]
    stats, ops = ctx.worker_stats(), ctx.op_stats()
    ctx.profiling(False)
    kernel_report("ours", lambda: train_step(ctx, model, opt, ids, targets), dtype)
    cuda = [s for s in stats if "CUDA" in s["worker"]]
    busy = sum(s["executing_s"] for s in cuda) / max(sum(s["total_s"] for s in cuda), 1e-9)
    loss_ours = float(model.loss_value.to_array()[0])
    model.unregister()

    with paused(ctx):
        theirs = torch_reference.Trainer(hf, "cuda", dtype)
        attention = getattr(theirs.model.config, "_attn_implementation", "?")
        tids, ttargets = theirs.tensors(ids, targets)
        for _ in range(3):
            theirs.step(tids, ttargets)
        t_theirs = [seconds(lambda: theirs.step(tids, ttargets)) for _ in range(STEPS)]
        kernel_report("pytorch", lambda: theirs.step(tids, ttargets), dtype)
        loss_theirs = theirs.loss  # after as many steps as loss_ours
        del hf
        theirs.close()
    benchmark.pedantic(lambda: None, rounds=1, iterations=1)
    tokens = BATCH * SEQ
    ours_tps = tokens / float(np.median(t_ours))
    theirs_tps = tokens / float(np.median(t_theirs))
    nparams = GPT2Config(**CONFIG, tie_word_embeddings=False).num_parameters()
    flops_per_token = model_flops_per_step(nparams, CONFIG["n_layer"], CONFIG["n_embd"], SEQ,
                                           1)
    table = op_table(ops, STEPS)
    print(f"\nGPT-2 124M {dtype}, our step per op ({STEPS} steps; a CUDA worker's tasks "
          f"overlap, so the times add up to more than the step):\n{table}", flush=True)
    benchmark.extra_info.update(ours_tokens_per_s=ours_tps, torch_tokens_per_s=theirs_tps,
                                cuda_busy_share=busy, loss_ours=loss_ours,
                                loss_torch=loss_theirs, torch_attention=attention,
                                op_stats=ops)
    reference = "PyTorch autocast(bf16) + fused AdamW" if dtype == "bf16-mixed" else "PyTorch"
    report(f"GPT-2 124M {dtype} tokens/s ours / {reference}", ours_tps / theirs_tps,
           f"({ours_tps:,.0f} vs {theirs_tps:,.0f} tokens/s; ours "
           f"{ours_tps * flops_per_token / 1e12:.0f} model TFLOP/s; CUDA workers executing "
           f"{100 * busy:.0f}% of the time, idle {100 * (1 - busy):.0f}%; losses "
           f"{loss_ours:.4f} vs {loss_theirs:.4f}; PyTorch attention {attention}; batch "
           f"{BATCH}x{SEQ}, {CONFIG['n_layer']} layers)")
