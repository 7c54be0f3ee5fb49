"""GPT-2 behaviour that needs a runtime of its own: worker-count independence, memory."""
import json

import pytest

from tests.conftest import run_python

pytest.importorskip("torch")
pytest.importorskip("transformers")

TRAIN = """
import json, resource, sys
import numpy as np, nntile
from nntile.models import GPT2Config, GPT2LMHead
from nntile.optim import AdamW
ncpu, steps = int(sys.argv[1]) if len(sys.argv) > 1 else {ncpu}, {steps}
config = GPT2Config(vocab_size=300, n_positions=32, n_embd=48, n_layer=2, n_head=3)
rng = np.random.default_rng(0)
with nntile.Context(ncpu={ncpu}):
    model = GPT2LMHead(config, dict(batch=1, seq=10, embd=20, head=2, inner=70, vocab=128))
    model.load_state_dict({{k: 0.05 * rng.standard_normal(v.shape)
                            for k, v in model.state_dict().items()}})
    opt = AdamW(model.named_parameters(), lr=1e-3, max_grad_norm=1.0)
    losses, rss = [], []
    batches = [rng.integers(0, 300, (2, 24)) for _ in range(4)]
    for step in range(steps):
        ids = batches[step % 4]
        model.zero_grad()
        losses.append(model.loss(ids, np.roll(ids, -1, axis=1)))
        model.backward()
        opt.step()
        rss.append(int(open("/proc/self/statm").read().split()[1]) * 4096)
    print(json.dumps(dict(losses=losses, rss=rss, grad=model.gradients()["transformer.wte.weight"].tolist())))
"""


def train(ncpu, steps):
    result = run_python(TRAIN.format(ncpu=ncpu, steps=steps), timeout=600)
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout.strip().splitlines()[-1])


def test_results_do_not_depend_on_worker_count():
    one, two = train(1, 3), train(2, 3)
    for a, b in zip(one["losses"], two["losses"]):
        assert abs(a - b) <= 1e-6 * abs(a)
    import numpy as np
    g1, g2 = np.array(one["grad"]), np.array(two["grad"])
    assert np.linalg.norm(g1 - g2) <= 1e-6 * np.linalg.norm(g1)


def test_no_memory_growth_over_100_steps():
    run = train(2, 100)
    rss = run["rss"]
    # after warm-up (first 10 steps) resident memory stays flat: tensors are reused
    growth = rss[-1] - rss[10]
    assert growth < 8 * 2**20, f"resident memory grew by {growth / 2**20:.1f} MiB over 90 steps"
    assert run["losses"][-1] < run["losses"][0]
