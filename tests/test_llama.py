"""Llama, and the families built on it, on StarPU against transformers' LlamaForCausalLM
(Qwen2ForCausalLM, ...): same weights, same numbers. A case names its family by
``model_type`` (none: llama).

In fp64 the reference computes in float64 throughout (``in_float64``): transformers computes
its rotary cos and sin, and RMSNorm, in fp32 whatever the model's dtype, which alone moves
its fp64 logits by about 1e-7. Its rotary inverse frequencies are then the float64 ones of
nntile.nn.rope.rope_inv_freq, which the test checks against transformers' own fp32 buffer
(and tests/test_llama_ops.py against its rope functions). The fp32 comparisons run
transformers unmodified.
"""
import functools
import types

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
transformers.logging.set_verbosity_error()

from nntile.models import LlamaConfig, LlamaLM, config_from_dict, model_class
from nntile.nn.rope import rope_inv_freq
from nntile.optim import AdamW
from tests.devices import tf32_tol
from tests.test_gpt2 import (adamw_like_torch, batches_of_two_shapes, check_against,
                             same_with_recompute)

B, T, V = 2, 19, 97
BASE = dict(vocab_size=V, num_hidden_layers=2, max_position_embeddings=32, rms_norm_eps=1e-5)
PARTIAL = dict(batch=1, seq=7, embd=24, inner=40, vocab=30)  # partial tiles everywhere
# Each case: transformers' config fields (model_type: the family, llama unless given) and our
# tiles (head: query heads per tile)
CASES = {
    "mha": (dict(hidden_size=32, intermediate_size=64, num_attention_heads=4), {}),
    "gqa 4:1, tied, partial": (
        dict(hidden_size=64, intermediate_size=96, num_attention_heads=8,
             num_key_value_heads=2, tie_word_embeddings=True), dict(PARTIAL, head=4)),
    "gqa 8:1, llama3, head_dim 12": (
        # wavelengths 6 to 13500 positions: each of llama3's three bands holds some
        dict(hidden_size=64, intermediate_size=96, num_attention_heads=8,
             num_key_value_heads=1, head_dim=12,
             rope_parameters=dict(rope_type="llama3", rope_theta=10000.0, factor=8.0,
                                  low_freq_factor=1.0, high_freq_factor=4.0,
                                  original_max_position_embeddings=512)),
        dict(PARTIAL, head=8)),
    "linear, biases, partial": (
        dict(hidden_size=48, intermediate_size=80, num_attention_heads=4,
             num_key_value_heads=2, attention_bias=True, mlp_bias=True,
             rope_parameters=dict(rope_type="linear", rope_theta=10000.0, factor=4.0)),
        dict(PARTIAL, head=2, embd=20)),
    # Qwen2: biases on q, k and v, none on o
    "qwen2: gqa 4:1, tied, partial": (
        dict(model_type="qwen2", hidden_size=64, intermediate_size=96, num_attention_heads=8,
             num_key_value_heads=2, tie_word_embeddings=True), dict(PARTIAL, head=4)),
    "qwen2: gqa 2:1, one key/value head per tile": (
        dict(model_type="qwen2", hidden_size=48, intermediate_size=80, num_attention_heads=4,
             num_key_value_heads=2), dict(head=2)),
    # Qwen3: q and k normalised per head before the rotation, head_dim apart from hidden/heads
    "qwen3: gqa 4:1, head_dim 12, tied, partial": (
        dict(model_type="qwen3", hidden_size=64, intermediate_size=96, num_attention_heads=8,
             num_key_value_heads=2, head_dim=12, tie_word_embeddings=True),
        dict(PARTIAL, head=4)),
    "qwen3: gqa 2:1, attention biases, one key/value head per tile": (
        dict(model_type="qwen3", hidden_size=48, intermediate_size=80, num_attention_heads=4,
             num_key_value_heads=2, head_dim=16, attention_bias=True), dict(head=2)),
}


def rel(a, b):
    return np.linalg.norm(np.asarray(a, np.float64) - b) / max(np.linalg.norm(b), 1e-30)


def hf_config(case):
    fields = dict(dict(BASE, tie_word_embeddings=False), **CASES[case][0])
    return transformers.AutoConfig.for_model(fields.pop("model_type", "llama"), **fields)


