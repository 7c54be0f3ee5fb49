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
    tile, query heads per tile, kv heads per tile, head dim, compute dtype, mask, scale, seq
    tiles), where the seq tiles are enough for every pair of a query tile and a key tile that
    cuDNN tells apart (``seq_tiles_met``). cuDNN runs bf16 attention only."""
    tiles = model.tiles
    bt = min(batch, tiles.get("batch") or math.ceil(batch / model.batch_count))
    tt = min(seq, tiles.get("seq") or seq)
    shapes = set()
    for _, module in model.named_modules():
        if isinstance(module, CoreAttention) and module.fused and module.compute == "bf16":
            shapes.add((bt, tt, module.head_tile, module.head_tile // module.group,
                        module.head_dim, module.compute, module.mask, module.scale,
                        seq_tiles_met(module.mask, seq, tt)))
    return sorted(shapes, key=repr)


def seq_tiles_met(mask, seq, tile):
    """The fewest sequence tiles of ``tile`` positions whose attention under ``mask`` meets
    every kind of (query tile, key tile) pair that ``seq`` positions meet, as the attention
    ops submit them (``mask.key_tiles``): a pair the mask cuts is a kind of its own at each
    distance between the two tiles (its band moves with it), a pair it leaves whole is one
    kind at every distance."""
    cut, whole = [0], []
    for qi in range(math.ceil(seq / tile)):
        q0, q1 = qi * tile, min(seq, (qi + 1) * tile)
        for ki in mask.key_tiles(q0, q1, seq, tile):
            pairs = whole if mask.whole(q0, q1, ki * tile, min(seq, (ki + 1) * tile)) else cut
            pairs.append(qi - ki)
    return 1 + max(max(cut), min(whole, default=0))


def run_attention_tiles(shapes):
    """Forward and backward once per shape of ``attention_tile_shapes`` on every rank (each
    on tensors it owns), waited for."""
    ctx = current_context()
    created = []
    for rank in range(ctx.owner_ranks):
        for bt, tt, ht, hkv, d, dtype, mask, scale, nseq in shapes:
            q_shape, kv_shape = (bt, nseq * tt, ht, d), (bt, nseq * tt, hkv, d)
            q_tile, kv_tile = (bt, tt, ht, d), (bt, tt, hkv, d)
            owned = [rank] * nseq
            q, o, do, dq = (Tensor(q_shape, q_tile, dtype, owners=owned) for _ in range(4))
            k, v, dk, dv = (Tensor(kv_shape, kv_tile, dtype, owners=owned) for _ in range(4))
            lse = Tensor(q_shape[:3], q_tile[:3], "fp32", owners=owned)
            ops.flash_attention(q, k, v, o, lse, scale, mask)
            ops.flash_attention_backward(q, k, v, o, do, lse, dq, dk, dv, scale, mask)
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
