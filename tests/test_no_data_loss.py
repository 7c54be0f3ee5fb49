"""Nothing is lost or replaced without asking (issue 26, first section): resuming from an
earlier checkpoint, re-running nntile-prepare and nntile-convert into existing outputs, two
runs into one --out, resuming on other data, and `make train` run twice."""
import json
import os
import subprocess
import sys
import time

import numpy as np
import pytest

from nntile.data import TokenData, prepare, stdlib_files
from tests.test_train_cli import ROOT, assert_clean_error, cli, data_dir, read_metrics, train  # noqa: F401

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")


def ckpts(out):
    return sorted(int(p.name[5:-3]) for p in out.glob("ckpt-*.h5"))


def test_resuming_an_earlier_checkpoint_keeps_both_lines_of_work(tmp_path, data_dir):  # noqa: F811
    out = tmp_path / "run"
    first = train(out, data_dir, "--steps", "20", "--save-every", "5", "--keep", "0")
    assert first.returncode == 0, first.stderr
    assert ckpts(out) == [5, 10, 15, 20]
    old_metrics = read_metrics(out / "metrics.jsonl")
    old_10 = (out / "ckpt-10.h5").read_bytes()

    again = train(out, data_dir, "--resume", out / "ckpt-5.h5", "--steps", "12", "--keep", "2",
                  "--save-every", "5")
    assert again.returncode == 0, again.stderr
    # the new line: its newest two checkpoints, and what the summary names exists
    assert ckpts(out) == [10, 12]
    assert "checkpoint " + str(out / "ckpt-12.h5") in again.stdout
    assert [r["step"] for r in read_metrics(out / "metrics.jsonl")] == list(range(1, 13))
    # the abandoned line (steps 10, 15, 20 after step 5) is kept aside, with its metrics
    aside = [p for p in out.iterdir() if p.is_dir()]
    assert len(aside) == 1, list(out.iterdir())
    assert str(aside[0]) in again.stderr  # and the run says where
    assert ckpts(aside[0]) == [10, 15, 20]
    assert (aside[0] / "ckpt-10.h5").read_bytes() == old_10
    assert read_metrics(aside[0] / "metrics.jsonl") == old_metrics

    # --overwrite deletes the abandoned line instead
    third = train(out, data_dir, "--resume", out / "ckpt-10.h5", "--steps", "11", "--overwrite")
    assert third.returncode == 0, third.stderr
    assert ckpts(out) == [10, 11]
    assert len([p for p in out.iterdir() if p.is_dir()]) == 1


def test_resuming_into_another_runs_directory_is_refused(tmp_path, data_dir):  # noqa: F811
    a, b = tmp_path / "a", tmp_path / "b"
    assert train(a, data_dir, "--steps", "4", "--save-every", "2").returncode == 0
    assert train(b, data_dir, "--steps", "3").returncode == 0
    result = train(b, data_dir, "--resume", a / "ckpt-2.h5", "--steps", "4")
    assert_clean_error(result, str(b), "another run", "--overwrite")
    assert ckpts(b) == [3]


def test_a_second_run_into_a_busy_out_is_refused_at_once(tmp_path, data_dir):  # noqa: F811
    out = tmp_path / "run"
    from tests.test_train_cli import TINY, cli_env
    first = subprocess.Popen([sys.executable, "-m", "nntile.train", *TINY, "--data",
                              str(data_dir), "--out", str(out), "--steps", "100000"],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                             env=cli_env())
    try:
        deadline = time.time() + 120
        while not (out / "metrics.jsonl").exists() and time.time() < deadline:
            assert first.poll() is None, first.communicate()
            time.sleep(0.05)
        start = time.time()
        second = train(out, data_dir, "--steps", "3", "--overwrite")
        line = assert_clean_error(second, str(out), "in use", str(first.pid))
        assert time.time() - start < 60, line
        assert first.poll() is None  # the first goes on training
    finally:
        first.terminate()
        first.communicate(timeout=120)
    assert first.returncode == 143
    assert ckpts(out)  # it saved on SIGTERM, untouched by the second


def test_overwrite_finds_what_blocks_the_run_before_deleting(tmp_path, data_dir):  # noqa: F811
    out = tmp_path / "run"
    assert train(out, data_dir, "--steps", "2").returncode == 0
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    for name in ("ckpt-99.h5", "ckpt-7.h5.tmp"):  # a checkpoint, a partial save: files
        (out / name).mkdir()
        result = train(out, data_dir, "--steps", "2", "--overwrite")
        assert_clean_error(result, f"holds a directory {name}", "move that directory away")
        assert {p.name: p.read_bytes() for p in out.iterdir() if p.is_file()} == before
        (out / name).rmdir()


