"""The fault battery (issue 16): damaged checkpoints, kills in the middle of saves, a full
disk, bad data files, misuse of the Python API, NaN and inf.

Every case must end in one clear message (exit code 2 and one line for the programs, a Python
exception for the API): no traceback, no hang (every program runs under a timeout), no crash,
and no checkpoint lost or overwritten. Cases covered elsewhere: other bad data files
(test_train_cli.test_bad_data), GEMM shape and dtype mismatches (test_bad_input). The full
disk is a real one, a small tmpfs (mounting it needs root: skipped without). The last
section holds what a new user tried beyond the issue's list.
"""
import collections
import concurrent.futures
import hashlib
import json
import os
import shutil
import subprocess
import sys
import time

import numpy as np
import pytest

h5py = pytest.importorskip("h5py")

import nntile
from nntile.checkpoint import (FORMAT_VERSION, Checkpoint, CheckpointError, latest,
                               list_checkpoints, save)
from nntile.cli_common import model_from_checkpoint
from nntile.models import GPT2Config, GPT2LMHead
from nntile.optim import AdamW
from tests.conftest import run_python
from tests.test_train_cli import TINY, cli, cli_env, data_dir  # noqa: F401

TIMEOUT = 90  # seconds for one program run: a hang fails the test instead of blocking it
NO_EVAL = ["--eval-every", "0"]


def train(out, data, *extra, **kw):
    return cli("train", *TINY, *NO_EVAL, "--data", data, "--out", out, *extra,
               timeout=TIMEOUT, **kw)


def assert_fails_in_one_line(result, *words):
    """Exit code 2 and one error line naming the problem, the last thing printed (a run
    that started prints its set-up first); no traceback."""
    assert result.returncode == 2, (result.returncode, result.stdout, result.stderr)
    assert "Traceback" not in result.stderr, result.stderr
    lines = result.stderr.strip().splitlines()
    errors = [line for line in lines if ": error: " in line]
    assert errors == lines[-1:], result.stderr
    for word in words:
        assert word in errors[0], (word, errors[0])
    return errors[0]


def digest(path):
    return hashlib.sha256(open(path, "rb").read()).hexdigest()


@pytest.fixture(scope="module")
def finished_run(tmp_path_factory, data_dir):  # noqa: F811
    """A two-step run of the tiny model: its checkpoint ckpt-2.h5 is what gets damaged."""
    out = tmp_path_factory.mktemp("run")
    result = train(out, data_dir, "--steps", "2")
    assert result.returncode == 0, result.stderr
    return out


# ---- damaged checkpoints: every damage is refused, or changes nothing ---------------------

def regions(path):
    """Offsets of a checkpoint's tile bytes (its chunks), of the bytes of HDF5's own
    structures that are in use (metadata that is not zero: free space is all zeros), and of
    the chunk indexes' keys (the first bytes of each B-tree node, zero or not)."""
    content = open(path, "rb").read()
    data = np.frombuffer(content, np.uint8)
    in_chunk = np.zeros(len(data), bool)
    with h5py.File(path, "r") as f:
        def mark(chunk):
            in_chunk[chunk.byte_offset:chunk.byte_offset + chunk.size] = True
        f.visititems(lambda name, obj: obj.id.chunk_iter(mark)
                     if isinstance(obj, h5py.Dataset) else None)
    nodes = [at for at in range(len(content)) if content.startswith(b"TREE", at)]
    keys = np.unique(np.concatenate([np.arange(at, at + 128) for at in nodes]))
    return (np.flatnonzero(in_chunk), np.flatnonzero(~in_chunk & (data != 0)),
            keys[~in_chunk[keys]])


def loaded_state(model, opt):
    out = {f"params/{n}": p.value.to_array() for n, p in model.named_parameters()}
    out.update({f"optim/{n}": t.to_array() for n, t in opt.state_tensors().items()})
    return out


