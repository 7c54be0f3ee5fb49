"""Issues 26 and 41, "Rough edges": a clear line instead of a traceback, and the new user's
path.
One test (or two) per item of the issue; the README's code blocks are tests/test_readme.py,
and hostile input of every kind is tests/test_hostile.py."""
import fcntl
import json
import os
import pty
import re
import signal
import struct
import subprocess
import sys
import termios
import time

import numpy as np
import pytest

from tests.test_train_cli import (ROOT, TINY, assert_clean_error, cli, cli_env, data_dir,  # noqa: F401
                                  read_metrics, train)

README = (ROOT / "README.md").read_text()


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory, data_dir):  # noqa: F811
    """A 6-step run with gradient accumulation, its stderr a pipe (no terminal)."""
    out = tmp_path_factory.mktemp("tiny") / "run"
    result = cli("train", *[a for a in TINY if a != "--no-progress"], "--data", data_dir,
                 "--out", out, "--steps", "6", "--grad-accum", "2", "--eval-every", "3")
    assert result.returncode == 0, result.stderr
    return out, result


# ---- a clear line instead of a traceback ---------------------------------------------------

@pytest.mark.parametrize("text, words", [
    ("[1, 2]", ["a JSON object", "not list"]),
    ('"gpt2"', ["a JSON object", "not str"]),
    ('{"n_embd": "128"}', ["n_embd='128'", "positive integer"]),
    ('{"layer_norm_epsilon": "1e-5"}', ["layer_norm_epsilon='1e-5'", "positive number"]),
    ('{"tie_word_embeddings": "no"}', ["tie_word_embeddings='no'", "true or false"]),
    ('{"n_inner": true}', ["n_inner=True"]),
])
def test_config_json_of_wrong_types_is_one_line(tmp_path, text, words):
    config = tmp_path / "config.json"
    config.write_text(text)
    assert_clean_error(cli("train", "--config", config, "--out", tmp_path / "o"), *words)
    from nntile.models import GPT2Config
    with pytest.raises(ValueError, match=re.escape(words[0])):
        GPT2Config.from_dict(json.loads(text))
    # a transformers directory holding it: nntile-convert import says the same
    hf = tmp_path / "hf"
    hf.mkdir()
    (hf / "config.json").write_text(text)
    (hf / "model.safetensors").write_bytes(b"")
    assert_clean_error(cli("convert", "import", hf, tmp_path / "m.h5"), "config.json", words[0])


def test_a_tokenizer_that_cannot_encode_is_one_line(tmp_path):
    """A WordLevel tokenizer.json of an empty vocabulary: the tokenizers library loads it and
    raises its own exception on the first word."""
    tokenizers = pytest.importorskip("tokenizers")
    tok = tmp_path / "tok"
    tok.mkdir()
    tokenizers.Tokenizer(tokenizers.models.WordLevel(vocab={}, unk_token="[UNK]")).save(
        str(tok / "tokenizer.json"))
    (tmp_path / "a.txt").write_text("hello world\n")
    result = cli("data", tmp_path / "a.txt", "--out", tmp_path / "out", "--tokenizer", tok)
    assert_clean_error(result, f"the tokenizer {tok}/tokenizer.json cannot encode the text",
                       "[UNK]")
    assert not (tmp_path / "out").exists()


def _importing_numpy(pid):
    """Whether a process has loaded numpy's C extension: nntile's imports are under way
    (numpy is the first thing nntile imports; Python's own start-up before it is not
    nntile's)."""
    with open(f"/proc/{pid}/maps") as f:
        return "_multiarray_umath" in f.read()


def test_ctrl_c_at_any_point_of_start_up_is_quiet(tmp_path, data_dir):  # noqa: F811
    """SIGINT from nntile's first import to the first steps: exit code 130, no traceback,
    and before the steps begin, at most one line."""
    for delay in (0, 0.02, 0.05, 0.1, 0.15, 0.2, 0.25, 0.3, 0.4, 0.8):
        proc = subprocess.Popen([sys.executable, "-m", "nntile.train", *TINY, "--data",
                                 str(data_dir), "--out", str(tmp_path / f"run-{delay}"),
                                 "--steps", "100000"], stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True, env=cli_env())
        while not _importing_numpy(proc.pid):
            assert proc.poll() is None, proc.communicate()
            time.sleep(0.001)
        time.sleep(delay)
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=120)
        assert proc.returncode == 130, (delay, err)
        assert "Traceback" not in err and "KeyboardInterrupt" not in err, (delay, err)
        if "finishing this step" not in err:  # still starting
            assert len(err.strip().splitlines()) <= 1, (delay, err)


