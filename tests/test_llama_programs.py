"""The programs on Llama models and the families built on Llama's model, against
transformers: nntile-convert import and export, nntile-generate (greedy, 32 tokens, as
transformers' generate), nntile-train from an imported checkpoint (the loss falls, and
transformers computes its validation loss of the exported weights), and resuming bit for
bit."""
import codecs
import json
import shutil

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
pytest.importorskip("safetensors")
transformers.logging.set_verbosity_error()

from nntile.data import TokenData, eval_batches
from tests.test_convert import hf_loss
from tests.test_train_cli import cli, data_dir, read_metrics  # noqa: F401 (fixture)

# byte-level: the data_dir fixture's vocabulary; grouped-query attention, 2 layers
CONFIG = dict(vocab_size=256, hidden_size=48, intermediate_size=80, num_hidden_layers=2,
              num_attention_heads=6, num_key_value_heads=2, max_position_embeddings=64,
              rope_parameters=dict(rope_type="llama3", rope_theta=10000.0, factor=8.0,
                                   low_freq_factor=1.0, high_freq_factor=4.0,
                                   original_max_position_embeddings=16),
              bos_token_id=None, eos_token_id=None, pad_token_id=None)
# what a family's config adds to CONFIG and its name: Qwen2 has q/k/v biases of its own, Qwen3
# per-head q/k norms with heads of 12 (not hidden / heads), Mistral a window shorter than the
# 32 trained and the 40 evaluated positions
FAMILIES = {"llama": ({}, "Llama"), "qwen2": ({}, "Qwen2"), "qwen3": ({"head_dim": 12}, "Qwen3"),
            "mistral": ({"sliding_window": 9}, "Mistral")}
# nntile's tiles for the run: partial ones in every dimension, key/value heads tiled
TILES = ["--tile-embd", "20", "--tile-head", "3", "--tile-inner", "30", "--tile-vocab", "100"]


def save_hf(path, tied, seed=0, model_type="llama"):
    torch.manual_seed(seed)
    model = transformers.AutoModelForCausalLM.from_config(transformers.AutoConfig.for_model(
        model_type, **CONFIG, **FAMILIES[model_type][0], tie_word_embeddings=tied))
    with torch.no_grad():  # large random weights: 32 greedy tokens of ~30 different ones,
        for p in model.parameters():  # each ahead of the next likeliest by > 0.03
            p.add_(0.5 * torch.randn_like(p))
    model.save_pretrained(path)
    return model.eval()


# (Mistral's window in generation: tests/test_generation.py)
@pytest.mark.parametrize("model_type", ["llama", "qwen2", "qwen3"])
def test_import_and_generate_as_transformers(tmp_path, model_type):
    hf = save_hf(tmp_path / "hf", tied=True, model_type=model_type)
    ckpt = tmp_path / "imported.h5"
    result = cli("convert", "import", tmp_path / "hf", ckpt, *TILES)
    assert result.returncode == 0, result.stderr
    assert FAMILIES[model_type][1] in result.stdout
    prompt = "def "
    result = cli("generate", "--checkpoint", ckpt, "--prompt", prompt, "--max-new-tokens",
                 "32", "--greedy", "--seq-len", "40")
    assert result.returncode == 0, result.stderr
    with torch.no_grad():
        ids = hf.generate(torch.tensor([list(prompt.encode())]), max_new_tokens=32,
                          do_sample=False, pad_token_id=0)[0].tolist()
    assert len(ids) == len(prompt) + 32 and len(set(ids)) > 16
    assert result.stdout == codecs.decode(bytes(ids), "utf-8", errors="replace") + "\n"


LR = 1e-3


@pytest.mark.parametrize("model_type, tied", [("llama", True), ("qwen2", True),
                                              ("qwen3", False), ("mistral", False)])
