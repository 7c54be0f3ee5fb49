"""HDF5 checkpoints: tile-by-tile writing, any-tiling loading, atomic saves, clear errors."""
import contextlib
import errno
import json
import os

import numpy as np
import pytest

h5py = pytest.importorskip("h5py")

from nntile import checkpoint as ckpt_mod
from nntile.checkpoint import Checkpoint, CheckpointError, list_checkpoints, latest, prune, save
from nntile.models import GPT2Config, GPT2LMHead
from nntile.optim import AdamW, LRSchedule

CONFIG = GPT2Config(vocab_size=50, n_positions=16, n_embd=12, n_layer=2, n_head=3)
TILING = dict(batch=1, seq=8, embd=5, head=2, inner=20, vocab=16)
OTHER_TILING = dict(embd=12, head=1, inner=48, vocab=50, seq=16)


def trained(tiling=TILING, config=CONFIG, steps=2, seed=0):
    """A small model and optimizer after a few steps (nonzero moments)."""
    rng = np.random.default_rng(seed)
    model = GPT2LMHead(config, tiling=tiling)
    model.load_state_dict({k: 0.1 * rng.standard_normal(v.shape)
                           for k, v in model.state_dict().items()})
    opt = AdamW(model.named_parameters(), lr=LRSchedule(1e-2, 1, 10), max_grad_norm=1.0)
    for _ in range(steps):
        ids = rng.integers(0, config.vocab_size, (2, 12))
        model.zero_grad()
        model.loss(ids, np.roll(ids, -1, 1))
        model.backward()
        opt.step()
    return model, opt


def meta(model, opt, step=2):
    return dict(config=CONFIG.to_dict(), tiling=dict(model.tiles), dtype="fp32", step=step,
                schedule=opt.schedule.state(), optimizer=dict(step_count=opt.step_count),
                rng={"bit_generator": "PCG64"}, data={"batches_drawn": 3})


def arrays(model, opt):
    out = {f"params/{n}": p.value.to_array() for n, p in model.named_parameters()}
    out.update({f"optim/{n}": t.to_array() for n, t in opt.state_tensors().items()})
    return out


def test_save_writes_tile_by_tile_with_tile_chunks(ctx, tmp_path, monkeypatch):
    model, opt = trained()
    calls = []
    original = ckpt_mod._write_tile
    monkeypatch.setattr(ckpt_mod, "_write_tile",
                        lambda ds, sl, a: (calls.append(a.shape), original(ds, sl, a)))
    path = str(tmp_path / "ckpt-2.h5")
    save(path, model, opt, meta(model, opt))
    tensors = [p.value for _, p in model.named_parameters()] + list(opt.state_tensors().values())
    assert len(calls) == sum(t.ntiles for t in tensors)
    assert max(int(np.prod(s)) for s in calls) <= max(int(np.prod(t.basetile)) for t in tensors)
    with h5py.File(path, "r") as f:
        for name, param in model.named_parameters():
            ds = f[f"params/{name}"]
            assert ds.chunks == tuple(param.value.basetile), name
            np.testing.assert_array_equal(ds[()], param.value.to_array())
        for name, tensor in opt.state_tensors().items():
            assert f[f"optim/{name}"].chunks == tuple(tensor.basetile)
        assert f.attrs["format_version"] == ckpt_mod.FORMAT_VERSION
        assert json.loads(f.attrs["config"]) == CONFIG.to_dict()
        assert json.loads(f.attrs["data"]) == {"batches_drawn": 3}
    assert os.listdir(tmp_path) == ["ckpt-2.h5"]
    model.unregister()


def test_load_into_another_tiling_is_exact(ctx, tmp_path):
    model, opt = trained()
    path = str(tmp_path / "ckpt-2.h5")
    save(path, model, opt, meta(model, opt))
    want = arrays(model, opt)
    other = GPT2LMHead(CONFIG, tiling=OTHER_TILING)
    other_opt = AdamW(other.named_parameters(), lr=1e-3)
    ck = Checkpoint(path)
    assert ck.step == 2 and ck.has_optimizer and ck.config == CONFIG
    ck.load_params(other)
    ck.load_optimizer(other_opt)
    assert other_opt.step_count == 2
    got = arrays(other, other_opt)
    assert set(got) == set(want)
    for key in want:
        np.testing.assert_array_equal(got[key], want[key])
    # the same forward pass in both tilings
    ids = np.arange(24).reshape(2, 12) % 50
    np.testing.assert_allclose(other.forward(ids), model.forward(ids), rtol=1e-5, atol=1e-6)
    model.unregister()
    other.unregister()


def test_failed_save_keeps_older_checkpoints_and_removes_its_temp_file(ctx, tmp_path,
                                                                      monkeypatch):
    model, opt = trained()
    first = str(tmp_path / "ckpt-1.h5")
    save(first, model, opt, meta(model, opt, 1))
    before = open(first, "rb").read()
    calls = []

    def disk_full(ds, sl, a):
        calls.append(1)
        if len(calls) > 3:
            raise OSError(errno.ENOSPC, "No space left on device")
        ds[sl] = a
    monkeypatch.setattr(ckpt_mod, "_write_tile", disk_full)
    with pytest.raises(CheckpointError, match="No space left on device") as info:
        save(str(tmp_path / "ckpt-2.h5"), model, opt, meta(model, opt, 2))
    assert "ckpt-2.h5" in str(info.value)
    assert sorted(os.listdir(tmp_path)) == ["ckpt-1.h5"]
    assert open(first, "rb").read() == before
    assert Checkpoint(first).step == 1
    # a failure while renaming is cleaned up too
    monkeypatch.setattr(ckpt_mod, "_write_tile", lambda ds, sl, a: ds.__setitem__(sl, a))
    monkeypatch.setattr(ckpt_mod.os, "replace", lambda a, b: (_ for _ in ()).throw(
        OSError(errno.EIO, "Input/output error")))
    with pytest.raises(CheckpointError, match="Input/output error"):
        save(str(tmp_path / "ckpt-3.h5"), model, opt, meta(model, opt, 3))
    assert sorted(os.listdir(tmp_path)) == ["ckpt-1.h5"]
    model.unregister()


