"""GPT-2 training step on CPU: ours against PyTorch eager + transformers, side by side.

Full size (the issue's configuration): n_embd 256, 4 layers, 4 heads, vocabulary 50257,
sequence 256, batch 8. NNTILE_BENCH_QUICK=1 shrinks it so CI-sized machines finish quickly.
"""
import os
import time

import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from nntile.models import GPT2LMHead
from nntile.optim import AdamW

QUICK = os.environ.get("NNTILE_BENCH_QUICK") == "1"
CONFIG = dict(vocab_size=50257, n_positions=1024, n_embd=256, n_layer=4, n_head=4)
BATCH, SEQ = 8, 256
TILING = dict(batch=1, vocab=8192)
if QUICK:
    CONFIG.update(vocab_size=4096, n_layer=2)
    BATCH, SEQ = 2, 128
STEPS = 2 if QUICK else 3


def hf_model():
    torch.manual_seed(0)
    cfg = transformers.GPT2Config(**CONFIG, resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0,
                                  tie_word_embeddings=False)
    return transformers.GPT2LMHeadModel(cfg)


def test_gpt2_training_step_vs_pytorch(benchmark, ctx, report):
    rng = np.random.default_rng(0)
    ids = rng.integers(0, CONFIG["vocab_size"], (BATCH, SEQ))
    targets = rng.integers(0, CONFIG["vocab_size"], (BATCH, SEQ))
    hf = hf_model()
    model = GPT2LMHead.from_transformers(hf, TILING, "fp32")
    opt = AdamW(model.named_parameters(), lr=1e-4)

    def ours():
        model.zero_grad()
        model.submit_loss(ids, targets)
        model.backward()
        opt.step()
        ctx.wait()

    torch_opt = torch.optim.AdamW(hf.parameters(), lr=1e-4)
    tids, ttargets = torch.from_numpy(ids), torch.from_numpy(targets)

    def theirs():
        # StarPU's idle workers poll for tasks; pause them so PyTorch gets the cores.
        ctx.pause()
        try:
            torch_step()
        finally:
            ctx.resume()

    def torch_step():
        torch_opt.zero_grad()
        logits = hf(tids).logits
        loss = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]),
                                                 ttargets.reshape(-1))
        loss.backward()
        torch_opt.step()

    ours()
    theirs()  # warm-up both
    t_ours, t_theirs = [], []
    for _ in range(STEPS):
        start = time.perf_counter()
        ours()
        t_ours.append(time.perf_counter() - start)
        start = time.perf_counter()
        theirs()
        t_theirs.append(time.perf_counter() - start)
    benchmark.pedantic(ours, rounds=1, iterations=1)
    tokens = BATCH * SEQ
    ours_tps, theirs_tps = tokens / min(t_ours), tokens / min(t_theirs)
    benchmark.extra_info.update(ours_tokens_per_s=ours_tps, torch_tokens_per_s=theirs_tps,
                                torch_threads=torch.get_num_threads())
    report("GPT-2 CPU training tokens/s ours / PyTorch", ours_tps / theirs_tps,
           f"({ours_tps:.0f} vs {theirs_tps:.0f} tokens/s, {CONFIG}, batch {BATCH}x{SEQ}, "
           f"torch threads {torch.get_num_threads()})")
    model.unregister()
