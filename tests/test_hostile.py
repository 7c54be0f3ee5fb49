"""Hostile input of every kind against the programs and the Python API: each case ends in one
clear line and exit code 2 (a program) or a clear exception (the API), before any task runs;
never a traceback, an abort or a hang.

The programs run in this process (their main(), as the console scripts call it) wherever they
fail before StarPU starts, which is where bad input must be caught; a traceback would escape
run_cli and fail the test.
"""
import json
import os
import re

import numpy as np
import pytest

import nntile
from nntile import convert, data, evaluate, generate, train
from tests.test_train_cli import data_dir  # noqa: F401 (fixture)

PROGRAMS = {"train": train.main, "prepare": data.main, "convert": convert.main,
            "eval": evaluate.main, "generate": generate.main}


@pytest.fixture(scope="module")
def files(tmp_path_factory, data_dir):  # noqa: F811
    """Hostile files, and good ones to hold them against."""
    d = tmp_path_factory.mktemp("hostile")

    def write(name, content):
        path = d / name
        path.parent.mkdir(parents=True, exist_ok=True)
        (path.write_bytes if isinstance(content, bytes) else path.write_text)(content)
        return path

    f = {"data": data_dir, "dir": d / "a-dir", "missing": d / "missing"}
    f["dir"].mkdir()
    f["text"] = write("text.txt", "hello world, " * 50)
    f["empty"] = write("empty.txt", "")
    f["binary"] = write("junk.bin", bytes(range(256)) * 4)
    f["fifo"] = d / "fifo"
    os.mkfifo(f["fifo"])
    for name, content in {"not-json": "{n_layer: 2", "json-list": "[1, 2]",
                          "json-null": "null", "json-number": "3", "nan": '{"n_embd": NaN}',
                          "str-n-layer": '{"n_layer": "2"}', "float-n-head": '{"n_head": 2.5}',
                          "neg-eps": '{"layer_norm_epsilon": -1e-5}',
                          "huge-embd": '{"n_embd": 99999999999, "n_head": 1}',
                          "bool-vocab": '{"vocab_size": true}',
                          "mamba": '{"model_type": "mamba"}',
                          "gqa-5": '{"model_type": "llama", "num_key_value_heads": 5}',
                          "latin1": "{\"n_layer\": 2, \"x\": \"caf\xe9\"}".encode("latin-1"),
                          "deep": "[" * 100000 + "]" * 100000}.items():
        f[name] = write(f"configs/{name}.json", content)
    # data directories that look like data and are not
    for name, files_ in {"odd": {"train.bin": b"\0" * 101, "val.bin": b"\0" * 100},
                         "empty-split": {"train.bin": b"\0" * 100, "val.bin": b""},
                         "short": {"train.bin": b"\1\0" * 5, "val.bin": b"\1\0" * 5},
                         "no-val": {"train.bin": b"\1\0" * 500},
                         "bad-meta": {"train.bin": b"\1\0" * 500, "val.bin": b"\1\0" * 500,
                                      "meta.json": '{"vocab_size": "many"}'},
                         "meta-list": {"train.bin": b"\1\0" * 500, "val.bin": b"\1\0" * 500,
                                       "meta.json": "[]"},
                         "deep-meta": {"train.bin": b"\1\0" * 500, "val.bin": b"\1\0" * 500,
                                       "meta.json": "[" * 100000 + "]" * 100000},
                         "big-ids": {"train.bin": b"\xff\xff" * 500,
                                     "val.bin": b"\xff\xff" * 500,
                                     "meta.json": '{"vocab_size": 256}'}}.items():
        for fname, content in files_.items():
            write(f"data-{name}/{fname}", content)
        f[f"data-{name}"] = d / f"data-{name}"
    # a checkpoint that is an HDF5 file, but not ours; and truncated ones
    import h5py
    with h5py.File(d / "foreign.h5", "w") as h:
        h["x"] = np.arange(3)
    f["foreign"] = d / "foreign.h5"
    return f


def run(capsys, program, *argv):
    """(exit code, stderr) of a program run in this process."""
    code = PROGRAMS[program]([str(a) for a in argv])
    return code, capsys.readouterr().err


def assert_one_line(code, err, *words):
    assert code == 2, (code, err)
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    for word in words:
        assert word in lines[0], (word, lines[0])


