"""Model families against transformers: configs (fields, checks, parameter counts), name maps
(keys, shapes and what each transposition and cut means) and the registry."""
import copy

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
transformers.logging.set_verbosity_error()

from nntile.cli_common import CLIError, resolve_tiling
from nntile.models import (FAMILIES, CausalLM, GPT2Config, GPT2LMHead, LlamaConfig, LlamaLM,
                           config_from_dict, model_class, trainable)

# the parity targets people use (their transformers configs: shapes only, no weights)
LLAMA3 = dict(rope_type="llama3", factor=32.0, low_freq_factor=1.0, high_freq_factor=4.0,
              original_max_position_embeddings=8192)
TARGETS = {
    "TinyLlama-1.1B": dict(vocab_size=32000, hidden_size=2048, intermediate_size=5632,
                           num_hidden_layers=22, num_attention_heads=32, num_key_value_heads=4,
                           tie_word_embeddings=False, rms_norm_eps=1e-5),
    "SmolLM2-135M": dict(vocab_size=49152, hidden_size=576, intermediate_size=1536,
                         num_hidden_layers=30, num_attention_heads=9, num_key_value_heads=3,
                         tie_word_embeddings=True, max_position_embeddings=8192,
                         rope_theta=100000.0, rms_norm_eps=1e-5),
    "Llama-3.2-1B": dict(vocab_size=128256, hidden_size=2048, intermediate_size=8192,
                         num_hidden_layers=16, num_attention_heads=32, num_key_value_heads=8,
                         head_dim=64, tie_word_embeddings=True, max_position_embeddings=131072,
                         rope_theta=500000.0, rope_scaling=LLAMA3, rms_norm_eps=1e-5),
}
# published counts (the model cards), for the transformers side of the comparison
PUBLISHED = {"TinyLlama-1.1B": 1_100_048_384, "SmolLM2-135M": 134_515_008,
             "Llama-3.2-1B": 1_235_814_400}


def hf_count(hf_config):
    """transformers' parameter count, the model built on the meta device (no weights)."""
    with torch.device("meta"):
        model = transformers.AutoModelForCausalLM.from_config(hf_config)
    return model.num_parameters()


@pytest.mark.parametrize("name", list(TARGETS))
def test_parameter_counts_of_the_parity_targets(name):
    hf_config = transformers.LlamaConfig(**copy.deepcopy(TARGETS[name]))  # it changes dicts
    config = LlamaConfig.from_transformers(hf_config)
    assert config.num_parameters() == hf_count(hf_config) == PUBLISHED[name]
    assert config.head_dim == 64
    assert config.num_key_value_heads == TARGETS[name]["num_key_value_heads"]
    assert config.rope_scaling == (LLAMA3 if name == "Llama-3.2-1B" else None)
    # what we write is what transformers reads, rotary positions included
    back = transformers.LlamaConfig.from_dict(config.to_transformers_dict())
    assert hf_count(back) == PUBLISHED[name]
    assert back.rope_parameters == hf_config.rope_parameters
    assert LlamaConfig.from_transformers(back) == config


def inv_freq(hf_config):
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS
    kind = hf_config.rope_parameters["rope_type"]
    if kind == "default":
        base, dim = hf_config.rope_parameters["rope_theta"], hf_config.head_dim
        return 1.0 / base ** (np.arange(0, dim, 2) / dim)
    return ROPE_INIT_FUNCTIONS[kind](hf_config, "cpu")[0].numpy()


@pytest.mark.parametrize("rope", [
    {"rope_theta": 500000.0, "rope_scaling": dict(LLAMA3)},                      # 4.x
    {"rope_theta": 500000.0, "rope_scaling": dict(LLAMA3, type="llama3")},
    {"rope_theta": 2e4, "rope_scaling": {"type": "linear", "factor": 4.0}},       # 4.x, old key
    {"rope_parameters": dict(LLAMA3, rope_theta=500000.0)},                       # 5.x
    {"rope_parameters": {"rope_type": "default", "rope_theta": 1e4}},
    {},
])
def test_both_spellings_of_rotary_positions(rope):
    data = dict(model_type="llama", vocab_size=100, hidden_size=64, intermediate_size=96,
                num_hidden_layers=1, num_attention_heads=4, num_key_value_heads=2,
                max_position_embeddings=16384, **rope)
    config = config_from_dict(data)
    assert isinstance(config, LlamaConfig)
    # the frequencies transformers computes from the original and from what we write agree
    theirs = transformers.LlamaConfig.from_dict({k: v for k, v in data.items()
                                                 if k != "model_type"})
    ours = transformers.LlamaConfig.from_dict(config.to_transformers_dict())
    np.testing.assert_array_equal(inv_freq(ours), inv_freq(theirs))
    assert config_from_dict(config.to_dict()) == config