SMALL = GPT2Config(vocab_size=40, n_positions=8, n_embd=8, n_layer=1, n_head=2)


def small_model(seed=0):
    """A one-layer model with random weights, in tiles of several sizes."""
    model = GPT2LMHead(SMALL, tiling=dict(embd=4, inner=16, vocab=16))
    rng = np.random.default_rng(seed)
    model.load_state_dict({k: rng.standard_normal(v.shape)
                           for k, v in model.state_dict().items()})
    return model


def test_damaged_checkpoints_are_refused_or_load_unchanged(ctx, tmp_path):
    """Cut short at many offsets, one bit flipped in the tiles or in HDF5's structures
    (superblock, object headers, chunk indexes and their keys, heaps, attributes): opening
    and loading each damaged copy raises CheckpointError, or loads exactly what was saved.
    Before the checksums, bit flips loaded zeros or other numbers quietly, HDF5's
    RuntimeError and KeyError escaped as tracebacks, and one flip made reading the
    attributes hang."""
    model = small_model()
    opt = AdamW(model.named_parameters(), lr=1e-2)
    ids = np.arange(16).reshape(2, 8)
    for _ in range(2):  # moments that are not zero
        model.zero_grad()
        model.loss(ids, ids)
        model.backward()
        opt.step()
    path = str(tmp_path / "good.h5")
    save(path, model, opt, dict(config=SMALL.to_dict(), tiling=dict(model.tiles),
                                dtype="fp32", step=2, optimizer=dict(step_count=2)))
    good = open(path, "rb").read()
    want, want_meta = loaded_state(model, opt), Checkpoint(path).meta
    tiles, structures, keys = regions(path)
    rng = np.random.default_rng(16)
    cuts = set(np.linspace(0, len(good) - 1, 16).astype(int)) | set(range(0, 2048, 128))
    cases = [("cut", int(n), good[:n]) for n in sorted(cuts)]
    for kind, where, count in (("tile bit", tiles, 12), ("structure bit", structures, 90),
                               ("chunk index bit", keys, 40)):
        for at in rng.choice(where, count, replace=False):
            damaged = bytearray(good)
            damaged[at] ^= 1 << int(rng.integers(8))
            cases.append((kind, int(at), bytes(damaged)))
    bad = str(tmp_path / "ckpt-2.h5")
    outcomes = collections.Counter()
    for kind, at, content in cases:
        with open(bad, "wb") as f:
            f.write(content)
        try:
            damaged = Checkpoint(bad)
            damaged.load_params(model)
            damaged.load_optimizer(opt)
        except CheckpointError as exc:
            assert bad in str(exc), (kind, at, str(exc))
            outcomes[kind, "refused"] += 1
            continue
        got = loaded_state(model, opt)
        changed = [k for k in want if not np.array_equal(got[k], want[k])]
        assert not changed and damaged.meta == want_meta, (kind, at, changed)
        outcomes[kind, "unchanged"] += 1
    # every cut and every tile flip is found; a flip in HDF5's structures often lands on a
    # field HDF5 does not use, and then nothing changes
    assert outcomes["cut", "unchanged"] == 0 and outcomes["tile bit", "unchanged"] == 0
    assert outcomes["structure bit", "refused"] > 20, outcomes
    assert outcomes["chunk index bit", "refused"] > 10, outcomes
    model.unregister()


def _flip_in(content, marker, old, new):
    """``content`` with the byte ``old`` right after ``marker`` set to ``new`` (one bit)."""
    at = content.index(marker) + len(marker)
    assert content[at:at + 1] == old
    return content[:at] + new + content[at + 1:]


