"""Every code block of README.md runs as written (issue 26: "the new user's path").

A ```python block runs in a fresh interpreter. A ```sh block runs in bash, in a directory of
its own, with the programs (`nntile-train`, ...) of this checkout on PATH and the files its
commands name made first (a small transformers GPT-2 directory with its tokenizer, text
files). `make` runs dry (`make -n`: the targets exist and expand; `make test` inside the
test suite would run the suite again, `make train` takes minutes). The `mpirun` lines are
tests/test_mpi.py's, which runs them word for word and compares their losses. A block of
`docker` commands needs a container engine, which the CI machine does not have: it is
skipped there.
"""
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text()
BLOCKS = [(m.group(1), m.group(2), README[:m.start()].count("\n") + 1)
          for m in re.finditer(r"^```(\w+)\n(.*?)^```", README, re.M | re.S)]
PROGRAMS = {"nntile-train": "train", "nntile-prepare": "data", "nntile-convert": "convert",
            "nntile-eval": "evaluate", "nntile-generate": "generate"}


def _env(tmp_path):
    """This checkout first on the path, its programs on PATH, mpirun allowed as root."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name, module in PROGRAMS.items():
        shim = bin_dir / name
        shim.write_text(f'#!/bin/sh\nexec "{sys.executable}" -m nntile.{module} "$@"\n')
        shim.chmod(0o755)
    env = dict(os.environ)
    env.update(PYTHONPATH=os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")]),
               PATH=os.pathsep.join([str(bin_dir), env["PATH"]]), ROOT=str(ROOT),
               OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1",
               STARPU_SILENT="1")
    return env


def _gpt2_dir(path, texts):
    """A transformers GPT-2 directory as save_pretrained writes it: config.json,
    model.safetensors and a byte-level BPE tokenizer (tokenizer.json) learnt from ``texts``."""
    transformers = pytest.importorskip("transformers")
    tokenizers = pytest.importorskip("tokenizers")
    bpe = tokenizers.ByteLevelBPETokenizer()
    bpe.train([str(p) for p in texts], vocab_size=300, special_tokens=["<|endoftext|>"])
    tok = transformers.GPT2TokenizerFast(tokenizer_object=bpe._tokenizer,
                                         eos_token="<|endoftext|>", bos_token="<|endoftext|>")
    tok.save_pretrained(path)
    config = transformers.GPT2Config(n_layer=2, n_head=2, n_embd=32, n_positions=32,
                                     vocab_size=len(tok))
    transformers.GPT2LMHeadModel(config).save_pretrained(path)


def _files_named_in(block, cwd):
    """The inputs a block's commands name, made in ``cwd``."""
    if "my-texts" in block:
        from nntile.data import stdlib_files
        texts = cwd / "my-texts"
        texts.mkdir()
        for path in stdlib_files()[1][:12]:
            shutil.copy(path, texts / f"{len(list(texts.iterdir()))}-{Path(path).name}")
    if "gpt2-hf" in block:
        _gpt2_dir(cwd / "gpt2-hf", sorted((cwd / "my-texts").iterdir()))


@pytest.mark.parametrize("lang, block, line", BLOCKS,
                         ids=[f"line{line}-{lang}" for lang, _, line in BLOCKS])
def test_readme_block_runs_as_written(lang, block, line, tmp_path):
    env = _env(tmp_path)
    cwd = tmp_path / "work"
    cwd.mkdir()
    if lang == "python":
        script = cwd / "block.py"
        script.write_text(block)
        result = subprocess.run([sys.executable, str(script)], cwd=cwd, env=env,
                                capture_output=True, text=True, timeout=600)
    elif lang == "sh":
        if re.search(r"^docker ", block, re.M):
            engine = shutil.which("docker") and subprocess.run(
                ["docker", "info"], capture_output=True, timeout=60).returncode == 0
            if not engine:
                pytest.skip("no docker engine here (tests/test_rough_edges reads the "
                            "Dockerfile)")
            cwd = ROOT  # docker build's context
        block = "\n".join(line for line in block.splitlines()
                           if not line.startswith("mpirun "))  # tests/test_mpi.py's
        if not any(line.strip() and not line.startswith("#") for line in block.splitlines()):
            pytest.skip("mpirun lines only: tests/test_mpi.py runs them")
        _files_named_in(block, cwd)
        # make runs dry, in the checkout; everything else as written
        preamble = 'set -eo pipefail\nmake() { command make -n -C "$ROOT" "$@" >/dev/null; }\n'
        result = subprocess.run(["bash", "-c", preamble + block], cwd=cwd, env=env,
                                capture_output=True, text=True, timeout=900)
    else:
        pytest.fail(f"README.md line {line}: a ```{lang} block, which this test cannot run")
    assert result.returncode == 0, (f"README.md line {line}", result.stdout[-3000:],
                                    result.stderr[-3000:])
    assert "[transformers]" not in result.stderr, result.stderr  # its warnings: a slip