@pytest.mark.parametrize("change, words", [
    (dict(hidden_act="gelu"), "only silu"),
    (dict(rope_scaling={"rope_type": "yarn", "factor": 2.0}), "'yarn' is not implemented"),
    (dict(rope_scaling={"rope_type": "dynamic", "factor": 2.0}), "'dynamic'"),
    (dict(rope_scaling={"rope_type": "linear"}), "positive factor"),
    (dict(rope_scaling=dict(LLAMA3, low_freq_factor=4.0)), "low_freq_factor <"),
    (dict(rope_parameters=dict(LLAMA3, partial_rotary_factor=0.5, rope_theta=1e4)),
     "partial_rotary_factor"),
    (dict(num_key_value_heads=3), "not divisible by num_key_value_heads"),
    (dict(hidden_size=66), "not divisible by num_attention_heads"),
    (dict(head_dim=7), "must be even"),
    (dict(rms_norm_eps=0), "rms_norm_eps"),
    (dict(vocab_size=0), "vocab_size"),
    (dict(mlp_bias="yes"), "mlp_bias"),
])
def test_llama_config_refuses_what_nntile_does_not_compute(change, words):
    data = dict(dict(model_type="llama", vocab_size=100, hidden_size=64, intermediate_size=96,
                     num_hidden_layers=1, num_attention_heads=4), **change)
    with pytest.raises(ValueError, match=words):
        config_from_dict(data)


def test_dropout_is_read_and_named_as_ignored():
    assert LlamaConfig.ignored({"attention_dropout": 0.1}) == [
        "attention_dropout=0.1 ignored (nntile trains without dropout)"]
    assert LlamaConfig.ignored({"attention_dropout": 0.0}) == []
    assert len(GPT2Config.ignored({"resid_pdrop": 0.1, "embd_pdrop": 0.1, "attn_pdrop": 0})) == 2


def llama_case():
    """Small Llama configs of every kind: grouped heads, head_dim given apart, biases, tied."""
    return st.builds(
        lambda kv, group, head_dim, own_dim, inner, layers, attention_bias, mlp_bias, tied:
        dict(vocab_size=37, hidden_size=8 * kv * group, num_attention_heads=kv * group,
             num_key_value_heads=kv, head_dim=head_dim if own_dim else None,
             intermediate_size=inner, num_hidden_layers=layers, attention_bias=attention_bias,
             mlp_bias=mlp_bias, tie_word_embeddings=tied),
        st.integers(1, 3), st.integers(1, 3), st.sampled_from([2, 6, 10]), st.booleans(),
        st.integers(1, 20), st.integers(1, 2), st.booleans(), st.booleans(), st.booleans())


@settings(max_examples=12, deadline=None)
@given(llama_case())
def test_llama_name_map_is_transformers_state_dict(fields):
    torch.manual_seed(0)
    hf = transformers.LlamaForCausalLM(transformers.LlamaConfig(**fields))
    check_name_map(hf, LlamaConfig.from_transformers(hf.config))
    # nn.Linear is [out, in], ours [in, out] with heads apart: the same products
    config = LlamaConfig.from_transformers(hf.config)
    ours = dict(config.name_map().to_ours(state_of(hf)))
    x = np.random.default_rng(0).standard_normal((3, config.hidden_size))
    attn = hf.model.layers[0].self_attn
    H, Hkv, E, D = (config.num_attention_heads, config.num_key_value_heads,
                    config.hidden_size, config.head_dim)
    for name, heads in (("q_proj", H), ("k_proj", Hkv), ("v_proj", Hkv)):
        weight = ours[f"model.layers.0.self_attn.{name}.weight"]
        assert weight.shape == (E, heads, D)
        want = getattr(attn, name)(torch.from_numpy(x).float()).detach().numpy()
        bias = ours.get(f"model.layers.0.self_attn.{name}.bias", 0)
        got = np.einsum("te,ehd->thd", x, weight) + bias
        np.testing.assert_allclose(got.reshape(3, -1), want, rtol=1e-5, atol=1e-5)
    heads = np.random.default_rng(1).standard_normal((3, config.num_attention_heads,
                                                      config.head_dim))
    want = attn.o_proj(torch.from_numpy(heads.reshape(3, -1)).float()).detach().numpy()
    got = np.einsum("thd,hde->te", heads, ours["model.layers.0.self_attn.o_proj.weight"]) + \
        ours.get("model.layers.0.self_attn.o_proj.bias", 0)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
    assert config.num_parameters() == hf.num_parameters()