def test_a_tiny_temperature_samples_the_likeliest_token(tmp_path, tiny_run):
    ckpt = tiny_run[0] / "ckpt-6.h5"
    args = ("generate", "--checkpoint", ckpt, "--prompt", "def ", "--max-new-tokens", "12")
    greedy = cli(*args, "--greedy")
    tiny = cli(*args, "--temperature", "1e-320", "--seed", "5")
    assert greedy.returncode == 0 and tiny.returncode == 0, tiny.stderr
    assert tiny.stdout == greedy.stdout
    # the distribution itself, against float64 numpy: all mass on the largest logit
    from nntile.generate import token_probs
    logits = np.array([0.5, 3.0, -1.0, 2.999])
    np.testing.assert_array_equal(token_probs(logits, 1e-320), [0, 1, 0, 0])


def test_a_prompt_that_is_not_utf8_is_one_line(tiny_run):
    # bytes that are not UTF-8 reach Python's argv as lone surrogates (surrogateescape)
    result = subprocess.run([sys.executable, "-m", "nntile.generate", "--checkpoint",
                             str(tiny_run[0] / "ckpt-6.h5"), "--prompt", b"caf\xe9 \xff"],
                            capture_output=True, text=True, env=cli_env(), timeout=120)
    assert_clean_error(result, "--prompt is not UTF-8 text", "character 4")


def test_resuming_past_steps_says_how_to_go_on(tmp_path, data_dir):  # noqa: F811
    out = tmp_path / "run"
    assert train(out, data_dir, "--steps", "4", "--eval-every", "0").returncode == 0
    line = assert_clean_error(train(out, data_dir, "--resume", "latest", "--steps", "2"),
                              "ckpt-4.h5 is at step 4, past --steps 2", "nothing to train",
                              "pass a larger --steps, e.g. --steps 8")
    assert "learning rate" in line
    assert len(read_metrics(out / "metrics.jsonl")) == 4  # nothing touched
    # at the end of its --steps (from the checkpoint): exit 0, and the same advice
    done = train(out, data_dir, "--resume", "latest")
    assert done.returncode == 0, done.stderr
    assert "at step 4, the end of --steps 4 (the checkpoint's)" in done.stdout


def test_a_lower_lr_on_resume_takes_the_final_rate_down_with_it(tmp_path, data_dir):  # noqa: F811
    out = tmp_path / "run"
    assert train(out, data_dir, "--steps", "2", "--min-lr", "1e-3").returncode == 0  # lr 3e-3
    result = train(out, data_dir, "--resume", "latest", "--steps", "3", "--lr", "1e-4")
    assert result.returncode == 0, result.stderr
    from nntile.checkpoint import Checkpoint
    settings = Checkpoint(str(out / "ckpt-3.h5")).get("train")
    assert settings["lr"] == 1e-4 and np.isclose(settings["min_lr"], 1e-4 / 3)
    explicit = train(out, data_dir, "--resume", "latest", "--steps", "4", "--lr", "1e-4",
                     "--min-lr", "2e-4")
    assert_clean_error(explicit, "--min-lr 0.0002 is larger than --lr 0.0001")


def test_an_output_file_that_is_a_directory_is_one_line(tmp_path, data_dir):  # noqa: F811
    out = tmp_path / "run"
    (out / "metrics.jsonl").mkdir(parents=True)
    assert_clean_error(train(out, data_dir, "--steps", "2"), "holds a directory metrics.jsonl",
                       "move that directory away")
    assert sorted(p.name for p in out.iterdir()) == ["metrics.jsonl"]
    # every program option naming a file to write: nntile-convert import's OUT.h5 and the
    # benchmark tools' --out/--data/--plot-data
    assert_clean_error(cli("convert", "import", tmp_path, tmp_path),
                       f"{tmp_path} is a directory: name the file to write")
    for script, flag in [("plot_performance.py", "--out"), ("plot_convergence.py", "--data"),
                         ("node_table.py", "--out")]:
        args = [sys.executable, str(ROOT / "bench" / script), flag, str(tmp_path)]
        if script == "plot_convergence.py":
            args.append(f"run={out}")
        result = subprocess.run(args, capture_output=True, text=True, env=cli_env(), timeout=60)
        assert result.returncode == 2, (script, result.stderr)
        assert f"argument {flag}: {tmp_path} is a directory: name the file to write" \
            in result.stderr, (script, result.stderr)
        assert "Traceback" not in result.stderr


