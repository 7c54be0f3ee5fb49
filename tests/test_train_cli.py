"""nntile-train as a user runs it: subprocesses, real signals, exact resume, bad input."""
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[1]
MODEL = ["--n-layer", "2", "--n-head", "2", "--n-embd", "32", "--seq-len", "32"]
RUN = ["--batch-size", "4", "--tile-batch", "2", "--tile-seq", "16", "--ncpu", "2",
       "--no-progress", "--lr", "3e-3"]
TINY = MODEL + RUN


def cli_env(extra=None):
    """This process's environment with ``extra``'s variables; one set to None is removed."""
    env = dict(os.environ)
    env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    env.update(extra or {})
    return {name: value for name, value in env.items() if value is not None}


def cli(module, *args, cwd=None, timeout=180, env=None):
    """Run ``python -m nntile.<module> args`` and return the CompletedProcess."""
    return subprocess.run([sys.executable, "-m", f"nntile.{module}", *map(str, args)],
                          capture_output=True, text=True, timeout=timeout, cwd=cwd,
                          env=cli_env(env))


def assert_clean_error(result, *words):
    """Exit code 2, one line on stderr naming the problem, no traceback."""
    assert result.returncode == 2, (result.returncode, result.stdout, result.stderr)
    assert "Traceback" not in result.stderr, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    for word in words:
        assert word in lines[0], (word, lines[0])
    return lines[0]


def read_metrics(path):
    with open(path) as f:
        return [json.loads(line) for line in f]


@pytest.fixture(scope="session")
def data_dir(tmp_path_factory):
    """A small byte-level dataset (a few standard-library files)."""
    from nntile.data import prepare, stdlib_files
    out = tmp_path_factory.mktemp("data") / "bytes"
    prepare(stdlib_files()[1][:30], str(out))
    return out


def train(out, data, *extra, **kw):
    return cli("train", *TINY, "--data", data, "--out", out, *extra, **kw)


def test_small_run_writes_metrics_checkpoints_plot_and_summary(tmp_path, data_dir):
    out = tmp_path / "run"
    result = train(out, data_dir, "--steps", "12", "--eval-every", "5", "--save-every", "4",
                   "--keep", "2", "--grad-accum", "2")
    assert result.returncode == 0, result.stderr
    assert "2 CPU workers, scheduler " in result.stderr  # ctx.describe(verbose=False)
    # the tiles: the flags' as given, the rest chosen (nntile.policy.tiles)
    assert "tiles: batch 2 of 4 (2 tiles), seq 16 of 32 (2 tiles)" in result.stderr
    summary = result.stdout.strip().splitlines()
    assert len(summary) == 1 and "step 12/12" in summary[0] and "tokens/s" in summary[0]
    records = read_metrics(out / "metrics.jsonl")
    assert [r["step"] for r in records] == list(range(1, 13))
    for r in records:
        assert set(r) >= {"step", "loss", "lr", "tokens_per_s", "tflops"}
        assert np.isfinite(r["loss"]) and r["tokens_per_s"] > 0 and r["tflops"] > 0
    assert [r["step"] for r in records if "val_loss" in r] == [5, 10, 12]
    assert records[-1]["loss"] < records[0]["loss"]
    # --keep 2: the newest two of ckpt-4, -8, -12
    assert sorted(p.name for p in out.glob("ckpt-*")) == ["ckpt-12.h5", "ckpt-8.h5"]
    assert not list(out.glob("*.tmp"))
    assert (out / "loss.png").stat().st_size > 1000
    # the checkpoint holds everything a resume needs
    import h5py
    with h5py.File(out / "ckpt-12.h5", "r") as f:
        for key in ("config", "tiling", "dtype", "step", "schedule", "optimizer", "rng",
                    "data", "format_version"):
            assert key in f.attrs, key
        assert f.attrs["step"] == 12
        assert json.loads(f.attrs["optimizer"])["step_count"] == 12
        assert json.loads(f.attrs["data"])["batches_drawn"] == 24  # 12 steps x 2 micro
        wte = f["params/transformer.wte.weight"]
        assert wte.chunks == (256, 32)
        q = f["params/transformer.h.0.attn.q.weight"]
        assert q.shape == (32, 2, 16)
        assert "optim/transformer.h.0.attn.q.weight/exp_avg" in f
    # running again into the same --out without --resume is refused, nothing touched
    again = train(out, data_dir, "--steps", "12")
    assert_clean_error(again, "already holds checkpoints", "--resume latest")
    assert len(read_metrics(out / "metrics.jsonl")) == 12
    # already finished: resuming with the same --steps does nothing and says how to go on
    done = train(out, data_dir, "--steps", "12", "--resume", "latest")
    assert done.returncode == 0, done.stderr
    assert "at step 12, the end of --steps 12" in done.stdout
    assert "pass a larger --steps" in done.stdout


