"""nntile-convert, nntile-eval and nntile-generate against transformers."""
import codecs
import json

import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
pytest.importorskip("safetensors")

from nntile.data import TokenData, eval_batches
from tests.test_train_cli import assert_clean_error, cli, data_dir  # noqa: F401 (fixture)

CONFIG = dict(vocab_size=256, n_positions=48, n_embd=32, n_layer=2, n_head=4)


def save_hf(path, tied=True, seed=0):
    torch.manual_seed(seed)
    config = transformers.GPT2Config(**CONFIG, tie_word_embeddings=tied, resid_pdrop=0.0,
                                     embd_pdrop=0.0, attn_pdrop=0.0)
    model = transformers.GPT2LMHeadModel(config)
    with torch.no_grad():  # larger-than-default weights: clear winners for greedy decoding
        for p in model.parameters():
            p.add_(0.1 * torch.randn_like(p))
    model.save_pretrained(path)
    return model.eval()


def hf_loss(model, batches):
    losses = []
    with torch.no_grad():
        for x, y in batches:
            logits = model(torch.from_numpy(x)).logits
            losses.append(torch.nn.functional.cross_entropy(
                logits.reshape(-1, logits.shape[-1]), torch.from_numpy(y).reshape(-1)).item())
    return float(np.mean(losses))


def test_import_eval_export_roundtrip(tmp_path, data_dir):  # noqa: F811
    hf = save_hf(tmp_path / "hf")
    ckpt = tmp_path / "imported.h5"
    result = cli("convert", "import", tmp_path / "hf", ckpt, "--tile-embd", "16",
                 "--tile-vocab", "100", "--tile-inner", "50", "--tile-head", "3")
    assert result.returncode == 0, result.stderr
    assert ckpt.exists()

    # nntile-eval equals transformers on the same tokens
    result = cli("evaluate", "--checkpoint", ckpt, "--data", data_dir, "--batches", "3",
                 "--batch-size", "2", "--seq-len", "40", "--json", "--tile-batch", "1",
                 "--tile-seq", "16")
    assert result.returncode == 0, result.stderr
    ours = json.loads(result.stdout)
    batches = eval_batches(TokenData(str(data_dir)).splits["val"], 2, 40, 3)
    ref = hf_loss(hf, batches)
    assert abs(ours["loss"] - ref) <= 1e-5 * abs(ref), (ours["loss"], ref)

    # export and load back in transformers: the very same weights
    result = cli("convert", "export", ckpt, tmp_path / "hf2")
    assert result.returncode == 0, result.stderr
    back = transformers.GPT2LMHeadModel.from_pretrained(tmp_path / "hf2",
                                                        local_files_only=True)
    want, got = hf.state_dict(), back.state_dict()
    for name, tensor in want.items():
        assert torch.equal(got[name], tensor), name
    assert back.config.tie_word_embeddings

    # greedy generation follows transformers' argmax (checked by transformers' logits)
    result = cli("generate", "--checkpoint", ckpt, "--prompt", "def ", "--max-new-tokens",
                 "12", "--greedy", "--seq-len", "16")
    assert result.returncode == 0, result.stderr
    ids = list(b"def ")
    with torch.no_grad():
        for _ in range(12):
            logits = hf(torch.tensor([ids[-16:]])).logits[0, -1].numpy()
            ids.append(int(np.argmax(logits)))
    expected = codecs.decode(bytes(ids), "utf-8", errors="replace")
    assert result.stdout == expected + "\n"


def test_untied_pytorch_bin_roundtrip_and_sampling(tmp_path, data_dir):  # noqa: F811
    hf = save_hf(tmp_path / "hf", tied=False, seed=1)
    # a pytorch_model.bin instead of model.safetensors: read through transformers
    (tmp_path / "hf" / "model.safetensors").unlink()
    torch.save(hf.state_dict(), tmp_path / "hf" / "pytorch_model.bin")
    ckpt = tmp_path / "imported.h5"
    result = cli("convert", "import", tmp_path / "hf", ckpt, "--dtype", "fp64")
    assert result.returncode == 0, result.stderr
    result = cli("convert", "export", ckpt, tmp_path / "hf2")
    assert result.returncode == 0, result.stderr
    back = transformers.GPT2LMHeadModel.from_pretrained(tmp_path / "hf2", local_files_only=True)
    assert not back.config.tie_word_embeddings
    assert back.dtype == torch.float64
    for name, tensor in hf.state_dict().items():
        assert torch.equal(back.state_dict()[name], tensor.double()), name
    runs = [cli("generate", "--checkpoint", ckpt, "--prompt", "x", "--max-new-tokens", "20",
                "--seed", str(seed), "--top-k", "5", "--temperature", "1.5") for seed in (3, 3)]
    for run in runs:
        assert run.returncode == 0, run.stderr
        assert run.stdout.startswith("x")
    assert runs[0].stdout == runs[1].stdout  # same seed, same text
    # fine-tuning from the imported weights: a fresh optimizer, the model of the checkpoint
    result = cli("train", "--init", ckpt, "--data", data_dir, "--out", tmp_path / "tuned",
                 "--steps", "2", "--seq-len", "16", "--batch-size", "2", "--ncpu", "2",
                 "--no-progress")
    assert result.returncode == 0, result.stderr
    assert "weights of" in result.stderr