def our_config(hf_config):
    """Our config of a transformers config, of the family its model_type names."""
    return config_from_dict(hf_config.to_dict())


def ours_from(hf, tiles, dtype):
    """Our model of a transformers model, of its family."""
    return model_class(hf.config.model_type).from_transformers(hf, tiles, dtype)


def in_float64(hf):
    """Make the float64 reference compute its rotary cos and sin and its RMSNorms in float64
    (see the module's docstring), patching those modules of this model only."""
    emb = hf.model.rotary_emb
    config = our_config(hf.config)
    inv_freq, scale = rope_inv_freq(config.head_dim, config.rope_theta, config.rope_scaling)
    # the same frequencies as transformers' own, to its fp32 rounding
    np.testing.assert_allclose(inv_freq, emb.inv_freq.double().numpy(), rtol=1e-6)
    inv_freq = torch.from_numpy(inv_freq)

    def rotary(self, x, position_ids):
        freqs = position_ids[..., None].double() * inv_freq
        angle = torch.cat((freqs, freqs), dim=-1)
        return angle.cos() * scale, angle.sin() * scale

    def rmsnorm(self, x):
        return self.weight * x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True)
                                             + self.variance_epsilon)
    emb.forward = types.MethodType(rotary, emb)
    for module in hf.modules():  # LlamaRMSNorm, Qwen2RMSNorm, ...
        if type(module).__name__.endswith("RMSNorm"):
            module.forward = types.MethodType(rmsnorm, module)


def hf_model(case, dtype):
    torch.manual_seed(0)
    return reference_model(transformers.AutoModelForCausalLM.from_config(hf_config(case)),
                           dtype)


def reference_model(model, dtype):
    """A freshly built transformers model of the Llama kind in ``dtype``, with
    larger-than-default weights so every path carries signal, in eval mode (and float64
    throughout for fp64)."""
    model = model.to(dtype)
    with torch.no_grad():
        for name, p in model.named_parameters():
            p.add_((0.1 if "norm" in name else 0.05) * torch.randn_like(p))
    if dtype == torch.float64:
        in_float64(model)
    return model.eval()


def tokens(seed, batch=B, seq=T):
    rng = np.random.default_rng(seed)
    return rng.integers(0, V, (batch, seq)), rng.integers(0, V, (batch, seq))


def hf_loss_and_grads(model, ids, targets, autocast=False):
    model.zero_grad()
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
        logits = model(torch.from_numpy(ids)).logits
        if autocast:  # bf16 logits: the loss in fp32, as ours
            logits = logits.float()
        loss = torch.nn.functional.cross_entropy(logits.reshape(-1, V),
                                                 torch.from_numpy(targets).reshape(-1))
    loss.backward()
    grads = {n: p.grad.detach().double().numpy() for n, p in model.named_parameters()}
    return logits.detach().double().numpy(), loss.item(), grads


@functools.lru_cache(maxsize=None)
def reference(case, dtype_name, seed=1):
    """transformers' model, and its logits, loss and gradients on tokens(seed)."""
    hf = hf_model(case, torch.float64 if dtype_name == "fp64" else torch.float32)
    return hf, hf_loss_and_grads(hf, *tokens(seed))


@pytest.mark.parametrize("attention", ["fused", "unfused"])
@pytest.mark.parametrize("case", list(CASES))
@pytest.mark.parametrize("dtype, tol", [("fp32", 1e-5), ("fp64", 1e-10)])
def test_parity_with_transformers(ctx, case, dtype, tol, attention):
    hf, ref = reference(case, dtype)
    model = ours_from(hf, CASES[case][1], dtype)
    if attention == "unfused":
        model.unregister()
        config = our_config(hf.config).replace(attention="unfused")
        model = model_class(config.model_type)(config, CASES[case][1], dtype)
        model.load_state_dict({k: v.numpy() for k, v in hf.state_dict().items()})
    assert model.config.attention == attention
    check_against(model, ref, *tokens(1), tol)
    model.unregister()