def test_import_train_export_round_trip(tmp_path, data_dir, model_type, tied):  # noqa: F811
    """A transformers directory -> nntile-convert import -> 3 steps of nntile-train --init
    from that checkpoint -> nntile-convert export: transformers computes, on the exported
    directory, the validation loss nntile-train computed of its trained weights (below the
    loss of the weights it started from), and every weight moved, by no more than 3 steps of
    AdamW move one."""
    start = save_hf(tmp_path / "hf", tied, model_type=model_type)
    result = cli("convert", "import", tmp_path / "hf", tmp_path / "in.h5", *TILES)
    assert result.returncode == 0, result.stderr
    out = tmp_path / "run"
    result = cli("train", "--init", tmp_path / "in.h5", "--data", data_dir, "--out", out,
                 "--steps", "3", "--seq-len", "32", "--batch-size", "4", "--tile-batch", "2",
                 "--tile-seq", "12", *TILES, "--ncpu", "2", "--no-progress", "--eval-every",
                 "0", "--eval-batches", "2", "--lr", str(LR))
    assert result.returncode == 0, result.stderr
    assert FAMILIES[model_type][1] in result.stderr
    result = cli("convert", "export", out / "ckpt-3.h5", tmp_path / "back")
    assert result.returncode == 0, result.stderr
    back = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "back",
                                                            local_files_only=True)
    assert type(back) is type(start) and back.config.tie_word_embeddings == tied
    for field, value in dict(num_key_value_heads=2, **FAMILIES[model_type][0]).items():
        assert getattr(back.config, field) == value, field
    assert back.config.rope_parameters["rope_type"] == "llama3"
    ours = read_metrics(out / "metrics.jsonl")[-1]["val_loss"]  # the same windows, step 3
    batches = list(eval_batches(TokenData(str(data_dir)).splits["val"], 4, 32, 2))
    ref = hf_loss(back.eval(), batches)
    assert abs(ours - ref) <= 1e-5 * ref, (ours, ref)
    assert ours < hf_loss(start, batches)  # fine-tuned on the corpus
    after = back.state_dict()
    assert sorted(after) == sorted(start.state_dict())
    for name, before in start.state_dict().items():
        moved = (after[name] - before).abs().max().item()
        assert 0 < moved <= 3 * 2 * LR, (name, moved)


def test_llama_run_resumes_bit_for_bit(tmp_path, data_dir):  # noqa: F811
    """A fresh bf16-mixed Llama (grouped-query attention) resumed from step 3 of 6 gives the
    uninterrupted run's losses, exactly: checkpoints hold what a Llama run needs (its rotary
    frequencies are recomputed, not saved)."""
    steps = ["--model", "llama", "--n-layer", "2", "--n-embd", "32", "--n-head", "4",
             "--n-kv-head", "2", "--seq-len", "32", "--batch-size", "4", "--tile-batch", "2",
             "--tile-seq", "16", "--tile-head", "2", "--ncpu", "2", "--no-progress", "--steps",
             "6", "--save-every", "3", "--eval-every", "3", "--precision", "bf16-mixed"]
    ref = tmp_path / "ref"
    result = cli("train", *steps, "--data", data_dir, "--out", ref)
    assert result.returncode == 0, result.stderr
    out = tmp_path / "resumed"
    shutil.copytree(ref, out)
    (out / "ckpt-6.h5").unlink()
    lines = (out / "metrics.jsonl").read_text().splitlines()
    (out / "metrics.jsonl").write_text("".join(line + "\n" for line in lines[:3]))
    result = cli("train", *steps, "--data", data_dir, "--out", out, "--resume", "latest")
    assert result.returncode == 0, result.stderr
    got, expected = read_metrics(out / "metrics.jsonl"), read_metrics(ref / "metrics.jsonl")
    assert [r["loss"] for r in got] == [r["loss"] for r in expected]  # exact floats
    assert [r.get("val_loss") for r in got] == [r.get("val_loss") for r in expected]
    import h5py
    with h5py.File(out / "ckpt-6.h5", "r") as f:
        assert json.loads(f.attrs["config"])["model_type"] == "llama"
        assert not any("rotary" in name for name in f["params"])
