"""bench/node_table.py on the CPU: both sides train the same tiny wide GPT-2, and a run our
memory pre-check refuses is reported as refused, not as a crash."""
import json
import math
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TABLE = os.path.join(ROOT, "bench", "node_table.py")


def node_table(tmp_path, *extra):
    out = tmp_path / "table.json"
    proc = subprocess.run([sys.executable, TABLE, "--ngpu", "0", "--n-layer", "2", "--seq", "32",
                           "--vocab", "100", "--steps", "2", "--tile", "64", "--tile-vocab",
                           "50", "--timeout", "240", "--out", str(out), "--logs",
                           str(tmp_path / "logs"), *extra],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return json.loads(out.read_text())["records"], proc.stdout


def test_both_sides_train_and_the_ratio_is_printed(tmp_path):
    pytest.importorskip("torch.distributed")
    records, stdout = node_table(tmp_path, "--configs", "64x2")
    (record,) = records
    ours, fsdp = record["ours"], record["fsdp"]
    assert ours["status"] == fsdp["status"] == "ok", (ours, fsdp)
    # same model on both sides: a random initialisation starts near ln(vocab)
    for losses in (ours["losses"], fsdp["losses"]):
        assert all(math.isfinite(x) for x in losses)
        assert abs(losses[0] - math.log(100)) < 0.5
    assert ours["params"] == fsdp["params"]
    assert record["ratio"] == pytest.approx(ours["tokens_per_s"] / fsdp["tokens_per_s"])
    assert "| 64, 2x32 |" in stdout


def test_a_run_the_pre_check_refuses_is_a_result(tmp_path):
    records, stdout = node_table(tmp_path, "--configs", "65536x64", "--only", "ours")
    assert records[0]["ours"]["status"] == "refused"
    assert "not enough memory" in records[0]["ours"]["error"]
    assert "refused" in stdout