def test_starpu_messages_and_settings_only_under_verbose(tmp_path, data_dir):
    """Without -v: no line of StarPU's own and no runtime setting, but one line saying that
    StarPU calibrates; with -v, StarPU's performance-model warnings, the settings and the
    CPU's BLAS. dmda on performance models not measured yet makes StarPU calibrate (lws, the
    default without GPUs, reads no model)."""
    # nntile's defaults as such: no STARPU_ variable that an earlier test's Context set
    env = {name: None for name in os.environ if name.startswith("STARPU_")}
    env.update({"STARPU_PERF_MODEL_DIR": str(tmp_path / "models"), "STARPU_HOSTNAME": "test"})
    quiet = train(tmp_path / "quiet", data_dir, "--steps", "2", "--sched", "dmda", env=env)
    assert quiet.returncode == 0, quiet.stderr
    lines = quiet.stderr.splitlines()
    assert not [line for line in lines if line.startswith("[starpu]")], quiet.stderr
    assert not [line for line in lines if "(nntile default" in line], quiet.stderr
    assert len([line for line in lines if "StarPU is calibrating" in line]) == 1, quiet.stderr
    verbose = train(tmp_path / "verbose", data_dir, "--steps", "2", "--sched", "dmda", "-v",
                    env=dict(env, STARPU_PERF_MODEL_DIR=str(tmp_path / "models-v")))
    assert verbose.returncode == 0, verbose.stderr
    assert "is not calibrated enough" in verbose.stderr
    assert "history_max_error = 1000 (nntile default" in verbose.stderr
    assert "CPU BLAS: OpenBLAS " in verbose.stderr
    assert "StarPU is calibrating" not in verbose.stderr


def _start(out, data, *extra):
    return subprocess.Popen([sys.executable, "-m", "nntile.train", *TINY, "--data", str(data),
                             "--out", str(out), *extra], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=cli_env())


def _wait_for_steps(proc, metrics, count, timeout=120):
    deadline = time.time() + timeout
    while time.time() < deadline:
        if proc.poll() is not None:
            out, err = proc.communicate()
            pytest.fail(f"training ended (code {proc.returncode}) before step {count}: {err}")
        if metrics.exists():
            with open(metrics) as f:
                if sum(1 for _ in f) >= count:
                    return
        time.sleep(0.02)
    proc.kill()
    pytest.fail("training made no progress")


def test_interrupted_and_resumed_run_equals_uninterrupted_run_bit_for_bit(tmp_path, data_dir):
    # enough steps that both signals land before the end; two validation batches, as the
    # exactness under test does not depend on how many
    total = 160
    steps = ["--steps", str(total), "--eval-every", "20", "--eval-batches", "2",
             "--save-every", "40", "--keep", "2"]
    reference = train(tmp_path / "ref", data_dir, *steps)
    assert reference.returncode == 0, reference.stderr
    expected = read_metrics(tmp_path / "ref" / "metrics.jsonl")

    out = tmp_path / "interrupted"
    metrics = out / "metrics.jsonl"
    proc = _start(out, data_dir, *steps)
    _wait_for_steps(proc, metrics, 15)
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 130, err
    assert "Traceback" not in err
    first_stop = len(read_metrics(metrics))
    assert 15 <= first_stop < total
    assert (out / f"ckpt-{first_stop}.h5").exists()
    assert not list(out.glob("*.tmp"))

    proc = _start(out, data_dir, *steps, "--resume", "latest")
    _wait_for_steps(proc, metrics, first_stop + 15)
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 143, err
    second_stop = len(read_metrics(metrics))
    assert first_stop < second_stop < total
    assert (out / f"ckpt-{second_stop}.h5").exists()

    final = train(out, data_dir, *steps, "--resume", "latest")
    assert final.returncode == 0, final.stderr
    got = read_metrics(metrics)
    assert [r["step"] for r in got] == list(range(1, total + 1))
    assert [r["loss"] for r in got] == [r["loss"] for r in expected]  # exact floats
    assert [r["lr"] for r in got] == [r["lr"] for r in expected]
    assert [r.get("val_loss") for r in got] == [r.get("val_loss") for r in expected]