def state_of(hf):
    return {k: v.detach().numpy() for k, v in hf.state_dict().items()}


def check_name_map(hf, config):
    """The map's names and shapes are transformers' (a tied head aside), every parameter
    appears once, and import then export gives back transformers' very arrays."""
    state = state_of(hf)
    name_map = config.name_map()
    tied = {"lm_head.weight"} if config.tie_word_embeddings else set()
    assert set(name_map.hf_shapes()) == set(state) - tied
    for name, shape in name_map.hf_shapes().items():
        assert shape == state[name].shape, name
    ours = dict(name_map.to_ours(state))
    assert {k: v.shape for k, v in ours.items()} == name_map.params()
    back = name_map.to_hf(ours.__getitem__)
    for name, array in back.items():
        np.testing.assert_array_equal(array, state[name], err_msg=name)
    return ours


@pytest.mark.parametrize("tied", [True, False])
def test_gpt2_name_map_is_transformers_state_dict(tied):
    torch.manual_seed(0)
    hf = transformers.GPT2LMHeadModel(transformers.GPT2Config(
        vocab_size=50, n_positions=16, n_embd=12, n_layer=2, n_head=3,
        tie_word_embeddings=tied))
    config = GPT2Config.from_transformers(hf.config)
    ours = check_name_map(hf, config)
    c_attn = hf.transformer.h[1].attn.c_attn.weight.detach().numpy()
    for j, x in enumerate("qkv"):  # the fused projection is q, k, v side by side
        np.testing.assert_array_equal(ours[f"transformer.h.1.attn.{x}.weight"].reshape(12, 12),
                                      c_attn[:, 12 * j:12 * (j + 1)])
    assert config.num_parameters() == hf.num_parameters()
    # a GPT2Model's state dict (no prefix, no head) loads under the full model's names
    base = {k[len("transformer."):]: v for k, v in state_of(hf).items()
            if k.startswith("transformer.")}
    if tied:
        assert dict(config.name_map().to_ours(base)).keys() == ours.keys()
    state = dict(state_of(hf), **{"transformer.h.0.attn.bias": np.zeros(1)})
    config.name_map().check(state)  # an older checkpoint's buffer is no parameter
    with pytest.raises(ValueError, match="holds 'transformer.h.0.attn.extra'"):
        config.name_map().check(dict(state, **{"transformer.h.0.attn.extra": np.zeros(1)}))
    with pytest.raises(ValueError, match=r"ln_f.bias: shape \(13,\), the model expects \(12,\)"):
        config.name_map().check(dict(state, **{"transformer.ln_f.bias": np.zeros(13)}))
    with pytest.raises(KeyError, match="no 'transformer.wpe.weight'"):
        config.name_map().check({k: v for k, v in state.items() if "wpe" not in k})


def test_small_llama_is_the_size_of_the_default_gpt2():
    gpt2, llama = GPT2Config.small(256, 128), LlamaConfig.small(256, 128)
    assert gpt2.num_parameters() == 842_496
    assert llama.num_parameters() == hf_count(transformers.LlamaConfig(
        **{k: v for k, v in llama.to_transformers_dict().items() if k != "model_type"}))
    assert abs(llama.num_parameters() / gpt2.num_parameters() - 1) < 0.01
    assert (llama.num_attention_heads, llama.num_key_value_heads) == (4, 2)


def test_grouped_heads_are_tiled_by_whole_groups():
    config = LlamaConfig(vocab_size=64, hidden_size=96, intermediate_size=64,
                         num_hidden_layers=1, num_attention_heads=12, num_key_value_heads=3)
    for head in (4, 8, 12):  # groups of 4 heads: the key/value tile is head / 4
        assert CausalLM.check_tiling({"head": head}, config)["head"] == head
        assert resolve_tiling({"head": head}, config)["head"] == head
    for head in (1, 2, 6, 9):
        with pytest.raises(ValueError, match="give a multiple of 4"):
            CausalLM.check_tiling({"head": head}, config)
        with pytest.raises(CLIError, match=f"--tile-head {head}: .*splits a group of 4"):
            resolve_tiling({"head": head}, config)
    gpt2 = GPT2Config(vocab_size=64, n_positions=8, n_embd=12, n_layer=1, n_head=3)
    assert resolve_tiling({"head": 2}, gpt2)["head"] == 2  # no groups: any head tile