@st.composite
def tilings(draw):
    """Tiles of every dimension of the 4:1 case, partial ones included: query heads by whole
    groups of 4 (the key/value tile is that divided by 4)."""
    return dict(batch=draw(st.integers(1, B)), seq=draw(st.integers(3, T)),
                embd=draw(st.integers(8, 64)), head=draw(st.sampled_from([4, 8])),
                inner=draw(st.integers(16, 96)), vocab=draw(st.integers(16, V)))


@pytest.mark.parametrize("case", ["gqa 4:1, tied, partial",
                                  "qwen3: gqa 4:1, head_dim 12, tied, partial"])
@settings(max_examples=4, deadline=None)
@given(tiling=tilings())
def test_any_tiling_gives_transformers_numbers(ctx, case, tiling):
    hf, ref = reference(case, "fp64")
    model = ours_from(hf, tiling, "fp64")
    check_against(model, ref, *tokens(1), 1e-10)
    model.unregister()


def test_rotary_frequencies_are_one_constant_of_the_model(ctx):
    """One inv_freq tensor for every block, fp64 in fp64 and fp32 otherwise (tf32: fp32
    storage under its own name); no parameter, so neither trained nor checkpointed."""
    config = LlamaConfig.from_transformers(hf_config("gqa 4:1, tied, partial"))
    for dtype, want in (("fp64", "fp64"), ("fp32", "fp32"), ("tf32", "tf32"),
                        ("bf16", "fp32"), ("bf16-mixed", "fp32")):
        model = LlamaLM(config, dtype=dtype, create=False)
        specs = [s for s in model.tensor_specs() if "inv_freq" in s.name]
        assert [(s.name, s.shape, s.dtype) for s in specs] == [
            ("model.rotary_emb.inv_freq", (config.head_dim // 2,), want)]
        assert all(block.self_attn.rotary is model.rotary_emb for block in model.blocks)
        assert not any("rotary" in name for name, _ in model.named_parameters())


def test_adamw_with_warmup_and_clipping_matches_torch(ctx):
    hf = hf_model("linear, biases, partial", torch.float32)
    model = LlamaLM.from_transformers(hf, CASES["linear, biases, partial"][1], "fp32")
    ours = adamw_like_torch(hf, model, [tokens(100 + step) for step in range(8)],
                            hf_loss_and_grads)
    errors = {name: rel(ours[name], p.detach().numpy()) for name, p in hf.named_parameters()}
    # Most of the key bias's gradient cancels: it adds q.R(j - i) b_k to the score of query
    # i and key j, which varies with j only through the rotation (the low frequencies turn
    # it little), and softmax ignores what is the same for every key of a row. Its gradient
    # is 10x smaller than the query bias's and holds more rounding, which Adam normalises
    # into full-size steps (GPT-2's key bias, whose gradient is exactly 0, is worse).
    bad = {name: error for name, error in errors.items()
           if not error < (1e-4 if "k_proj.bias" in name else 1e-5)}
    assert not bad
    model.unregister()


@pytest.mark.parametrize("case, slack", [
    ("gqa 4:1, tied, partial", 2 ** -9), ("gqa 8:1, llama3, head_dim 12", 2 ** -9),
    ("qwen3: gqa 4:1, head_dim 12, tied, partial", 2 ** -6)])
def test_bf16_mixed_against_autocast(ctx, case, slack):
    """bf16-mixed against transformers under torch.autocast(bfloat16).

    bf16 keeps 8 significant bits: one rounding moves a value by up to 2**-9 of it (~2e-3;
    ~4e-3 across two values rounded apart). Both sides round every GEMM operand and output,
    the SwiGLU product and attention's probabilities to bf16, but not at the same places
    (autocast rounds RMSNorm's output and the rotated q and k op by op; our kernels keep fp32
    inside and round once), so the two are two different bf16 computations of the same fp32
    model. Measured on these models: each is 0.5-0.9% from the fp32 model in its logits and
    1-2% in its worst gradient (RMSNorm weights and k_proj, whose gradients sum many rounded
    terms), and they are 0.5-0.8% (logits) and 1.1-1.8% (gradients) from each other. So the
    bounds: logits 2**-6 (~1.6e-2, a few roundings), gradients 2**-5 (each side within
    2**-6 of fp32), the loss, an fp32 mean whose rows' errors partly cancel, 2**-10.

    That is enough because the question is not whether we round as autocast does but
    whether we lose more than it does: our distance from the fp32 model is at most
    autocast's own plus one rounding (2**-9), for logits, loss and the worst gradient, and
    more than fp32 rounding (so bf16 is really used).

    Qwen3's gradients get more ``slack``: its per-head norm writes q and k in bf16 and the
    rotation rounds them again, where autocast's norm (an fp32 weight times bf16) keeps
    them fp32 until attention. Measured: the q_norm and k_norm weights' gradients 0.6-2.6%
    from fp32, autocast's 0.9-1.8%, the worse layer not the same on both sides."""
    hf = hf_model(case, torch.float32)
    ids, targets = tokens(1)
    ref_logits, ref_loss, ref_grads = hf_loss_and_grads(hf, ids, targets, autocast=True)
    fp32_logits, fp32_loss, fp32_grads = hf_loss_and_grads(hf, ids, targets)
    model = ours_from(hf, CASES[case][1], "bf16-mixed")
    logits = model.forward(ids)
    model.zero_grad()
    loss = model.loss(ids, targets)
    model.backward()
    grads = model.gradients()
    assert set(grads) == set(ref_grads)
    assert rel(logits, ref_logits) < 2 ** -6
    assert abs(loss - ref_loss) / ref_loss < 2 ** -10
    assert max(rel(grads[n], ref_grads[n]) for n in grads) < 2 ** -5
    assert 2 ** -12 < rel(logits, fp32_logits) < rel(ref_logits, fp32_logits) + 2 ** -9
    assert abs(loss - fp32_loss) <= abs(ref_loss - fp32_loss) + 2 ** -9 * fp32_loss
    assert max(rel(grads[n], fp32_grads[n]) for n in grads) < \
        max(rel(ref_grads[n], fp32_grads[n]) for n in grads) + slack
    # masters, gradients, norms and the rotary frequencies fp32; GEMM operands bf16
    head = model.lm_head
    assert (head.value.dtype, head.grad.dtype, head.copy.dtype) == ("fp32", "fp32", "bf16")
    assert model.norm.weight.copy is None
    assert model.rotary_emb.constant("inv_freq").dtype == "fp32"
    model.unregister()


@pytest.mark.parametrize("dtype, tol", [("tf32", 1e-5), ("bf16", 5e-2)])
def test_tf32_and_bf16_against_fp32(ctx, dtype, tol):
    """tf32 computes fp32 on CPU workers (TF32 is a GPU GEMM mode): transformers' fp32
    numbers there, a few TF32 roundings from them on a GPU (tests/devices.py). bf16
    (everything stored in bf16, computed in fp32) within a few percent of them, as
    tests/test_bf16.py bounds GPT-2."""
    if dtype == "tf32":
        tol = tf32_tol(tol)
    case = "gqa 8:1, llama3, head_dim 12"
    hf, (ref_logits, ref_loss, ref_grads) = reference(case, "fp32")
    model = LlamaLM.from_transformers(hf, CASES[case][1], dtype)
    ids, targets = tokens(1)
    assert rel(model.forward(ids), ref_logits) < tol
    model.zero_grad()
    assert abs(model.loss(ids, targets) - ref_loss) / ref_loss < tol
    model.backward()
    grads = model.gradients()
    for name, ref in ref_grads.items():
        assert np.isfinite(grads[name]).all() and rel(grads[name], ref) < tol, name
    model.unregister()


def test_backward_drops_what_forward_kept_and_changes_no_number(ctx):
    """free_activations (the default) invalidates each block's activations once backward has
    read them, and layer priorities only order tasks: three AdamW steps with both, with
    neither, and with one of each give the same losses and weights, bit for bit."""
    case = "gqa 4:1, tied, partial"
    hf, _ = reference(case, "fp32")
    runs = {}
    for free, priorities in ((True, True), (False, True), (True, False)):
        model = LlamaLM.from_transformers(hf, CASES[case][1], "fp32")
        model.free_activations, model.layer_priorities = free, priorities
        opt = AdamW(model.named_parameters(), lr=1e-3, weight_decay=0.1)
        losses = []
        for step in range(3):
            model.zero_grad()
            losses.append(model.loss(*tokens(200 + step)))
            model.backward()
            opt.step()
        ctx.wait()
        kept = [(name, t) for block in model.blocks for name, t in block.kept_buffers()]
        # a block keeps x1, out; both norms' stats and y; the y of q, k, v, o, gate, up and
        # down; the attention core's o and lse (fused); the MLP's h
        assert len(kept) == 16 * 2
        valid = {name: t.valid_tiles() for name, t in kept}
        if free:
            assert not any(valid.values()), valid
        else:
            assert all(valid[name] == t.ntiles for name, t in kept), valid
        runs[free, priorities] = losses, model.state_dict()
        model.unregister()
    losses, state = runs[True, True]
    for other_losses, other_state in runs.values():
        assert other_losses == losses
        for name, weights in state.items():
            np.testing.assert_array_equal(other_state[name], weights, err_msg=name)


@pytest.mark.parametrize("case, attention", [
    ("gqa 4:1, tied, partial", "fused"), ("linear, biases, partial", "unfused"),
    ("qwen3: gqa 4:1, head_dim 12, tied, partial", "fused")])
def test_recompute_gives_the_same_gradients(ctx, case, attention):
    config = our_config(hf_config(case)).replace(attention=attention)

    def make(recompute):
        model = model_class(config.model_type)(config, CASES[case][1], "fp32",
                                               recompute=recompute)
        model.init_weights(5)
        return model
    same_with_recompute(ctx, make, batches_of_two_shapes(tokens))


@pytest.mark.parametrize("case", ["gqa 4:1, tied, partial", "linear, biases, partial"])
def test_accumulated_micro_batches_give_the_whole_batch_gradients(ctx, case):
    """Gradients dropped by zero_grad, then two micro-batches of backward at half scale (the
    first overwrites each dropped tile, the second adds), equal those of the whole batch in
    fp64; again after an update, whose next zero_grad drops them once more."""
    model = model_class(hf_config(case).model_type)(our_config(hf_config(case)),
                                                    CASES[case][1], "fp64")
    model.init_weights(3)
    opt = AdamW(model.named_parameters(), lr=1e-3)
    ids, targets = tokens(11, batch=4)
    for _ in range(2):
        model.zero_grad()
        whole_loss = model.loss(ids, targets)
        model.backward()
        whole = model.gradients()
        model.zero_grad()
        halves = []
        for rows in (slice(0, 2), slice(2, 4)):
            halves.append(model.loss(ids[rows], targets[rows]))
            model.backward(0.5)
        assert np.mean(halves) == pytest.approx(whole_loss, rel=1e-12)
        for name, grad in model.gradients().items():
            np.testing.assert_allclose(grad, whole[name], rtol=1e-10, atol=1e-13,
                                       err_msg=name)
        opt.step()


def test_a_block_built_alone_has_its_own_rotary_frequencies(ctx):
    """LlamaBlock(config, tiles, dtype), as the skeleton's contract builds a block, works
    without a model: it then holds its rotary frequencies itself."""
    from nntile.models.llama import LlamaBlock
    config = LlamaConfig.from_transformers(hf_config("mha"))
    tiles = dict(batch=1, seq=T, embd=32, head=4, inner=64, vocab=V)
    block = LlamaBlock(config, tiles, "fp32")
    assert [s.name for s in block.declaration() if "inv_freq" in s.name] == \
        ["rotary_emb.inv_freq"]
    assert dict(block.named_modules())["rotary_emb."] is block.self_attn.rotary


def test_bad_input(ctx):
    config = LlamaConfig.from_transformers(hf_config("gqa 4:1, tied, partial"))
    with pytest.raises(ValueError, match="give a multiple of 4"):
        LlamaLM(config, {"head": 2})
    with pytest.raises(ValueError, match="vocab"):
        LlamaLM(config, {"vocab": 0})
    model = LlamaLM(config)
    with pytest.raises(ValueError, match="max_position_embeddings"):
        model.forward(np.zeros((1, 33), int))
    with pytest.raises(ValueError, match="outside the vocabulary"):
        model.forward(np.full((1, 8), V))
    with pytest.raises(RuntimeError, match="loss"):
        model.backward()
    model.unregister()
