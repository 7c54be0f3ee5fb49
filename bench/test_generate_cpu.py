"""Generation on the CPU against transformers' generate with its cache (bench/generate.py):
the full size is a 2-layer Llama of hidden 256, prompt 64, 128 new tokens, batch 1;
NNTILE_BENCH_QUICK=1 runs prompt 16 and 32 new tokens."""
import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")

import generate
from harness import QUICK
from nntile.models import LlamaLM


def test_generation_vs_transformers(benchmark, ctx, report):
    args = generate.parse_args(["--prompt", "16", "--new", "32", "--repeat", "2"] if QUICK
                               else [])
    hf = generate.hf_model(args)
    model = LlamaLM.from_transformers(hf, dtype=args.dtype)
    t_ours, t_theirs = generate.measure(hf, model, args, 1)
    benchmark.pedantic(lambda: None, rounds=1, iterations=1)
    report("Llama CPU generation time transformers / ours", t_theirs / t_ours,
           generate.result_line(args, 1, t_ours, t_theirs))
    model.unregister()