def test_bad_input(tmp_path, data_dir):  # noqa: F811
    (tmp_path / "empty").mkdir()
    (tmp_path / "config-only").mkdir()
    (tmp_path / "config-only" / "config.json").write_text(json.dumps({"model_type": "gpt2"}))
    (tmp_path / "bert").mkdir()
    (tmp_path / "bert" / "config.json").write_text(json.dumps({"model_type": "bert"}))
    (tmp_path / "bert" / "model.safetensors").write_bytes(b"")
    (tmp_path / "garbage").mkdir()
    (tmp_path / "garbage" / "config.json").write_text(json.dumps(CONFIG))
    (tmp_path / "garbage" / "model.safetensors").write_bytes(b"garbage" * 10)
    (tmp_path / "scaled").mkdir()
    (tmp_path / "scaled" / "config.json").write_text(json.dumps(
        dict(CONFIG, scale_attn_by_inverse_layer_idx=True)))
    (tmp_path / "scaled" / "model.safetensors").write_bytes(b"")
    junk = tmp_path / "junk.h5"
    junk.write_bytes(b"junk" * 100)
    cases = [
        (("convert", "import", tmp_path / "missing", tmp_path / "o.h5"), "not a directory"),
        (("convert", "import", tmp_path / "empty", tmp_path / "o.h5"), "no config.json"),
        (("convert", "import", tmp_path / "config-only", tmp_path / "o.h5"), "model.safetensors"),
        (("convert", "import", tmp_path / "bert", tmp_path / "o.h5"), "bert"),
        (("convert", "import", tmp_path / "empty", tmp_path / "no" / "o.h5"), "does not exist"),
        (("convert", "import", tmp_path / "garbage", tmp_path / "o.h5"), "cannot load"),
        (("convert", "import", tmp_path / "scaled", tmp_path / "o.h5"),
         "scale_attn_by_inverse_layer_idx"),
        (("convert", "export", junk, tmp_path / "out"), "not a readable HDF5 file"),
        (("convert", "export", tmp_path / "none.h5", tmp_path / "out"), "does not exist"),
        (("convert", "frobnicate"), "frobnicate"),
        (("evaluate", "--checkpoint", junk, "--data", data_dir), "junk.h5"),
        (("evaluate", "--checkpoint", tmp_path / "none.h5"), "does not exist"),
        (("generate", "--checkpoint", junk), "junk.h5"),
        (("generate", "--checkpoint", junk, "--temperature", "-1"), "--temperature"),
    ]
    for args, words in cases:
        assert_clean_error(cli(*args), words)
    assert not (tmp_path / "o.h5").exists() and not (tmp_path / "out").exists()
    # a checkpoint that is fine, asked for too long a window or the wrong data
    save_hf(tmp_path / "hf")
    ckpt = tmp_path / "ok.h5"
    assert cli("convert", "import", tmp_path / "hf", ckpt).returncode == 0
    assert_clean_error(cli("generate", "--checkpoint", ckpt, "--seq-len", "49"),
                       "n_positions (48)")
    big = tmp_path / "big"
    big.mkdir()
    np.full(100, 300, dtype=np.uint16).tofile(big / "train.bin")
    np.full(100, 300, dtype=np.uint16).tofile(big / "val.bin")
    assert_clean_error(cli("evaluate", "--checkpoint", ckpt, "--data", big, "--seq-len", "8"),
                       "token id 300")
    assert_clean_error(cli("evaluate", "--checkpoint", ckpt), "pass --data")
