"""Data preparation and reading: nanoGPT format, tokenizers, sampling state, bad files."""
import json
import os

import numpy as np
import pytest

from nntile.cli_common import CLIError
from nntile.data import (BatchSampler, ByteTokenizer, TokenData, default_data_dir,
                         eval_batches, prepare, stdlib_files)
from tests.test_train_cli import assert_clean_error, cli


def make_texts(tmp_path):
    src = tmp_path / "src"
    (src / "sub").mkdir(parents=True)
    (src / "b.txt").write_text("second file, with ünïcödé\n" * 40)
    (src / "a.txt").write_text("first file\n" * 50)
    (src / "sub" / "c.txt").write_text("nested\n" * 30)
    (src / ".hidden").write_text("skipped")
    return src


def test_prepare_bytes_roundtrip(tmp_path):
    src = make_texts(tmp_path)
    extra = tmp_path / "extra.txt"
    extra.write_bytes(b"\x00\xff raw bytes")
    info = prepare([str(src), str(extra)], str(tmp_path / "out"), val_fraction=0.2)
    train = np.fromfile(tmp_path / "out" / "train.bin", dtype=np.uint16)
    val = np.fromfile(tmp_path / "out" / "val.bin", dtype=np.uint16)
    expected = b"".join(p.read_bytes() for p in [src / "a.txt", src / "b.txt",
                                                 src / "sub" / "c.txt", extra])
    assert bytes(np.concatenate([train, val]).astype(np.uint8)) == expected
    assert len(val) == round(0.2 * len(expected))
    meta = json.loads((tmp_path / "out" / "meta.json").read_text())
    assert meta["tokenizer"] == "byte" and meta["vocab_size"] == 256
    assert meta["train_tokens"] == len(train) == info["train_tokens"]
    assert not [p for p in os.listdir(tmp_path / "out") if p.endswith(".tmp")]
    data = TokenData(str(tmp_path / "out"))
    assert data.vocab_hint == 256 and data.tokenizer == "byte"
    data.check(256, 16)
    with pytest.raises(CLIError, match="token id 255"):
        data.check(200, 16)


def test_prepare_cli(tmp_path):
    src = make_texts(tmp_path)
    result = cli("data", src, "--out", tmp_path / "out")
    assert result.returncode == 0, result.stderr
    assert "train" in result.stdout and (tmp_path / "out" / "train.bin").exists()
    assert_clean_error(cli("data", tmp_path / "missing", "--out", tmp_path / "o2"),
                       "does not exist")
    empty = tmp_path / "empty.txt"
    empty.write_text("")
    assert_clean_error(cli("data", empty, "--out", tmp_path / "o3"), "no text")
    assert_clean_error(cli("data", src, "--out", tmp_path / "o4", "--val-fraction", "1.5"),
                       "--val-fraction")
    assert_clean_error(cli("data", src, "--out", tmp_path / "o5", "--tokenizer",
                           tmp_path / "no-tokenizer"), "no-tokenizer", "no such directory", "tokenizer.json")
    assert_clean_error(cli("data", src, "--out", empty), "not a directory")
    for name in ("o2", "o3", "o4", "o5"):
        assert not (tmp_path / name).exists()