def test_registry():
    assert set(FAMILIES) == {"gpt2", "llama", "qwen2", "qwen3", "mistral"}
    assert type(config_from_dict({"n_embd": 12, "n_head": 3})) is GPT2Config  # old checkpoints
    assert config_from_dict(GPT2Config().to_dict()) == GPT2Config()
    assert model_class("gpt2") is GPT2LMHead
    with pytest.raises(ValueError, match="'bert' is not a family nntile has"):
        config_from_dict({"model_type": "bert"})
    with pytest.raises(ValueError, match="is not llama"):
        LlamaConfig.from_dict({"model_type": "gpt2"})
    assert model_class("llama") is LlamaLM and trainable() == list(FAMILIES)
    config = LlamaConfig.small(256, 16)
    assert len(LlamaLM(config, create=False).blocks) == 4
    with pytest.raises(TypeError, match="GPT2LMHead needs a GPT2Config, got LlamaConfig"):
        GPT2LMHead(config, create=False)
    with pytest.raises(TypeError, match="LlamaLM needs a LlamaConfig, got GPT2Config"):
        LlamaLM(GPT2Config(), create=False)


def test_gpt2_to_transformers_and_back(ctx):
    torch.manual_seed(3)
    hf = transformers.GPT2LMHeadModel(transformers.GPT2Config(
        vocab_size=50, n_positions=16, n_embd=12, n_layer=2, n_head=3, resid_pdrop=0.0,
        embd_pdrop=0.0, attn_pdrop=0.0, tie_word_embeddings=False))
    model = GPT2LMHead.from_transformers(hf, dict(embd=5, head=2, vocab=16), "fp64")
    back = model.to_transformers()
    assert back.dtype == torch.float64 and not back.config.tie_word_embeddings
    for name, tensor in hf.state_dict().items():
        assert torch.equal(back.state_dict()[name], tensor.double()), name
    model.unregister()


# families built on Llama's model: transformers' config class and small configs of each
QWEN = {"qwen2": transformers.Qwen2Config, "qwen3": transformers.Qwen3Config}


@pytest.mark.parametrize("model_type", list(QWEN))
@pytest.mark.parametrize("tied", [True, False])
def test_qwen_name_map_config_and_count_are_transformers(model_type, tied):
    torch.manual_seed(0)
    hf_config = QWEN[model_type](vocab_size=37, hidden_size=24, intermediate_size=20,
                                 num_hidden_layers=2, num_attention_heads=4,
                                 num_key_value_heads=2, tie_word_embeddings=tied,
                                 head_dim=10)  # Qwen3's: not hidden / heads
    hf = transformers.AutoModelForCausalLM.from_config(hf_config)
    config = config_from_dict(hf_config.to_dict())
    assert type(config).model_type == model_type and type(FAMILIES[model_type](
        config, create=False).config) is type(config)
    check_name_map(hf, config)
    assert config.num_parameters() == hf.num_parameters()
    # what we write is what transformers reads, and reads back to the same config
    data = config.to_transformers_dict()
    assert data["architectures"] == [type(hf).__name__]
    back = transformers.AutoConfig.for_model(data.pop("model_type"), **data)
    assert config_from_dict(back.to_dict()) == config
    assert hf_count(back) == hf.num_parameters()


@pytest.mark.parametrize("model_type", list(QWEN))
@pytest.mark.parametrize("change, words", [
    (dict(use_sliding_window=True), "use_sliding_window true is not implemented"),
    (dict(layer_types=["sliding_attention"]), "layer_types other than full_attention"),
    (dict(mlp_bias=True), "MLP has no biases"),
])
def test_qwen_config_refuses_a_window(model_type, change, words):
    data = dict(model_type=model_type, vocab_size=100, hidden_size=64, intermediate_size=96,
                num_hidden_layers=1, num_attention_heads=4, **change)
    with pytest.raises(ValueError, match=words):
        config_from_dict(data)
