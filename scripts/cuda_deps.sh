#!/usr/bin/env bash
# What the CUDA build needs beyond nvcc and cuBLAS, installed where it can be (make runs this
# before building): cuDNN 9 and NVRTC (pip wheels matching nvcc's CUDA major version) and the
# header-only cudnn-frontend (the nvidia-cudnn-frontend wheel's include/, unpacked into
# vendor/cudnn_frontend/include). nntile/cuda/find_cudnn.py says where each is looked for.
# Only where the build is a CUDA one: nvcc found, NNTILE_CUDA not 0, and the StarPU of
# $NNTILE_STARPU_PREFIX built with CUDA (setup.py's rule). Offline, it says what to fetch.
set -uo pipefail
cd "$(dirname "$0")/.."
python="${PYTHON:-python3}"
command -v nvcc >/dev/null 2>&1 && [ "${NNTILE_CUDA:-auto}" != 0 ] || exit 0
config="$(ls "${NNTILE_STARPU_PREFIX:-/nonexistent}"/include/starpu/*/starpu_config.h 2>/dev/null)"
grep -qs "define STARPU_USE_CUDA 1" $config || exit 0
missing="$("$python" nntile/cuda/find_cudnn.py missing)"
[ -z "$missing" ] && exit 0
major="$(nvcc --version | sed -n 's/.*release \([0-9]*\)\..*/\1/p')"
status=0
for part in $missing; do
    case "$part" in
    frontend)
        echo "cuda deps: the cudnn-frontend headers into vendor/cudnn_frontend/include"
        rm -rf .whl/frontend && mkdir -p .whl/frontend vendor/cudnn_frontend
        if "$python" -m pip download -q --no-deps --only-binary=:all: -d .whl/frontend \
                nvidia-cudnn-frontend; then
            "$python" - .whl/frontend/*.whl <<'PY'
import sys, zipfile
with zipfile.ZipFile(sys.argv[1]) as wheel:  # the wheel's top-level include/
    wheel.extractall("vendor/cudnn_frontend",
                     [n for n in wheel.namelist() if n.startswith("include/")])
PY
        else
            echo "cuda deps: offline? fetch the nvidia-cudnn-frontend wheel elsewhere and unpack" \
                 "its include/ into vendor/cudnn_frontend/ (or set CUDNN_FRONTEND_INCLUDE)"
            status=1
        fi ;;
    cudnn)
        echo "cuda deps: cuDNN 9 (pip install nvidia-cudnn-cu$major)"
        "$python" -m pip install -q "nvidia-cudnn-cu$major" || {
            echo "cuda deps: install cuDNN 9 for CUDA $major and set CUDNN_HOME"; status=1; } ;;
    nvrtc)
        pkg="nvidia-cuda-nvrtc"; [ "$major" -lt 13 ] && pkg="nvidia-cuda-nvrtc-cu$major"
        echo "cuda deps: NVRTC (pip install $pkg)"
        "$python" -m pip install -q "$pkg" || {
            echo "cuda deps: install the CUDA toolkit's NVRTC"; status=1; } ;;
    esac
done
exit $status