def make_damaged(kind, good_path, path):
    """A damaged or foreign file at ``path``, made from a good checkpoint."""
    good = open(good_path, "rb").read()
    if kind == "truncated":
        content = good[:len(good) * 2 // 3]
    elif kind == "tile bit":
        with h5py.File(good_path, "r") as f:
            chunk = f["params/transformer.wte.weight"].id.get_chunk_info(0)
        at = chunk.byte_offset + chunk.size // 2
        content = good[:at] + bytes([good[at] ^ 0x10]) + good[at + 1:]
    elif kind == "metadata bit":  # the attribute 'config' says 3 layers instead of 2
        content = _flip_in(good, b'"n_layer": ', b"2", b"3")
    else:
        content = None
    if content is not None:
        with open(path, "wb") as f:
            f.write(content)
    elif kind == "newer format":
        shutil.copyfile(good_path, path)
        with h5py.File(path, "a") as f:
            f.attrs["format_version"] = FORMAT_VERSION + 1
    elif kind == "another program's HDF5":  # e.g. a Keras model
        with h5py.File(path, "w") as f:
            f.attrs["keras_version"] = "2.15.0"
            f.create_dataset("model_weights/dense/kernel", data=np.ones((4, 4), np.float32))
    elif kind == "FIFO":
        os.mkfifo(path)
    elif kind == "directory":
        os.mkdir(path)
    elif kind == "empty":
        open(path, "wb").close()
    return path


DAMAGES = {"truncated": "truncated or corrupt", "tile bit": "cannot read params/",
           "metadata bit": "checksum", "newer format": f"format version {FORMAT_VERSION + 1}",
           "another program's HDF5": "not an nntile checkpoint"}
ODD_FILES = {"FIFO": "not a regular file", "directory": "is a directory",
             "empty": "not a readable HDF5 file"}


def _programs(bad, run, data, tmp):
    """(name, command, what must stay untouched) for each program given a bad checkpoint.
    --resume finds it as the newest checkpoint of a run whose older one must survive."""
    return [
        ("--resume", ["train", *TINY, *NO_EVAL, "--data", data, "--out", run, "--steps", "6",
                      "--resume", "latest"], run),
        ("--init", ["train", *TINY, *NO_EVAL, "--data", data, "--out", tmp / "init",
                    "--steps", "2", "--init", bad], tmp / "init"),
        ("nntile-eval", ["evaluate", "--checkpoint", bad, "--data", data, "--batches", "1"],
         None),
        ("nntile-generate", ["generate", "--checkpoint", bad, "--max-new-tokens", "2"], None),
        ("nntile-convert export", ["convert", "export", bad, tmp / "hf"], tmp / "hf"),
    ]


def _snapshot(directory):
    """Digests of the files in a directory (none when it does not exist)."""
    if directory is None or not os.path.exists(directory):
        return {}
    return {name: digest(os.path.join(directory, name)) for name in sorted(os.listdir(directory))
            if os.path.isfile(os.path.join(directory, name))}


def _run_program(args):
    module, *rest = args
    return subprocess.run([sys.executable, "-m", f"nntile.{module}", *map(str, rest), "--ncpu",
                           "1"], capture_output=True, text=True, timeout=TIMEOUT, env=cli_env())


@pytest.mark.parametrize("kind", list(DAMAGES) + list(ODD_FILES))
def test_every_program_refuses_a_damaged_checkpoint_in_one_line(kind, finished_run, data_dir,  # noqa: F811
                                                                   tmp_path):
    run = tmp_path / "run"
    shutil.copytree(finished_run, run)
    bad = make_damaged(kind, finished_run / "ckpt-2.h5", run / "ckpt-4.h5")
    programs = _programs(bad, run, data_dir, tmp_path)
    if kind in ODD_FILES:  # one code path opens every checkpoint: two programs suffice
        programs = programs[:1] + programs[2:3]
    before = [_snapshot(keep) for _, _, keep in programs]
    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        results = list(pool.map(_run_program, [cmd for _, cmd, _ in programs]))
    for (name, _, keep), result, snapshot in zip(programs, results, before):
        line = assert_fails_in_one_line(result, str(bad), {**DAMAGES, **ODD_FILES}[kind])
        assert _snapshot(keep) == snapshot, (name, line)  # nothing written, nothing lost
        assert not list(tmp_path.glob("**/*.tmp")), name
    assert latest(run) == str(bad)  # the damaged file is left for the user to look at


def test_another_models_checkpoint_conflicts_with_the_flags(finished_run, data_dir, tmp_path):  # noqa: F811
    other = tmp_path / "other"
    assert train(other, data_dir, "--steps", "1", "--n-embd", "16").returncode == 0
    run = tmp_path / "run"
    shutil.copytree(finished_run, run)
    shutil.copyfile(other / "ckpt-1.h5", run / "ckpt-9.h5")
    before = _snapshot(run)
    resumed = train(run, data_dir, "--steps", "12", "--resume", "latest")
    assert_fails_in_one_line(resumed, "--n-embd 32 conflicts with checkpoint", "ckpt-9.h5")
    started = train(tmp_path / "new", data_dir, "--steps", "2", "--init", other / "ckpt-1.h5")
    assert_fails_in_one_line(started, "--n-embd 32 conflicts with checkpoint", "ckpt-1.h5")
    assert _snapshot(run) == before


# ---- SIGKILL while checkpoints are written ------------------------------------------------

def newest_step(directory):
    """The step of the newest finished checkpoint (from its name: a running save may prune
    it before it could be opened), 0 without one."""
    found = list_checkpoints(directory)
    return found[-1][0] if found else 0


def _wait(condition, proc, timeout=TIMEOUT):
    deadline = time.monotonic() + timeout
    while not condition():
        if proc.poll() is not None:
            pytest.fail(f"training ended with code {proc.returncode}: {proc.stderr.read()}")
        if time.monotonic() > deadline:
            proc.kill()
            pytest.fail("training made no progress")
        time.sleep(0.002)


def test_sigkill_during_saves_leaves_latest_complete(ctx, tmp_path, data_dir):  # noqa: F811
    """Training that saves after every step is killed (SIGKILL) again and again, each time
    at a random moment once a save has begun: what --resume latest finds loads completely,
    and the next run, resuming it, removes the partial file the kill left."""
    out = tmp_path / "run"
    rng = np.random.default_rng(1616)
    args = [sys.executable, "-m", "nntile.train", *TINY, *NO_EVAL, "--data", str(data_dir),
            "--out", str(out), "--steps", "100000", "--warmup", "0", "--save-every", "1",
            "--keep", "3"]
    kills_in_a_save = 0
    for attempt in range(5):
        resumed = newest_step(out)
        proc = subprocess.Popen(args + (["--resume", "latest"] if attempt else []),
                                stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                                env=cli_env())
        # once this run has saved (its start removed the partial file of the last kill),
        # wait for its next save to begin
        _wait(lambda: newest_step(out) > resumed, proc)
        _wait(lambda: any(p.suffix == ".tmp" for p in out.iterdir()), proc)
        time.sleep(rng.uniform(0.0, 0.03))
        proc.kill()
        proc.communicate()
        kills_in_a_save += any(p.suffix == ".tmp" for p in out.iterdir())
        ckpt = Checkpoint(latest(out))
        model = model_from_checkpoint(ckpt)
        opt = AdamW(model.named_parameters(), lr=1e-3)
        ckpt.load_optimizer(opt)
        assert opt.step_count == ckpt.step
        model.unregister()
    assert kills_in_a_save >= 1  # the kills did land inside saves
    step = newest_step(out)
    done = train(out, data_dir, "--steps", str(step + 2), "--resume", "latest")
    assert done.returncode == 0, done.stderr
    assert f"step {step + 2}/{step + 2}" in done.stdout
    assert not list(out.glob("*.tmp"))


# ---- a full disk --------------------------------------------------------------------------

@pytest.fixture
def small_disk(tmp_path):
    """A 3 MiB tmpfs: a disk that fills up for real (mounting needs root)."""
    mount = tmp_path / "disk"
    mount.mkdir()
    made = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=3m", "tmpfs", str(mount)],
                          capture_output=True, text=True)
    if made.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs: {made.stderr.strip()}")
    try:
        yield mount
    finally:
        subprocess.run(["umount", "-l", str(mount)], check=True)


