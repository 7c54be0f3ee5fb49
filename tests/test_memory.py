"""nntile.memory: the estimate equals the tensors a run registers; the check refuses clearly."""
import contextlib
import math
import os
import re
import subprocess
import sys
from collections import Counter
from pathlib import Path

import numpy as np
import pytest

from nntile import fit, machine, memory
from nntile.precision import precision_dtypes
from nntile._core.core import current_context, live_tensor_count
from nntile.cli_common import CLIError
from nntile.models import GPT2Config, GPT2LMHead, config_from_dict, model_class
from nntile.models.gpt2 import GPT2Block
from nntile.optim import SGD, AdamW
from tests.conftest import estimate_of_train_run

ROOT = Path(__file__).resolve().parents[1]

LLAMA = dict(model_type="llama", vocab_size=50, max_position_embeddings=16, hidden_size=24,
             intermediate_size=28, num_hidden_layers=2, num_attention_heads=4,
             num_key_value_heads=2)
CASES = {  # each: config fields (GPT-2's without model_type), batch, seq, tiles, dtype, optimizer
    # partial tiles along every axis; untied head
    "partial": (dict(vocab_size=50, n_positions=16, n_embd=24, n_layer=2, n_head=3,
                     tie_word_embeddings=False), 3, 10,
                dict(batch=2, seq=4, embd=10, head=2, inner=40, vocab=16), "fp32", "adamw"),
    # one tile per dimension, tied embeddings, SGD
    "untiled-bf16": (dict(vocab_size=37, n_positions=12, n_embd=16, n_layer=1, n_head=2), 2, 12,
                     {}, "bf16", "sgd"),
    # n_inner, seq shorter than n_positions, a seq tile that does not divide it
    "fp64-inner": (dict(vocab_size=37, n_positions=12, n_embd=16, n_layer=3, n_head=4,
                        n_inner=20), 5, 7, dict(seq=5, embd=7, head=3, inner=9), "fp64", "adamw"),
    # batch tile larger than the batch (clipped), tf32
    "tf32-clipped": (dict(vocab_size=64, n_positions=8, n_embd=8, n_layer=1, n_head=1), 1, 8,
                     dict(batch=4, vocab=30), "tf32", "adamw"),
    # fp32 and bf16 tensors side by side, bf16 copies of the GEMM weights (lm_head untied)
    "mixed-partial": (dict(vocab_size=50, n_positions=16, n_embd=24, n_layer=2, n_head=3,
                           tie_word_embeddings=False), 3, 10,
                      dict(batch=2, seq=4, embd=10, head=2, inner=40, vocab=16), "bf16-mixed",
                      "adamw"),
    # the unfused attention: scores and probabilities as tensors
    "unfused": (dict(vocab_size=50, n_positions=16, n_embd=24, n_layer=2, n_head=3,
                     attention="unfused"), 3, 10, dict(batch=2, seq=4, head=2), "bf16-mixed",
                "adamw"),
    # tied: the token embedding has the copy; SGD refreshes it with a cast
    "mixed-tied-sgd": (dict(vocab_size=37, n_positions=12, n_embd=16, n_layer=1, n_head=2), 2,
                       12, {}, "bf16-mixed", "sgd"),
    # Llama: grouped-query attention (key/value heads tiled by the head tile / the group),
    # biases, the rotary frequencies (one constant of the model), partial tiles, untied
    "llama-partial": (dict(LLAMA, num_attention_heads=6, num_key_value_heads=2,
                           attention_bias=True, mlp_bias=True), 3, 10,
                      dict(batch=2, seq=4, embd=10, head=3, inner=14, vocab=16), "fp32",
                      "adamw"),
    # unfused under GQA (the key/value heads repeated per query head), bf16 copies
    "llama-mixed-unfused": (dict(LLAMA, attention="unfused"), 3, 10,
                            dict(batch=2, seq=4, head=2), "bf16-mixed", "adamw"),
    # bf16 storage with fp32 rotary frequencies, tied, SGD
    "llama-bf16-tied-sgd": (dict(LLAMA, num_key_value_heads=1, tie_word_embeddings=True), 2,
                            12, {}, "bf16", "sgd"),
    # Qwen3: the per-head norms of q and k (their statistics, and q and k widened to fp32
    # under bf16-mixed), head_dim apart from hidden / heads, partial tiles
    "qwen3-mixed-partial": (dict(LLAMA, model_type="qwen3", head_dim=10), 3, 10,
                            dict(batch=2, seq=4, embd=10, head=2, inner=14, vocab=16),
                            "bf16-mixed", "adamw"),
}


def _new_tensors(before):
    return [t for t in memory.live_tensors() if id(t) not in before]


