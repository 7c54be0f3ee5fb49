"""nntile-train --dry-run and nntile.plan: the plan of a run without StarPU, its predicted step
against the steps measured on one H100."""
import json
import os
import re
import subprocess
import sys

import numpy as np
import pytest

from nntile import fit, machine, memory, plan, policy
from nntile.cli_common import default_tiles
from nntile.models import GPT2Config, LlamaConfig
from tests.test_train_cli import ROOT, assert_clean_error, cli, cli_env

H100 = "gpus=1x80GiB,host=128GiB"  # one H100 80GB, 128 GiB of host memory
# (hidden, MLP, layers, heads, key/value heads, vocabulary, tied)
LLAMA = {"13B": (5120, 13824, 40, 40, 40, 32000, False),
         "8B": (4096, 14336, 32, 32, 8, 128256, False),
         "3B": (3072, 8192, 28, 24, 8, 128256, True),
         "1B": (2048, 8192, 16, 32, 8, 128256, True)}
# Steps measured on one H100 80GB + 128 GiB host (2026-11-27, bf16-mixed; the middle of the
# steps given): model, batch, sequence, recomputation, seconds
MEASURED = [
    ("8B", 8, 2048, True, 4.64),
    ("8B", 16, 2048, True, 6.67),
    ("8B", 2, 2048, False, 3.71),
    ("3B", 4, 2048, True, 0.55),
    ("3B", 32, 2048, True, 4.11),
    ("1B", 8, 2048, False, 0.30),
    ("1B", 64, 2048, True, 2.83),
    ("gpt2-10240x4", 16, 1024, False, 3.17),
]


