"""bench/node_table.py on the CPU: ours and FSDP2 (with and without activation checkpointing)
train the same tiny wide GPT-2 and the same tiny Llama, and a run our memory pre-check refuses
is reported as refused, not as a crash."""
import json
import math
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TABLE = os.path.join(ROOT, "bench", "node_table.py")
TINY_LLAMA = ["--model", "llama", "--n-embd", "64", "--n-inner", "128", "--n-head", "4",
              "--n-kv-head", "2", "--tied", "--batch", "2"]


def node_table(tmp_path, *extra):
    out = tmp_path / "table.json"
    proc = subprocess.run([sys.executable, TABLE, "--ngpu", "0", "--n-layer", "2", "--seq", "32",
                           "--vocab", "100", "--steps", "2", "--timeout", "240", "--out", str(out), "--logs",
                           str(tmp_path / "logs"), *extra],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return json.loads(out.read_text())["records"], proc.stdout


def assert_trained(record, sides):
    """Every side trained the same model: a random initialisation starts near ln(vocab)."""
    for side in sides:
        assert record[side]["status"] == "ok", record[side]
        losses = record[side]["losses"]
        assert all(math.isfinite(x) for x in losses)
        assert abs(losses[0] - math.log(100)) < 0.5
        assert record[side]["params"] == record["params"]
    assert record["ratio"] == pytest.approx(record["ours"]["tokens_per_s"]
                                            / record["fsdp"]["tokens_per_s"])


def test_both_sides_train_and_the_ratio_is_printed(tmp_path):
    pytest.importorskip("torch.distributed")
    records, stdout = node_table(tmp_path, "--configs", "64x2", "--sides", "ours,fsdp")
    (record,) = records
    assert_trained(record, ["ours", "fsdp"])
    assert record["fsdp-ac"] is None and record["ratio_ac"] is None
    assert "| 64, 2x32 |" in stdout


def test_a_llama_trains_on_every_side(tmp_path):
    pytest.importorskip("torch.distributed")
    records, stdout = node_table(tmp_path, *TINY_LLAMA)
    (record,) = records
    assert_trained(record, ["ours", "fsdp", "fsdp-ac"])
    fsdp, checkpointed = record["fsdp"], record["fsdp-ac"]
    assert not fsdp["activation_checkpointing"] and checkpointed["activation_checkpointing"]
    # recomputing a block's forward in backward changes no number
    assert checkpointed["losses"] == pytest.approx(fsdp["losses"], rel=1e-5)
    # both sides count a step's model FLOPs alike
    for side in (fsdp, checkpointed):
        assert side["tflops"] * side["step_s"] * 1e12 == pytest.approx(
            record["ours"]["flops_per_step"])
    assert record["ratio_ac"] == pytest.approx(record["ours"]["tokens_per_s"]
                                               / checkpointed["tokens_per_s"])
    row = next(line for line in stdout.splitlines() if line.startswith("| llama, 2x32 |"))
    assert row.endswith(f"| {record['ratio']:.2f} | {record['ratio_ac']:.2f} |")


def test_a_run_the_pre_check_refuses_is_a_result(tmp_path):
    records, stdout = node_table(tmp_path, "--configs", "65536x64", "--sides", "ours")
    assert records[0]["ours"]["status"] == "refused"
    assert "not enough memory" in records[0]["ours"]["error"]
    assert "refused" in stdout


def test_the_ours_column_names_arguments_that_are_not_the_defaults(tmp_path):
    _, stdout = node_table(tmp_path, "--configs", "65536x64", "--sides", "ours",
                           "--ours-args", "--tile-batch 1")
    assert "| shape, batch | parameters | ours (--tile-batch 1) |" in stdout
    assert "(defaults)" not in stdout


def test_capacity_names_the_largest_shape_each_side_trains(tmp_path):
    records, stdout = node_table(tmp_path, "--capacity", "llama-3.2-3b,llama-3.1-8b",
                                 "--sides", "ours", "--seq", "4096", "--batch", "64")
    assert [r["model"] for r in records] == ["llama-3.2-3b", "llama-3.1-8b"]
    assert all(r["ours"]["status"] == "refused" for r in records)
    assert "| llama-3.1-8b, 64x4096 | 8.03B | refused |" in stdout
    assert "largest trained, ours (defaults): none" in stdout


def test_pipelined_steps_train_alike_and_report_their_mean(tmp_path):
    """Both sides run their steps back to back by default (--pipeline): the same losses as
    with --waited (each step waited for), and the step reported is the mean of the steps
    after the first."""
    pytest.importorskip("torch.distributed")
    args = ["--configs", "64x2", "--sides", "ours,fsdp", "--steps", "3"]
    for run in ("waited", "pipelined"):
        (tmp_path / run).mkdir()
    (waited,), waited_out = node_table(tmp_path / "waited", *args, "--waited")
    (pipelined,), pipelined_out = node_table(tmp_path / "pipelined", *args)  # the default
    for side in ("ours", "fsdp"):
        assert pipelined[side]["losses"] == pytest.approx(waited[side]["losses"], rel=1e-5)
        steps = pipelined[side]["steps_s"]
        assert pipelined[side]["step_s"] == pytest.approx(sum(steps[1:]) / (len(steps) - 1))
        assert waited[side]["step_s"] == min(waited[side]["steps_s"][1:])
    assert "steps back to back" in pipelined_out and "each step waited for" in waited_out
