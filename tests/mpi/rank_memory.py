"""Run under mpirun: train a few steps and compare what this rank holds with its estimate.

Prints one JSON line per rank: the tile bytes it owns (registered tensors) and what
nntile.memory.estimate predicts, and StarPU's count of host memory in use, sampled while the
steps run (StarPU counts its allocations only under a memory limit, hence limit_cpu_mem).
"""
import json
import sys
import threading
import time

import numpy as np

import nntile
from nntile import memory
from nntile.cli_common import launcher_rank
from nntile.distributed import Distribution
from nntile.models import GPT2Config, GPT2LMHead
from nntile.optim import AdamW

rank, nranks = launcher_rank()
dist = Distribution.parse(sys.argv[1], nranks)
config = GPT2Config(vocab_size=1000, n_positions=128, n_embd=256, n_layer=2, n_head=4,
                    tie_word_embeddings=False)
tiling = dict(batch=2, seq=128, embd=64, head=1, inner=256, vocab=250)
B, T = 4, 128
est = memory.estimate(config, B, T, tiling, "fp32", init="tiles", distribution=dist, rank=rank)
with nntile.Context(ncpu=1, ncuda=0, limit_cpu_mem=4000, distribution=dist) as ctx:
    model = GPT2LMHead(config, tiling, "fp32")
    for _, param in model.named_parameters():
        param.value.write_tiles(lambda s: np.full(tuple(x.stop - x.start for x in s), 0.02))
    opt = AdamW(model.named_parameters(), lr=1e-4, max_grad_norm=1.0)
    rng = np.random.default_rng(0)
    ids, targets = rng.integers(0, 1000, (B, T)), rng.integers(0, 1000, (B, T))
    peak, done = [0], threading.Event()

    def sample():
        while not done.is_set():
            peak[0] = max(peak[0], ctx.memory_nodes()[0]["used"])
            time.sleep(0.0005)

    sampler = threading.Thread(target=sample)
    sampler.start()
    for _ in range(2):
        model.zero_grad()
        model.submit_loss(ids, targets)
        model.backward()
        opt.step()
        ctx.wait()
    done.set()
    sampler.join()
    used = ctx.memory_nodes()[0]["used"]
    print(json.dumps(dict(rank=rank, owned=memory.live_owned_bytes(rank),
                          est_owned=est.owned_total, est_total=est.total,
                          whole=est.whole.total, used=used, peak=max(peak[0], used))),
          flush=True)