def _fill(disk, leave):
    """Fill the disk up to ``leave`` free bytes."""
    filler = disk / f"filler-{len(list(disk.glob('filler-*')))}"
    free = shutil.disk_usage(disk).free
    with open(filler, "wb") as f:
        f.write(b"\0" * max(0, free - leave))
    return filler


def test_full_disk_keeps_the_last_checkpoint_and_the_data(small_disk):
    from nntile.data import prepare, stdlib_files
    data = small_disk / "data"
    prepare(stdlib_files()[1][:3], str(data))
    out = small_disk / "run"
    assert train(out, data, "--steps", "2", "--keep", "0").returncode == 0
    kept = {p: digest(p) for p in [out / "ckpt-2.h5", *data.iterdir()]}
    # room for the metrics, not for a checkpoint: the save finds out before writing
    _fill(small_disk, 200 << 10)
    failed = train(out, data, "--steps", "4", "--keep", "0", "--resume", "latest")
    assert_fails_in_one_line(failed, "cannot save checkpoint", "ckpt-4.h5", "not enough free space")
    # no room at all: the metrics cannot be written either
    _fill(small_disk, 0)
    failed = train(out, data, "--steps", "4", "--keep", "0", "--resume", "latest")
    assert_fails_in_one_line(failed, "cannot write", "metrics.jsonl", "No space left on device")
    assert {p: digest(p) for p in kept} == kept
    assert sorted(p.name for p in out.glob("ckpt-*")) == ["ckpt-2.h5"]
    # space again: the run goes on from the checkpoint that was kept
    for filler in small_disk.glob("filler-*"):
        filler.unlink()
    done = train(out, data, "--steps", "4", "--keep", "0", "--resume", "latest")
    assert done.returncode == 0, done.stderr
    assert Checkpoint(str(out / "ckpt-4.h5")).step == 4