def test_prepare_with_a_local_gpt2_tokenizer(tmp_path):
    transformers = pytest.importorskip("transformers")
    try:
        from transformers.convert_slow_tokenizer import bytes_to_unicode
        vocab = {c: b for b, c in bytes_to_unicode().items()}
        vocab["<|endoftext|>"] = 256
        tok = transformers.GPT2TokenizerFast(vocab=vocab, merges=[])
        tok.save_pretrained(tmp_path / "tok")
        assert len(transformers.GPT2TokenizerFast.from_pretrained(tmp_path / "tok")) == 257
    except Exception as exc:  # older transformers build tokenizers differently
        pytest.skip(f"cannot build a local test tokenizer: {exc}")
    src = make_texts(tmp_path)
    result = cli("data", src, "--out", tmp_path / "out", "--tokenizer", tmp_path / "tok")
    assert result.returncode == 0, result.stderr
    meta = json.loads((tmp_path / "out" / "meta.json").read_text())
    # transformers saved a tokenizer.json beside vocab.json: the tokenizers library reads it
    assert meta["tokenizer"] == "tokenizer.json" and meta["vocab_size"] == 257
    ids = np.concatenate([np.fromfile(tmp_path / "out" / f"{s}.bin", dtype=np.uint16)
                          for s in ("train", "val")])
    assert (ids == 256).sum() == 3  # one end-of-text after each of the three files
    text = tok.decode([int(i) for i in ids if i != 256])
    assert text == "".join(p.read_text() for p in [src / "a.txt", src / "b.txt",
                                                   src / "sub" / "c.txt"])
    # a model trained on it generates through the same tokenizer
    result = cli("train", "--data", tmp_path / "out", "--out", tmp_path / "run", "--steps", "2",
                 "--n-layer", "1", "--n-embd", "16", "--n-head", "2", "--seq-len", "16",
                 "--batch-size", "2", "--ncpu", "2", "--no-progress")
    assert result.returncode == 0, result.stderr
    result = cli("generate", "--checkpoint", tmp_path / "run" / "ckpt-2.h5", "--prompt",
                 "héllo", "--max-new-tokens", "5", "--greedy")
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("héllo") and len(result.stdout) > len("héllo")


def test_a_vocabulary_past_uint16_is_written_as_uint32(tmp_path):
    """Llama 3's tokenizer has 128,256 tokens: its ids do not fit the uint16 files of nanoGPT.
    A word-level tokenizer of 70,000 words (w0 .. w69999) stands for it; the ids nntile reads
    back are the tokenizers library's own, ids past 65,535 included."""
    tokenizers = pytest.importorskip("tokenizers")
    vocab = {f"w{i}": i for i in range(70000)}
    tok = tokenizers.Tokenizer(tokenizers.models.WordLevel(vocab, unk_token="w0"))
    tok.pre_tokenizer = tokenizers.pre_tokenizers.Whitespace()
    (tmp_path / "tok").mkdir()
    tok.save(str(tmp_path / "tok" / "tokenizer.json"))
    words = np.random.default_rng(0).integers(0, 70000, 3000)
    (tmp_path / "text.txt").write_text(" ".join(f"w{i}" for i in words))
    result = cli("data", tmp_path / "text.txt", "--out", tmp_path / "out", "--tokenizer",
                 tmp_path / "tok")
    assert result.returncode == 0, result.stderr
    meta = json.loads((tmp_path / "out" / "meta.json").read_text())
    assert meta["dtype"] == "uint32" and meta["vocab_size"] == 70000
    data = TokenData(str(tmp_path / "out"))
    got = np.concatenate([np.asarray(data.splits[s]) for s in ("train", "val")])
    want = tok.encode(" ".join(f"w{i}" for i in words)).ids
    assert got.dtype == np.uint32 and got.tolist() == want == words.tolist()
    assert data.max_token("train") > 65535
    data.check(70000, 16)


def test_gpt2_tokenizer_from_the_local_cache_or_a_clear_error(tmp_path):
    src = make_texts(tmp_path)
    result = cli("data", src, "--out", tmp_path / "out", "--tokenizer", "gpt2",
                 env={"HF_HUB_OFFLINE": "1"})
    if result.returncode == 0:
        assert json.loads((tmp_path / "out" / "meta.json").read_text())["vocab_size"] == 50257
    else:
        assert_clean_error(result, "'gpt2' is not on this machine", "downloads nothing",
                           "--tokenizer DIR", "tokenizer.json")