def test_the_readme_says_what_the_checksums_cover(ctx, tmp_path, tiny_run):
    """Damage is refused (tests/test_faults.py has many kinds); an edit through HDF5 loads as
    edited, and the README says so instead of promising more."""
    import h5py
    from nntile.checkpoint import Checkpoint
    from nntile.cli_common import model_from_checkpoint
    name = "transformer.h.0.mlp.c_fc.weight"
    src = tiny_run[0] / "ckpt-6.h5"
    with h5py.File(src, "r") as f:
        before = f["params/" + name][...]
        offset = f["params/" + name].id.get_chunk_info(0).byte_offset
    edited = tmp_path / "edited.h5"
    edited.write_bytes(src.read_bytes())
    with h5py.File(edited, "r+") as f:
        f["params/" + name][...] *= 2
    model = model_from_checkpoint(Checkpoint(str(edited)))  # no error: HDF5 wrote a new
    try:                                                    # Fletcher-32 with the values
        np.testing.assert_array_equal(model.state_dict()[name], 2 * before)
    finally:
        model.unregister()
    damaged = tmp_path / "damaged.h5"
    data = bytearray(src.read_bytes())
    data[offset + 5] ^= 0x10  # the same tile, changed on disk
    damaged.write_bytes(bytes(data))
    with pytest.raises(OSError, match="(?i)checksum|filter"):
        with h5py.File(damaged, "r") as f:
            f["params/" + name][...]
    text = " ".join(README.split())
    assert "Checksums find damage, not edits" in text
    assert "the checksums do not sign the values" in text


# ---- the new user's path -------------------------------------------------------------------

def test_init_refuses_a_model_of_another_vocabulary(tmp_path, data_dir):  # noqa: F811
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    hf = transformers.GPT2LMHeadModel(transformers.GPT2Config(
        vocab_size=300, n_positions=32, n_embd=32, n_layer=2, n_head=2))
    hf.save_pretrained(tmp_path / "hf")
    assert cli("convert", "import", tmp_path / "hf", tmp_path / "m.h5").returncode == 0
    result = train(tmp_path / "run", data_dir, "--init", tmp_path / "m.h5", "--steps", "2")
    assert_clean_error(result, "--init", "vocabulary of 300 tokens", "one of 256",
                       "byte tokenizer", "nntile-prepare --tokenizer")
    assert not (tmp_path / "run").exists() or not list((tmp_path / "run").iterdir())
    readme = " ".join(README.split())
    assert "## Fine-tuning a transformers model" in README
    assert "nntile-train --init gpt2.h5" in readme and "--init-from" in readme


def test_generate_refuses_a_tokenizer_of_another_vocabulary(tmp_path):
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    transformers.GPT2LMHeadModel(transformers.GPT2Config(
        vocab_size=512, n_positions=32, n_embd=32, n_layer=2, n_head=2)).save_pretrained(
        tmp_path / "hf")
    assert cli("convert", "import", tmp_path / "hf", tmp_path / "m.h5").returncode == 0
    result = cli("generate", "--checkpoint", tmp_path / "m.h5", "--tokenizer", "byte",
                 "--prompt", "hi", "--max-new-tokens", "4")
    assert_clean_error(result, "byte tokenizer has 256 tokens", "vocabulary 512", "--tokenizer")
    assert result.stdout == ""


def test_install_runs_pip_only_when_its_inputs_changed(tmp_path):
    """make install, its StarPU step left out (-o starpu), pip replaced by echo, and
    INSTALLED_HERE=true: this checkout's Python may have another checkout installed."""
    stamps = tmp_path / "stamps"
    stamps.mkdir()
    (stamps / "starpu-prefix").write_text(f"{tmp_path}\n")  # a StarPU prefix, as far as
    (tmp_path / ".nntile-build-stamp").touch()             # make is concerned
    (stamps / "installed").touch()

    def make_install():
        result = subprocess.run(["make", "-o", "starpu", "install", f"STAMP={stamps}",
                                 "PIP=echo PIP-RUN", "INSTALLED_HERE=true"], cwd=ROOT,
                                capture_output=True, text=True, timeout=120)
        assert result.returncode == 0, result.stderr
        return result.stdout

    assert "PIP-RUN" not in make_install()  # nothing changed since the stamp
    os.utime(stamps / "installed", (0, 0))  # older than every source: install again
    out = make_install()
    assert "PIP-RUN install -q --no-build-isolation -e .[test]" in out
    assert (stamps / "installed").stat().st_mtime > 1  # and the stamp is renewed