# (program, argv with {file} placeholders, words of the one line)
CASES = [
    # nntile-train: numbers
    ("train", ["--steps", "0"], ["--steps", ">= 1"]),
    ("train", ["--steps", "1e3"], ["--steps", "not an integer"]),
    ("train", ["--steps", str(2**31)], ["--steps", "too large"]),
    ("train", ["--lr", "nan"], ["--lr", "positive number"]),
    ("train", ["--lr", "inf"], ["--lr", "positive number"]),
    ("train", ["--lr=-1e-3"], ["--lr", "positive number"]),
    ("train", ["--min-lr", "1"], ["--min-lr 1.0 is larger than --lr"]),
    ("train", ["--beta2", "1"], ["--beta2 1.0 must be in [0, 1)"]),
    ("train", ["--grad-clip=-1"], ["--grad-clip", ">= 0"]),
    ("train", ["--warmup", "50", "--steps", "10"], ["--warmup 50 is longer than --steps 10"]),
    ("train", ["--batch-size", str(10**12)], ["--batch-size", "too large"]),
    ("train", ["--n-embd", "130", "--n-head", "4"], ["n_embd=130 is not divisible by n_head=4"]),
    ("train", ["--n-layer", str(10**9)], ["parameters alone need", "more than this machine"]),
    ("train", ["--tile-embd", "0"], ["--tile-embd", ">= 1"]),
    ("train", ["--tile-embd", "4096"], ["--tile-embd 4096 is larger than n_embd"]),
    ("train", ["--precision", "fp16"], ["--precision 'fp16'", "fp32"]),
    ("train", ["--distribution", "cubes"], ["cubes"]),
    ("train", ["--eval-batches", "0"], ["--eval-batches", ">= 1"]),
    ("train", ["--bogus-flag"], ["unrecognized arguments: --bogus-flag"]),
    # nntile-train: files
    ("train", ["--config", "{not-json}"], ["--config", "Expecting"]),
    ("train", ["--config", "{json-list}"], ["a JSON object, not list"]),
    ("train", ["--config", "{json-null}"], ["a JSON object, not NoneType"]),
    ("train", ["--config", "{json-number}"], ["a JSON object, not int"]),
    ("train", ["--config", "{nan}"], ["n_embd=nan"]),
    ("train", ["--config", "{str-n-layer}"], ["n_layer='2'"]),
    ("train", ["--config", "{float-n-head}"], ["n_head=2.5"]),
    ("train", ["--config", "{neg-eps}"], ["layer_norm_epsilon=-1e-05", "positive number"]),
    ("train", ["--config", "{huge-embd}"], ["n_embd=99999999999", "at most"]),
    ("train", ["--config", "{bool-vocab}"], ["vocab_size=True"]),
    ("train", ["--config", "{mamba}"], ["model_type 'mamba'", "gpt2, llama, qwen2, qwen3"]),
    ("train", ["--config", "{gqa-5}"], ["num_key_value_heads=5"]),
    ("train", ["--config", "{latin1}"], ["--config", "utf-8"]),
    ("train", ["--config", "{deep}"], ["--config", "recursion"]),
    ("train", ["--config", "{empty}"], ["--config", "Expecting value"]),
    ("train", ["--config", "{fifo}"], ["--config", "not a regular file"]),
    ("train", ["--config", "{dir}"], ["--config", "not a regular file"]),
    ("train", ["--config", "{missing}"], ["--config", "no such file"]),
    ("train", ["--config", "{json-list}", "--n-layer", "2"], ["--config and --n-layer conflict"]),
    ("train", ["--data", "{missing}"], ["does not exist"]),
    ("train", ["--data", "{text}"], ["not a directory"]),
    ("train", ["--data", "{dir}"], ["train.bin does not exist"]),
    ("train", ["--data", "{data-odd}"], ["101 bytes", "not a whole number"]),
    ("train", ["--data", "{data-empty-split}"], ["val.bin is empty"]),
    ("train", ["--data", "{data-short}"], ["holds 5 tokens", "sequence length + 1"]),
    ("train", ["--data", "{data-no-val}"], ["val.bin does not exist"]),
    ("train", ["--data", "{data-bad-meta}"], ["meta.json", "vocab_size 'many'"]),
    ("train", ["--data", "{data-meta-list}"], ["meta.json", "not a JSON object"]),
    ("train", ["--data", "{data-deep-meta}"], ["meta.json", "recursion"]),
    ("train", ["--data", "{data-big-ids}"], ["token id 65535", "vocabulary of 256"]),
    ("train", ["--out", "{text}"], ["--out", "not a directory"]),
    ("train", ["--resume", "{missing}"], ["--resume", "no such checkpoint file"]),
    ("train", ["--resume", "latest", "--out", "{dir}"], ["--resume latest: no checkpoint"]),
    ("train", ["--resume", "{text}"], ["not a readable HDF5 file"]),
    ("train", ["--resume", "{fifo}"], ["not a regular file"]),
    ("train", ["--resume", "{foreign}"], ["not an nntile checkpoint"]),
    ("train", ["--init", "{dir}"], ["is a directory"]),
    ("train", ["--init", "{text}", "--resume", "{text}"], ["--resume and --init conflict"]),
    # nntile-prepare
    ("prepare", ["{missing}", "--out", "{dir}/p1"], ["does not exist"]),
    ("prepare", ["{fifo}", "--out", "{dir}/p2"], ["not a regular file"]),
    ("prepare", ["{empty}", "--out", "{dir}/p3"], ["no text"]),
    ("prepare", ["{text}", "--out", "{text}"], ["not a directory"]),
    ("prepare", ["{text}", "--out", "{dir}/p4", "--val-fraction", "nan"], ["--val-fraction"]),
    ("prepare", ["{text}", "--out", "{dir}/p5", "--val-fraction", "1"], ["--val-fraction"]),
    ("prepare", ["{text}", "--out", "{dir}/p6", "--tokenizer", "{dir}"],
     ["holds no tokenizer.json"]),
    ("prepare", ["{text}", "--out", "{dir}/p7", "--tokenizer", "no-such-tokenizer-anywhere"],
     ["no-such-tokenizer-anywhere", "no such directory", "tokenizer.json"]),
    ("prepare", ["{text}"], ["the following arguments are required: --out"]),
    # nntile-convert
    ("convert", [], ["required"]),
    ("convert", ["import", "{missing}", "{dir}/m.h5"], ["is not a directory"]),
    ("convert", ["import", "{dir}", "{dir}/m.h5"], ["has no config.json"]),
    ("convert", ["import", "{dir}", "{dir}"], ["is a directory: name the file to write"]),
    ("convert", ["import", "{dir}", "{missing}/m.h5"], ["does not exist"]),
    ("convert", ["export", "{text}", "{dir}/hf"], ["not a readable HDF5 file"]),
    ("convert", ["export", "{foreign}", "{dir}/hf"], ["not an nntile checkpoint"]),
    # nntile-eval and nntile-generate
    ("eval", ["--checkpoint", "{missing}"], ["does not exist"]),
    ("eval", ["--checkpoint", "{binary}"], ["not a readable HDF5 file"]),
    ("eval", ["--checkpoint", "{text}", "--batches", "0"], ["--batches", ">= 1"]),
    ("generate", ["--checkpoint", "{dir}"], ["is a directory"]),
    ("generate", ["--checkpoint", "{text}", "--temperature", "nan"], ["--temperature"]),
    ("generate", ["--checkpoint", "{text}", "--temperature=-0.5"], [">= 0"]),
    ("generate", ["--checkpoint", "{text}", "--top-p", "1.5"], ["--top-p", "(0, 1]"]),
    ("generate", ["--checkpoint", "{text}", "--top-k=-3"], ["--top-k"]),
    ("generate", ["--checkpoint", "{text}", "--max-new-tokens", "many"], ["not an integer"]),
    ("generate", ["--checkpoint", "{text}", "--prompt", "\udcff\udcfe"],
     ["--prompt is not UTF-8 text"]),
    ("generate", ["--checkpoint", "{text}", "--prompt", "\ud800"],
     ["--prompt is not UTF-8 text"]),
]