def test_token_data_errors(tmp_path):
    d = tmp_path / "d"
    with pytest.raises(CLIError, match="does not exist"):
        TokenData(str(d))
    d.mkdir()
    with pytest.raises(CLIError, match="train.bin does not exist"):
        TokenData(str(d))
    np.arange(100, dtype=np.uint16).tofile(d / "train.bin")
    np.arange(100, dtype=np.uint16).tofile(d / "val.bin")
    TokenData(str(d)).check(256, 50)
    with pytest.raises(CLIError, match="fewer than"):
        TokenData(str(d)).check(256, 100)
    (d / "val.bin").write_bytes(b"\x00" * 7)
    with pytest.raises(CLIError, match="7 bytes"):
        TokenData(str(d))
    (d / "val.bin").write_bytes(b"")
    with pytest.raises(CLIError, match="empty"):
        TokenData(str(d))
    os.unlink(d / "val.bin")
    os.symlink(d / "nowhere", d / "val.bin")
    with pytest.raises(CLIError, match="val.bin does not exist"):
        TokenData(str(d))
    os.unlink(d / "val.bin")
    np.arange(100, dtype=np.uint16).tofile(d / "val.bin")
    (d / "meta.json").write_text("{broken")
    with pytest.raises(CLIError, match="meta.json"):
        TokenData(str(d))


def test_sampler_state_roundtrip_through_json():
    tokens = np.arange(10_000, dtype=np.uint16)
    a = BatchSampler(tokens, 3, 7, seed=5)
    for _ in range(4):
        a.next()
    state = json.loads(json.dumps(a.state()))
    assert state["batches_drawn"] == 4 and state["tokens_drawn"] == 4 * 3 * 7
    b = BatchSampler(tokens, 3, 7, seed=999)
    b.set_state(state)
    for _ in range(5):
        (xa, ya), (xb, yb) = a.next(), b.next()
        np.testing.assert_array_equal(xa, xb)
        np.testing.assert_array_equal(ya, yb)
        np.testing.assert_array_equal(xa[:, 1:], ya[:, :-1])  # targets are shifted inputs
        assert xa.dtype == np.int64 and xa.shape == (3, 7)
    with pytest.raises(ValueError, match="state"):
        b.set_state({"bit_generator": "nonsense"})


def test_eval_batches_are_fixed_and_in_range():
    tokens = np.arange(1000, dtype=np.uint16)
    first = eval_batches(tokens, 4, 16, 3)
    again = eval_batches(tokens, 4, 16, 3)
    assert len(first) == 3
    for (x, y), (x2, y2) in zip(first, again):
        np.testing.assert_array_equal(x, x2)
        np.testing.assert_array_equal(y, x + 1)
        assert x.shape == (4, 16) and y.max() <= 999
    assert first[0][0][0, 0] == 0 and first[-1][1][-1, -1] == 999  # spread over the split


def test_embedded_corpus_is_prepared_once(tmp_path, monkeypatch):
    monkeypatch.setenv("NNTILE_CACHE", str(tmp_path / "cache"))
    path = default_data_dir(quiet=True)
    assert path.startswith(str(tmp_path / "cache"))
    data = TokenData(path)
    root, files = stdlib_files()
    assert len(files) > 100 and all(f.endswith(".py") for f in files)
    assert not any("site-packages" in f for f in files)
    total = len(data.splits["train"]) + len(data.splits["val"])
    assert total == sum(os.path.getsize(f) for f in files)
    assert 0.08 < len(data.splits["val"]) / total < 0.12
    first = open(files[0], "rb").read()
    assert bytes(np.asarray(data.splits["train"][:len(first)]).astype(np.uint8)) == first
    mtime = os.path.getmtime(os.path.join(path, "train.bin"))
    assert default_data_dir(quiet=True) == path  # reused, not rewritten
    assert os.path.getmtime(os.path.join(path, "train.bin")) == mtime
    assert ByteTokenizer().decode(ByteTokenizer().encode("héllo")) == "héllo"