def test_eval_and_training_measure_the_same_validation_loss(tiny_run, data_dir):  # noqa: F811
    out, _ = tiny_run
    final = read_metrics(out / "metrics.jsonl")[-1]["val_loss"]
    result = cli("evaluate", "--checkpoint", out / "ckpt-6.h5", "--json", "--ncpu", "2")
    assert result.returncode == 0, result.stderr
    measured = json.loads(result.stdout)
    from nntile.data import EVAL_BATCHES
    assert measured["batches"] == EVAL_BATCHES
    np.testing.assert_allclose(measured["loss"], final, rtol=1e-6)


@pytest.mark.parametrize("n_tokens, seq", [(10, 3), (2, 1), (100, 7), (33, 32), (40, 32)])
def test_single_pass_windows_score_each_token_once(n_tokens, seq):
    from nntile.evaluate import single_pass_windows
    scored = [start + 1 + i for start, first in single_pass_windows(n_tokens, seq)
              for i in range(first, seq)]
    assert sorted(scored) == list(range(1, n_tokens))


def test_eval_scores_a_text_file_each_token_once(tmp_path, tiny_run):
    out, _ = tiny_run
    text = tmp_path / "notes.txt"
    text.write_text("def main():\n    return sum(range(10))  # a few lines of Python\n" * 2)
    n = len(text.read_bytes())
    results = [cli("evaluate", "--checkpoint", out / "ckpt-6.h5", "--text", text, "--json",
                   "--ncpu", "2", *extra) for extra in ([], ["--batch-size", "3"])]
    assert all(r.returncode == 0 for r in results), results[0].stderr
    first, batched = (json.loads(r.stdout) for r in results)
    assert first["tokens"] == n - 1 and first["seq_len"] == 32 and 0 < first["loss"] < 10
    np.testing.assert_allclose(batched["loss"], first["loss"], rtol=1e-6)
    assert "each token scored once" in " ".join(cli("evaluate", "--help").stdout.split())
    (tmp_path / "texts").mkdir()
    assert_clean_error(cli("evaluate", "--checkpoint", out / "ckpt-6.h5", "--data",
                           tmp_path / "texts"), "no train.bin", "nntile-prepare", "--text FILE")


def test_readme_says_each_thing_once_and_as_the_code_does():
    flat = " ".join(README.split())
    assert flat.count("`python -m nntile.<train|data|convert|evaluate|generate>` works") == 1
    makefile = (ROOT / "Makefile").read_text()
    apt = re.search(r"^APT_PACKAGES := (.*)$", makefile, re.M).group(1)
    assert f"the system packages `{apt}`" in flat
    assert re.search(r"install -q torch==([\d.]+)", makefile).group(1) in flat
    assert "`make train` installs it too" in flat
    version = re.search(r'STARPU_VERSION:-([\d.]+)', (ROOT / "scripts/install_starpu.sh")
                        .read_text()).group(1)
    assert f"the release tarball `starpu-{version}.tar.gz`" in flat
    from nntile.train import build_parser
    flags = {o for a in build_parser()._actions for o in a.option_strings}
    used = set(re.findall(r"nntile-train [^`\n]*", README))
    named = {flag for line in used for flag in re.findall(r"(?<![\w-])--[a-z][\w-]*\w", line)}
    assert named and named <= flags | {"--tile"}, named - flags  # --tile-* N
    assert "--init CKPT" in flat and "--init-from HF_DIR" in flat


def test_one_step_and_one_file_are_singular(tmp_path, data_dir):  # noqa: F811
    result = train(tmp_path / "run", data_dir, "--steps", "1")
    assert result.returncode == 0, result.stderr
    assert "1 step in" in result.stdout and "  1 step, each" in result.stderr
    (tmp_path / "one.txt").write_text("hello " * 200)
    prepared = cli("data", tmp_path / "one.txt", "--out", tmp_path / "data")
    assert prepared.returncode == 0 and "nntile-prepare: 1 file -> " in prepared.stdout, \
        prepared.stderr


