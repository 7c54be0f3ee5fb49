"""Task priorities and worker kinds decide when and where tasks run, never what they compute:
training with them gives the same numbers bit for bit, and a bad kind is refused. The update's
share on CPU workers is the end of the model's parameters."""
import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from nntile import ops
from nntile.models import FAMILIES, GPT2Config, GPT2LMHead, LlamaConfig
from nntile.optim import AdamW, last_share

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


class _Sized:
    """A parameter as last_share reads it: a value with a shape."""

    def __init__(self, size):
        self.value = type("Value", (), {"shape": (size,)})()


@settings(max_examples=50, deadline=None)
@given(sizes=st.lists(st.integers(1, 1000), min_size=1, max_size=30),
       share=st.floats(0.0, 1.0))
def test_last_share_takes_the_end_of_the_model_up_to_the_share(sizes, share):
    """The parameters updated on CPU workers (nntile.policy.cpu_update) are the longest tail
    of the model's parameters that holds at most the share of its elements."""
    params = [(f"p{i}", _Sized(n)) for i, n in enumerate(sizes)]
    taken = last_share(params, share)
    count = sum(id(p) in taken for _, p in params)
    assert all(id(p) in taken for _, p in params[len(params) - count:])  # a tail
    tail = sum(sizes[len(sizes) - count:])
    assert tail <= share * sum(sizes)
    if count < len(sizes):
        assert tail + sizes[-count - 1] > share * sum(sizes)
    assert last_share(params, 0) == frozenset()


@pytest.mark.parametrize("family", ["gpt2", "llama"])
def test_parameters_come_in_the_order_forward_reads_them(ctx, family):
    """The embeddings first, then the blocks in order, the final norm, the head last: the
    optimizer's CPU share is the end of this order."""
    config = (CONFIG if family == "gpt2" else LlamaConfig(
        vocab_size=101, hidden_size=32, intermediate_size=48, num_hidden_layers=3,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=16,
        tie_word_embeddings=False))
    model = FAMILIES[family](config, dict(TILING, head=2), create=False)
    names = [name for name, _ in model.named_parameters()]
    blocks = [int(n.split(".")[2]) for n in names if ".layers." in n or ".h." in n]
    assert blocks == sorted(blocks) and set(blocks) == {0, 1, 2}
    assert "embed" in names[0] or "wte" in names[0]
    assert names[-1] == "lm_head.weight"
    assert names[-2].startswith(("transformer.ln_f.", "model.norm."))
    assert sorted(names) == sorted(model.name_map.params())
