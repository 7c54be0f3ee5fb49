"""A replica of the model per device of one process (nntile.parallel.DeviceReplicas), on the
CI's CPU workers grouped into devices (Context(device_replicas=2)): every task of a replica
pinned to its device, gradients summed and updates run on each tile's home device. Losses and
weights against one model trained on the same batches. Each runtime with device groups runs
in a fresh interpreter, beside the session's."""
import json

import numpy as np
import pytest

import nntile
from nntile import ops, policy
from nntile.models.gpt2 import GPT2LMHead
from nntile.models.gpt2_config import GPT2Config
from nntile.models.llama import LlamaLM
from nntile.models.llama_config import LlamaConfig
from nntile.optim import AdamW
from nntile.parallel import DataParallel
from tests.conftest import run_python

LLAMA = LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                    num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=16)
GPT2 = GPT2Config(vocab_size=64, n_positions=16, n_embd=32, n_layer=2, n_head=4)


def _train(model_type, config, devices, steps=3, accumulate=1):
    """(losses, summed gradients of the first step by name, homes of the first weight, the
    gradient norm of each step) of
    ``steps`` AdamW steps on fixed batches of 4 x 16, ``accumulate`` micro-batches each.
    (Weights after AdamW are no measure: a gradient that is zero but for rounding, GPT-2's
    key bias's, gets a full step of either sign.)"""
    rng = np.random.default_rng(0)
    batches = [(rng.integers(0, 64, (4, 16)), rng.integers(0, 64, (4, 16)))
               for _ in range(steps * accumulate)]
    with nntile.Context(ncpu=2, ncuda=0, device_replicas=devices) as ctx:
        model = model_type(config, tiling={"batch": 1, "embd": 16, "inner": 32,
                                           "vocab": 32}, dtype="fp32")
        model.init_weights(1)
        replicas = DataParallel(model, ctx)
        opt = AdamW(model.named_parameters(), lr=1e-2, max_grad_norm=1.0)
        losses, grads, norms = [], None, []
        for step in range(steps):
            replicas.zero_grad()
            for micro in range(accumulate):
                x, y = batches[step * accumulate + micro]
                losses.append(replicas.loss(x, y))
                replicas.backward(1.0 / accumulate, reduce=micro == accumulate - 1)
            if grads is None:
                grads = {name: p.grad.to_array() for name, p in model.named_parameters()}
            opt.step()
            norms.append(opt.grad_norm())
        homes = next(iter(model.named_parameters()))[1].value.homes
        assert ctx.device_replicas == devices
    return losses, grads, homes, norms


def _train_apart(family, devices, steps=3, accumulate=1):
    """``_train`` in a fresh interpreter (``family``: "llama" or "gpt2")."""
    result = run_python(f"""
        import json
        from tests.test_device_replicas import _train, FAMILIES
        losses, grads, homes, norms = _train(*FAMILIES[{family!r}], {devices}, {steps},
                                             {accumulate})
        print(json.dumps([losses, {{k: v.tolist() for k, v in grads.items()}}, homes, norms]))
        """, timeout=300)
    assert result.returncode == 0, result.stderr
    losses, grads, homes, norms = json.loads(result.stdout.splitlines()[-1])
    return losses, {k: np.array(v) for k, v in grads.items()}, homes, norms


FAMILIES = {"llama": (LlamaLM, LLAMA), "gpt2": (GPT2LMHead, GPT2)}


@pytest.mark.parametrize("family", ["llama", "gpt2"])
def test_replicas_per_device_train_as_one_model(family):
    one, grads_one, homes_one, norms_one = _train_apart(family, 1)
    two, grads_two, homes_two, norms_two = _train_apart(family, 2)
    np.testing.assert_allclose(two, one, rtol=1e-6)
    # the norm's partials, one per device, against numpy's norm of the summed gradients
    numpy_norm = np.sqrt(sum(np.sum(g.astype(np.float64) ** 2) for g in grads_one.values()))
    np.testing.assert_allclose(norms_one[0], numpy_norm, rtol=1e-5)
    np.testing.assert_allclose(norms_two, norms_one, rtol=1e-5)
    for name, value in grads_one.items():
        np.testing.assert_allclose(grads_two[name], value, rtol=1e-4, atol=1e-6, err_msg=name)
    assert set(homes_one) == {None}
    assert set(homes_two) <= {0, 1}


@pytest.mark.parametrize("family", ["llama", "gpt2"])  # GPT-2's head is tied, Llama's is not
def test_replicas_per_device_accumulate_micro_batches(family):
    one, grads_one, _, _ = _train_apart(family, 1, steps=2, accumulate=2)
    two, grads_two, _, _ = _train_apart(family, 2, steps=2, accumulate=2)
    np.testing.assert_allclose(two, one, rtol=1e-6)
    for name, value in grads_one.items():
        np.testing.assert_allclose(grads_two[name], value, rtol=1e-4, atol=1e-6, err_msg=name)


