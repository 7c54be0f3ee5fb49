"""GPT-2 124M training on one GPU: ours against PyTorch eager + transformers, same run.

Untied head, batch 8 x 1024, AdamW; tf32 and bf16 for both. Skipped without a CUDA build.
NNTILE_BENCH_GPU_BATCH / _SEQ / _LAYERS shrink it for a quick look.
"""
import os
import time

import numpy as np
import pytest

import nntile

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not nntile.HAVE_CUDA or not torch.cuda.is_available(),
                                 reason="needs nntile built with CUDA and a GPU")]

from nntile.models import GPT2LMHead
from nntile.optim import AdamW

BATCH = int(os.environ.get("NNTILE_BENCH_GPU_BATCH", "8"))
SEQ = int(os.environ.get("NNTILE_BENCH_GPU_SEQ", "1024"))
CONFIG = dict(vocab_size=50257, n_positions=1024, n_embd=768,
              n_layer=int(os.environ.get("NNTILE_BENCH_GPU_LAYERS", "12")), n_head=12)
TILING = dict(batch=int(os.environ.get("NNTILE_BENCH_GPU_TILE_BATCH", "8")))
STEPS = 5


@pytest.fixture(scope="module")
def gpu_ctx():
    # No CPU workers by default: with history-based models still uncalibrated, dmda would
    # force some large GEMMs onto a CPU core just to measure them.
    ctx = nntile.Context(ncuda=1, ncpu=int(os.environ.get("NNTILE_BENCH_GPU_NCPU", "0")),
                         verbose=True)
    yield ctx
    ctx.shutdown()


def model_flops_per_token(cfg, seq):
    params = sum(p for p in [
        cfg["vocab_size"] * cfg["n_embd"] * 2,  # wte + untied head
        cfg["n_layer"] * 12 * cfg["n_embd"] ** 2])
    return 6 * params + 12 * cfg["n_layer"] * cfg["n_embd"] * seq


@pytest.mark.parametrize("dtype", ["tf32", "bf16"])
def test_gpt2_124m_vs_pytorch(benchmark, gpu_ctx, report, dtype):
    """tf32: fp32 weights, TF32 matrix products on both sides. bf16: weights, gradients and
    optimizer states stored in bf16 on both sides (PyTorch: the model cast to bfloat16)."""
    ctx = gpu_ctx
    torch.manual_seed(0)
    hf = transformers.GPT2LMHeadModel(transformers.GPT2Config(
        **CONFIG, resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0, tie_word_embeddings=False))
    rng = np.random.default_rng(0)
    ids = rng.integers(0, CONFIG["vocab_size"], (BATCH, SEQ))
    targets = rng.integers(0, CONFIG["vocab_size"], (BATCH, SEQ))
    model = GPT2LMHead.from_transformers(hf, TILING, dtype)
    opt = AdamW(model.named_parameters(), lr=1e-4)

    def ours():
        model.zero_grad()
        model.submit_loss(ids, targets)
        model.backward()
        opt.step()
        ctx.wait()

    for _ in range(3):  # calibrates StarPU's performance models, allocates tiles
        ours()
    ctx.profiling(True)
    ctx.worker_stats()
    t_ours = []
    for _ in range(STEPS):
        start = time.perf_counter()
        ours()
        t_ours.append(time.perf_counter() - start)
    stats = ctx.worker_stats()
    ctx.profiling(False)
    cuda = [s for s in stats if "CUDA" in s["worker"]]
    busy = sum(s["executing_s"] for s in cuda) / max(sum(s["total_s"] for s in cuda), 1e-9)
    loss_ours = float(model.loss_value.to_array()[0])
    model.unregister()

    ctx.pause()  # idle StarPU workers poll; let PyTorch have the machine
    try:
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True
        hf = hf.cuda().to(torch.bfloat16 if dtype == "bf16" else torch.float32)
        topt = torch.optim.AdamW(hf.parameters(), lr=1e-4)
        tids = torch.from_numpy(ids).cuda()
        ttargets = torch.from_numpy(targets).cuda()

        def theirs():
            topt.zero_grad()
            logits = hf(tids).logits
            loss = torch.nn.functional.cross_entropy(logits.view(-1, logits.shape[-1]),
                                                     ttargets.view(-1))
            loss.backward()
            topt.step()
            torch.cuda.synchronize()
            return loss.item()

        for _ in range(3):
            theirs()
        t_theirs = []
        for _ in range(STEPS):
            start = time.perf_counter()
            loss_theirs = theirs()
            t_theirs.append(time.perf_counter() - start)
        del hf, topt
        torch.cuda.empty_cache()
    finally:
        ctx.resume()
    benchmark.pedantic(lambda: None, rounds=1, iterations=1)
    tokens = BATCH * SEQ
    ours_tps = tokens / float(np.median(t_ours))
    theirs_tps = tokens / float(np.median(t_theirs))
    flops = model_flops_per_token(CONFIG, SEQ)
    benchmark.extra_info.update(ours_tokens_per_s=ours_tps, torch_tokens_per_s=theirs_tps,
                                cuda_busy_share=busy, loss_ours=loss_ours,
                                loss_torch=loss_theirs)
    report(f"GPT-2 124M {dtype} tokens/s ours / PyTorch", ours_tps / theirs_tps,
           f"({ours_tps:,.0f} vs {theirs_tps:,.0f} tokens/s; ours {ours_tps * flops / 1e12:.0f} "
           f"model TFLOP/s; CUDA worker executing {100 * busy:.0f}% of the time, idle "
           f"{100 * (1 - busy):.0f}%; batch {BATCH}x{SEQ}, {CONFIG['n_layer']} layers)")
