"""Generation with a key/value cache (nntile.models.kv_cache): 64 greedy tokens equal to
transformers' generate (greedy, with its cache) for every family in GENERATION, and prompts
of two lengths each equal to transformers' generate of that prompt alone; the cache's
tensor ops (copy_into, flash attention of a query tile against a longer, differently tiled
cache) against numpy; sampling, end-of-sequence and stop text; bad input refused before any
task."""
import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
transformers.logging.set_verbosity_error()

import nntile
from nntile import ops
from nntile.data import ByteTokenizer
from nntile.models import FAMILIES
from tests.attention_refs import reference
from tests.test_llama import reference_model

SMALL = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
             num_key_value_heads=2, max_position_embeddings=128, bos_token_id=None,
             eos_token_id=None, pad_token_id=None)
# family -> transformers' config class, model class and the family's own fields; one line a
# family. Mistral's window (16) is shorter than prompt + new tokens (76), and not a multiple
# of the cache's sequence tile (8).
GENERATION = {
    "llama": ("LlamaConfig", "LlamaForCausalLM", {}),
    "qwen2": ("Qwen2Config", "Qwen2ForCausalLM", {}),
    "mistral": ("MistralConfig", "MistralForCausalLM", {"sliding_window": 16}),
}
TILES = {"seq": 8, "head": 2, "embd": 16}  # partial tiles: the prompt 12, the cache 76


def hf_model(family, vocab=96):
    config_name, model_name, fields = GENERATION[family]
    torch.manual_seed(0)
    config = getattr(transformers, config_name)(vocab_size=vocab, **SMALL, **fields)
    return reference_model(getattr(transformers, model_name)(config), torch.float64)


@pytest.mark.parametrize("family", GENERATION)
def test_greedy_tokens_equal_transformers(ctx, family):
    hf = hf_model(family)
    model = FAMILIES[family].from_transformers(hf, TILES, "fp64")
    prompts = np.random.default_rng(1).integers(0, 96, size=(2, 12))
    try:
        ours = model.generate(prompts, max_new_tokens=64)
    finally:
        model.unregister()
    with torch.no_grad():
        theirs = hf.generate(torch.from_numpy(prompts), max_new_tokens=64, do_sample=False,
                             attention_mask=torch.ones(prompts.shape, dtype=torch.long),
                             pad_token_id=0)
    np.testing.assert_array_equal(np.array(ours), theirs[:, 12:].numpy())


def test_prompts_of_two_lengths_as_transformers_one_by_one(ctx):
    """Three prompts of two lengths, the short ones first and last: each one's tokens are
    transformers' for that prompt alone (greedy), and each stops at its own first
    end-of-sequence token: the first one early, while the other of its batch goes on."""
    hf = hf_model("llama")
    rng = np.random.default_rng(2)
    prompts = [rng.integers(0, 96, n).tolist() for n in (5, 9, 5)]

    def theirs(prompt, **eos):
        with torch.no_grad():
            out = hf.generate(torch.tensor([prompt]), max_new_tokens=16, do_sample=False,
                              attention_mask=torch.ones((1, len(prompt)), dtype=torch.long),
                              pad_token_id=0, **eos)
        return out[0, len(prompt):].tolist()

    eos = theirs(prompts[0])[8]
    want = [theirs(prompt, eos_token_id=eos) for prompt in prompts]
    assert [len(one) for one in want] == [9, 16, 16]
    model = FAMILIES["llama"].from_transformers(hf, TILES, "fp64")
    try:
        assert model.generate(prompts, 16, eos_token_id=eos) == want
    finally:
        model.unregister()


def tensor(array, tiles):
    t = nntile.Tensor(array.shape, tiles, "fp64")
    t.write(array)
    return t


@settings(max_examples=12, deadline=None)
@given(st.integers(1, 9), st.integers(1, 5), st.integers(0, 20), st.integers(1, 7))
def test_copy_into_writes_a_box(ctx, n, src_tile, at, dst_tile):
    rng = np.random.default_rng(n * 100 + at)
    src, dst = rng.standard_normal((2, n, 3)), rng.standard_normal((2, n + at, 3))
    d = tensor(dst, (1, min(dst_tile, n + at), 3))
    ops.copy_into(tensor(src, (2, min(src_tile, n), 2)), d, (0, at, 0))
    dst[:, at:] = src
    np.testing.assert_array_equal(d.to_array(), dst)