def test_eval_and_generate_help_name_every_precision_they_take():
    from nntile.precision import PRECISIONS
    for program in ("evaluate", "generate"):
        text = " ".join(cli(program, "--help").stdout.split())
        assert f"compute in {', '.join(PRECISIONS)}" in text, text


def test_a_tokenizer_directory_that_does_not_exist_is_named_so(tmp_path):
    (tmp_path / "a.txt").write_text("hello")
    line = assert_clean_error(cli("data", tmp_path / "a.txt", "--out", tmp_path / "d",
                                  "--tokenizer", "nowhere-dir"), "nowhere-dir",
                              "no such directory")
    assert "not on this machine" not in line


def test_the_lock_message_names_the_program_not_its_directory():
    from nntile.cli_common import command_line

    def cmdline(*words):  # as /proc/PID/cmdline holds them
        return "".join(word + "\0" for word in words).encode()

    assert command_line(cmdline("/root/.pyenv/versions/3.11.7/bin/python3.11",
                                "/root/.pyenv/versions/3.11.7/bin/nntile-train", "--out",
                                "/tmp/run")) == "nntile-train --out /tmp/run"
    assert command_line(cmdline("/usr/bin/python3", "-m", "nntile.train", "--steps", "9")) \
        == "python3 -m nntile.train --steps 9"


def test_readme_says_oversubscribe_where_ranks_outnumber_cores():
    lines = [line for line in README.splitlines() if line.startswith("mpirun -np")]
    assert lines
    for line in lines:
        ranks = int(re.search(r"-np (\d+)", line).group(1))
        assert ("--oversubscribe" in line) == (ranks > 2), line  # the CI has 2 cores


def test_without_a_terminal_progress_is_plain_lines_and_the_banner_is_short(tiny_run):
    _, result = tiny_run
    err = result.stderr
    assert "\r" not in err
    steps = [line for line in err.splitlines() if re.match(r"step \d+/6: loss", line)]
    assert len(steps) == 6 and "elapsed" in steps[-1] and "left" in steps[-1]
    banner = err[:err.index("step 1/6")].strip().splitlines()
    assert len(banner) <= 4, banner
    assert not any(word in err for word in ("limit_cuda_mem", "{'batch'", "x 2 per step"))
    assert "2 micro-batches" in err and "gradient accumulation" in err
    assert "tiles: batch 2 of 4 (2 tiles), seq 16 of 32 (2 tiles); the others whole" in err
    assert re.search(r"nntile: StarPU \S+, 2 CPU workers, scheduler \w+", err)


def test_on_a_terminal_the_bar_and_with_v_every_setting(tmp_path, data_dir):  # noqa: F811
    """stderr on a pseudo-terminal: tqdm's bar; -v: StarPU's settings and threads."""
    master, slave = pty.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 24, 100, 0, 0))
    args = [sys.executable, "-m", "nntile.train", *[a for a in TINY if a != "--no-progress"],
            "--data", str(data_dir), "--out", str(tmp_path / "run"), "--steps", "3",
            "--eval-every", "0", "-v"]
    proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=slave, env=cli_env())
    os.close(slave)
    chunks = []
    while True:
        try:
            chunk = os.read(master, 4096)
        except OSError:  # the child closed the terminal
            break
        if not chunk:
            break
        chunks.append(chunk)
    assert proc.wait(timeout=120) == 0
    os.close(master)
    err = b"".join(chunks).decode(errors="replace")
    assert re.search(r"\r *\d+%\|.*\| 3/3 \[", err), err  # the bar, redrawn
    assert "limit_cuda_mem = " in err and "cores: " in err


def test_no_future_warning_from_listing_live_tensors():
    result = subprocess.run(
        [sys.executable, "-W", "error::FutureWarning", "-c",
         "import torch.distributed, nntile\nfrom nntile.memory import live_tensors\n"
         "print(len(live_tensors()))"], capture_output=True, text=True, env=cli_env(),
        timeout=120)
    assert result.returncode == 0, result.stderr[-2000:]