def test_listing_latest_and_keep(tmp_path):
    for step in (5, 40, 12, 100):
        (tmp_path / f"ckpt-{step}.h5").write_bytes(b"x")
    (tmp_path / "ckpt-900.h5.tmp").write_bytes(b"x")
    (tmp_path / "notes.h5").write_bytes(b"x")
    assert [s for s, _ in list_checkpoints(tmp_path)] == [5, 12, 40, 100]
    assert latest(tmp_path).endswith("ckpt-100.h5")
    prune(tmp_path, 2)
    assert sorted(os.listdir(tmp_path)) == ["ckpt-100.h5", "ckpt-40.h5", "ckpt-900.h5.tmp",
                                            "notes.h5"]
    assert latest(tmp_path / "nowhere") is None


@pytest.fixture
def saved(ctx, tmp_path):
    model, opt = trained()
    path = str(tmp_path / "ckpt-2.h5")
    save(path, model, opt, meta(model, opt))
    yield path, model, opt
    model.unregister()


def test_truncated_and_corrupt_files(saved, tmp_path):
    path, model, _ = saved
    data = open(path, "rb").read()
    for name, content in [("truncated", data[:len(data) // 2]), ("tiny", data[:100]),
                          ("random", os.urandom(len(data))), ("empty", b"")]:
        bad = tmp_path / f"{name}.h5"
        bad.write_bytes(content)
        with pytest.raises(CheckpointError, match="truncated|corrupt|not a readable") as info:
            ck = Checkpoint(str(bad))
            ck.load_params(model)  # a file cut after its header fails here
        assert str(bad) in str(info.value)
    with pytest.raises(CheckpointError, match="does not exist"):
        Checkpoint(str(tmp_path / "missing.h5"))
    with pytest.raises(CheckpointError, match="is a directory"):
        Checkpoint(str(tmp_path))


def test_damaged_data_is_named(saved, tmp_path):
    """A file whose structure reads but whose tensor data was overwritten: the checksum of
    each tile catches it, and the error names the dataset."""
    path, model, _ = saved
    name = "params/transformer.h.1.mlp.c_fc.weight"
    with h5py.File(path, "r") as f:
        offset = f[name].id.get_chunk_info(0).byte_offset
    with open(path, "r+b") as f:
        f.seek(offset + 4)
        f.write(b"\xff" * 16)
    with pytest.raises(CheckpointError, match="cannot read " + name.replace(".", r"\.")) as info:
        Checkpoint(path).load_params(model)
    assert path in str(info.value)


@contextlib.contextmanager
def edited(path):
    """Open a checkpoint to change it as a tool would, its checksum made to match again (so
    that the checks behind the checksum are what is tested)."""
    with h5py.File(path, "a") as f:
        yield f
        f.attrs["checksum"] = ckpt_mod._checksum(f, ckpt_mod._datasets(f))


def test_missing_dataset_wrong_shape_and_other_model(saved, tmp_path):
    path, model, opt = saved
    with edited(path) as f:
        del f["params/transformer.ln_f.bias"]
    with pytest.raises(CheckpointError, match=r"no dataset params/transformer\.ln_f\.bias"):
        Checkpoint(path).load_params(model)
    with edited(path) as f:
        f.create_dataset("params/transformer.ln_f.bias", data=np.zeros(13, np.float32),
                         chunks=(13,), fletcher32=True)
    with pytest.raises(CheckpointError, match=r"params/transformer\.ln_f\.bias has shape "
                                              r"\(13,\), the model expects \(12,\)"):
        Checkpoint(path).load_params(model)
    with edited(path) as f:
        del f["optim/transformer.wpe.weight/exp_avg_sq"]
    with pytest.raises(CheckpointError, match="exp_avg_sq"):
        Checkpoint(path).load_optimizer(opt)
    # a deeper model: the checkpoint lacks its layer 2
    deeper = GPT2LMHead(GPT2Config(vocab_size=50, n_positions=16, n_embd=12, n_layer=3,
                                   n_head=3))
    with pytest.raises(CheckpointError, match="transformer.h.2"):
        Checkpoint(path).load_params(deeper)
    deeper.unregister()
    # a shallower one: the checkpoint holds a layer the model does not have
    shallow = GPT2LMHead(GPT2Config(vocab_size=50, n_positions=16, n_embd=12, n_layer=1,
                                    n_head=3))
    with pytest.raises(CheckpointError, match="transformer.h.1.*does not have"):
        Checkpoint(path).load_params(shallow)
    shallow.unregister()


def test_missing_or_bad_attributes(saved):
    path, _, _ = saved
    with edited(path) as f:
        f.attrs["config"] = "{not json"
    with pytest.raises(CheckpointError, match="'config' is not valid JSON"):
        Checkpoint(path)
    with edited(path) as f:
        del f.attrs["config"]
    with pytest.raises(CheckpointError, match="lacks the attribute 'config'"):
        Checkpoint(path)
    with edited(path) as f:
        f.attrs["format_version"] = 99
    with pytest.raises(CheckpointError, match="format version 99"):
        Checkpoint(path)
    with edited(path) as f:
        f.attrs["format"] = "something else"
    with pytest.raises(CheckpointError, match="not an nntile checkpoint"):
        Checkpoint(path)
