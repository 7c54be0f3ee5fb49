"""transformers directories read and written without torch (nntile.transformers_io), against
the safetensors library, torch's bfloat16 and transformers' from_pretrained."""
import json
import os

import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
safetensors_torch = pytest.importorskip("safetensors.torch")
transformers.logging.set_verbosity_error()
transformers.logging.disable_progress_bar()

from nntile.models import GPT2Config, LlamaConfig
from nntile.transformers_io import (TransformersDirError, read_config, read_safetensors,
                                    read_state, write_safetensors, write_dir)

TORCH = {"fp32": torch.float32, "fp64": torch.float64, "bf16": torch.bfloat16,
         "fp16": torch.float16}


def awkward_floats(rng, n=4000):
    """Values that test rounding: random ones over many binades, halfway cases between two
    bf16 numbers (ties to even), the largest finite, the smallest subnormal, zeros, infinities
    and NaN."""
    bits = rng.integers(0, 2**32, n, dtype=np.uint64).astype(np.uint32)
    ties = (rng.integers(0, 2**16, 64, dtype=np.uint64).astype(np.uint32) << 16) | 0x8000
    special = np.array([0x00000000, 0x80000000, 0x7F7FFFFF, 0xFF7FFFFF, 0x00000001, 0x7F800000,
                        0xFF800000, 0x7FC00000, 0x7F7F8000, 0x3F808000, 0x3F818000],
                       dtype=np.uint32)
    return np.concatenate([bits, ties, special]).view(np.float32)


@pytest.mark.parametrize("dtype", ["fp32", "fp16", "bf16", "fp64"])
def test_read_safetensors_written_by_the_library(tmp_path, rng, dtype):
    tensors = {f"t{i}": torch.from_numpy(rng.standard_normal(shape)).to(TORCH[dtype])
               for i, shape in enumerate([(3, 5), (7,), (2, 3, 4), (0, 3), ()])}
    tensors["ids"] = torch.arange(6, dtype=torch.int64)
    path = str(tmp_path / "w.safetensors")
    safetensors_torch.save_file(tensors, path, metadata={"format": "pt"})
    for want in (np.float32, np.float64):
        got = read_safetensors(path, want)
        assert set(got) == set(tensors)
        for name, tensor in tensors.items():
            ref = tensor.to(torch.float64).numpy() if tensor.is_floating_point() else tensor.numpy()
            assert got[name].dtype == (want if tensor.is_floating_point() else np.int64)
            np.testing.assert_array_equal(got[name], ref.astype(got[name].dtype))


@pytest.mark.filterwarnings("ignore:invalid value encountered in cast")  # NaN to float64
@pytest.mark.parametrize("weights", ["fp32", "bf16", "fp64"])
def test_written_safetensors_read_by_the_library(tmp_path, rng, weights):
    # float32, as the masters are (torch rounds float64 to bf16 through float32)
    arrays = {"a": rng.standard_normal((4, 6)).astype(np.float32),
              "b": awkward_floats(rng, 99).reshape(2, -1), "c": np.float32(7.0)}
    path = str(tmp_path / "w.safetensors")
    write_safetensors(path, arrays, weights)
    got = safetensors_torch.load_file(path)
    for name, array in arrays.items():
        want = torch.from_numpy(np.asarray(array, np.float64 if weights == "fp64"
                                           else np.float32)).to(TORCH[weights])
        assert got[name].dtype == TORCH[weights]
        assert torch.equal(got[name], want) or (
            torch.isnan(want).any() and torch.equal(got[name].isnan(), want.isnan()) and
            torch.equal(got[name][~want.isnan()], want[~want.isnan()]))
    assert not os.path.exists(path + ".tmp")


def tiny_llama(tied, seed=0, **extra):
    torch.manual_seed(seed)
    config = transformers.LlamaConfig(
        vocab_size=40, hidden_size=16, intermediate_size=24, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=tied,
        max_position_embeddings=64, **extra)
    return transformers.LlamaForCausalLM(config).eval()


@pytest.mark.parametrize("tied, dtype, shard", [(True, "bf16", "2KB"), (False, "fp32", "4KB"),
                                                (False, "fp16", None)])
def test_read_a_saved_llama_directory(tmp_path, tied, dtype, shard):
    hf = tiny_llama(tied, attention_bias=True, mlp_bias=not tied,
                    rope_scaling={"rope_type": "linear", "factor": 2.0}).to(TORCH[dtype])
    hf.save_pretrained(tmp_path, **({"max_shard_size": shard} if shard else {}))
    files = sorted(os.listdir(tmp_path))
    assert ("model.safetensors.index.json" in files) == bool(shard)
    config, notes = read_config(str(tmp_path))
    assert config == LlamaConfig.from_transformers(hf.config) and not notes
    state = read_state(str(tmp_path))
    want = {k: v.float().numpy() for k, v in hf.state_dict().items()}
    assert set(state) == set(want) - ({"lm_head.weight"} if tied else set())
    for name, array in state.items():
        assert array.dtype == np.float32
        np.testing.assert_array_equal(array, want[name], err_msg=name)
    config.name_map().check(state)


