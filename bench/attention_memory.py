"""What fused attention saves in memory, from the declarations (nntile.memory; no StarPU).

    python3 bench/attention_memory.py

Prints a markdown table: the GiB a whole training run registers (parameters, gradients, AdamW
states, activations, workspaces, logits) with unfused and fused attention, for GPT-2 124M and
XL at batch 8x1024 and the wide 4-layer 6.07B of bench/scale.py at batch 16x1024 with its
documented tiles, in tf32 and bf16-mixed; then the attention core alone of Llama-3.2-1B's
shape (16 layers, hidden 2048, 32 query heads, 8 kv heads, seq 2048, batch 8), whose model
nntile does not have yet: what its CoreAttention declares, once per layer, plus backward's
scratch once.
"""
from nntile import memory
from nntile.models import GPT2Config
from nntile.nn.attention import CoreAttention

GIB = 2 ** 30
WIDE_TILES = dict(batch=2, embd=4096, inner=4096, head=32, vocab=8192)
RUNS = [
    ("GPT-2 124M", dict(), 8, 1024, {}),
    ("GPT-2 XL 1.5B", dict(n_layer=48, n_embd=1600, n_head=25), 8, 1024, {}),
    ("wide 4-layer 6.07B", dict(n_layer=4, n_embd=10240, n_head=80, tie_word_embeddings=False),
     16, 1024, WIDE_TILES),
]
PRECISIONS = ("tf32", "bf16-mixed")


def run_row(name, fields, batch, seq, tiling, dtype):
    est = {att: memory.estimate(GPT2Config(**fields, attention=att), batch, seq, tiling, dtype)
           for att in ("unfused", "fused")}
    return (f"| {name} | {batch}x{seq} | {dtype} | {est['unfused'].total / GIB:.1f} | "
            f"{est['fused'].total / GIB:.1f} | "
            f"{(est['unfused'].total - est['fused'].total) / GIB:.1f} |")


def core_bytes(n_layer, n_head, n_kv_head, head_dim, batch, seq, dtype, fused):
    """Bytes the attention cores of n_layer layers declare (buffers per layer, scratch once)."""
    core = CoreAttention(n_head, n_kv_head, head_dim, n_head, dtype, fused)
    specs = core.declaration((batch, seq), (batch, seq))
    return sum(s.nbytes * (1 if s.shared else n_layer) for s in specs)


def main():
    print("| model | batch | precision | unfused GiB | fused GiB | saved GiB |")
    print("| --- | --- | --- | --- | --- | --- |")
    for name, fields, batch, seq, tiling in RUNS:
        for dtype in PRECISIONS:
            print(run_row(name, fields, batch, seq, tiling, dtype))
    print()
    print("| Llama-3.2-1B attention cores (16 layers, 32/8 heads, d 64) | batch | precision | "
          "unfused GiB | fused GiB | saved GiB |")
    print("| --- | --- | --- | --- | --- | --- |")
    for dtype in PRECISIONS:
        b = {fused: core_bytes(16, 32, 8, 64, 8, 2048, dtype, fused) for fused in (False, True)}
        print(f"| Llama-3.2-1B shape | 8x2048 | {dtype} | {b[False] / GIB:.2f} | "
              f"{b[True] / GIB:.2f} | {(b[False] - b[True]) / GIB:.2f} |")


if __name__ == "__main__":
    main()