def test_resume_into_another_tiling(tmp_path, data_dir):
    out = tmp_path / "run"
    first = train(out, data_dir, "--steps", "6", "--save-every", "3", "--eval-every", "0")
    assert first.returncode == 0, first.stderr
    expected = read_metrics(out / "metrics.jsonl")
    os.unlink(out / "ckpt-6.h5")
    again = train(out, data_dir, "--steps", "6", "--resume", str(out / "ckpt-3.h5"),
                  "--tile-embd", "10", "--tile-vocab", "100", "--tile-inner", "48",
                  "--tile-head", "1", "--tile-batch", "4", "--tile-seq", "32")
    assert again.returncode == 0, again.stderr
    got = read_metrics(out / "metrics.jsonl")
    assert [r["step"] for r in got] == list(range(1, 7))
    assert got[:3] == expected[:3]
    for a, b in zip(got[3:], expected[3:]):  # another tiling sums in another order
        assert abs(a["loss"] - b["loss"]) <= 1e-4 * abs(b["loss"])


def test_resume_with_a_damaged_checkpoint_fails_cleanly(tmp_path, data_dir):
    import h5py
    out = tmp_path / "run"
    assert train(out, data_dir, "--steps", "2", "--eval-every", "0").returncode == 0
    before = (out / "metrics.jsonl").read_text()
    with h5py.File(out / "ckpt-2.h5", "a") as f:
        del f["params/transformer.h.1.mlp.c_fc.bias"]
    result = train(out, data_dir, "--steps", "4", "--resume", "latest")
    assert_clean_error(result, "ckpt-2.h5", "corrupt", "checksum")  # a dataset went missing
    assert (out / "metrics.jsonl").read_text() == before  # nothing touched
    assert sorted(p.name for p in out.iterdir() if "tfevents" not in p.name) == [
        "ckpt-2.h5", "loss.png", "metrics.jsonl"]


def _bad_data(tmp_path, data_dir, kind):
    bad = tmp_path / "bad"
    bad.mkdir()
    val = np.fromfile(data_dir / "val.bin", dtype=np.uint16)
    val.tofile(bad / "val.bin")
    if kind == "odd":
        (bad / "train.bin").write_bytes(b"\x01\x00\x02\x00\x03")
    elif kind == "empty":
        (bad / "train.bin").write_bytes(b"")
    elif kind == "directory":
        (bad / "train.bin").mkdir()
    elif kind == "big ids":
        ids = np.fromfile(data_dir / "train.bin", dtype=np.uint16)[:5000].copy()
        ids[1234] = 300
        ids.tofile(bad / "train.bin")
    elif kind == "short":
        np.arange(10, dtype=np.uint16).tofile(bad / "train.bin")
    elif kind == "no val":
        os.unlink(bad / "val.bin")
        val.tofile(bad / "train.bin")
    return bad


BAD_DATA = {
    "odd": "not a whole number of uint16 tokens",
    "empty": "is empty",
    "directory": "not a regular file",
    "big ids": "token id 300",
    "short": "fewer than",
    "no val": "val.bin does not exist",
}


@pytest.mark.parametrize("kind", list(BAD_DATA))
def test_bad_data(tmp_path, data_dir, kind):
    bad = _bad_data(tmp_path, data_dir, kind)
    extra = ["--vocab-size", "256"] if kind == "big ids" else []
    result = train(tmp_path / "out", bad, "--steps", "2", *extra)
    assert_clean_error(result, BAD_DATA[kind])
    assert not (tmp_path / "out").exists()  # nothing half-written