@pytest.mark.parametrize("tq, offset, window", [(1, 13, 0), (3, 9, 5), (1, 0, 0)])
def test_flash_attention_against_a_longer_cache(ctx, tq, offset, window):
    """Queries at key positions offset, offset + 1, ... against a cache of 20 keys tiled 8:
    the keys past the last query's are never seen."""
    rng = np.random.default_rng(offset)
    q = rng.standard_normal((2, tq, 4, 4))
    k, v = rng.standard_normal((2, 2, 20, 2, 4))
    o = nntile.Tensor(q.shape, (1, tq, 2, 4), "fp64")
    lse = nntile.Tensor(q.shape[:3], (1, tq, 2), "fp64")
    ops.flash_attention(tensor(q, (1, tq, 2, 4)), tensor(k, (1, 8, 1, 4)),
                        tensor(v, (1, 8, 1, 4)), o, lse, 0.5,
                        nntile.AttentionMask(offset=offset, window=window))
    ref_o, ref_lse, _ = reference(q, k, v, 0.5, True, offset=offset, window=window)
    np.testing.assert_allclose(o.to_array(), ref_o, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(lse.to_array(), ref_lse, rtol=1e-12)


@pytest.fixture(scope="module")
def byte_model(ctx):
    model = FAMILIES["llama"].from_transformers(hf_model("llama", vocab=256), TILES, "fp64")
    yield model
    model.unregister()


def test_sampling_eos_and_stop_text(byte_model):
    prompt = np.frombuffer(b"abcdefgh", dtype=np.uint8)[None].astype(np.int64)
    greedy = byte_model.generate(prompt, 12)[0]
    assert len(greedy) == 12
    # top_k=1 keeps only the likeliest token: sampling is greedy whatever the temperature
    assert byte_model.generate(prompt, 12, temperature=5.0, top_k=1, seed=3)[0] == greedy
    # the same seed draws the same tokens; a flat distribution (high temperature) draws others
    hot = byte_model.generate(prompt, 12, temperature=50.0, top_p=0.99, seed=3)[0]
    assert hot == byte_model.generate(prompt, 12, temperature=50.0, top_p=0.99, seed=3)[0]
    assert hot != greedy
    # a sequence stops after its end-of-sequence token, kept
    assert byte_model.generate(prompt, 12, eos_token_id=greedy[4])[0] == \
        greedy[:greedy.index(greedy[4]) + 1]
    # and after the token that completes the stop text
    tok = ByteTokenizer()
    stop = tok.decode(greedy[3:5])
    out = byte_model.generate(prompt, 12, stop=stop, tokenizer=tok)[0]
    assert stop in tok.decode(out) and stop not in tok.decode(out[:-1])


def test_an_unfused_model_generates_as_the_fused_one(byte_model):
    """The cache runs the fused kernels whatever the model trains with."""
    prompt = np.arange(40, 48)[None]
    config = byte_model.config.replace(attention="unfused")
    unfused = FAMILIES["llama"](config, TILES, "fp64")
    try:
        unfused.load_state_dict(byte_model.state_dict())
        assert unfused.generate(prompt, 12) == byte_model.generate(prompt, 12)
    finally:
        unfused.unregister()


def test_bad_input_is_refused(byte_model):
    for bad in ([[1, 2, 3], []], [1, 2, 3], [[[1, 2]]], [[1.0, 2.0]], []):
        with pytest.raises(ValueError, match="token ids of each prompt"):
            byte_model.generate(bad, 4)
    with pytest.raises(ValueError, match="prompt 1 holds token id 256"):  # before prompt 0 runs
        byte_model.generate([[1, 2], [3, 256, 4]], 4)
    with pytest.raises(ValueError, match="positions"):
        byte_model.generate(np.ones((1, 100), dtype=np.int64), 29)
    with pytest.raises(ValueError, match="max_new_tokens"):
        byte_model.generate(np.ones((1, 4), dtype=np.int64), -1)
    with pytest.raises(ValueError, match="positions 126 to 129 .*max_position_embeddings=128"):
        byte_model.forward(np.ones((1, 4), dtype=np.int64), start=126)
    with pytest.raises(ValueError, match="tokenizer"):
        byte_model.generate(np.ones((1, 4), dtype=np.int64), 4, stop="x")


def test_load_and_nntile_generate(ctx, tmp_path):
    """nntile.load of a transformers directory and of the checkpoint imported from it, and
    nntile-generate on two prompts of two lengths with a stop text: the texts
    model.generate gives, in the order of the prompts."""
    from tests.test_llama_programs import save_hf
    from tests.test_train_cli import cli
    hf = save_hf(tmp_path / "hf", tied=True)
    model, tok = nntile.load(str(tmp_path / "hf"))
    try:
        assert tok is None  # the directory holds no tokenizer
        ids = np.array([list(b"ab"), list(b"cd")])
        with torch.no_grad():
            want = hf(torch.from_numpy(ids)).logits.numpy()
        np.testing.assert_allclose(model.forward(ids), want, rtol=1e-4, atol=1e-4)
    finally:
        model.unregister()
    assert cli("convert", "import", tmp_path / "hf", tmp_path / "m.h5").returncode == 0
    model, tok = nntile.load(str(tmp_path / "m.h5"))
    try:
        assert tok.name == "byte"
        new = model.generate([list(b"abc"), list(b"cd")], 8, tokenizer=tok)
    finally:
        model.unregister()
    # a stop text of the first continuation that the second one lacks: only the first stops
    stop = next(text for text in (tok.decode(new[0][i:i + 2]) for i in range(2, 6))
                if text not in tok.decode(new[1]))
    result = cli("generate", "--checkpoint", tmp_path / "m.h5", "--prompt", "abc", "--prompt",
                 "cd", "--greedy", "--max-new-tokens", "8", "--stop", stop)
    assert result.returncode == 0, result.stderr
    cut = next(n for n in range(1, 9) if stop in tok.decode(new[0][:n]))
    assert result.stdout == f"abc{tok.decode(new[0][:cut])}\n\ncd{tok.decode(new[1])}\n\n"
