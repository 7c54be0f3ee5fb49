"""PyTorch FSDP2 (full shard, one rank per GPU), or DDP, on the models of bench/scale.py.

    python3 -m torch.distributed.run --standalone --nproc-per-node N bench/fsdp_ref.py \
        --n-embd 8192 --n-layer 4 --batch 4 --steps 3 [--dtype tf32|bf16|bf16-mixed] \
        [--model llama-3.2-1b ...] [--activation-checkpointing] [--ddp]

FSDP2: the model is built on the meta device, sharded block by block (``fully_shard``), then
materialised on each rank's GPU and initialised there, so no rank ever holds the whole model.
Llama is transformers' LlamaForCausalLM (sdpa attention). With --activation-checkpointing each
block is wrapped in PyTorch's checkpoint_wrapper before it is sharded: backward computes the
block's forward again, and only the blocks' inputs stay live between forward and backward.
DDP (``--ddp``): every rank holds the whole model, gradients all-reduced in buckets during
backward; bf16-mixed is then autocast to bf16 over fp32 weights. Gradients clipped to a global
norm of 1 (``--max-grad-norm``) and fused AdamW, as ours; ``--batch`` is
the global batch, split over the ranks. Prints one RESULT line (status ok or oom) on rank 0,
with the best step after the first, like bench/scale.py.
"""
import argparse
import os
import sys
import time
from contextlib import nullcontext

# NVLink multicast stays off on shared hosts: NCCL's, symmetric memory's and NVSHMEM's
for variable, value in (("NCCL_NVLS_ENABLE", "0"), ("TORCH_SYMM_MEM_DISABLE_MULTICAST", "1"),
                        ("NVSHMEM_DISABLE_NVLS", "1")):
    os.environ.setdefault(variable, value)
import numpy as np  # noqa: E402
import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import (  # noqa: E402
    checkpoint_wrapper)
from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard  # noqa: E402

import torch_reference  # noqa: E402
from harness import model_flops_per_step, print_result, reported_step  # noqa: E402
from shapes import add_model_args, llama_config, resolve_model  # noqa: E402


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_model_args(p, batch_help="global batch, split over ranks")
    p.add_argument("--dtype", default="tf32", choices=["tf32", "fp32", "bf16", "bf16-mixed"],
                   help="bf16-mixed: MixedPrecisionPolicy(param_dtype=bf16, "
                   "reduce_dtype=fp32), fp32 shards and Adam states")
    p.add_argument("--ddp", action="store_true",
                   help="DistributedDataParallel (replicated model) instead of FSDP2")
    p.add_argument("--activation-checkpointing", action="store_true",
                   help="recompute each block's forward in backward (checkpoint_wrapper)")
    p.add_argument("--max-grad-norm", type=float, default=1.0,
                   help="clip the gradients' global norm, as bench/scale.py does (0: off)")
    p.add_argument("--pipeline", action="store_true", help="no barrier, synchronize or loss "
                   "read between the steps after the first: the CPU queues the next step "
                   "while the GPU runs; the step is the mean of the steps after the first, as "
                   "bench/scale.py --pipeline")
    return resolve_model(p.parse_args(argv))


def blocks(model):
    return model.transformer.h if hasattr(model, "transformer") else model.model.layers


def checkpoint_blocks(model):
    """Each block wrapped in PyTorch's non-reentrant checkpoint_wrapper. No dropout runs, so
    the random state need not be saved for the recomputation."""
    layers = blocks(model)
    for i, block in enumerate(layers):
        layers[i] = checkpoint_wrapper(block, preserve_rng_state=False)


def compute_buffers(model):
    """The buffers ``to_empty`` left uninitialised, computed again: they are not learned but
    derived from the config (Llama's rotary frequencies), so the module holding them is built
    once more, on the CPU, and its values copied."""
    with torch.no_grad():
        for module in model.modules():
            own = dict(module.named_buffers(recurse=False))
            if own:
                fresh = type(module)(module.config)
                for name, buffer in own.items():
                    buffer.copy_(getattr(fresh, name))


def build_ddp(args, device):
    torch.manual_seed(0)
    model = torch_reference.of_args(args)
    if args.activation_checkpointing:
        checkpoint_blocks(model)
    model.to(device)
    if args.dtype == "bf16":
        model.to(torch.bfloat16)
    nparams = sum(p.numel() for p in model.parameters())
    ids = [device.index] if device.type == "cuda" else None
    return torch.nn.parallel.DistributedDataParallel(model, device_ids=ids), nparams


def build(args, device):
    if args.ddp:
        return build_ddp(args, device)
    with torch.device("meta"):
        model = torch_reference.of_args(args)
    nparams = sum(p.numel() for p in model.parameters())
    if args.activation_checkpointing:
        checkpoint_blocks(model)
    # bf16-mixed: fp32 shards, gathered and computed in bf16, gradients reduced in fp32
    mp = dict(mp_policy=MixedPrecisionPolicy(param_dtype=torch.bfloat16,
                                             reduce_dtype=torch.float32)) \
        if args.dtype == "bf16-mixed" else {}
    for block in blocks(model):
        fully_shard(block, **mp)
    fully_shard(model, **mp)
    model.to_empty(device=device)
    compute_buffers(model)
    torch.manual_seed(0)
    with torch.no_grad():  # GPT-2's initialisation, on each rank's shards
        for name, p in model.named_parameters():
            if ("ln" in name or "norm" in name) and name.endswith("weight"):
                p.fill_(1.0)
            elif name.endswith("bias"):
                p.zero_()
            else:
                p.normal_(0.0, 0.02)
    if args.dtype == "bf16":
        model.to(torch.bfloat16)
    return model, nparams


