"""transformers directories through the programs: nntile-prepare --tokenizer DIR (a
tokenizer.json), nntile-train --init-from HF_DIR, nntile-convert of sharded bf16 weights, and
the one-line refusals (a vocabulary that is not the model's, flags that do not fit the
family). tests/test_llama_programs.py runs the programs on Llama directories."""
import json
import shutil

import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
tokenizers = pytest.importorskip("tokenizers")
h5py = pytest.importorskip("h5py")
transformers.logging.set_verbosity_error()
transformers.logging.disable_progress_bar()

from nntile.data import BatchSampler, TokenData
from tests.test_train_cli import assert_clean_error, cli, data_dir, read_metrics  # noqa: F401

TEXTS = {"a.py": "def hello():\n    return 'héllo wörld'\n" * 30,
         "b.py": "import os\nprint(os.getcwd(), sorted(os.listdir('.')))\n" * 30}


@pytest.fixture(scope="module")
def hf_dir(tmp_path_factory):
    """A GPT-2 of a byte-level BPE tokenizer's vocabulary, saved with its tokenizer.json (as
    transformers saves models with their tokenizer); and the texts."""
    root = tmp_path_factory.mktemp("hf")
    src = root / "src"
    src.mkdir()
    for name, text in TEXTS.items():
        (src / name).write_text(text)
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.train_from_iterator(list(TEXTS.values()), trainers.BpeTrainer(
        vocab_size=300, special_tokens=["<|endoftext|>"], show_progress=False,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    model_dir = root / "model"
    torch.manual_seed(0)
    model = transformers.GPT2LMHeadModel(transformers.GPT2Config(
        vocab_size=tok.get_vocab_size(), n_positions=32, n_embd=16, n_layer=2, n_head=2,
        resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0, bos_token_id=0, eos_token_id=0))
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.05 * torch.randn_like(p))
    model.save_pretrained(model_dir)
    tok.save(str(model_dir / "tokenizer.json"))
    (model_dir / "tokenizer_config.json").write_text(json.dumps({"eos_token": "<|endoftext|>"}))
    return model_dir, src, tok, model.eval()


def test_prepare_train_and_generate_through_a_transformers_directory(tmp_path, hf_dir,
                                                                     data_dir):  # noqa: F811
    model_dir, src, tok, hf = hf_dir
    data = tmp_path / "data"
    result = cli("data", src, "--out", data, "--tokenizer", model_dir)
    assert result.returncode == 0, result.stderr
    meta = json.loads((data / "meta.json").read_text())
    assert meta["tokenizer"] == "tokenizer.json" and meta["vocab_size"] == tok.get_vocab_size()
    assert meta["tokenizer_path"] == str(model_dir)
    eot = tok.token_to_id("<|endoftext|>")
    want = np.concatenate([tok.encode(TEXTS[name]).ids + [eot] for name in sorted(TEXTS)])
    got = np.concatenate([np.fromfile(data / f"{s}.bin", np.uint16) for s in ("train", "val")])
    np.testing.assert_array_equal(got, want)

    # fine-tuning: the first step's loss is transformers' loss on the same batch
    out = tmp_path / "run"
    result = cli("train", "--init-from", model_dir, "--data", data, "--out", out, "--steps",
                 "2", "--seq-len", "16", "--batch-size", "2", "--ncpu", "2", "--no-progress",
                 "--eval-every", "0", "--tile-vocab", "100", "--tile-embd", "8")
    assert result.returncode == 0, result.stderr
    assert f"weights of {model_dir}" in result.stderr
    x, y = BatchSampler(TokenData(str(data)).splits["train"], 2, 16, 1337).next()
    with torch.no_grad():
        logits = hf(torch.from_numpy(x)).logits
    ref = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]),
                                            torch.from_numpy(y).reshape(-1)).item()
    first = read_metrics(out / "metrics.jsonl")[0]["loss"]
    assert abs(first - ref) <= 1e-5 * ref, (first, ref)
    with h5py.File(out / "ckpt-2.h5", "r") as f:
        assert json.loads(f.attrs["tokenizer"]) == {"name": "tokenizer.json",
                                                    "path": str(model_dir)}
        assert json.loads(f.attrs["source"]) == {"transformers": str(model_dir)}
        assert json.loads(f.attrs["config"])["model_type"] == "gpt2"

    # generation encodes and decodes through the recorded tokenizer: what transformers
    # generates greedily from the exported fine-tuned weights
    result = cli("generate", "--checkpoint", out / "ckpt-2.h5", "--prompt", "def hello",
                 "--max-new-tokens", "6", "--greedy", "--seq-len", "16")
    assert result.returncode == 0, result.stderr
    assert cli("convert", "export", out / "ckpt-2.h5", tmp_path / "tuned").returncode == 0
    tuned = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "tuned")
    ids = tok.encode("def hello").ids
    with torch.no_grad():
        for _ in range(6):
            ids.append(int(tuned(torch.tensor([ids[-16:]])).logits[0, -1].argmax()))
    assert result.stdout == tok.decode(ids) + "\n"

    # data of another tokenizer is refused in one line, before anything runs
    result = cli("train", "--init-from", model_dir, "--data", data_dir, "--out",
                 tmp_path / "o2", "--steps", "1", "--seq-len", "16", "--no-progress")
    assert_clean_error(result, "tokenized with byte (256 tokens)",
                       f"tokenizer of {tok.get_vocab_size()}", f"--tokenizer {model_dir}")
    assert not (tmp_path / "o2").exists()