def test_bad_flags(tmp_path, data_dir):
    out = tmp_path / "out"
    config = tmp_path / "config.json"
    config.write_text(json.dumps(dict(vocab_size=256, n_positions=32, n_embd=32, n_layer=1,
                                      n_head=2)))
    bert = tmp_path / "bert.json"
    bert.write_text(json.dumps(dict(model_type="bert")))
    a_file = tmp_path / "file"
    a_file.write_text("x")
    corrupt = tmp_path / "corrupt.h5"
    corrupt.write_bytes(os.urandom(4096))
    base = ["--data", data_dir, "--steps", "2"]
    cases = [
        (["--data", tmp_path / "nowhere", "--out", out], "does not exist"),
        (["--data", a_file, "--out", out], "not a directory"),
        (base + ["--out", out, "--config", config, "--n-embd", "64"], "conflict"),
        (base + ["--out", out, "--config", tmp_path / "none.json"], "no such file"),
        (base + ["--out", out, "--config", bert], "bert"),
        (base + ["--out", out, "--tile-embd", "64"], "larger than n_embd"),
        (base + ["--out", out, "--tile-batch", "8"], "larger than the batch size"),
        (base + ["--out", out, "--tile-seq", "33"], "larger than the sequence length"),
        (base + ["--out", out, "--n-embd", "33"], "divisible"),
        (base + ["--out", out, "--dtype", "fp16"], "fp16"),
        (base + ["--out", out, "--attention", "flash"], "--attention: invalid choice: 'flash'"),
        (base + ["--out", out, "--lr", "-1"], "--lr"),
        (base + ["--out", out, "--warmup", "5"], "--warmup"),
        (base + ["--out", out, "--steps", "0"], "--steps"),
        (base + ["--out", a_file], "not a directory"),
        (base + ["--out", a_file / "sub"], "not writable"),
        (base + ["--out", out, "--resume", tmp_path / "missing.h5"], "no such checkpoint"),
        (base + ["--out", out, "--resume", corrupt], "not a readable HDF5 file"),
        (base + ["--out", out, "--resume", a_file], "not a readable HDF5 file"),
        (base + ["--out", out, "--resume", "latest"], "no checkpoint"),
        (base + ["--out", out, "--resume", "latest", "--init", corrupt], "conflict"),
        (base + ["--out", out, "--no-such-flag"], "--no-such-flag"),
    ]
    for args, words in cases:
        result = cli("train", *(RUN if "--config" in args else TINY), *args)
        assert_clean_error(result, words)
        assert not out.exists(), args


def test_checkpoint_of_another_model_is_refused(tmp_path, data_dir):
    out = tmp_path / "run"
    assert train(out, data_dir, "--steps", "1", "--eval-every", "0").returncode == 0
    result = train(out, data_dir, "--steps", "2", "--resume", "latest", "--n-embd", "64")
    assert_clean_error(result, "--n-embd 64 conflicts with checkpoint", "n_embd = 32")


def test_attention_flag_and_checkpoints(tmp_path, data_dir):
    """--attention unfused trains to the fused run's losses; the checkpoint keeps the choice,
    which a resumed run takes unless told otherwise."""
    from nntile.train import build_parser, resolve
    steps = ["--steps", "3", "--eval-every", "0"]
    runs = {att: train(tmp_path / att, data_dir, *steps, "--attention", att)
            for att in ("fused", "unfused")}
    assert all(r.returncode == 0 for r in runs.values()), runs
    losses = {att: [r["loss"] for r in read_metrics(tmp_path / att / "metrics.jsonl")]
              for att in runs}
    np.testing.assert_allclose(losses["fused"], losses["unfused"], rtol=1e-5)
    ckpt = str(tmp_path / "unfused" / "ckpt-3.h5")
    for flags, want in (([], "unfused"), (["--attention", "fused"], "fused")):
        s = resolve(build_parser().parse_args(["--resume", ckpt, "--data", str(data_dir),
                                               *flags]))
        assert s.config.attention == want


def test_recompute_flag_trains_to_the_same_losses_and_says_so(tmp_path, data_dir):
    """--recompute, and --recompute 1 (the first block only): the same losses, bit for bit,
    as --no-recompute; the start-up line says so (on this machine the policy leaves it off:
    the run fits either way)."""
    steps = ["--steps", "2", "--eval-every", "0"]
    runs = {flag: train(tmp_path / flag.replace(" ", "-"), data_dir, *steps, *flag.split())
            for flag in ("--recompute", "--recompute 1", "--no-recompute")}
    assert all(r.returncode == 0 for r in runs.values()), runs
    losses = {flag: [r["loss"] for r in read_metrics(
        tmp_path / flag.replace(" ", "-") / "metrics.jsonl")] for flag in runs}
    assert losses["--recompute"] == losses["--recompute 1"] == losses["--no-recompute"]
    assert "activations recomputed in backward\n" in runs["--recompute"].stderr
    assert "activations recomputed in backward (the first block)" in \
        runs["--recompute 1"].stderr
    assert "recomputed" not in runs["--no-recompute"].stderr