def step_flops(args, nparams, tokens):
    """Model FLOPs of a step, counted as bench/scale.py counts them (recomputation is not
    counted: the same model FLOPs with and without activation checkpointing)."""
    if args.model == "gpt2":
        return model_flops_per_step(nparams, args.n_layer, args.n_embd, args.seq, tokens)
    return llama_config(args).flops_per_token(args.seq) * tokens


def start_ranks(args):
    """The process group (NCCL on GPUs, gloo on CPUs) and this rank's device:
    (gpu, device, rank, world)."""
    gpu = torch.cuda.is_available()
    dist.init_process_group("nccl" if gpu else "gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    if args.batch % world:
        sys.exit(f"fsdp_ref.py: error: batch {args.batch} does not split over {world} ranks")
    device = (torch.device("cuda", int(os.environ.get("LOCAL_RANK", 0))) if gpu
              else torch.device("cpu"))
    if gpu:
        torch.cuda.set_device(device)
        torch.backends.cuda.matmul.allow_tf32 = args.dtype == "tf32"
    return gpu, device, rank, world


def train_steps(args, model, device, gpu, rank, world, times):
    """args.steps AdamW steps on this rank's share of a random batch, each step's seconds
    appended to ``times`` as it ends; returns the losses, their mean over the ranks."""
    autocast = (torch.autocast(device.type if gpu else "cpu", dtype=torch.bfloat16)
                if args.ddp and args.dtype == "bf16-mixed" else nullcontext())
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=gpu)
    rng = np.random.default_rng(rank)
    local = args.batch // world
    ids = torch.from_numpy(rng.integers(0, args.vocab, (local, args.seq))).to(device)
    targets = torch.from_numpy(rng.integers(0, args.vocab, (local, args.seq))).to(device)
    losses, ended = [], None
    for step in range(args.steps):
        waited = not args.pipeline or step in (0, args.steps - 1)
        if waited:
            dist.barrier()
        start = time.perf_counter()
        opt.zero_grad()
        with autocast:
            # no key/value cache: it would keep every layer's keys and values, and a
            # recomputed block would append to it again
            logits = model(ids, use_cache=False).logits
        loss = torch.nn.functional.cross_entropy(
            logits.reshape(-1, logits.shape[-1]).float(), targets.reshape(-1))
        loss.backward()
        if args.max_grad_norm > 0:
            torch.nn.utils.clip_grad_norm_(model.parameters(), args.max_grad_norm)
        opt.step()
        if waited:
            if gpu:
                torch.cuda.synchronize()
            dist.barrier()  # ends the step on every rank
        # back to back, a step is timed from the last one's end: the GPU work queued by
        # the steps not waited for is done inside the last step's barrier and sync
        since = ended if args.pipeline and ended is not None else start
        ended = time.perf_counter()
        times.append(ended - since)
        losses.append(loss.detach())
    losses = torch.stack(losses)
    dist.all_reduce(losses)  # the mean over the ranks, read once all steps ran
    return [float(x) / world for x in losses]


def main(argv=None):
    args = parse_args(argv)
    gpu, device, rank, world = start_ranks(args)
    tokens = args.batch * args.seq
    result = dict(status="ok", model=args.model, n_embd=args.n_embd, n_layer=args.n_layer,
                  batch=args.batch, seq=args.seq, ranks=world, dtype=args.dtype,
                  scheme="ddp" if args.ddp else "fsdp2",
                  activation_checkpointing=args.activation_checkpointing,
                  max_grad_norm=args.max_grad_norm)
    times, losses = [], []
    try:
        model, nparams = build(args, device)
        result["params"] = nparams
        losses = train_steps(args, model, device, gpu, rank, world, times)
    except Exception as exc:  # an OOM is a result, not a crash
        result.update(status="oom" if torch_reference.is_oom(exc) else "error",
                      error=f"{type(exc).__name__}: {exc}"[:300])
        result.setdefault("params", None)
    if times:
        best = reported_step(times, args.pipeline)
        flops = step_flops(args, result["params"], tokens)
        result.update(step_s=best, steps_s=times, tokens_per_s=tokens / best,
                      tflops=flops / best / 1e12, losses=losses,
                      peak_gpu_gib=torch.cuda.max_memory_allocated() / 2**30 if gpu else 0)
    if rank == 0:
        for i, (t, loss) in enumerate(zip(times, losses)):
            print(f"step {i + 1}: {t:.2f} s, loss {loss:.4f}", flush=True)
    if rank == 0 or result["status"] != "ok":
        # a rank that fails alone says so itself: its peers wait in a collective until the
        # launcher ends them, and rank 0 may never print
        print_result(dict(result, rank=rank))
    if result["status"] != "ok":
        os._exit(0 if rank == 0 else 1)  # a peer may be stuck in a collective: do not wait
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