def test_resuming_on_other_data_warns_with_both_sizes(tmp_path, data_dir):  # noqa: F811
    out = tmp_path / "run"
    assert train(out, data_dir, "--steps", "3").returncode == 0
    bigger = tmp_path / "bigger"
    prepare(stdlib_files()[1][:60], str(bigger))
    old, new = len(TokenData(str(data_dir))), len(TokenData(str(bigger)))
    result = train(out, bigger, "--resume", "latest", "--steps", "4")
    assert result.returncode == 0, result.stderr
    warning = [line for line in result.stderr.splitlines() if "warning" in line]
    assert len(warning) == 1, result.stderr
    assert f"{old:,}" in warning[0] and f"{new:,}" in warning[0], warning[0]
    same = train(out, bigger, "--resume", "latest", "--steps", "5")
    assert "warning" not in same.stderr  # the checkpoint now records the new data


def test_prepare_refuses_to_replace_a_data_set(tmp_path):
    files = stdlib_files()[1]
    out = tmp_path / "data"
    assert cli("data", files[0], files[1], "--out", out).returncode == 0
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    result = cli("data", files[2], "--out", out)
    assert_clean_error(result, str(out), "--overwrite")
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before
    result = cli("data", files[2], "--out", out, "--overwrite")
    assert result.returncode == 0, result.stderr
    assert (out / "train.bin").read_bytes() != before["train.bin"]


# run as `python -c PAUSED_BEFORE_WRITING READY GO ARGS...`: nntile-prepare ARGS, which
# creates the file READY once it has checked --out and tokenized, and waits for GO to write
PAUSED_BEFORE_WRITING = """
import os, sys, time
import nntile.data as data
write_dataset = data.write_dataset
def paused(*args, **kwargs):
    open(sys.argv[1], "w").close()
    while not os.path.exists(sys.argv[2]):
        time.sleep(0.02)
    return write_dataset(*args, **kwargs)
data.write_dataset = paused
sys.exit(data.main(sys.argv[3:]))
"""


def test_a_second_prepare_into_the_same_out_is_refused(tmp_path):
    """Two nntile-prepare started together: the second, which checks --out while the first
    tokenizes, is refused instead of replacing the first's data set (or being replaced)."""
    from tests.test_train_cli import cli_env
    files = stdlib_files()[1]
    out, ready, go = tmp_path / "data", tmp_path / "ready", tmp_path / "go"
    first = subprocess.Popen([sys.executable, "-c", PAUSED_BEFORE_WRITING, str(ready), str(go),
                              files[0], "--out", str(out)], stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True, env=cli_env())
    try:
        deadline = time.time() + 120
        while not ready.exists():
            assert first.poll() is None and time.time() < deadline, first.communicate()
            time.sleep(0.02)
        second = cli("data", files[1], "--out", out)
    finally:
        go.touch()
        stdout, stderr = first.communicate(timeout=120)
    assert first.returncode == 0, stderr
    assert_clean_error(second, str(out), "in use", str(first.pid))
    data = TokenData(str(out))
    tokens = np.concatenate([data.splits["train"], data.splits["val"]])
    assert tokens.tobytes() == np.frombuffer(open(files[0], "rb").read(), np.uint8).astype(
        np.uint16).tobytes()


def test_a_data_file_cut_at_a_token_boundary_is_refused(tmp_path):
    """uint32 tokens, train.bin cut to 20,250 of the 27,000 that meta.json records: whole
    tokens, so only the count tells."""
    from nntile.cli_common import CLIError
    data = tmp_path / "data"
    data.mkdir()
    rng = np.random.default_rng(0)
    for split, count in (("train", 27_000), ("val", 3_000)):
        rng.integers(0, 70_000, count, dtype=np.uint32).tofile(data / f"{split}.bin")
    (data / "meta.json").write_text(json.dumps(dict(
        tokenizer="byte", vocab_size=70_000, dtype="uint32", train_tokens=27_000,
        val_tokens=3_000)))
    assert len(TokenData(str(data))) == 27_000
    with open(data / "train.bin", "r+b") as f:
        f.truncate(20_250 * 4)
    with pytest.raises(CLIError, match="train.bin holds 20,250 tokens, meta.json records "
                       "27,000"):
        TokenData(str(data))
    result = train(tmp_path / "run", data, "--steps", "1")
    assert_clean_error(result, str(data / "train.bin"), "20,250", "27,000")
    (data / "meta.json").write_text(json.dumps(dict(vocab_size=70_000, train_tokens="all")))
    with pytest.raises(CLIError, match="train_tokens 'all' is not a token count"):
        TokenData(str(data))