def test_a_plot_that_cannot_be_written_is_one_line(tmp_path):
    from nntile.cli_common import CLIError
    from nntile.train import plot_losses
    (tmp_path / "loss.png").mkdir()
    with pytest.raises(CLIError, match="cannot write .*loss.png: Is a directory"):
        plot_losses([{"step": 1, "loss": 2.0}, {"step": 2, "loss": 1.5}],
                    str(tmp_path / "loss.png"))
    assert os.listdir(tmp_path) == ["loss.png"]  # no partial plot left behind


# ---- data files ---------------------------------------------------------------------------

def _bad_data(tmp_path, data_dir, kind):  # noqa: F811
    bad = tmp_path / "bad"
    shutil.copytree(data_dir, bad)
    val = bad / "val.bin"
    if kind == "empty val.bin":
        val.write_bytes(b"")
    elif kind == "odd val.bin":
        val.write_bytes(val.read_bytes()[:-1])
    elif kind == "val.bin shorter than a sequence":  # as meta.json records it
        val.write_bytes(val.read_bytes()[:40])
        meta = json.loads((bad / "meta.json").read_text())
        (bad / "meta.json").write_text(json.dumps(dict(meta, val_tokens=20)))
    elif kind == "token id past the vocabulary":
        ids = np.fromfile(val, np.uint16)
        ids[7] = 4000
        ids.tofile(val)
    elif kind == "unreadable train.bin":
        os.chmod(bad / "train.bin", 0)
    elif kind == "FIFO train.bin":
        os.unlink(bad / "train.bin")
        os.mkfifo(bad / "train.bin")
    elif kind == "FIFO meta.json":
        os.unlink(bad / "meta.json")
        os.mkfifo(bad / "meta.json")
    elif kind == "meta.json says uint64":
        (bad / "meta.json").write_text('{"tokenizer": "byte", "vocab_size": 256, '
                                       '"dtype": "uint64"}')
    elif kind == "meta.json vocabulary not a number":
        (bad / "meta.json").write_text('{"tokenizer": "byte", "vocab_size": "many"}')
    return bad