def config_of(name, seq):
    if name.startswith("gpt2"):  # gpt2-EMBDxLAYERS, a head of 128
        embd, layers = (int(x) for x in name[len("gpt2-"):].split("x"))
        return GPT2Config(vocab_size=50257, n_positions=1024, n_embd=embd, n_layer=layers,
                          n_head=embd // 128, tie_word_embeddings=False)
    hidden, inner, layers, heads, kv, vocab, tied = LLAMA[name]
    return LlamaConfig(vocab_size=vocab, hidden_size=hidden, intermediate_size=inner,
                       num_hidden_layers=layers, num_attention_heads=heads,
                       num_key_value_heads=kv, max_position_embeddings=seq,
                       tie_word_embeddings=tied)


def planned(name, batch, seq, recompute, described=H100):
    config = config_of(name, seq)
    with machine.described(machine.parse_machine(described)):
        choices = default_tiles(config, batch, seq, {}, None, "bf16-mixed")
        tiling = {k: v for k, (v, _) in choices.items() if k != "batch_count"}
        est = fit.preflight(config, batch, seq, tiling, "bf16-mixed", init="tiles",
                            quiet_below=1 << 60, recompute=recompute)
        return plan.plan(est, config, batch, seq, "bf16-mixed", choices)


@pytest.mark.parametrize("name,batch,seq,recompute,seconds", MEASURED)
def test_predicted_step_within_a_quarter_of_the_measured(name, batch, seq, recompute, seconds):
    step = planned(name, batch, seq, recompute).step
    assert abs(step.seconds / seconds - 1) <= 0.25, (step, seconds)


@pytest.mark.parametrize("name,batch", [("3B", 4), ("1B", 32), ("3B", 16), ("1B", 64)])
def test_batch_tiles_follow_the_workers_of_the_run_as_recomputed(name, batch, monkeypatch):
    """The tiles are picked before preflight chooses recomputation, the Context's workers
    after it: both from the run as recomputed. The first two fit one H100 only by recomputing
    (two workers, two batch tiles), the last two not even so (four of each)."""
    for variable in [v for v in os.environ if v.startswith("STARPU_")]:
        monkeypatch.delenv(variable)  # a Context started earlier leaves STARPU_NCUDA=0
    config = config_of(name, 2048)
    with machine.described(machine.parse_machine(H100)):
        choices = default_tiles(config, batch, 2048, {}, None, "bf16-mixed")
        tiling = {k: v for k, (v, _) in choices.items() if k != "batch_count"}
        est = fit.preflight(config, batch, 2048, tiling, "bf16-mixed", quiet_below=1 << 60,
                            recompute=None)
        settings = policy.runtime_settings(machine.probe(False), {}, {}, est.total)
    assert batch // choices["batch"].value == settings["workers_per_gpu"].value


def test_traffic_is_predicted_where_the_gpu_cannot_hold_the_run():
    assert planned("8B", 8, 2048, True).step.moved / memory.GiB == pytest.approx(86, rel=0.15)
    assert planned("1B", 8, 2048, False).step.moved == 0  # in GPU memory


@pytest.fixture(scope="module")
def run_files(tmp_path_factory):
    """Token data in Llama 3's vocabulary (random ids) and the Llama-3.1-8B config (its own
    keys; sequence 2048)."""
    from nntile.data import write_dataset
    root = tmp_path_factory.mktemp("dry")
    hidden, inner, layers, heads, kv, vocab, tied = LLAMA["8B"]
    ids = np.random.default_rng(0).integers(0, vocab, 40000)
    write_dataset(str(root / "data"), ids[:36000], ids[36000:],
                  {"tokenizer": "random ids", "vocab_size": vocab})
    (root / "config.json").write_text(json.dumps(dict(
        model_type="llama", vocab_size=vocab, hidden_size=hidden, intermediate_size=inner,
        num_hidden_layers=layers, num_attention_heads=heads, num_key_value_heads=kv,
        max_position_embeddings=8192, tie_word_embeddings=tied)))
    return root


def dry_run(files, *extra):
    return cli("train", "--dry-run", "--config", files / "config.json", "--data",
               files / "data", "--out", files / "out", "--seq-len", "2048", "--precision",
               "bf16-mixed", *extra, timeout=60)


def test_8b_fits_an_h100_at_batch_8_with_recomputation_and_not_without(run_files):
    result = dry_run(run_files, "--batch-size", "8", "--machine", H100)
    assert result.returncode == 0, result.stderr
    out = result.stdout
    assert re.search(r"recompute +on \(.*without, nowhere", out), out
    for line in ("memory by kind", "memory by place", "tiles", "PCIe per step"):
        assert f"  {line} " in out, out
    seconds = float(re.search(r"predicted step +([\d.]+) s", out)[1])
    assert abs(seconds / 4.64 - 1) <= 0.25, out
    assert not (run_files / "out").exists()  # a plan writes nothing
    refused = dry_run(run_files, "--batch-size", "8", "--machine", H100, "--no-recompute")
    assert_clean_error(refused, "not enough memory", "--recompute")


def test_recomputing_some_blocks_is_planned_between_none_and_all(run_files):
    """--recompute 16 of the 8B's 32 blocks: the plan says so, and predicts a step between
    recomputing every block and none (on a machine where all three fit); more blocks than
    the model has is a one-line error."""
    def step(*flag):
        result = dry_run(run_files, "--batch-size", "2", "--machine", "gpus=2x141GiB,host=1TiB",
                         *flag)
        assert result.returncode == 0, result.stderr
        return result.stdout, float(re.search(r"predicted step +([\d.]+) s", result.stdout)[1])
    half, half_s = step("--recompute", "16")
    assert re.search(r"recompute +the first 16 of 32 blocks \(argument\)", half), half
    assert step("--no-recompute")[1] < half_s < step("--recompute")[1]
    assert_clean_error(dry_run(run_files, "--batch-size", "2", "--recompute", "33"),
                       "--recompute 33", "32 blocks")


H200_PAIR = "gpus=2x143771MiB,host=453GiB"  # nvidia-h200-x2


def test_recomputes_only_the_fewest_blocks_that_leave_a_margin():
    """Llama-3.1-8B at batch 16x2048 fits two H200s only with recomputation; recomputing its
    first 20 of 32 blocks, each GPU's replica is within policy.RECOMPUTE_FILL of StarPU's
    share (measured: no host traffic, 1.09x the step of all 32), and with 19 it would not
    be."""
    est, share = gpu_share("8B", 16, None)
    assert est.recompute.value == 20, est.recompute
    assert share <= policy.RECOMPUTE_FILL * H200_GPU < gpu_share("8B", 16, 19)[1]
    assert gpu_share("8B", 16, True)[1] < share  # every block would leave more room


def h200_pair_budget():
    with machine.described(machine.parse_machine(H200_PAIR)):
        return fit.process_budget()


H200_GPU = h200_pair_budget()["gpu"] / 2


def gpu_share(name, batch, recompute):
    """(estimate, a GPU's share of it) of a run planned for two H200s, 2048 tokens a row
    (1024 for the wide GPT-2)."""
    est = planned(name, batch, 1024 if name.startswith("gpt2") else 2048, recompute,
                  H200_PAIR).est
    return est, policy.device_replica_bytes(est.breakdown, 2)


@pytest.mark.parametrize("name,batch,blocks", [("13B", 8, 29), ("gpt2-8192x16", 16, 11)])
def test_keeps_activations_that_take_no_room_of_their_own(name, batch, blocks):
    """Llama-2-13B at batch 8 and the 16-layer wide GPT-2 fill a GPU past RECOMPUTE_FILL even
    recomputing every block, but there a GPU's gradients outweigh its activations: the
    blocks kept add nothing to its share while the run still fits both GPUs (measured:
    1.5% and 6% faster, no more host traffic). One more kept block would either grow the share
    or take the run past the GPUs (the wide model keeping 8 ran at 0.59x, through the host)."""
    est, share = gpu_share(name, batch, None)
    assert est.recompute.value == blocks, est.recompute
    assert share == gpu_share(name, batch, True)[1] > policy.RECOMPUTE_FILL * H200_GPU
    fewer, fewer_share = gpu_share(name, batch, blocks - 1)
    assert fewer_share > share or fit.fits_where(fewer, h200_pair_budget()) != "gpu"


def test_plan_of_this_machine_by_default(run_files):
    result = cli("train", "--dry-run", "--data", run_files / "data", "--out",
                 run_files / "out", "--n-layer", "2", "--n-embd", "64", "--n-head", "2")
    assert result.returncode == 0, result.stderr
    assert "machine          this machine" in result.stdout
    assert "predicted step" in result.stdout


@pytest.mark.parametrize("extra,words", [
    (["--machine", "gpus=1x80GiB,hots=1TiB"], ["unknown key", "hots"]),
    (["--machine", "gpus=eighty"], ["--machine", "COUNTxSIZE"]),
    (["--machine", "{not json"], ["--machine", "JSON"]),
])
def test_bad_machine_is_one_line(run_files, extra, words):
    assert_clean_error(dry_run(run_files, *extra), *words)


def test_machine_needs_dry_run(run_files):
    result = cli("train", "--machine", H100, "--data", run_files / "data")
    assert_clean_error(result, "--machine", "--dry-run")


def test_machine_descriptions():
    pairs = machine.parse_machine("gpus=2x80GiB,host=128GiB,cores=16")
    as_json = machine.parse_machine('{"gpus": "2x80GiB", "host": 137438953472, "cores": 16}')
    assert pairs == as_json == machine.Described((80 << 30,) * 2, 128 << 30, 16)
    assert machine.parse_machine("gpus=none,host=1GB").gpus == ()
    with machine.described(pairs):
        assert machine.probe().gpus == pairs.gpus and machine.probe().cores == 16
        assert machine.host_memory() == 128 << 30
    assert machine._described is None


def test_scale_dry_run():
    result = subprocess.run(
        [sys.executable, "scale.py", "--model", "llama-3.2-1b", "--seq", "2048", "--batch",
         "64", "--precision", "bf16-mixed", "--dry-run", "--machine", H100],
        cwd=ROOT / "bench", capture_output=True, text=True, timeout=60, env=cli_env())
    assert result.returncode == 0, result.stderr
    assert re.search(r"recompute +on", result.stdout), result.stdout
    assert "predicted step" in result.stdout


def test_disk_swap_flags_reach_the_plan(run_files, tmp_path):
    def train(*extra):
        return cli("train", "--dry-run", "--data", run_files / "data", "--out",
                   run_files / "out", "--n-layer", "2", "--n-embd", "64", "--n-head", "2",
                   "--disk-swap", tmp_path / "swap", *extra)
    result = train("--disk-swap-mib", "2048")
    assert result.returncode == 0, result.stderr
    assert re.search(r"machine .*disk swap 2\.0 GiB", result.stdout), result.stdout
    assert re.search(r"memory by place .*disk [\d.]+ [KM]iB of 2\.0 GiB", result.stdout)
    assert_clean_error(train("--disk-swap-mib", "3"), "--disk-swap", "at least 16 MiB")
