"""Before the first step: attention's GPU code prepared, host memory pinned.

cuDNN builds a fused-attention graph at its first call with a shape, and its kernels are
compiled at run time: on a machine that has never compiled them, the driver compiles them
then (and keeps them in its cache, ~/.nv/ComputeCache) while holding the GPU's context, and
every worker of the GPU stops. Two such stalls, 1.1-1.3 s each (forward and backward), made
step 1 of 6.07B on a new H100 machine 2.0-2.8x a later step; on a machine that had run once,
1.4x (docs/performance.md, "The first step on a new machine"). ``warm_up_attention`` runs one
tile of each shape the model's fused attention will see, forward and backward, on tensors of
its own, while nothing else runs.
"""
import math
import time

from nntile import ops
from nntile._core.core import Tensor, current_context
from nntile.nn.attention import CoreAttention


def attention_tile_shapes(model, batch, seq):
    """The distinct fused-attention calls of a ``[batch, seq]`` input as (batch tile, seq
    tile, query heads per tile, kv heads per tile, head dim, compute dtype, causal, window,
    scale, seq tiles), where the seq tiles are enough for every distance between a query tile
    and a key tile it sees: 1 or 2 without a window (2: the causal tiles off the diagonal,
    which see every key, are a call of their own), up to 1 + ceil(window / seq tile) with one
    (each distance cuts the window elsewhere). cuDNN runs bf16 attention only."""
    tiles = model.tiles
    bt = min(batch, tiles.get("batch") or math.ceil(batch / model.batch_count))
    tt = min(seq, tiles.get("seq") or seq)
    shapes = set()
    for _, module in model.named_modules():
        if isinstance(module, CoreAttention) and module.fused and module.compute == "bf16":
            nseq = 1 if tt == seq or not module.causal else 2
            if module.window and nseq > 1:
                nseq = min(math.ceil(seq / tt), 1 + math.ceil(module.window / tt))
            shapes.add((bt, tt, module.head_tile, module.head_tile // module.group,
                        module.head_dim, module.compute, module.causal, module.window,
                        module.scale, nseq))
    return sorted(shapes)


def run_attention_tiles(shapes):
    """Forward and backward once per shape of ``attention_tile_shapes`` on every rank (each
    on tensors it owns), waited for."""
    ctx = current_context()
    created = []
    for rank in range(ctx.owner_ranks):
        for bt, tt, ht, hkv, d, dtype, causal, window, scale, nseq in shapes:
            q_shape, kv_shape = (bt, nseq * tt, ht, d), (bt, nseq * tt, hkv, d)
            q_tile, kv_tile = (bt, tt, ht, d), (bt, tt, hkv, d)
            owned = [rank] * nseq
            q, o, do, dq = (Tensor(q_shape, q_tile, dtype, owners=owned) for _ in range(4))
            k, v, dk, dv = (Tensor(kv_shape, kv_tile, dtype, owners=owned) for _ in range(4))
            lse = Tensor(q_shape[:3], q_tile[:3], "fp32", owners=owned)
            ops.flash_attention(q, k, v, o, lse, scale, causal, 0, window)
            ops.flash_attention_backward(q, k, v, o, do, lse, dq, dk, dv, scale, causal, 0,
                                         window)
            created += [q, o, do, dq, k, v, dk, dv, lse]
    ctx.wait()
    for tensor in created:
        tensor.unregister()


def before_first_step(model, batch, seq):
    """What a training program does between initialisation and step 1, so that step 1 waits
    for neither: the rest of the host memory pinned ahead (Context.finish_pinning; pinning
    while steps run would stall them) and attention's GPU code (``warm_up_attention``).
    Returns (seconds waited for pinning, seconds spent on attention, attention shapes run)."""
    ctx = current_context()
    pin_wait_s = ctx.finish_pinning()
    start = time.perf_counter()
    shapes = warm_up_attention(model, batch, seq)
    return pin_wait_s, time.perf_counter() - start, shapes


def warm_up_attention(model, batch, seq):
    """Run the model's fused attention once per tile shape of a ``[batch, seq]`` input, forward
    and backward, on tensors of its own, where a GPU worker runs it (the module's docstring
    says why); nothing where no rank has one. Returns the number of shapes run."""
    ctx = current_context()
    gpus = ctx.ncuda_workers
    if ctx.owner_ranks > 1:  # every rank registers the same tensors
        from mpi4py import MPI
        gpus = ctx.comm.allreduce(gpus, op=MPI.MAX)
    if not gpus:
        return 0
    shapes = attention_tile_shapes(model, batch, seq)
    run_attention_tiles(shapes)
    return len(shapes)
