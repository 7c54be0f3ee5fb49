"""Run under mpirun: a small model (4 blocks, so that the one block whose gradients are in
flight is a quarter of them, nearer a real model's share) trained by replicas for 4 steps,
with the update sharded or not (argv[1]: a --distribution value, argv[2]: gpt2 or llama,
argv[3]: a precision). Prints one JSON line per rank: the losses, the estimate's bytes of
masters, optimizer states and gradients, the bytes of the tiles of these tensors that hold
valid contents after the steps and at their peak during the steps, and StarPU's count of the
host memory in use.

The peak is sampled with every task done at each point of the step where the held bytes may
be highest: after forward, after each piece of backward (before its gradients are reduced,
when they are all written), and after the update. Waiting there runs the pieces one after
another, so the peak is that of gradients reduced as soon as each piece is final."""
import json
import math
import sys

import numpy as np

import nntile
from nntile import memory
from nntile.distributed import Distribution, mpi
from nntile.models import GPT2Config, GPT2LMHead, LlamaConfig, LlamaLM
from nntile.optim import AdamW
from nntile.parallel import DataParallel

SHARDED = ("parameters", "optimizer_states", "gradients")


def held_bytes(tensors):
    """Bytes of the tiles that hold valid contents (StarPU's view, tasks done)."""
    total = 0
    for t in tensors:
        assert all(n % b == 0 for n, b in zip(t.shape, t.basetile)), \
            "the tiling here cuts every tensor into equal tiles"
        total += math.prod(t.basetile) * t.numpy_dtype.itemsize * t.valid_tiles()
    return total


def held(model, opt):
    """Bytes of the tiles of masters, optimizer states and gradients with valid contents."""
    params = [p for _, p in model.named_parameters()]
    return dict(parameters=held_bytes(p.value for p in params),
                optimizer_states=held_bytes(t for ts in opt.states.values() for t in ts),
                gradients=held_bytes(p.grad for p in params))


def main():
    nranks = mpi().COMM_WORLD.Get_size()
    dist = Distribution.parse(sys.argv[1], nranks)
    family, precision = sys.argv[2], sys.argv[3]
    if family == "llama":
        config = LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64,
                             num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2,
                             max_position_embeddings=16)
        model_class = LlamaLM
    else:
        config = GPT2Config(n_layer=4, n_head=2, n_embd=32, n_positions=16, vocab_size=64)
        model_class = GPT2LMHead
    tiling = dict(embd=16, inner=32, vocab=32)
    batch = 2 * 6  # shared equally by 1, 2 or 3 ranks
    with nntile.Context(ncpu=1, mpi=True, distribution=dist, limit_cpu_mem=4000) as ctx:
        est = memory.estimate(config, batch, 16, tiling, precision, distribution=dist,
                              rank=ctx.rank)
        model = model_class(config, tiling=tiling, dtype=precision)
        model.init_weights(0)
        replicas = DataParallel(model, ctx, bucket_bytes=4096)
        opt = AdamW(model.named_parameters(), lr=1e-2, max_grad_norm=1.0,
                    sharding=replicas.sharding)
        rng = np.random.default_rng(0)  # the same global batches on every rank
        losses, peak = [], 0

        def sample():
            nonlocal peak
            ctx.wait()
            peak = max(peak, sum(held(model, opt).values()))

        for _ in range(4):
            tokens = rng.integers(0, 64, (batch, 17))
            replicas.zero_grad()
            losses.append(replicas.loss(tokens[:, :-1], tokens[:, 1:]))
            sample()
            for _ in replicas.backward_steps():
                sample()
            opt.step()
            sample()
            replicas.check()
        print(json.dumps(dict(rank=ctx.rank, losses=losses,
                              estimated={c: est[c] for c in SHARDED}, held=held(model, opt),
                              peak=peak, used=ctx.memory_nodes()[0]["used"])), flush=True)


if __name__ == "__main__":
    main()