def test_second_signal_abandons_the_step_and_resume_stays_exact(tmp_path, data_dir):
    steps = ["--steps", "5", "--grad-accum", "12", "--eval-every", "0", "--save-every", "0"]
    reference = train(tmp_path / "ref", data_dir, *steps)
    assert reference.returncode == 0, reference.stderr
    out = tmp_path / "run"
    proc = _start(out, data_dir, *steps)
    _wait_for_steps(proc, out / "metrics.jsonl", 2)
    proc.send_signal(signal.SIGINT)
    time.sleep(0.05)
    proc.send_signal(signal.SIGINT)  # most likely mid-step: that step is dropped
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 130, err
    done = len(read_metrics(out / "metrics.jsonl"))
    assert [p.name for p in out.glob("ckpt-*.h5")] == [f"ckpt-{done}.h5"]
    final = train(out, data_dir, *steps, "--resume", "latest")
    assert final.returncode == 0, final.stderr
    assert read_metrics(out / "metrics.jsonl") == [
        dict(r, tokens_per_s=g["tokens_per_s"], tflops=g["tflops"])
        for r, g in zip(read_metrics(tmp_path / "ref" / "metrics.jsonl"),
                        read_metrics(out / "metrics.jsonl"))]


def test_model_from_a_config_file_in_fp64(tmp_path, data_dir):
    config = tmp_path / "config.json"  # transformers' keys; unknown ones are ignored
    config.write_text(json.dumps(dict(model_type="gpt2", vocab_size=256, n_positions=24,
                                      n_embd=24, n_layer=1, n_head=3, n_inner=40,
                                      resid_pdrop=0.1, architectures=["GPT2LMHeadModel"])))
    out = tmp_path / "run"
    result = cli("train", *RUN, "--config", config, "--data", data_dir, "--out", out,
                 "--steps", "3", "--seq-len", "16", "--tile-seq", "8", "--dtype", "fp64")
    assert result.returncode == 0, result.stderr
    import h5py
    with h5py.File(out / "ckpt-3.h5", "r") as f:
        assert json.loads(f.attrs["config"])["n_inner"] == 40
        assert f.attrs["dtype"] == b"fp64"  # fixed-length strings read as bytes
        assert f["params/transformer.h.0.mlp.c_fc.weight"].dtype == np.float64
        assert json.loads(f.attrs["train"])["seq_len"] == 16
    assert_clean_error(cli("train", *RUN, "--config", config, "--data", data_dir, "--out",
                           tmp_path / "o2", "--seq-len", "25"), "n_positions (24)")