def test_read_pytorch_bin_shards(tmp_path):
    hf = tiny_llama(False)
    state = {k: v.to(torch.bfloat16) for k, v in hf.state_dict().items()}
    names = sorted(state)
    shards = {"pytorch_model-1.bin": names[:5], "pytorch_model-2.bin": names[5:]}
    for file, keys in shards.items():
        torch.save({k: state[k] for k in keys}, tmp_path / file)
    (tmp_path / "pytorch_model.bin.index.json").write_text(json.dumps(
        {"weight_map": {k: file for file, keys in shards.items() for k in keys}}))
    got = read_state(str(tmp_path), np.float64)
    for name, tensor in state.items():
        np.testing.assert_array_equal(got[name], tensor.double().numpy())


@pytest.mark.parametrize("tied", [True, False])
@pytest.mark.parametrize("weights", ["fp32", "bf16"])
def test_written_directory_loads_in_transformers(tmp_path, tied, weights):
    hf = tiny_llama(tied, seed=1, rope_theta=5e5, rope_scaling=dict(
        rope_type="llama3", factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0,
        original_max_position_embeddings=32))
    config = LlamaConfig.from_transformers(hf.config)
    state = {k: v.numpy() for k, v in hf.state_dict().items()
             if k in config.name_map().hf_shapes()}
    write_dir(str(tmp_path), config, state, weights)
    stored = safetensors_torch.load_file(tmp_path / "model.safetensors")
    assert ("lm_head.weight" in stored) == (not tied)
    back = transformers.AutoModelForCausalLM.from_pretrained(tmp_path, local_files_only=True)
    assert type(back) is transformers.LlamaForCausalLM
    assert back.config.tie_word_embeddings == tied
    assert back.config.rope_parameters == hf.config.rope_parameters
    assert back.config.torch_dtype == TORCH[weights]
    for name, tensor in hf.state_dict().items():
        want = tensor.to(TORCH[weights])
        assert torch.equal(back.state_dict()[name], want), name
    if weights == "fp32":  # the same model: the same logits
        ids = torch.randint(0, 40, (2, 9), generator=torch.Generator().manual_seed(0))
        with torch.no_grad():
            assert torch.equal(back(ids).logits, hf(ids).logits)


def test_bad_directories(tmp_path):
    def directory(name, config=None, files=()):
        path = tmp_path / name
        path.mkdir()
        if config is not None:
            (path / "config.json").write_text(json.dumps(config))
        for file, data in files:
            (path / file).write_bytes(data)
        return str(path)

    llama = dict(model_type="llama", vocab_size=40, hidden_size=16, intermediate_size=24,
                 num_hidden_layers=1, num_attention_heads=4)
    weights = [("model.safetensors", b"")]
    cases = [
        (str(tmp_path / "missing"), "is not a directory"),
        (directory("empty"), "has no config.json"),
        (directory("bare", llama), "has no model.safetensors"),
        (directory("bert", {"model_type": "bert"}, weights), "holds a 'bert' model"),
        (directory("yarn", dict(llama, rope_scaling={"rope_type": "yarn", "factor": 2.0}),
                   weights), "'yarn' is not implemented"),
        (directory("gelu", dict(llama, hidden_act="gelu"), weights), "only silu"),
        (directory("json", None, [("config.json", b"{"), *weights]), "cannot be read"),
    ]
    for path, words in cases:
        with pytest.raises(TransformersDirError, match=words):
            read_config(path)
    assert read_config(directory("dropout", dict(llama, attention_dropout=0.1), weights))[1] \
        == ["attention_dropout=0.1 ignored (nntile trains without dropout)"]
    # damaged weights: each a clear error
    good = tmp_path / "good"
    tiny_llama(False).save_pretrained(good)
    data = (good / "model.safetensors").read_bytes()
    for name, damaged, words in [
            ("short", data[:5], "too short"),
            ("cut", data[:-100], "do not fit its shape"),
            ("header", data[:8] + b"x" + data[9:], "not a safetensors file"),
            ("length", (2**40).to_bytes(8, "little") + data[8:], "header length")]:
        path = directory(name, files=[("model.safetensors", damaged)])
        with pytest.raises(TransformersDirError, match=words):
            read_state(path)
    index = directory("index", files=[("model.safetensors.index.json", json.dumps(
        {"weight_map": {"lm_head.weight": "model-00002.safetensors"}}).encode())])
    with pytest.raises(TransformersDirError, match="names 'model-00002.safetensors'"):
        read_state(index)
    gpt2 = GPT2Config(vocab_size=40, n_positions=8, n_embd=8, n_layer=1, n_head=2)
    with pytest.raises(KeyError, match="no 'transformer.wte.weight'"):
        gpt2.name_map().check(read_state(str(good)))
