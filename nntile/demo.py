"""What `make train` runs until the training program (nntile-train) exists: a small GPT-2
trained on StarPU with AdamW, on bytes of the running Python's standard library sources."""
import glob
import os
import sysconfig
import time

import numpy as np

import nntile
from nntile.models import GPT2Config, GPT2LMHead
from nntile.optim import AdamW, LRSchedule


def stdlib_bytes(limit=4_000_000):
    """Byte-level corpus every machine has: the standard library's .py files."""
    root = sysconfig.get_paths()["stdlib"]
    chunks, size = [], 0
    for path in sorted(glob.glob(os.path.join(root, "*.py"))):
        with open(path, "rb") as f:
            data = f.read()
        chunks.append(data)
        size += len(data)
        if size >= limit:
            break
    return np.frombuffer(b"".join(chunks), dtype=np.uint8).astype(np.int64)


def main(steps=int(os.environ.get("NNTILE_DEMO_STEPS", "60"))):
    data = stdlib_bytes()
    split = int(0.95 * len(data))
    train, val = data[:split], data[split:]
    config = GPT2Config(vocab_size=256, n_positions=128, n_embd=128, n_layer=2, n_head=4)
    batch, seq = 8, 128
    rng = np.random.default_rng(0)

    def sample(source):
        starts = rng.integers(0, len(source) - seq - 1, batch)
        x = np.stack([source[s:s + seq] for s in starts])
        y = np.stack([source[s + 1:s + seq + 1] for s in starts])
        return x, y

    with nntile.Context(verbose=True):
        model = GPT2LMHead(config, dict(batch=4, seq=64, vocab=128))
        init = {k: 0.02 * rng.standard_normal(v.shape) for k, v in model.state_dict().items()}
        for k in init:
            if k.endswith("ln_1.weight") or k.endswith("ln_2.weight") or k.endswith("ln_f.weight"):
                init[k] = np.ones_like(init[k])
            elif k.endswith("bias"):
                init[k] = np.zeros_like(init[k])
        model.load_state_dict(init)
        opt = AdamW(model.named_parameters(), lr=LRSchedule(3e-3, warmup=10, total=steps),
                    weight_decay=0.01, max_grad_norm=1.0)
        vx, vy = sample(val)
        first_val = model.loss(vx, vy)
        print(f"demo: GPT-2 {config.num_parameters() / 1e6:.2f}M parameters, byte-level, "
              f"batch {batch}x{seq}; validation loss at start {first_val:.3f}")
        start = time.perf_counter()
        for step in range(1, steps + 1):
            x, y = sample(train)
            model.zero_grad()
            loss = model.loss(x, y)
            model.backward()
            opt.step()
            if step % 10 == 0 or step == steps:
                rate = step * batch * seq / (time.perf_counter() - start)
                print(f"step {step:4d}  loss {loss:.3f}  {rate:,.0f} tokens/s")
        last_val = model.loss(vx, vy)
        print(f"demo: validation loss {first_val:.3f} -> {last_val:.3f} after {steps} AdamW "
              f"steps (no checkpoint is written: nntile-train is not there yet)")


if __name__ == "__main__":
    main()