def test_convert_sharded_bf16_weights(tmp_path, hf_dir):
    model_dir, _, _, hf = hf_dir
    sharded = tmp_path / "sharded"
    hf.to(torch.bfloat16).save_pretrained(sharded, max_shard_size="20KB")
    hf.float()
    assert (sharded / "model.safetensors.index.json").exists()
    shutil.copy(model_dir / "tokenizer.json", sharded)
    ckpt = tmp_path / "ckpt.h5"
    result = cli("convert", "import", sharded, ckpt, "--tile-embd", "8")
    assert result.returncode == 0, result.stderr
    assert "GPT-2" in result.stdout
    with h5py.File(ckpt, "r") as f:
        assert json.loads(f.attrs["tokenizer"])["name"] == "tokenizer.json"
    result = cli("convert", "export", ckpt, tmp_path / "back")
    assert result.returncode == 0, result.stderr
    assert "and the tokenizer" in result.stdout
    assert (tmp_path / "back" / "tokenizer.json").read_bytes() == \
        (model_dir / "tokenizer.json").read_bytes()
    back = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "back",
                                                            local_files_only=True)
    assert back.dtype == torch.float32
    for name, tensor in hf.state_dict().items():  # the bf16 values, exactly
        assert torch.equal(back.state_dict()[name], tensor.to(torch.bfloat16).float()), name


def test_export_back_into_the_directory_it_was_imported_from(tmp_path, hf_dir):
    """The checkpoint records the directory's own tokenizer: it is carried over, unchanged."""
    model_dir = hf_dir[0]
    shutil.copytree(model_dir, tmp_path / "hf")
    hf = transformers.AutoModelForCausalLM.from_pretrained(model_dir)
    before = {p.name: p.read_bytes() for p in (tmp_path / "hf").iterdir()}
    assert cli("convert", "import", tmp_path / "hf", tmp_path / "m.h5").returncode == 0
    result = cli("convert", "export", tmp_path / "m.h5", tmp_path / "hf", "--overwrite")
    assert result.returncode == 0, result.stderr
    assert "and the tokenizer" in result.stdout
    after = {p.name: p.read_bytes() for p in (tmp_path / "hf").iterdir()}
    assert sorted(after) == sorted(before)
    for name in ("tokenizer.json", "tokenizer_config.json"):
        assert after[name] == before[name], name
    back = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "hf")
    for name, tensor in hf.state_dict().items():
        assert torch.equal(back.state_dict()[name], tensor), name


