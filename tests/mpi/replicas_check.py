"""Run under mpirun: a small GPT-2 trained by replicas for 3 steps. Prints, per rank, one JSON
line: the bytes handed to all-reduce in each step, the gradients' bytes, and a hash of the
weights after the last step."""
import hashlib
import json

import numpy as np

import nntile
from nntile.distributed import Distribution, mpi
from nntile.models import GPT2Config, GPT2LMHead
from nntile.optim import AdamW
from nntile.parallel import DataParallel


def main():
    nranks = mpi().COMM_WORLD.Get_size()
    config = GPT2Config(n_layer=2, n_head=2, n_embd=32, n_positions=16, vocab_size=64)
    with nntile.Context(ncpu=1, mpi=True, distribution=Distribution.replicated(nranks)) as ctx:
        model = GPT2LMHead(config, tiling=dict(embd=16, inner=64, vocab=32))
        model.init_weights(0)
        replicas = DataParallel(model, ctx, bucket_bytes=4096)  # several buckets
        opt = AdamW(model.named_parameters(), lr=1e-2, max_grad_norm=1.0)
        rng = np.random.default_rng(0)  # the same global batches on every rank
        reduced = []
        for _ in range(3):
            tokens = rng.integers(0, 64, (2 * nranks, 17))
            model.zero_grad()
            replicas.loss(tokens[:, :-1], tokens[:, 1:])
            replicas.backward()
            opt.step()
            ctx.wait()
            replicas.check()
            reduced.append(replicas.bytes_reduced())
        digest = hashlib.sha256()
        for _, param in model.named_parameters():
            digest.update(param.value.to_array().tobytes())
        grads = sum(p.grad.traits.size * p.grad.numpy_dtype.itemsize
                    for _, p in model.named_parameters())
        print(json.dumps(dict(rank=ctx.rank, reduced_per_step=reduced, gradient_bytes=grads,
                              weights_sha256=digest.hexdigest())), flush=True)


if __name__ == "__main__":
    main()