def test_bf16_run_checkpoints_and_resumes(tmp_path, data_dir):
    out = tmp_path / "run"
    result = cli("train", *TINY, "--data", data_dir, "--out", out, "--steps", "4",
                 "--save-every", "2", "--dtype", "bf16")
    assert result.returncode == 0, result.stderr
    losses = [json.loads(line)["loss"] for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert len(losses) == 4 and all(np.isfinite(losses))
    import h5py
    with h5py.File(out / "ckpt-4.h5", "r") as f:
        assert f.attrs["dtype"] == b"bf16"
        weight = f["params/transformer.wte.weight"][...]
    # bf16 values stored exactly: the low 16 bits of their float32 patterns are zero
    assert not (weight.astype(np.float32).view(np.uint32) & 0xFFFF).any()
    resumed = cli("train", *TINY, "--data", data_dir, "--out", out, "--steps", "6",
                  "--dtype", "bf16", "--resume", "latest")
    assert resumed.returncode == 0, resumed.stderr


def test_bf16_mixed_run_resumes_bit_for_bit_and_exports_bf16(tmp_path, data_dir):
    steps = ["--steps", "6", "--save-every", "3", "--eval-every", "3", "--precision",
             "bf16-mixed"]
    ref = tmp_path / "ref"
    result = train(ref, data_dir, *steps)
    assert result.returncode == 0, result.stderr
    import h5py
    import shutil
    with h5py.File(ref / "ckpt-3.h5", "r") as f:
        assert f.attrs["dtype"] == b"bf16-mixed"  # fixed-length strings read as bytes
        master = f["params/transformer.h.0.mlp.c_fc.weight"][...]
        assert master.dtype == np.float32  # the fp32 masters: not bf16 values
        assert (master.view(np.uint32) & 0xFFFF).any()
        assert not any("copy" in name for name in f["params"])  # copies are derived
    # resume from step 3 (Adam states, bf16 copies refreshed from the masters): the same run
    out = tmp_path / "resumed"
    shutil.copytree(ref, out)
    (out / "ckpt-6.h5").unlink()
    lines = (out / "metrics.jsonl").read_text().splitlines()
    (out / "metrics.jsonl").write_text("".join(line + "\n" for line in lines[:3]))
    result = train(out, data_dir, *steps, "--resume", "latest")
    assert result.returncode == 0, result.stderr
    got, expected = read_metrics(out / "metrics.jsonl"), read_metrics(ref / "metrics.jsonl")
    assert [r["loss"] for r in got] == [r["loss"] for r in expected]  # exact floats
    assert [r.get("val_loss") for r in got] == [r.get("val_loss") for r in expected]
    # export in bf16 on request: the masters rounded to nearest even (fp32, the default, is
    # the path of every checkpoint: tests/test_convert.py)
    pytest.importorskip("safetensors")
    torch = pytest.importorskip("torch")
    hf_dir = tmp_path / "hf"
    result = cli("convert", "export", ref / "ckpt-6.h5", hf_dir, "--dtype", "bf16")
    assert result.returncode == 0, result.stderr
    assert json.loads((hf_dir / "config.json").read_text())["torch_dtype"] == "bfloat16"
    from safetensors import safe_open
    with safe_open(hf_dir / "model.safetensors", "pt") as f:
        weight = f.get_tensor("transformer.h.0.mlp.c_fc.weight")
    with h5py.File(ref / "ckpt-6.h5", "r") as f:
        master = f["params/transformer.h.0.mlp.c_fc.weight"][...]
    assert torch.equal(weight, torch.from_numpy(master).to(torch.bfloat16))


@pytest.mark.parametrize("config, words", [
    ({"n_layer": 2, "n_head": 2, "n_embd": 64, "lr": 0.01, "steps": 3, "batch_size": 4},
     ["--config", "unknown keys batch_size, lr, steps", "--train-config"]),
    ({"n_layer": 2, "n_head": 2, "n_embd": 64},
     ["byte (256 tokens)", "vocabulary of 50257", "vocab_size to 256"]),
])
def test_a_model_config_of_other_keys_or_vocabulary_is_refused(tmp_path, data_dir, config,
                                                                words):
    path = tmp_path / "config.json"
    path.write_text(json.dumps(dict(model_type="gpt2", **config)))
    result = cli("train", "--config", path, "--data", data_dir, "--out", tmp_path / "run")
    assert_clean_error(result, *words)
    assert not (tmp_path / "run").exists()


def test_train_config_round_trip_and_flags_over_it(tmp_path, data_dir):
    import tomllib
    out = tmp_path / "run"
    first = train(out, data_dir, "--steps", "2", "--print-config")
    assert first.returncode == 0, first.stderr
    settings = tomllib.loads(first.stdout)
    assert settings["model"]["n_embd"] == 32 and settings["training"]["lr"] == 3e-3
    assert settings["tiling"]["tile_seq"] == 16 and settings["data"]["out"] == str(out)
    toml = tmp_path / "run.toml"
    toml.write_text(first.stdout)
    as_json = tmp_path / "run.json"
    as_json.write_text(json.dumps(settings))
    for path in (toml, as_json):
        again = cli("train", "--train-config", path, "--print-config")
        assert again.returncode == 0 and again.stdout == first.stdout, again.stderr
    over = tomllib.loads(cli("train", "--train-config", toml, "--steps", "3",
                             "--print-config").stdout)
    assert over["training"]["steps"] == 3 and over["model"] == settings["model"]
    assert cli("train", "--train-config", toml).returncode == 0
    assert sorted(p.name for p in out.glob("ckpt-*.h5")) == ["ckpt-2.h5"]
    toml.write_text(first.stdout + "learning_rate = 1\n")
    assert_clean_error(cli("train", "--train-config", toml), "--train-config",
                       "unknown keys learning_rate")
    toml.write_text("[training]\nsteps = 'many'\n")
    assert_clean_error(cli("train", "--train-config", toml), "steps = 'many'")