def _damage(hf, damage):
    """A tiny Llama directory, damaged: a weight missing or transposed, config.json's
    hidden_size not the weights', or its model_type not a string."""
    from safetensors.torch import load_file, save_file
    config = json.loads((hf / "config.json").read_text())
    state = load_file(hf / "model.safetensors")
    up = "model.layers.0.mlp.up_proj.weight"
    if damage == "missing":
        del state[up]
    elif damage == "transposed":
        state[up] = state[up].T.contiguous()
    elif damage == "hidden_size":
        config["hidden_size"] = 32
    else:
        config["model_type"] = ["llama"]
    save_file(state, hf / "model.safetensors", metadata={"format": "pt"})
    (hf / "config.json").write_text(json.dumps(config))


@pytest.mark.parametrize("damage, words", [
    ("missing", ["has no 'model.layers.0.mlp.up_proj.weight'"]),
    ("transposed", ["model.layers.0.mlp.up_proj.weight: shape (16, 24), the model expects "
                    "(24, 16)"]),
    ("hidden_size", ["model.embed_tokens.weight: shape (256, 16), the model expects "
                     "(256, 32)"]),
    ("model_type", ["config.json: model_type ['llama'] is not a family nntile has"]),
])
def test_init_from_checks_the_weights_as_import_does(tmp_path, data_dir, damage,  # noqa: F811
                                                     words):
    hf = tmp_path / "hf"
    transformers.LlamaForCausalLM(transformers.LlamaConfig(
        vocab_size=256, hidden_size=16, intermediate_size=24, num_hidden_layers=1,
        num_attention_heads=4, num_key_value_heads=2)).save_pretrained(hf)
    _damage(hf, damage)
    line = assert_clean_error(cli("train", "--init-from", hf, "--data", data_dir, "--out",
                                  tmp_path / "run", "--steps", "1", "--seq-len", "16",
                                  "--no-progress"), str(hf), *words)
    assert not (tmp_path / "run").exists()
    same = assert_clean_error(cli("convert", "import", hf, tmp_path / "m.h5"), *words)
    assert line.split(": error: ")[1] == same.split(": error: ")[1]


def test_refusals_of_the_family_flags(tmp_path, data_dir):  # noqa: F811
    llama = transformers.LlamaForCausalLM(transformers.LlamaConfig(
        vocab_size=256, hidden_size=16, intermediate_size=24, num_hidden_layers=1,
        num_attention_heads=4, num_key_value_heads=2))
    llama.save_pretrained(tmp_path / "llama")
    base = ["--data", data_dir, "--steps", "1", "--no-progress"]
    cases = [
        (("train", "--n-kv-head", "2", *base, "--out", tmp_path / "o"),
         "--n-kv-head does not apply to a GPT-2 model"),
        (("train", "--model", "gpt2", "--init-from", tmp_path / "llama", *base, "--out",
          tmp_path / "o"), "--model gpt2 conflicts with the llama model"),
        (("train", "--model", "llama", "--n-head", "4", "--n-kv-head", "3", *base, "--out",
          tmp_path / "o"), "not divisible by num_key_value_heads=3"),
        (("train", "--model", "llama", "--n-head", "4", "--tile-head", "1", *base, "--out",
          tmp_path / "o"), "splits a group of 2"),
        (("train", "--init-from", tmp_path / "llama", "--init", tmp_path / "x.h5", *base),
         "--init and --init-from conflict"),
        (("train", "--init-from", tmp_path / "none", *base), "is not a directory"),
    ]
    for args, words in cases:
        assert_clean_error(cli(*args), words)
    assert not (tmp_path / "o").exists()
