"""DeepSpeed ZeRO-3 with parameters and optimizer offloaded to the CPU: the peer that trains
models larger than one GPU's memory, on the shapes bench/scale.py trains.

    python3 bench/deepspeed_ref.py --model gpt2 --n-embd 8192 --n-layer 4 --batch 8 --steps 3
    python3 bench/deepspeed_ref.py --model llama-3.1-8b --seq 2048 --batch 2 --steps 3
        [--no-pin] [--dtype bf16]

One process on one GPU (a world of one, started here: no launcher needed). The model is built
inside ``deepspeed.zero.Init`` (parameters partitioned to host memory as they are created, so
no copy of the whole model is ever made), in bf16 with fp32 master weights and AdamW states
in host memory (DeepSpeedCPUAdam, which compiles itself at first use); every step's
parameters stream to the GPU layer by layer. Prints each step and one RESULT line like
bench/scale.py's (status ok or oom; a process the kernel kills for host memory prints
nothing: its caller reports the exit signal).
"""
import argparse
import os
import sys
import time

import numpy as np
import torch

import torch_reference
from harness import model_flops_per_step, print_result
from shapes import add_model_args, llama_config, resolve_model


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_model_args(p)
    p.add_argument("--no-pin", dest="pin", action="store_false",
                   help="unpinned host buffers (pinned ones need more host memory)")
    return resolve_model(p.parse_args(argv))


def ds_config(args):
    offload = {"device": "cpu", "pin_memory": args.pin}
    return {
        "train_micro_batch_size_per_gpu": args.batch,
        "gradient_accumulation_steps": 1,
        "bf16": {"enabled": True},
        "optimizer": {"type": "AdamW", "params": {"lr": 1e-4, "weight_decay": 0.0}},
        "zero_optimization": {"stage": 3, "offload_param": offload,
                              "offload_optimizer": offload, "overlap_comm": True,
                              "contiguous_gradients": True},
        "steps_per_print": 10 ** 9,
        "wall_clock_breakdown": False,
    }


def initialise(deepspeed, model):
    """transformers' initialisation of each module, its parameters gathered for it: under
    zero.Init the model's own initialisation saw empty partitions, which left the weights as
    allocated (a first loss of 2572 on Llama-3.2-3B, 2026-11-25)."""
    for module in model.modules():
        params = list(module.parameters(recurse=False))
        if params:
            with deepspeed.zero.GatheredParameters(params, modifier_rank=0):
                model._init_weights(module)


def main(argv=None):
    args = parse_args(argv)
    for key, value in (("RANK", "0"), ("LOCAL_RANK", "0"), ("WORLD_SIZE", "1"),
                       ("MASTER_ADDR", "127.0.0.1"), ("MASTER_PORT", "29517"),
                       ("NCCL_NVLS_ENABLE", "0")):  # NVLink multicast stays off
        os.environ.setdefault(key, value)
    import deepspeed
    deepspeed.init_distributed(dist_backend="nccl", verbose=False)
    torch.cuda.set_device(0)
    config = ds_config(args)
    tokens = args.batch * args.seq
    result = dict(status="ok", model=args.model, n_embd=args.n_embd, n_layer=args.n_layer,
                  batch=args.batch, seq=args.seq, pinned=args.pin, peer="deepspeed-zero3-offload",
                  deepspeed=deepspeed.__version__, torch=torch.__version__)
    if args.model == "gpt2":
        nparams = torch_reference.gpt2_params(args.vocab, max(1024, args.seq), args.n_embd,
                                              args.n_layer)
        flops = model_flops_per_step(nparams, args.n_layer, args.n_embd, args.seq, tokens)
    else:  # the FLOPs bench/scale.py counts for ours
        nparams = llama_config(args).num_parameters()
        flops = llama_config(args).flops_per_token(args.seq) * tokens
    result["params"] = nparams
    print(f"deepspeed_ref.py: {args.model}, {nparams / 1e9:.2f}B parameters, batch "
          f"{args.batch}x{args.seq}, ZeRO-3, parameters and AdamW on the CPU "
          f"({'pinned' if args.pin else 'unpinned'})", flush=True)
    times, losses = [], []
    try:
        start = time.perf_counter()
        with deepspeed.zero.Init(config_dict_or_path=config, remote_device="cpu",
                                 pin_memory=args.pin, dtype=torch.bfloat16):
            model = torch_reference.of_args(args)
        initialise(deepspeed, model)
        engine, _, _, _ = deepspeed.initialize(model=model, model_parameters=model.parameters(),
                                               config=config)
        print(f"built in {time.perf_counter() - start:.1f} s", flush=True)
        rng = np.random.default_rng(0)
        ids = torch.from_numpy(rng.integers(0, args.vocab, (args.batch, args.seq))).cuda()
        targets = torch.from_numpy(rng.integers(0, args.vocab, (args.batch, args.seq))).cuda()
        for step in range(args.steps):
            torch.cuda.synchronize()
            start = time.perf_counter()
            logits = engine(ids).logits
            loss = torch.nn.functional.cross_entropy(
                logits.reshape(-1, logits.shape[-1]).float(), targets.reshape(-1))
            engine.backward(loss)
            engine.step()
            torch.cuda.synchronize()
            times.append(time.perf_counter() - start)
            losses.append(float(loss.detach()))
            print(f"step {step + 1}: {times[-1]:.2f} s, loss {losses[-1]:.4f}, "
                  f"{flops / times[-1] / 1e12:.1f} TFLOP/s", flush=True)
    except Exception as exc:  # an OOM is a result, not a crash
        result.update(status="oom" if torch_reference.is_oom(exc) else "error",
                      error=f"{type(exc).__name__}: {exc}"[:300])
    if times:
        best = min(times[1:]) if len(times) > 1 else times[0]
        result.update(step_s=best, steps_s=times, tokens_per_s=tokens / best,
                      tflops=flops / best / 1e12, losses=losses,
                      peak_gpu_gib=torch.cuda.max_memory_allocated() / 2**30)
    print_result(result)
    return 0 if result["status"] == "ok" else 1


if __name__ == "__main__":
    sys.exit(main())
