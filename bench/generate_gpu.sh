#!/usr/bin/env bash
# Generation on one GPU against transformers' generate with its cache, in one process: the
# Llama-3.2-1B shape (random weights), bf16, batch 1 and 8, prompt 512, 256 new tokens.
# Prints one RESULT line per batch size (ratio = transformers' time / ours).
set -euo pipefail
cd "$(dirname "$0")/.."
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
exec python3 bench/generate.py --shape llama-3.2-1b --device cuda --dtype bf16 \
    --batch 1 8 --prompt 512 --new 256 "$@"
