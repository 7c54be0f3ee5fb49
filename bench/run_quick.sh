#!/usr/bin/env bash
# The benches at CI size (NNTILE_BENCH_QUICK=1: small models, few rounds), GPU ones skipped
# where there is no GPU. pytest-benchmark's own timing rounds are off; each bench still
# times ours against its reference and prints the ratios at the end.
set -euo pipefail
cd "$(dirname "$0")/.."
export NNTILE_BENCH_QUICK=1 PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
exec python3 -m pytest -q -p no:cacheprovider bench --benchmark-disable "$@"
