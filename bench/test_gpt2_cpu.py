"""GPT-2 training step on CPU: ours against PyTorch eager + transformers, side by side.

Full size: n_embd 256, 4 layers, 4 heads, vocabulary 50257,
sequence 256, batch 8. NNTILE_BENCH_QUICK=1 shrinks it so CI-sized machines finish quickly; NNTILE_BENCH_CPU_TILING
gives our tiles (default: nntile's choice).
"""
import os

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

import torch_reference
from harness import QUICK, interleaved, program_tiling, train_step
from nntile.models import GPT2LMHead
from nntile.optim import AdamW

CONFIG = dict(vocab_size=50257, n_positions=1024, n_embd=256, n_layer=4, n_head=4)
BATCH, SEQ = 8, 256
if QUICK:
    CONFIG.update(vocab_size=4096, n_layer=2)
    BATCH, SEQ = 2, 128
# Our tiles (GPT2LMHead's tiling keys), e.g. "batch=1,vocab=8192", the hand tiling of earlier
# figures; the keys not given are nntile.policy's (none given: one batch tile per CPU worker,
# the vocabulary in tiles of 8192)
TILING = {key: int(value) for key, value in (
    item.split("=") for item in os.environ.get("NNTILE_BENCH_CPU_TILING", "").split(",") if item)}
STEPS = 2 if QUICK else 3


def test_gpt2_training_step_vs_pytorch(benchmark, ctx, report):
    rng = np.random.default_rng(0)
    ids = rng.integers(0, CONFIG["vocab_size"], (BATCH, SEQ))
    targets = rng.integers(0, CONFIG["vocab_size"], (BATCH, SEQ))
    hf = torch_reference.gpt2(**CONFIG)
    tiling = program_tiling(GPT2LMHead.config_type.from_transformers(hf.config), BATCH, SEQ,
                            TILING, ctx.ncpu, 0)
    model = GPT2LMHead.from_transformers(hf, tiling, "fp32")
    opt = AdamW(model.named_parameters(), lr=1e-4)
    theirs = torch_reference.Trainer(hf, "cpu", "fp32")
    tids, ttargets = theirs.tensors(ids, targets)

    def ours():
        train_step(ctx, model, opt, ids, targets)

    t_ours, t_theirs = interleaved(ctx, ours, lambda: theirs.step(tids, ttargets), STEPS + 1)
    t_ours, t_theirs = t_ours[1:], t_theirs[1:]  # the first step of each allocates
    benchmark.pedantic(ours, rounds=1, iterations=1)
    tokens = BATCH * SEQ
    ours_tps, theirs_tps = tokens / min(t_ours), tokens / min(t_theirs)
    threads = torch.get_num_threads()
    benchmark.extra_info.update(ours_tokens_per_s=ours_tps, torch_tokens_per_s=theirs_tps,
                                torch_threads=threads)
    report("GPT-2 CPU training tokens/s ours / PyTorch", ours_tps / theirs_tps,
           f"({ours_tps:.0f} vs {theirs_tps:.0f} tokens/s, {CONFIG}, batch {BATCH}x{SEQ}, "
           f"torch threads {threads})")
    model.unregister()