def _tile_alloc(tensor):
    """StarPU's allocation of each tile, from the tensor's own tile shapes."""
    total = 0
    for i in range(tensor.ntiles):
        size = math.prod(tensor.traits.tile_shape(i)) * tensor.numpy_dtype.itemsize
        if size <= memory.SUBALLOC_MAX:
            size = -(-size // memory.SUBALLOC_BLOCK) * memory.SUBALLOC_BLOCK
        total += size
    return total


@contextlib.contextmanager
def _one_training_step(config, B, T, tiling, dtype, optimizer, model_type=None):
    """Build a model (of the config's family, unless ``model_type``) and its optimizer and run
    one training step: (model, optimizer, the tensors they registered); all are unregistered
    afterwards."""
    before = {id(t) for t in memory.live_tensors()}
    count_before = live_tensor_count()
    model = (model_type or model_class(config.model_type))(config, tiling, dtype)
    try:
        params = model.named_parameters()
        opt = (AdamW(params, lr=1e-3, max_grad_norm=1.0) if optimizer == "adamw"
               else SGD(params, lr=1e-2, momentum=0.9, max_grad_norm=1.0))
        rng = np.random.default_rng(0)
        ids = rng.integers(0, config.vocab_size, (B, T))
        model.zero_grad()
        model.loss(ids, np.roll(ids, -1, axis=1))
        model.backward()
        opt.step()
        current_context().wait()
        tensors = _new_tensors(before)
        assert len(tensors) == live_tensor_count() - count_before
        yield model, opt, tensors
    finally:
        model.unregister()
        for t in _new_tensors(before):
            t.unregister()


def _same_tensors(tensors, est):
    """The registered tensors are the estimate's, one for one: shapes, tiles and dtypes."""
    assert len(tensors) == est.ntensors
    assert Counter((t.shape, t.basetile, t.dtype) for t in tensors) == \
        Counter(s.key for s in est.specs)
    assert sum(memory.tensor_bytes(t) for t in tensors) == est.total


@pytest.mark.parametrize("case", list(CASES))
def test_estimate_equals_the_tensors_a_training_step_registers(ctx, case):
    fields, B, T, tiling, dtype, optimizer = CASES[case]
    config = config_from_dict(fields)
    with _one_training_step(config, B, T, tiling, dtype, optimizer) as (model, opt, tensors):
        est = memory.estimate(config, B, T, tiling, dtype, optimizer=optimizer)
        _same_tensors(tensors, est)
        assert sum(t.ntiles for t in tensors) == est.ntiles
        assert sum(_tile_alloc(t) for t in tensors) == est.alloc_bytes
        # the categories hold what their names say
        master, compute = precision_dtypes(dtype)
        itemsize = memory.DTYPE_BYTES[master]
        nparams = sum(math.prod(p.value.shape) for _, p in model.named_parameters())
        assert nparams == config.num_parameters()
        assert est["parameters"] == est["gradients"] == nparams * itemsize
        copies = [p.copy for _, p in model.named_parameters() if p.copy is not None]
        assert est["compute_copies"] == sum(memory.tensor_bytes(t) for t in copies)
        assert bool(copies) == (compute != master)
        states = sum(memory.tensor_bytes(t) for t in opt.state_tensors().values())
        assert est["optimizer_states"] == states + itemsize  # + the clipping norm
        assert est["logits"] == B * T * config.vocab_size * memory.DTYPE_BYTES[compute]
        largest = max(math.prod(t.basetile) * t.numpy_dtype.itemsize for t in tensors)
        assert est.largest_tile == largest


class ProbedBlock(GPT2Block):
    """A block with one tensor more of each kind a layer declares, each added in one place:
    a parameter ``gain`` [n_embd] (with its gradient and optimizer states), a constant
    ``scale`` [7], a buffer ``probe`` [batch, seq, 3] and a backward scratch ``dprobe``
    [batch, seq, 5]."""

    def __init__(self, config, tiles, dtype):
        super().__init__(config, tiles, dtype)
        self.gain = self.add_param("gain", (config.n_embd,), (tiles["embd"],))
        self.add_constant("scale", np.arange(7) / 8)

    def declare(self, lead, tiles):
        return super().declare(lead, tiles) + [
            self.buffer_spec("probe", lead + (3,), tiles + (3,), self.master),
            self.scratch_spec("dprobe", lead + (5,), tiles + (5,), self.master)]


class ProbedGPT2(GPT2LMHead):
    block_type = ProbedBlock


@pytest.mark.parametrize("dtype", ["fp32", "bf16-mixed"])
def test_a_tensor_added_to_a_layer_is_registered_and_estimated(ctx, dtype):
    config = GPT2Config(vocab_size=40, n_positions=8, n_embd=12, n_layer=3, n_head=2)
    tiling, B, T = dict(embd=5, seq=3, batch=1), 2, 8
    base = memory.estimate(config, B, T, tiling, dtype)
    probed = memory.estimate(config, B, T, tiling, dtype, model=ProbedGPT2)
    # what the three tensors add, counted by hand (fp32: the master dtype of both precisions)
    L = config.n_layer
    assert probed["parameters"] - base["parameters"] == L * 12 * 4
    assert probed["gradients"] - base["gradients"] == L * 12 * 4
    assert probed["optimizer_states"] - base["optimizer_states"] == L * 2 * 12 * 4  # AdamW
    assert probed["activations"] - base["activations"] == L * B * T * 3 * 4  # one per layer
    # the scratch is shared by the layers, each layer has its constant
    assert probed["workspaces"] - base["workspaces"] == B * T * 5 * 4 + L * 7 * 4
    assert probed["compute_copies"] == base["compute_copies"]
    assert probed.ntensors - base.ntensors == L * (4 + 1 + 1) + 1
    names = {s.name for s in probed.specs} - {s.name for s in base.specs}
    assert {"transformer.h.2.gain/exp_avg_sq", "transformer.h.0.probe",
            "transformer.h.1.scale", "scratch.dprobe"} <= names
    # and the model built from the subclass registers exactly what the estimate lists
    with _one_training_step(config, B, T, tiling, dtype, "adamw", ProbedGPT2) as (model, _,
                                                                                 tensors):
        assert model.blocks[1].gain.value.shape == (12,)
        assert model.blocks[1].constant("scale").to_array().tolist() == [i / 8 for i in
                                                                          range(7)]
        assert not any(name.endswith("scale") for name, _ in model.named_parameters())
        _same_tensors(tensors, probed)


RECOMPUTE_CASES = ["partial", "llama-partial", "llama-mixed-unfused"]


@pytest.mark.parametrize("case", RECOMPUTE_CASES)
def test_recompute_keeps_every_blocks_stream_and_one_blocks_inner_activations(case):
    """With recomputation the activations are the stream out of every block (and into the
    first), one block's inner activations and the rest as before, summed here from the
    declarations of a run without it: smaller by the inner activations of all blocks but
    one. Nothing else changes."""
    fields, B, T, tiling, dtype, optimizer = CASES[case]
    config = config_from_dict(fields)
    est = {rc: memory.estimate(config, B, T, tiling, dtype, optimizer=optimizer, recompute=rc)
           for rc in (False, True)}
    blocks = model_class(config.model_type).block_prefix + "."
    L = config.num_hidden_layers
    acts = {s.name: s.nbytes for s in est[False].specs if s.category == "activations"}
    streams = sum(acts[f"{blocks}{i}.out"] for i in range(L))
    inner = sum(n for name, n in acts.items()
                if name.startswith(f"{blocks}0.") and name != f"{blocks}0.out")
    rest = sum(n for name, n in acts.items() if not name.startswith(blocks))
    assert inner > 0 and rest > 0  # the first block's input, x0, is the model's
    assert est[True]["activations"] == streams + inner + rest
    assert est[False]["activations"] - est[True]["activations"] == (L - 1) * inner
    assert {c: est[True][c] for c in memory.CATEGORIES if c != "activations"} == \
        {c: est[False][c] for c in memory.CATEGORIES if c != "activations"}


def test_recomputing_the_first_blocks_keeps_one_set_of_their_inner_activations():
    """Of 4 blocks, the first k recomputing hold one set of inner activations among them:
    each more such block saves one block's, and all 4 save 3."""
    fields, B, T, tiling, dtype, optimizer = CASES["llama-partial"]
    config = config_from_dict(dict(fields, num_hidden_layers=4))
    none, one, two, three, every = (
        memory.estimate(config, B, T, tiling, dtype, optimizer=optimizer,
                        recompute=k)["activations"] for k in (False, 1, 2, 3, True))
    inner = (none - every) // 3
    assert inner > 0 and none - every == 3 * inner
    assert [one, two, three] == [none, none - inner, none - 2 * inner]
    with pytest.raises(ValueError, match="from 0 to 4"):
        memory.estimate(config, B, T, tiling, dtype, recompute=5)


@pytest.mark.parametrize("case", RECOMPUTE_CASES[:2])
def test_recompute_registers_what_its_estimate_lists(ctx, case):
    fields, B, T, tiling, dtype, optimizer = CASES[case]
    config = config_from_dict(fields)
    family = model_class(config.model_type)
    with _one_training_step(config, B, T, tiling, dtype, optimizer,
                            lambda *a: family(*a, recompute=True)) as (model, _, tensors):
        assert model.recompute
        _same_tensors(tensors, memory.estimate(config, B, T, tiling, dtype,
                                               optimizer=optimizer, recompute=True))


def test_preflight_recomputes_where_only_that_fits(monkeypatch, capsys):
    """The policy's rule: on where the run fits with recomputation and not without; the
    flag's value wins, and a refusal without it names it."""
    config = GPT2Config(vocab_size=1000, n_positions=256, n_embd=256, n_layer=6, n_head=4)
    est = {rc: memory.estimate(config, 4, 256, dict(batch=2), "fp32", recompute=rc)
           for rc in (False, True)}
    host = (est[False].total + est[True].total) // 2 / fit.STARPU_MARGIN
    monkeypatch.setattr(machine, "host_memory_of_this_process", lambda: int(host))
    monkeypatch.delenv("NNTILE_MEMORY_CHECK", raising=False)
    monkeypatch.delenv("STARPU_DISK_SWAP", raising=False)
    monkeypatch.delenv("STARPU_LIMIT_CPU_MEM", raising=False)
    chosen = fit.preflight(config, 4, 256, dict(batch=2), "fp32", ncuda=0, recompute=None)
    assert chosen.recompute.value and "nowhere" in chosen.recompute.reason
    assert chosen.total == est[True].total
    assert fit.preflight(config, 4, 256, dict(batch=2), "fp32", ncuda=0,
                         recompute=True).recompute == (True, "argument")
    with pytest.raises(CLIError, match=r"activation recomputation \(--recompute\)"):
        fit.preflight(config, 4, 256, dict(batch=2), "fp32", ncuda=0, recompute=False)
    monkeypatch.setattr(machine, "host_memory_of_this_process", lambda: 10 * int(host))
    assert not fit.preflight(config, 4, 256, dict(batch=2), "fp32", ncuda=0,
                             recompute=None).recompute.value


def test_forward_only_estimate(ctx):
    config = GPT2Config(vocab_size=40, n_positions=8, n_embd=12, n_layer=2, n_head=2)
    before = {id(t) for t in memory.live_tensors()}
    model = GPT2LMHead(config, dict(embd=5, seq=3), "fp32")
    model.forward(np.zeros((2, 8), dtype=np.int64))
    ctx.wait()
    try:
        tensors = _new_tensors(before)
        est = memory.estimate(config, 2, 8, dict(embd=5, seq=3), optimizer=None,
                              training=False)
        assert Counter((t.shape, t.basetile, t.dtype) for t in tensors) == \
            Counter(s.key for s in est.specs)
        assert est["optimizer_states"] == 0 and est["gradients"] == est["parameters"]
    finally:
        model.unregister()
        for t in _new_tensors(before):
            t.unregister()


@pytest.mark.parametrize("dtype", ["fp32", "bf16-mixed"])
def test_fused_attention_keeps_no_scores(dtype):
    """Fused, nothing [batch, heads, seq, seq] is declared: per layer, forward keeps o and the
    log-sum-exp [batch, seq, heads] (fp32) instead of o, the probabilities and their softmax
    statistics [batch, heads, seq, 2]; backward's scratch loses the probabilities' gradient
    and their row sums (shared by the layers)."""
    B, T, H, L = 3, 16, 4, 2
    est = {att: memory.estimate(GPT2Config(vocab_size=40, n_positions=T, n_embd=32, n_layer=L,
                                           n_head=H, attention=att), B, T, dict(seq=6), dtype)
           for att in ("fused", "unfused")}
    master, compute = (memory.DTYPE_BYTES[d] for d in precision_dtypes(dtype))
    assert not [s for s in est["fused"].specs if s.shape == (B, H, T, T)]
    assert len([s for s in est["unfused"].specs if s.shape == (B, H, T, T)]) == L + 1
    scores, rows = B * H * T * T, B * H * T
    assert est["unfused"]["activations"] - est["fused"]["activations"] == \
        L * (scores * compute + rows * 2 * master - rows * 4)
    assert est["unfused"]["workspaces"] - est["fused"]["workspaces"] == \
        scores * compute + rows * master


def test_tile_sizes_count_partial_tiles():
    spec = memory.TensorSpec("x", (5, 7), (2, 3), "fp32", "activations")
    assert spec.tile_sizes() == [(1, 1), (2, 2), (3, 2), (6, 4)]  # (1,1), (2,1)x2, (1,3)x2, (2,3)x4
    assert spec.ntiles == 9 and spec.nbytes == 35 * 4
    assert memory.alloc_bytes(spec) == 9 * memory.SUBALLOC_BLOCK  # every tile rounds up to 16 KiB
    assert memory.unaligned_tiles(spec) == 9
    big = memory.TensorSpec("w", (3000, 1000), (1500, 1000), "fp32", "parameters")
    assert memory.alloc_bytes(big) == big.nbytes  # tiles above 4 MiB are allocated as they are


def _estimate(n_layer=4, batch=4, dtype="fp32"):
    config = GPT2Config(vocab_size=1000, n_positions=256, n_embd=512, n_layer=n_layer,
                        n_head=8)
    return memory.estimate(config, batch, 256, dict(batch=2, vocab=500), dtype)


def test_estimate_scales_as_expected():
    small, big = _estimate(batch=2), _estimate(batch=4)
    assert big["parameters"] == small["parameters"]
    assert big["activations"] > small["activations"]
    assert big["logits"] == 2 * small["logits"]
    # int64 token ids and labels (each twice) and positions do not shrink with the dtype,
    # nor the fp32 log-sum-exp [batch, seq, heads] of each layer's fused attention
    assert _estimate(dtype="bf16").total * 2 == \
        _estimate(dtype="fp32").total + 5 * 4 * 256 * 8 + 4 * 4 * 256 * 8 * 4
    assert _estimate().init_host_peak == _estimate()["parameters"] + 512 * 2048 * 8
    assert "parameters" in _estimate().summary()


def test_check_fits_passes_and_reports_the_budget():
    est = _estimate()
    host = 10 * est.total
    b = fit.check_fits(est, 0, host)
    assert b["host"] == int(0.9 * host) and b["gpu"] == 0
    assert b["needs"] == est.total
    b = fit.check_fits(est, 80 * memory.GiB, 10 * est.total, limit_cuda_mem=1000)
    assert b["gpu"] == 1000 * memory.MiB and "STARPU_LIMIT_CUDA_MEM" in b.summary()


def test_check_fits_names_the_numbers_and_what_to_change():
    est = _estimate(n_layer=8, batch=8)
    host = int(0.8 * est.total / 0.9)
    with pytest.raises(fit.MemoryBudgetError) as info:
        fit.check_fits(est, 0, host)
    assert isinstance(info.value, MemoryError)
    message = str(info.value)
    assert "\n" not in message
    assert memory.fmt_bytes(est.total) in message
    assert memory.fmt_bytes(0.9 * host) in message
    assert memory.fmt_bytes(est["activations"]) in message
    assert "n_layer <= " in message and "batch <= " in message and "n_embd" in message
    assert "STARPU_DISK_SWAP" in message
    # the disk it names is enough, beside a GPU too
    for gpu in (0, est.alloc_bytes // 20):
        with pytest.raises(fit.MemoryBudgetError) as info:
            fit.check_fits(est, gpu, host)
        size, unit = re.search(r"disk swap \(STARPU_DISK_SWAP\) of at least ([\d.]+) (\w+)",
                               str(info.value)).groups()
        units = {"GiB": memory.GiB, "MiB": memory.MiB, "KiB": 1 << 10}
        fit.check_fits(est, gpu, host, disk_bytes=int((float(size) + 0.1) * units[unit]))
    assert info.value.estimate is est and info.value.budget["host"] == int(0.9 * host)
    # what it suggests does fit
    layers = int(message.split("n_layer <= ")[1].split(";")[0])
    assert layers < 8
    fit.check_fits(_estimate(n_layer=layers, batch=8), 0, host)
    with pytest.raises(MemoryError):
        fit.check_fits(_estimate(n_layer=layers + 1, batch=8), 0, host)


def test_gpu_and_host_together_or_the_disk_alone_hold_the_run():
    est = _estimate()
    slack = fit.SWAP_SLACK_TILES * est.largest_tile
    host = int(0.6 * est.alloc_bytes / fit.STARPU_MARGIN)
    budget_host = fit.budget(0, host)["host"]

    def gpu_for(room):  # a GPU whose budget is `room` or up to 2 MiB more (whole MiB)
        gpu = int(room / fit.STARPU_MARGIN) + 2 * memory.MiB
        assert 0 <= fit.budget(gpu, host)["gpu"] - room <= 2 * memory.MiB
        return gpu

    fit.check_fits(est, gpu_for(est.alloc_bytes + slack - budget_host), host)
    with pytest.raises(fit.MemoryBudgetError, match="GPU and host memory together must "
                       "hold that plus .* livelocks"):
        fit.check_fits(est, gpu_for(est.alloc_bytes - budget_host), host)
    with pytest.raises(fit.MemoryBudgetError, match="GPU and host memory together hold less"):
        fit.check_fits(est, gpu_for(est.alloc_bytes // 4), host)
    # a disk swap that holds the run by itself counts instead of them (host memory caches
    # it), and never refuses what fits without; host and disk together do not count
    disk = est.alloc_bytes + slack
    fit.check_fits(est, gpu_for(est.alloc_bytes // 4), host, disk_bytes=disk)
    with pytest.raises(fit.MemoryBudgetError, match="the disk swap must hold that plus"):
        fit.check_fits(est, gpu_for(est.alloc_bytes // 4), host, disk_bytes=disk - 1)
    fit.check_fits(est, gpu_for(est.alloc_bytes + slack - budget_host), host, disk_bytes=1)
    # a smaller disk swap is not counted beside them, and the refusal says so
    with pytest.raises(fit.MemoryBudgetError, match="together hold less than that; a disk "
                       "swap smaller than they are adds nothing to them") as refused:
        fit.check_fits(est, gpu_for(est.alloc_bytes // 4), host, disk_bytes=disk // 2)
    # and names the disk swap that would hold the run
    size = re.search(r"disk swap \(STARPU_DISK_SWAP\) of at least ([\d.]+) MiB",
                     str(refused.value)).group(1)
    fit.check_fits(est, gpu_for(est.alloc_bytes // 4), host,
                   disk_bytes=int((float(size) + 0.1) * memory.MiB))
    # with neither, host memory holds it all
    with pytest.raises(fit.MemoryBudgetError, match="without a GPU or a disk swap"):
        fit.check_fits(est, 0, host)
    fit.check_fits(est, 0, int(est.total / fit.STARPU_MARGIN) + 1)


def test_gpu_and_host_memory_full_to_within_four_percent_is_refused():
    """The edge measured on one H100 (79.6 GiB) with 124.4 GiB of host memory, the wide GPT-2
    of bench/scale.py in tf32 at batch 1: 12.09B (n_embd 14848) stalled in step 1, 11.70B
    (14592) trained; 12 of the largest tiles (1.5 GiB) would have admitted both."""
    def run(n_embd):
        config = GPT2Config(vocab_size=50257, n_positions=1024, n_embd=n_embd, n_layer=4,
                            n_head=n_embd // 128, tie_word_embeddings=False)
        return memory.estimate(config, 1, 1024, dict(batch=1, embd=4096, inner=4096, head=32,
                                                      vocab=8192), "tf32", init="tiles")
    gpu, host = int(79.6 * memory.GiB), int(124.4 * memory.GiB)
    fit.check_fits(run(14592), gpu, host)
    stalled = run(14848)
    room = fit.budget(gpu, host)
    assert stalled.alloc_bytes + fit.SWAP_SLACK_TILES * stalled.largest_tile < \
        room["gpu"] + room["host"]
    with pytest.raises(fit.MemoryBudgetError, match=r"plus 7.5 GiB \(4% of them\)"):
        fit.check_fits(stalled, gpu, host)


def test_weights_written_from_numpy_must_fit_in_host_memory():
    est = _estimate()
    with pytest.raises(fit.MemoryBudgetError, match="writing the weights"):
        fit.check_fits(est, 100 * est.total, est["parameters"], disk_bytes=100 * est.total)


def test_tiles_too_large_for_the_gpu():
    est = _estimate()
    with pytest.raises(fit.MemoryBudgetError, match="smaller tiles"):
        fit.check_fits(est, int(2 * est.largest_tile / 0.9), 10 * est.total)


def test_available_reads_host_memory():
    gpu, host = machine.available()
    assert isinstance(gpu, int) and gpu >= 0
    assert 0 < host <= os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


def test_gpu_memory_from_nvidia_smi_and_visible_devices(tmp_path, monkeypatch):
    smi = tmp_path / "nvidia-smi"
    smi.write_text("#!/bin/sh\necho '0, GPU-aaaa-1111, 81559'\necho '1, GPU-bbbb-2222, 40960'\n")
    smi.chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    assert machine.gpu_memory() == [81559 * memory.MiB, 40960 * memory.MiB]
    assert machine.available(ncuda=1)[0] == 81559 * memory.MiB
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "1")
    assert machine.gpu_memory() == [40960 * memory.MiB]
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "GPU-aaaa")
    assert machine.gpu_memory() == [81559 * memory.MiB]
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    assert machine.gpu_memory() == [] and machine.available()[0] == 0


def test_preflight_refuses_with_one_line_and_can_be_overridden(monkeypatch, capsys):
    config = GPT2Config(vocab_size=1000, n_positions=256, n_embd=512, n_layer=4, n_head=8)
    monkeypatch.setattr(machine, "host_memory", lambda: 10 * memory.MiB)
    monkeypatch.delenv("NNTILE_MEMORY_CHECK", raising=False)
    with pytest.raises(CLIError, match="not enough memory") as info:
        fit.preflight(config, 4, 256, dict(batch=2), "fp32", ncuda=0)
    assert "\n" not in str(info.value)
    monkeypatch.setenv("NNTILE_MEMORY_CHECK", "0")
    est = fit.preflight(config, 4, 256, dict(batch=2), "fp32", ncuda=0, prog="x")
    assert est.total > 10 * memory.MiB
    assert "x: warning: not enough memory" in capsys.readouterr().err
    monkeypatch.setattr(machine, "host_memory", lambda: 1 << 40)
    fit.preflight(config, 4, 256, dict(batch=2), "fp32", ncuda=0, prog="x", quiet_below=0)
    assert capsys.readouterr().err.startswith("x: memory: needs ")


def test_preflight_notes_a_run_whose_tiles_do_not_all_fit_in_host_memory(monkeypatch, capsys):
    config = GPT2Config(vocab_size=1000, n_positions=256, n_embd=512, n_layer=4, n_head=8)
    est = memory.estimate(config, 4, 256, dict(batch=2), "fp32")
    monkeypatch.delenv("NNTILE_MEMORY_CHECK", raising=False)
    monkeypatch.delenv("STARPU_DISK_SWAP", raising=False)
    for key in ("STARPU_LIMIT_CUDA_MEM", "STARPU_LIMIT_CPU_MEM"):
        monkeypatch.delenv(key, raising=False)
    monkeypatch.setattr(machine, "gpus_of_this_process", lambda ncuda: [est.alloc_bytes])
    notes = []
    for host in (est.alloc_bytes // 2, 2 * est.alloc_bytes):
        monkeypatch.setattr(machine, "host_memory_of_this_process", lambda: host)
        fit.preflight(config, 4, 256, dict(batch=2), "fp32", prog="x")
        notes.append("x: note: host memory cannot hold every tile" in capsys.readouterr().err)
    assert notes == [True, False]


def test_train_refuses_a_model_that_cannot_fit_before_starting(tmp_path):
    from nntile.data import prepare, stdlib_files
    data = tmp_path / "data"
    prepare(stdlib_files()[1][:3], str(data))
    out = tmp_path / "out"
    env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    env.pop("NNTILE_MEMORY_CHECK", None)
    result = subprocess.run(
        [sys.executable, "-m", "nntile.train", "--data", str(data), "--out", str(out),
         "--n-layer", "64", "--n-head", "64", "--n-embd", "16384", "--seq-len", "64",
         "--batch-size", "2", "--ncpu", "1"], capture_output=True, text=True, timeout=120,
        env=env)
    assert result.returncode == 2, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in result.stderr
    assert lines[0].startswith("nntile-train: error: not enough memory: the run needs ")
    assert "parameters 768." in lines[0]  # 64 x 12 x 16384^2 x 4 bytes = 768 GiB, and more
    assert not out.exists()


def test_default_gpu_limit_leaves_a_fixed_reserve_on_large_gpus_and_90_percent_on_small():
    h100 = 81559 * memory.MiB  # nvidia-smi's total of an H100 80GB
    limit = fit.default_cuda_limit_mib(h100) * memory.MiB
    assert h100 - limit == pytest.approx(3 * memory.GiB, abs=memory.MiB)
    assert limit > 0.95 * h100
    for small in (8 * memory.GiB, 16 * memory.GiB):  # 10% is under 3 GiB: StarPU's own margin
        assert fit.default_cuda_limit_mib(small) == int(0.9 * small) // memory.MiB
    b = fit.budget(2 * h100, 100 * memory.GiB, ngpu=2)
    assert b["gpu"] == 2 * limit and "nntile's default" in b.summary()


# ---- one rank's share under StarPU-MPI -------------------------------------------------------

@pytest.mark.parametrize("case", list(CASES))
@pytest.mark.parametrize("grid", [(2, 1), (1, 2), (2, 2), (3, 1), (1, 3)])
def test_ranks_own_every_tile_once_and_gradients_and_states_stay_home(case, grid):
    from nntile.distributed import Distribution
    fields, B, T, tiling, dtype, optimizer = CASES[case]
    config = config_from_dict(fields)
    dist = Distribution(*grid)
    tiling = dict(tiling, batch=1)  # enough batch tiles for every data group
    shares = [memory.estimate(config, B, T, tiling, dtype, optimizer, distribution=dist, rank=r)
              for r in range(dist.nranks)]
    whole = shares[0].whole
    assert whole.total == memory.estimate(config, B, T, tiling, dtype, optimizer).total + (
        dist.nranks * memory.DTYPE_BYTES[precision_dtypes(dtype)[0]])  # per-rank norms
    for category in memory.CATEGORIES:
        assert sum(s.owned[category] for s in shares) == whole[category]
    for s in shares:
        for category in ("gradients", "optimizer_states"):
            assert s.received[category] == 0 and s[category] == s.owned[category]
        for category in memory.READ_BY_OTHER_RANKS:  # room for every tile read elsewhere
            assert s[category] == whole[category]
        assert s.owned_total < whole.total and s.total <= whole.total
        assert s.alloc_bytes >= s.total


def test_rank_share_follows_the_distribution():
    """Data parallelism: weights, their gradients and states go round-robin over the ranks;
    batch tiles go to data groups in turn."""
    from nntile.distributed import Distribution
    config = GPT2Config(vocab_size=64, n_positions=8, n_embd=8, n_layer=1, n_head=1)
    tiling = dict(batch=1, seq=8, embd=8, head=1, inner=32, vocab=32)
    dist = Distribution.data_parallel(2)
    r0, r1 = (memory.estimate(config, 2, 8, tiling, "fp32", distribution=dist, rank=r)
              for r in (0, 1))
    # wte (64 x 8) has two tiles of 32 x 8: one per rank; so has its gradient
    spec = next(s for s in r0.specs if s.name == "transformer.wte.weight/grad")
    assert spec.tile_owners(dist).tolist() == [0, 1]
    logits = next(s for s in r0.specs if s.name == "logits")  # [2, 8, 64], tiles [1, 8, 32]
    assert logits.tile_owners(dist).tolist() == [0, 0, 1, 1]
    assert r0.owned["logits"] == r1.owned["logits"] == 8 * 64 * 4
    with pytest.raises(ValueError, match="rank 2 does not exist"):
        memory.estimate(config, 2, 8, tiling, "fp32", distribution=dist, rank=2)
    with pytest.raises(ValueError, match="needs the rank"):
        memory.estimate(config, 2, 8, tiling, "fp32", distribution=dist)


def test_rank_that_cannot_fit_is_told_more_ranks_would_help():
    from nntile.distributed import Distribution
    config = GPT2Config(vocab_size=1000, n_positions=64, n_embd=128, n_layer=2, n_head=2)
    dist = Distribution.data_parallel(2)
    est = memory.estimate(config, 2, 64, dict(batch=1, embd=32, inner=128, vocab=250), "fp32",
                          distribution=dist, rank=1)
    with pytest.raises(fit.MemoryBudgetError) as info:
        fit.check_fits(est, 0, est.total - 1)
    text = str(info.value)
    assert "rank 1 of 2 (2 data x 1 tensor)" in text and "more ranks" in text
    assert fit.check_fits(est, 0, int(est.total / fit.STARPU_MARGIN) + 1)["needs"] == est.total


# ---- disk swap --------------------------------------------------------------------------------

def test_disk_swap_needs_slack_for_tiles_in_transit():
    est = _estimate()
    host = int(0.5 * est.total / fit.STARPU_MARGIN) + 1
    just = est.total  # the disk holds every tile, exactly
    with pytest.raises(fit.MemoryBudgetError, match="livelocks"):
        fit.check_fits(est, 0, host, disk_bytes=just)
    slack = fit.SWAP_SLACK_TILES * est.largest_tile
    fit.check_fits(est, 0, host, disk_bytes=just + slack)
    with pytest.raises(fit.MemoryBudgetError, match="the disk swap holds less"):
        fit.check_fits(est, 0, host, disk_bytes=est.total - int(0.5 * est.total) + slack)


def test_disk_swap_smaller_than_starpu_accepts_is_refused_before_it_starts(monkeypatch):
    import nntile
    monkeypatch.setenv("STARPU_DISK_SWAP", "/tmp/nntile-test-swap")
    for size, message in (("15", "at least 16 MiB"), ("1G", "whole number of MiB")):
        monkeypatch.setenv("STARPU_DISK_SWAP_SIZE", size)
        with pytest.raises(ValueError, match=message):
            nntile.Context(ncpu=1, ncuda=0, start=False).start()
        with pytest.raises(CLIError, match=message):
            fit.preflight(GPT2Config(vocab_size=37, n_positions=12, n_embd=16, n_layer=1,
                                     n_head=2), 1, 12, ncuda=0)


def _train_with_disk_swap(tmp_path, host_mib, disk_mib, steps=2):
    env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""),
               STARPU_LIMIT_CPU_MEM=str(host_mib), STARPU_DISK_SWAP=str(tmp_path / "swap"),
               STARPU_DISK_SWAP_SIZE=str(disk_mib), STARPU_DISK_SWAP_BACKEND="unistd",
               STARPU_SILENT="1")
    env.pop("NNTILE_MEMORY_CHECK", None)
    (tmp_path / "swap").mkdir(parents=True, exist_ok=True)
    return subprocess.run(
        [sys.executable, "-m", "nntile.train", *SWAP_RUN, "--steps", str(steps),
         "--out", str(tmp_path / "out")], capture_output=True, text=True, timeout=300, env=env)


SWAP_RUN = ["--n-layer", "2", "--n-embd", "256", "--n-head", "4", "--seq-len", "32",
            "--batch-size", "4", "--tile-batch", "4", "--tile-embd", "64", "--tile-inner", "256",
            # CPU workers only: host memory below the model is the premise, and a GPU would
            # hold all of it
            "--ncpu", "2", "--ncuda", "0",
            # one validation batch: the final evaluation reads through the disk swap too
            "--eval-every", "0", "--eval-batches", "1", "--save-every", "0", "--no-progress",
            # at the edge recomputation would make the run fit, and the policy take it
            "--no-recompute"]


def test_training_through_disk_swap_and_the_refusal_at_its_edge(tmp_path):
    """Host memory below the model: StarPU evicts tiles to the disk swap and training goes
    on; a disk that holds the tiles but not the slack is refused before StarPU starts (a disk
    that held less than the run hung about one run in a hundred: host memory and the disk
    waited for each other)."""
    est = estimate_of_train_run(SWAP_RUN)
    host = 16
    assert host * memory.MiB < est.total
    slack = fit.SWAP_SLACK_TILES * est.largest_tile
    enough = -(-(est.total + slack) // memory.MiB) + 1
    result = _train_with_disk_swap(tmp_path, host, enough)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "step 2/2" in result.stdout
    edge = -(-est.total // memory.MiB)
    assert edge >= 16 and est.total <= edge * memory.MiB < est.total + slack
    result = _train_with_disk_swap(tmp_path / "edge", host, edge)
    assert result.returncode == 2, result.stderr[-3000:]
    assert "livelocks" in result.stderr and "Traceback" not in result.stderr