def test_prepare_never_reads_its_own_outputs(tmp_path):
    src = tmp_path / "corpus"
    src.mkdir()
    (src / "a.py").write_text("print('hello world')\n" * 50)
    assert cli("data", src, "--out", src).returncode == 0
    meta = json.loads((src / "meta.json").read_text())
    # run again over the same directory: the data set's files are not text to tokenize
    result = cli("data", src, "--out", src, "--overwrite")
    assert result.returncode == 0, result.stderr
    assert json.loads((src / "meta.json").read_text())["train_tokens"] == meta["train_tokens"]
    result = cli("data", src / "train.bin", "--out", src, "--overwrite")
    assert_clean_error(result, "train.bin", "output")


def test_an_interrupted_prepare_leaves_no_mixed_data_set(tmp_path, monkeypatch):
    """A kill between the files' renames: the old set, or a set that refuses to load."""
    import nntile.data as data
    out = tmp_path / "data"
    files = stdlib_files()[1]
    prepare(files[:2], str(out))
    old = {p.name: p.read_bytes() for p in out.iterdir()}
    renames = []
    real_replace = os.replace

    def killed_after(n):
        def replace(src, dst):
            if len(renames) == n:
                raise KeyboardInterrupt  # the process dies here
            renames.append(dst)
            real_replace(src, dst)
        return replace

    for n in range(4):
        renames.clear()
        monkeypatch.setattr(data.os, "replace", killed_after(n))
        with pytest.raises(KeyboardInterrupt):
            prepare(files[2:5], str(out), overwrite=True)
        monkeypatch.setattr(data.os, "replace", real_replace)
        now = {p.name: p.read_bytes() for p in out.iterdir() if not p.name.startswith(".")}
        if now == old:
            continue
        with pytest.raises(Exception, match="interrupted"):
            TokenData(str(out))
        prepare(files[:2], str(out), overwrite=True)  # a new run repairs it
        assert {p.name: p.read_bytes() for p in out.iterdir()} == old


def _save_tiny_gpt2(path):
    config = transformers.GPT2Config(vocab_size=256, n_positions=32, n_embd=16, n_layer=1,
                                     n_head=2)
    transformers.GPT2LMHeadModel(config).save_pretrained(path)


def test_convert_refuses_to_replace_a_checkpoint_or_a_model_directory(tmp_path):
    _save_tiny_gpt2(tmp_path / "hf")
    ckpt = tmp_path / "model.h5"
    assert cli("convert", "import", tmp_path / "hf", ckpt).returncode == 0
    stamp = ckpt.read_bytes()
    result = cli("convert", "import", tmp_path / "hf", ckpt)
    assert_clean_error(result, str(ckpt), "--overwrite")
    assert ckpt.read_bytes() == stamp
    assert cli("convert", "import", tmp_path / "hf", ckpt, "--overwrite").returncode == 0

    before = {p.name: p.read_bytes() for p in (tmp_path / "hf").iterdir()}
    result = cli("convert", "export", ckpt, tmp_path / "hf")
    assert_clean_error(result, "config.json", "--overwrite")
    assert {p.name: p.read_bytes() for p in (tmp_path / "hf").iterdir()} == before
    result = cli("convert", "export", ckpt, tmp_path / "hf", "--overwrite")
    assert result.returncode == 0, result.stderr


# run as `python -c KILLED_AT N ARGS...`: nntile-convert ARGS, killed (SIGKILL) at its N-th
# rename, file replacement or directory removal, where an export changes what is on disk
KILLED_AT = """
import os, shutil, signal, sys
calls = [0]
def killed_at(n, real):
    def call(*args, **kwargs):
        if calls[0] == n:
            os.kill(os.getpid(), signal.SIGKILL)
        calls[0] += 1
        return real(*args, **kwargs)
    return call
n = int(sys.argv[1])
os.replace, os.rename, shutil.rmtree = (killed_at(n, f) for f in (os.replace, os.rename,
                                                                   shutil.rmtree))
from nntile.convert import main
sys.exit(main(sys.argv[2:]))
"""