BAD_DATA = {
    "empty val.bin": "val.bin is empty",
    "odd val.bin": "not a whole number of uint16 tokens",
    "val.bin shorter than a sequence": "fewer than sequence length + 1",
    "token id past the vocabulary": "token id 4000",
    "unreadable train.bin": "Permission denied",
    "FIFO train.bin": "not a regular file",
    "FIFO meta.json": "not a regular file",
    "meta.json says uint64": "dtype 'uint64'",
    "meta.json vocabulary not a number": "vocab_size 'many'",
}


def _without_root_powers():
    """Root reads any file: run without the capabilities that allow it, so that a mode of
    000 means unreadable."""
    if os.geteuid() != 0:
        return []
    if not shutil.which("setpriv"):
        pytest.skip("root without setpriv (util-linux) cannot give up reading every file")
    return ["setpriv", "--bounding-set=-dac_override,-dac_read_search"]


@pytest.mark.parametrize("kind", list(BAD_DATA))
def test_bad_data_files(tmp_path, data_dir, kind):  # noqa: F811
    bad = _bad_data(tmp_path, data_dir, kind)
    result = subprocess.run([*_without_root_powers(), sys.executable, "-m", "nntile.train",
                             *TINY, "--data", str(bad), "--out", str(tmp_path / "out"),
                             "--steps", "2", "--vocab-size", "256"],
                            capture_output=True, text=True, timeout=TIMEOUT, env=cli_env())
    assert_fails_in_one_line(result, BAD_DATA[kind])
    assert not (tmp_path / "out").exists()


def test_prepare_refuses_a_fifo_and_skips_one_in_a_directory(tmp_path):
    texts = tmp_path / "texts"
    texts.mkdir()
    (texts / "a.txt").write_text("hello world, " * 20)
    os.mkfifo(texts / "pipe")
    result = cli("data", texts / "pipe", "--out", tmp_path / "data", timeout=TIMEOUT)
    assert_fails_in_one_line(result, "pipe is not a regular file")
    result = cli("data", texts, "--out", tmp_path / "data", timeout=TIMEOUT)
    assert result.returncode == 0, result.stderr
    assert "1 file " in result.stdout


# ---- NaN and inf ----------------------------------------------------------------------------

def test_diverging_training_stops_and_keeps_the_last_good_checkpoint(tmp_path, data_dir):  # noqa: F811
    out = tmp_path / "run"
    # weights of 1e30 after the first step: the second step's loss is NaN
    result = train(out, data_dir, "--steps", "6", "--save-every", "1", "--warmup", "0",
                   "--lr", "1e30")
    assert_fails_in_one_line(result, "the loss is nan at step 2", "diverged", "ckpt-1.h5")
    assert sorted(p.name for p in out.glob("ckpt-*")) == ["ckpt-1.h5"]
    ckpt = Checkpoint(str(out / "ckpt-1.h5"))
    with h5py.File(ckpt.path, "r") as f:
        assert all(np.isfinite(f["params"][name][()]).all() for name in ckpt.param_names)
    # inf in the weights after the first step: that checkpoint is refused, not written
    out = tmp_path / "inf"
    result = train(out, data_dir, "--steps", "6", "--save-every", "1", "--warmup", "0",
                   "--lr", "3e38")
    assert_fails_in_one_line(result, "cannot save checkpoint", "ckpt-1.h5", "NaN or inf")
    assert not list(out.glob("ckpt-*"))