def test_homes_share_the_bytes_and_bad_devices_are_refused():
    result = run_python("""
        import numpy as np, pytest, nntile
        from nntile import ops
        from nntile.models.llama import LlamaLM
        from nntile.parallel import DataParallel
        from tests.test_device_replicas import LLAMA
        with pytest.raises((ValueError, RuntimeError), match="3"):
            nntile.Context(ncpu=2, ncuda=0, device_replicas=3)
        with pytest.raises(ValueError, match="device_replicas"):
            nntile.Context(ncpu=2, ncuda=0, device_replicas="yes", start=False)
        with pytest.raises(ValueError, match="batch of 3 rows"):
            nntile.Context(ncpu=2, ncuda=0, device_replicas=2, run_batch=3)
        assert nntile.current_context() is None
        with nntile.Context(ncpu=2, ncuda=0, device_replicas=2) as ctx:
            model = LlamaLM(LLAMA, tiling={"batch": 1, "embd": 16, "inner": 32}, dtype="fp32")
            replicas = DataParallel(model, ctx)
            held, largest = [0, 0], 0
            for _, param in model.named_parameters():
                sizes = param.specs[0].tile_bytes()
                largest = max(largest, max(sizes))
                for home, size in zip(param.value.homes, sizes):
                    held[home] += size
                assert param.grad.homes == param.value.homes
            assert abs(held[0] - held[1]) <= largest, held
            with pytest.raises(ValueError, match="drives 2"):
                ops.set_task_device(2)
            with pytest.raises(ValueError, match="homes for"):
                model.lm_head.value.set_homes([0])
            with pytest.raises(ValueError, match="unequally"):
                replicas.submit_loss(np.zeros((3, 16), dtype=np.int64),
                                     np.zeros((3, 16), dtype=np.int64))
        print("ok")
        """)
    assert result.returncode == 0 and result.stdout.strip() == "ok", result.stderr


def test_policy_keeps_a_replica_per_gpu_where_it_fits():
    gib = 2**30
    llama_8b_b8 = dict(parameters=32 * gib, gradients=32 * gib, optimizer_states=64 * gib,
                       compute_copies=16 * gib, activations=60 * gib, workspaces=5 * gib,
                       logits=8 * gib)
    need = policy.device_replica_bytes(llama_8b_b8, 2)
    # copies whole; half of masters, states, workspaces and logits, and of the larger of the
    # gradients and the activations
    assert need == int(16 * gib + (96 + 13 + 60) * gib / 2)
    assert policy.device_replica_bytes(dict(llama_8b_b8, activations=20 * gib), 2) == \
        int(16 * gib + (96 + 13 + 32) * gib / 2)
    assert policy.device_replicas(None, 2, 1, need, 136 * gib).value == 2
    assert policy.device_replicas(None, 2, 1, need, 96 * gib).value == 1
    # Llama-2-13B's shape at batch 8, activations recomputed: a replica per GPU of an H200
    llama_13b = dict(parameters=48.5 * gib, gradients=48.5 * gib, optimizer_states=97 * gib,
                     compute_copies=23.9 * gib, activations=15.8 * gib, workspaces=3.3 * gib,
                     logits=1 * gib)
    assert policy.device_replicas(None, 2, 1, policy.device_replica_bytes(llama_13b, 2),
                                  136 * gib).value == 2
    assert policy.device_replicas(None, 4, 1, policy.device_replica_bytes(llama_8b_b8, 4),
                                  96 * gib).value == 4
    assert policy.device_replicas(True, 2, 1, need, 96 * gib).value == 2
    assert policy.device_replicas(None, 2, 2).value == 1  # StarPU-MPI owners
    assert policy.device_replicas(None, 2, 1, rows=5).value == 1  # not shared equally
    assert policy.device_replicas(None, 2, 1, rows=6).value == 2
    assert policy.device_replicas(None, 1, 1).value == 1
    fp32 = dict(llama_8b_b8, compute_copies=0)
    assert policy.device_replica_bytes(fp32, 2) == int(32 * gib + (64 + 13 + 60) * gib / 2)


@pytest.mark.parametrize("model_type,config", [(LlamaLM, LLAMA), (GPT2LMHead, GPT2)])
def test_backward_pieces_hand_over_every_parameter_once(ctx, model_type, config):
    model = model_type(config, dtype="fp32")
    model.init_weights(0)
    ids = np.zeros((1, 8), dtype=np.int64)
    model.submit_loss(ids, ids)
    pieces = [[id(p) for p in piece] for piece in model.backward_steps()]
    handed = [i for piece in pieces for i in piece]
    assert sorted(handed) == sorted(id(p) for _, p in model.named_parameters())
    assert len(pieces) == config.num_hidden_layers + 2
    # with the lookup's part added elsewhere, a tied table comes with the head's piece and an
    # untied one with none (its gradient is summed where the lookup adds)
    model.submit_loss(ids, ids)
    table = model.embedding.weight
    pieces = list(model.backward_steps(1.0, table.grad))
    untied = [] if config.tie_word_embeddings else [id(table)]
    assert sorted(id(p) for piece in pieces for p in piece) == sorted(
        i for i in handed if i not in untied)
    assert model.lm_head in pieces[0] and model.lm_head not in pieces[-1]
    ctx.wait()
    model.unregister()
