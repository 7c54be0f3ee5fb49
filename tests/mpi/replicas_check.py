"""Run under mpirun: a small GPT-2 trained by replicas for 3 steps. Prints, per rank, one JSON
line: the losses, the bytes handed to all-reduce in each step, the gradients' bytes, and a
hash of the weights after the last step.

    replicas_check.py [DEVICES [WEIGHTS.npy]]

DEVICES: replicas within each rank (its CPU workers grouped into that many devices, as a rank
drives several GPUs); WEIGHTS.npy: where rank 0 writes the weights after the last step."""
import hashlib
import json
import sys

import numpy as np

import nntile
from nntile.distributed import Distribution, mpi
from nntile.models import GPT2Config, GPT2LMHead
from nntile.optim import AdamW
from nntile.parallel import DataParallel


def main():
    nranks = mpi().COMM_WORLD.Get_size()
    devices = int(sys.argv[1]) if len(sys.argv) > 1 else 1
    config = GPT2Config(n_layer=2, n_head=2, n_embd=32, n_positions=16, vocab_size=64)
    with nntile.Context(ncpu=devices, ncuda=0, mpi=True, device_replicas=devices,
                        distribution=Distribution.replicated(nranks)) as ctx:
        model = GPT2LMHead(config, tiling=dict(embd=16, inner=64, vocab=32))
        model.init_weights(0)
        replicas = DataParallel(model, ctx, bucket_bytes=4096)  # several buckets
        opt = AdamW(model.named_parameters(), lr=1e-2, max_grad_norm=1.0)
        rng = np.random.default_rng(0)  # the same global batches on every rank
        reduced, losses = [], []
        for _ in range(3):
            tokens = rng.integers(0, 64, (4 * nranks, 17))  # rows for 4 devices a rank
            replicas.zero_grad()
            losses.append(replicas.loss(tokens[:, :-1], tokens[:, 1:]))
            replicas.backward()
            opt.step()
            ctx.wait()
            replicas.check()
            reduced.append(replicas.bytes_reduced())
        weights = [param.value.to_array() for _, param in model.named_parameters()]
        digest = hashlib.sha256()
        for array in weights:
            digest.update(array.tobytes())
        if len(sys.argv) > 2 and ctx.rank == 0:
            np.save(sys.argv[2], np.concatenate([w.ravel() for w in weights]))
        grads = sum(p.grad.traits.size * p.grad.numpy_dtype.itemsize
                    for _, p in model.named_parameters())
        print(json.dumps(dict(rank=ctx.rank, losses=losses, reduced_per_step=reduced,
                              gradient_bytes=grads, weights_sha256=digest.hexdigest())),
              flush=True)


if __name__ == "__main__":
    main()