@pytest.mark.parametrize("program, argv, words", CASES,
                         ids=[f"{p}-{i}" for i, (p, _, _) in enumerate(CASES)])
def test_a_program_given_hostile_input_says_one_line(capsys, files, program, argv, words):
    argv = [re.sub(r"\{([\w-]+)\}", lambda m: str(files[m.group(1)]), a) for a in argv]
    if program == "train" and "--data" not in argv and "--resume" not in argv:
        argv += ["--data", str(files["data"])]
    if program == "train" and "--out" not in argv:
        argv += ["--out", str(files["dir"] / "unused-out")]
    code, err = run(capsys, program, *argv)
    assert_one_line(code, err, *words)


# ---- the Python API --------------------------------------------------------------------------

def _model(tiling=None):
    from nntile.models import GPT2Config, GPT2LMHead
    return GPT2LMHead(GPT2Config(vocab_size=64, n_positions=16, n_embd=16, n_layer=1,
                                 n_head=2), tiling=tiling)


def test_the_config_refuses_what_is_not_a_config():
    from nntile.models import GPT2Config
    for bad, match in [([1, 2], "JSON object"), ("gpt2", "JSON object"), (None, "JSON object"),
                       ({"n_embd": "64"}, "n_embd"), ({"n_head": 0}, "n_head"),
                       ({"n_layer": -1}, "n_layer"), ({"vocab_size": 2**40}, "at most"),
                       ({"layer_norm_epsilon": float("inf")}, "layer_norm_epsilon"),
                       ({"layer_norm_epsilon": None}, "layer_norm_epsilon"),
                       ({"tie_word_embeddings": 1}, "tie_word_embeddings"),
                       ({"activation_function": "relu"}, "gelu_new"),
                       ({"n_inner": 0}, "n_inner")]:
        with pytest.raises(ValueError, match=match):
            GPT2Config.from_dict(bad)