def test_nan_and_inf_inputs_flow_through_and_are_never_saved(ctx, tmp_path):
    a = np.array([[np.nan, 1.0], [np.inf, 2.0], [3.0, -np.inf]], np.float32)
    b = np.array([[1.0, 0.5], [2.0, 0.0]], np.float32)
    A = nntile.Tensor.from_array(a, (2, 1))
    B = nntile.Tensor.from_array(b, (1, 2))
    C = nntile.Tensor((3, 2), (2, 2))
    nntile.ops.gemm(1.0, A, "N", B, "N", 0.0, C)
    with np.errstate(invalid="ignore"):
        want = a.astype(np.float64) @ b
    np.testing.assert_array_equal(C.to_array(), want.astype(np.float32))  # NaN where numpy's
    model = small_model()
    state = model.state_dict()
    state["transformer.h.0.mlp.c_fc.weight"][1, 2] = np.inf
    model.load_state_dict(state)
    ids = np.arange(16).reshape(2, 8)
    assert np.isnan(model.loss(ids, ids))  # a number, not an exception: the caller decides
    path = str(tmp_path / "ckpt-1.h5")
    with pytest.raises(CheckpointError, match=r"params/transformer\.h\.0\.mlp\.c_fc\.weight "
                                              "holds NaN or inf"):
        save(path, model, None, dict(config=SMALL.to_dict(), tiling=dict(model.tiles),
                                     dtype="fp32", step=1))
    assert os.listdir(tmp_path) == []
    for t in (A, B, C):
        t.unregister()
    model.unregister()


# ---- Python API misuse ----------------------------------------------------------------------

def test_array_layouts_round_trip_exactly(ctx):
    base = np.arange(60, dtype=np.float64).reshape(6, 10) / 7
    for array in (base[:, ::3], base[::2, 1:], np.asfortranarray(base), base.T,
                  np.float64(2.5), np.arange(5, dtype=np.int8), np.arange(4, dtype=np.uint32)):
        tiles = tuple(min(4, n) for n in np.shape(array))
        got = nntile.Tensor.from_array(array, tiles).to_array()
        assert got.shape == np.shape(array) and np.array_equal(got, array)


def test_unsupported_arrays_and_tilings_raise(ctx):
    for array in (np.zeros(3, np.complex64), np.array([1, "a"], dtype=object),
                  np.zeros(3, np.float16), np.zeros(3, bool), np.array(["a", "b"])):
        with pytest.raises(TypeError, match="has no nntile dtype"):
            nntile.Tensor.from_array(array)
    with pytest.raises(TypeError, match="cannot write an array of dtype object"):
        nntile.Tensor((2,), (2,)).write(np.array([1.0, None], dtype=object))
    with pytest.raises(ValueError, match="more than an int64 tensor holds"):
        nntile.Tensor.from_array(np.array([1, 2**63 + 5], np.uint64))
    for shape, tiles, message in [((0, 3), (1, 3), "dimension 0 is 0"),
                                  ((4, 4), (0, 2), "tile size 0"),
                                  ((4, 4), (2,), "has 1 dimensions but shape"),
                                  ((4, 4), (2, 2, 2), "has 3 dimensions but shape"),
                                  ((4, 4), (-1, 2), "tile size -1"),
                                  # a typo's sizes: these looped for hours, or overflowed
                                  ((10**9, 10**9), (1, 1), r"fewer than 2\*\*32 tiles"),
                                  ((2**40, 2**40), (2**20, 1), r"fewer than 2\*\*62")]:
        with pytest.raises(ValueError, match=message):
            nntile.Tensor(shape, tiles)


def test_gemm_refuses_an_output_that_is_an_input(ctx):
    """C's tiles are overwritten while other tasks still read A's and B's: aliasing them
    used to return wrong numbers quietly."""
    A = nntile.Tensor.from_array(np.arange(16, dtype=np.float32).reshape(4, 4), (2, 2))
    B = A.copy()
    for a, b in ((A, B), (B, A)):
        with pytest.raises(ValueError, match="are the same tensor"):
            nntile.ops.gemm(1.0, a, "N", b, "N", 0.0, A)
    A.unregister()
    B.unregister()