def _files(directory):
    return {p.name: p.read_bytes() for p in directory.iterdir()}


def test_an_export_killed_at_any_point_leaves_the_old_model_or_the_new(tmp_path):
    """A Llama checkpoint exported over a GPT-2 directory: killed at each step, the directory
    holds the GPT-2 model or the Llama one, never Llama weights under GPT-2's config.json."""
    from tests.test_train_cli import cli_env
    _save_tiny_gpt2(tmp_path / "hf")
    (tmp_path / "hf" / "README.md").write_text("my notes\n")  # not the model's: kept
    transformers.LlamaForCausalLM(transformers.LlamaConfig(
        vocab_size=256, hidden_size=16, intermediate_size=24, num_hidden_layers=1,
        num_attention_heads=4, num_key_value_heads=2)).save_pretrained(tmp_path / "llama")
    ckpt = tmp_path / "llama.h5"
    assert cli("convert", "import", tmp_path / "llama", ckpt).returncode == 0
    assert cli("convert", "export", ckpt, tmp_path / "fresh").returncode == 0
    old = _files(tmp_path / "hf")
    new = dict(old, **_files(tmp_path / "fresh"))
    for n in range(20):
        result = subprocess.run([sys.executable, "-c", KILLED_AT, str(n), "export", str(ckpt),
                                 str(tmp_path / "hf"), "--overwrite"], capture_output=True,
                                text=True, timeout=180, env=cli_env())
        if result.returncode == 0:
            break
        assert result.returncode == -9, result.stderr
        assert _files(tmp_path / "hf") in (old, new), (n, sorted(_files(tmp_path / "hf")))
    assert n >= 2 and _files(tmp_path / "hf") == new
    model = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "hf")
    assert type(model) is transformers.LlamaForCausalLM
    # what a killed export left is a hidden directory beside, never in, the model's
    assert all(p.name.startswith(".") for p in tmp_path.iterdir()
               if p.name not in ("hf", "llama", "fresh", "llama.h5"))


def make_train(runs, *args):
    from tests.test_train_cli import TINY
    return subprocess.run(["make", "-s", "-C", str(ROOT), "train-run", f"CHECKPOINTS={runs}",
                           f"TRAIN_ARGS={' '.join(map(str, TINY + list(args)))}",
                           f"PYTHON={sys.executable}"],
                          capture_output=True, text=True, timeout=300,
                          env=dict(os.environ, PYTHONPATH=str(ROOT)))


def test_make_train_keeps_earlier_runs_and_resumes_the_latest(tmp_path, data_dir):  # noqa: F811
    """`make train` twice: two run directories (0777 less the umask), LATEST naming the
    second, which `--resume latest` continues in place, through make or the program."""
    runs = tmp_path / "checkpoints"
    old_umask = os.umask(0o022)
    try:
        for _ in range(2):
            result = make_train(runs, "--data", data_dir, "--steps", "2")
            assert result.returncode == 0, result.stderr
        refused = make_train(runs, "--data", data_dir, "--steps", "0")
        assert refused.returncode != 0
    finally:
        os.umask(old_umask)
    dirs = sorted(p for p in runs.iterdir() if p.is_dir())
    assert len(dirs) == 2 and all(ckpts(d) == [2] for d in dirs)  # the refused run left none
    assert all(d.stat().st_mode & 0o777 == 0o755 for d in dirs)
    assert (runs / "LATEST").read_text().strip() == dirs[-1].name
    resumed = make_train(runs, "--data", data_dir, "--resume", "latest", "--steps", "3")
    assert resumed.returncode == 0, resumed.stderr
    assert sorted(p for p in runs.iterdir() if p.is_dir()) == dirs
    assert ckpts(dirs[0]) == [2] and ckpts(dirs[-1]) == [2, 3]
    again = cli("train", "--resume", "latest", "--steps", "4", "--no-progress", "--ncpu", "2",
                cwd=tmp_path)
    assert again.returncode == 0, again.stderr
    assert ckpts(dirs[-1]) == [2, 3, 4]
    # TensorBoard (which follows links to directories) finds each run once
    io_wrapper = pytest.importorskip("tensorboard.backend.event_processing.io_wrapper")
    found = io_wrapper.GetLogdirSubdirectories(str(runs))
    assert sorted(found) == [str(d) for d in dirs]