def test_generate_help_shows_defaults():
    result = cli("generate", "--help")
    assert result.returncode == 0
    text = " ".join(result.stdout.split())
    for shown in ("tokens to add (default: 200)", "(0: greedy) (default: 0.8)",
                  "(0: all) (default: 0)", "nucleus sampling; 1: all) (default: 1.0)"):
        assert shown in text, shown


@pytest.mark.parametrize("temperature, top_k, top_p", [
    (1.0, 0, 0.9), (0.7, 0, 0.5), (1.3, 5, 0.8), (1.0, 3, 1.0), (0.5, 0, 1e-9)])
def test_sampling_distribution_matches_transformers(rng, temperature, top_k, top_p):
    """Temperature, top-k and top-p (nucleus) as transformers' logits warpers apply them."""
    torch = pytest.importorskip("torch")
    lp = pytest.importorskip("transformers.generation.logits_process")
    logits = rng.normal(0.0, 2.0, size=50)
    warpers = [lp.TemperatureLogitsWarper(temperature)]
    if top_k:
        warpers.append(lp.TopKLogitsWarper(top_k))
    if top_p < 1:
        warpers.append(lp.TopPLogitsWarper(top_p))
    scores = torch.from_numpy(logits)[None]
    for warper in warpers:
        scores = warper(None, scores)
    expected = torch.softmax(scores, dim=-1)[0].numpy()
    from nntile.generate import token_probs
    np.testing.assert_allclose(token_probs(logits, temperature, top_k, top_p), expected,
                               rtol=1e-12, atol=1e-15)


def test_top_p_sampling_draws_from_the_nucleus_only(tiny_run):
    ckpt = tiny_run[0] / "ckpt-6.h5"
    result = cli("generate", "--checkpoint", ckpt, "--prompt", "def ", "--max-new-tokens",
                 "8", "--top-p", "1e-9", "--seed", "3")
    greedy = cli("generate", "--checkpoint", ckpt, "--prompt", "def ", "--max-new-tokens",
                 "8", "--greedy")
    assert result.returncode == 0, result.stderr
    assert result.stdout == greedy.stdout  # a nucleus of one token: the likeliest
    assert_clean_error(cli("generate", "--checkpoint", ckpt, "--top-p", "0"),
                       "--top-p", "(0, 1]")


def test_tensorboard_reads_what_metrics_jsonl_holds(tiny_run):
    ea = pytest.importorskip("tensorboard.backend.event_processing.event_accumulator")
    out, _ = tiny_run
    records = read_metrics(out / "metrics.jsonl")
    files = list(out.glob("events.out.tfevents.*"))
    assert len(files) == 1
    acc = ea.EventAccumulator(str(out))
    acc.Reload()
    for tag in ("loss", "lr", "grad_norm", "tokens_per_s", "tflops", "val_loss"):
        events = acc.Scalars(tag)
        want = [(r["step"], r[tag]) for r in records if r.get(tag) is not None]
        assert [e.step for e in events] == [step for step, _ in want], tag
        np.testing.assert_allclose([e.value for e in events], [v for _, v in want],
                                   rtol=1e-6, err_msg=tag)  # stored as float32
    assert [r["step"] for r in records if "val_loss" in r] == [3, 6]
    # the gradient norm is the one clipping measured: a positive number each step
    assert all(r["grad_norm"] > 0 for r in records)


def test_event_file_records_and_crc32c():
    from nntile import events
    assert events.crc32c(b"123456789") == 0xE3069283  # CRC-32C's check value (RFC 3720)
    assert events.crc32c(b"") == 0
    rec = events.record(b"abc")
    assert rec[:8] == (3).to_bytes(8, "little") and rec[12:15] == b"abc" and len(rec) == 19


def test_dockerfile_builds_starpu_before_copying_the_sources():
    lines = [line.strip() for line in (ROOT / "Dockerfile").read_text().splitlines()]
    starpu = next(i for i, line in enumerate(lines) if "make starpu" in line)
    copy_all = lines.index("COPY . .")
    assert starpu < copy_all < lines.index("RUN make install")
    copies = [line for line in lines[:starpu] if line.startswith("COPY ")]
    assert copies and all(" . " not in line for line in copies)
    for text in (README, (ROOT / "Dockerfile").read_text()):
        run = next(line for line in text.splitlines() if "docker run" in line)
        assert "--gpus all" in run and "checkpoints:/opt/nntile/checkpoints" in run
