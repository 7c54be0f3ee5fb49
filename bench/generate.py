"""Generation speed against transformers' generate with its cache, in one process on one
machine: the same Llama weights (random), the same prompts, greedy, every sequence running
to max_new_tokens (no end-of-sequence token). Prints a RESULT line per batch size with both
times and the ratio (transformers' time over ours: > 1 is faster than transformers).

    python bench/generate.py                       # the 2-core CPU: 2 layers, hidden 256,
                                                   # prompt 64, 128 new tokens
    python bench/generate.py --shape llama-3.2-1b --device cuda --dtype bf16 \\
        --batch 1 8 --prompt 512 --new 256         # one H100

Both sides are timed after a short warm-up run (first-use costs: StarPU's calibration,
cuDNN's graphs, torch's kernels).
"""
import argparse
import time

import numpy as np

SHAPES = {
    "small": dict(hidden_size=256, intermediate_size=688, num_hidden_layers=2,
                  num_attention_heads=8, num_key_value_heads=4, vocab_size=32000),
    # Llama-3.2-1B's config.json, without its weights
    "llama-3.2-1b": dict(hidden_size=2048, intermediate_size=8192, num_hidden_layers=16,
                         num_attention_heads=32, num_key_value_heads=8, vocab_size=128256,
                         tie_word_embeddings=True, max_position_embeddings=131072,
                         rope_theta=500000.0,
                         rope_scaling=dict(rope_type="llama3", factor=32.0,
                                           low_freq_factor=1.0, high_freq_factor=4.0,
                                           original_max_position_embeddings=8192)),
}
TORCH_DTYPES = {"fp32": "float32", "bf16": "bfloat16"}


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--shape", choices=SHAPES, default="small")
    p.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    p.add_argument("--dtype", choices=TORCH_DTYPES, default="fp32")
    p.add_argument("--batch", type=int, nargs="+", default=[1])
    p.add_argument("--prompt", type=int, default=64)
    p.add_argument("--new", type=int, default=128)
    p.add_argument("--repeat", type=int, default=3, help="timed runs of each side (best kept)")
    return p.parse_args(argv)


def hf_model(args):
    import torch
    import transformers
    torch.manual_seed(0)
    fields = dict(dict(max_position_embeddings=args.prompt + args.new), **SHAPES[args.shape])
    config = transformers.LlamaConfig(**fields, bos_token_id=None, eos_token_id=None,
                                      pad_token_id=None)
    return transformers.LlamaForCausalLM(config).eval()


def best_time(run, repeat):
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        run()
        times.append(time.perf_counter() - start)
    return min(times)


def measure(hf, model, args, batch):
    """(ours, transformers') best times to continue ``batch`` random prompts."""
    import torch
    prompts = np.random.default_rng(batch).integers(0, hf.config.vocab_size,
                                                    size=(batch, args.prompt))
    ids = torch.from_numpy(prompts).to(args.device)
    mask = torch.ones_like(ids)

    def theirs(new=args.new):
        with torch.no_grad():
            hf.generate(ids, attention_mask=mask, max_new_tokens=new, min_new_tokens=new,
                        do_sample=False, pad_token_id=0)
        if args.device == "cuda":
            torch.cuda.synchronize()

    def ours(new=args.new):
        model.generate(prompts, max_new_tokens=new)

    theirs(4)
    ours(4)
    return best_time(ours, args.repeat), best_time(theirs, args.repeat)


def result_line(args, batch, t_ours, t_theirs):
    return (f"RESULT generate shape={args.shape} device={args.device} dtype={args.dtype} "
            f"batch={batch} prompt={args.prompt} new={args.new} nntile={t_ours:.3f}s "
            f"transformers={t_theirs:.3f}s ratio={t_theirs / t_ours:.2f}x")


def main(argv=None):
    args = parse_args(argv)
    import nntile
    from nntile.models import LlamaLM
    import torch
    hf = hf_model(args)
    ctx = nntile.Context(ncuda=1 if args.device == "cuda" else 0)
    model = LlamaLM.from_transformers(hf, dtype=args.dtype)
    # transformers' model moves to the GPU once ours holds its weights: no PyTorch tensor is
    # on a GPU while StarPU starts (its bus sampling used to reset the GPUs it measured:
    # scripts/starpu-patches/bus-sampling-keeps-cuda-context.patch)
    hf.to(device=args.device, dtype=getattr(torch, TORCH_DTYPES[args.dtype]))
    for batch in args.batch:
        print(result_line(args, batch, *measure(hf, model, args, batch)), flush=True)
    model.unregister()
    ctx.shutdown()


if __name__ == "__main__":
    main()