def test_a_model_refuses_hostile_tokens_and_tilings(ctx):
    for tiling, match in [({"embd": 0}, "embd"), ({"vocab": 10**6}, "vocab"),
                          ({"colour": 2}, "colour")]:
        with pytest.raises(ValueError, match=match):
            _model(tiling)
    model = _model()
    try:
        ids = np.zeros((2, 8), dtype=np.int64)
        for x, y, match in [(ids[0], ids[0], r"\[batch, seq\]"), (ids, ids[:, :4], "shape"),
                            (ids + 64, ids, "vocabulary|range|outside"),
                            (ids - 1, ids, "negative|range|outside"),
                            (ids.astype(np.float64) + 0.5, ids, "integer"),
                            (np.zeros((2, 17), np.int64), np.zeros((2, 17), np.int64),
                             "16|n_positions|longer")]:
            with pytest.raises((ValueError, TypeError), match=match):
                model.loss(x, y)
    finally:
        model.unregister()


def test_tensors_and_ops_refuse_hostile_shapes(ctx):
    with pytest.raises(ValueError):
        nntile.Tensor((4, 4), (0, 4))
    with pytest.raises(ValueError):
        nntile.Tensor((4, 4), (2,))
    with pytest.raises((ValueError, TypeError)):
        nntile.Tensor((4, -4), (2, 2))
    with pytest.raises((ValueError, TypeError)):
        nntile.Tensor((4, 4), (2, 2), "fp16")
    with pytest.raises((ValueError, TypeError)):
        nntile.Tensor.from_array(np.array(["a", "b"]), basetile=(1,))
    a = nntile.Tensor.from_array(np.ones((4, 4)), basetile=(2, 2))
    b = nntile.Tensor.from_array(np.ones((3, 4)), basetile=(3, 2))
    c = nntile.Tensor((4, 4), (2, 2), "fp64")
    with pytest.raises(ValueError):
        nntile.ops.gemm(1.0, a, "N", b, "N", 0.0, c)
    for t in (a, b, c):
        t.unregister()


def test_optimizers_schedules_and_sampling_refuse_hostile_settings(ctx):
    from nntile.optim import AdamW, LRSchedule
    for args in [(-1.0,), (1e-3, -1), (1e-3, 10, 5)]:
        with pytest.raises(ValueError):
            LRSchedule(*args)
    with pytest.raises(ValueError, match="no parameters"):
        AdamW([])
    model = _model()
    try:
        with pytest.raises(ValueError, match="max_grad_norm"):
            AdamW(model.named_parameters(), max_grad_norm=-1.0)
    finally:
        model.unregister()
    with pytest.raises(ValueError, match="NaN"):
        generate.token_probs(np.array([0.0, np.nan, 1.0]), 1.0)


def test_checkpoints_and_data_refuse_hostile_files(files):
    from nntile.checkpoint import Checkpoint, CheckpointError
    for name, match in [("missing", "does not exist"), ("dir", "is a directory"),
                        ("fifo", "not a regular file"), ("binary", "not a readable HDF5"),
                        ("foreign", "not an nntile checkpoint")]:
        with pytest.raises(CheckpointError, match=match):
            Checkpoint(str(files[name]))
    from nntile.cli_common import CLIError
    for name, match in [("data-odd", "not a whole number"), ("data-meta-list", "JSON object")]:
        with pytest.raises(CLIError, match=match):
            data.TokenData(str(files[name]))
    with pytest.raises(UnicodeEncodeError):  # a str that is not text: Python's own error
        data.ByteTokenizer().encode("\ud800")
    assert json.loads(json.dumps(data.ByteTokenizer().decode([255, 254])))  # replaced, no error