def test_token_ids_are_checked(ctx):
    model = GPT2LMHead(SMALL)
    ids = np.arange(16).reshape(2, 8)
    for inputs, targets, error, message in [
            (ids - 1, ids, ValueError, "input_ids holds token id -1"),
            (ids, ids + 30, ValueError, "targets holds token id 40"),
            (np.full((2, 8), 2**63 + 1, np.uint64), ids, ValueError,
             "token id 9223372036854775809"),
            (ids + 0.0, ids, TypeError, "must hold integers"),
            (ids[:0], ids[:0], ValueError, "the batch is empty"),
            (ids[:, :0], ids[:, :0], ValueError, "sequence length must be between 1"),
            (np.zeros((2, 9), np.int64), np.zeros((2, 9), np.int64), ValueError, "n_positions")]:
        with pytest.raises(error, match=message):
            model.loss(inputs, targets)
    model.unregister()


def test_gc_of_tensors_in_reference_cycles_and_use_after_shutdown():
    """The garbage collector may clear a tensor held in a reference cycle before freeing
    it: its tiles must still be released (this segfaulted), and a model whose Context
    stopped raises instead of touching freed tiles."""
    result = run_python("""
        import gc
        import numpy as np
        import nntile
        from nntile.models import GPT2Config, GPT2LMHead
        ctx = nntile.Context(ncpu=1, ncuda=0)
        for i in range(1000):
            tensor = nntile.Tensor((128, 128), (128, 64))
            cycle = [tensor]
            cycle.append(cycle)
            del tensor, cycle
            if i % 50 == 0:
                gc.collect()
        model = GPT2LMHead(GPT2Config(vocab_size=40, n_positions=8, n_embd=8, n_layer=1,
                                      n_head=2))
        ids = np.zeros((1, 8), np.int64)
        model.loss(ids, ids)
        ctx.shutdown()
        try:
            model.loss(ids, ids)
        except RuntimeError as exc:
            print("after shutdown:", exc)
    """, timeout=TIMEOUT)
    assert result.returncode == 0, result.stderr  # -11 before Tensor was no_gc_clear
    assert "after shutdown: tensor belongs to an nntile.Context that was shut down" in \
        result.stdout


# ---- beyond the list ----------------------------------------------------------------

def test_what_does_not_fit_in_memory_is_refused_in_one_line(finished_run, data_dir):  # noqa: F811
    """nntile-eval checks the memory a run needs before StarPU starts, as nntile-train
    does (a huge batch went on to allocate tiles); host arrays too large for numpy are one
    line too (both were tracebacks)."""
    ckpt = finished_run / "ckpt-2.h5"
    huge_batch = cli("evaluate", "--checkpoint", ckpt, "--data", data_dir, "--batch-size",
                     "100000000", "--batches", "1", timeout=TIMEOUT)
    assert_fails_in_one_line(huge_batch, "not enough memory", "batch <=")
    many_batches = cli("evaluate", "--checkpoint", ckpt, "--data", data_dir, "--batches",
                       "1000000000", timeout=TIMEOUT)
    assert_fails_in_one_line(many_batches, "out of memory", "Unable to allocate")


def test_a_fifo_for_the_config_is_refused(tmp_path, data_dir):  # noqa: F811
    os.mkfifo(tmp_path / "config.json")
    result = cli("train", "--config", tmp_path / "config.json", "--data", data_dir, "--out",
                 tmp_path / "out", timeout=TIMEOUT)
    assert_fails_in_one_line(result, "config.json: not a regular file")


def test_a_negative_seed_is_refused(finished_run):
    result = cli("generate", "--checkpoint", finished_run / "ckpt-2.h5", "--seed", "-1",
                 timeout=TIMEOUT)
    assert_fails_in_one_line(result, "--seed: -1 must be >= 0")  # was numpy's traceback
