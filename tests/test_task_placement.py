"""Task priorities and worker kinds decide when and where tasks run, never what they compute:
training with them gives the same numbers bit for bit, and a bad kind is refused."""
import numpy as np
import pytest

from nntile import ops
from nntile.models import GPT2Config, GPT2LMHead
from nntile.optim import AdamW

CONFIG = GPT2Config(vocab_size=101, n_positions=16, n_embd=32, n_layer=3, n_head=4,
                    tie_word_embeddings=False)
TILING = dict(batch=1, seq=8, embd=16, head=2, inner=48, vocab=40)


def train(ctx, layer_priorities, optimizer_on, steps=2):
    rng = np.random.default_rng(0)
    model = GPT2LMHead(CONFIG, TILING)
    model.layer_priorities = layer_priorities
    model.load_state_dict({name: 0.2 * rng.standard_normal(shape)
                           for name, shape in model.name_map.hf_shapes().items()})
    opt = AdamW(model.named_parameters(), lr=1e-2, max_grad_norm=1.0)
    ids, targets = rng.integers(0, CONFIG.vocab_size, (2, 2, 16))
    losses = []
    for _ in range(steps):
        model.zero_grad()
        model.submit_loss(ids, targets)
        model.backward()
        with ops.task_workers(optimizer_on):
            opt.step()
        losses.append(float(model.loss_value.to_array()[0]))
    assert np.isfinite(losses).all()
    state = model.state_dict()
    model.unregister()
    for tensor in opt.state_tensors().values():
        tensor.unregister()
    return losses, state


def test_priorities_and_optimizer_placement_keep_the_numbers(ctx):
    losses, state = train(ctx, False, None)
    for layer_priorities, optimizer_on in ((True, None), (True, "cpu"), (False, "cpu")):
        other_losses, other_state = train(ctx, layer_priorities, optimizer_on)
        assert other_losses == losses
        for name, value in state.items():
            np.testing.assert_array_equal(other_state[name], value, err_msg=name)
    assert ops.set_task_priority(0) == 0  # the model leaves the default priority behind


def test_unknown_worker_kind_is_refused(ctx):
    with pytest.raises(ValueError, match="task workers 'gpu'"):
        ops.set_task_workers("gpu")
    assert ops.set_task_workers(None) is None
