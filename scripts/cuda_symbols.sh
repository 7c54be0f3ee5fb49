#!/usr/bin/env bash
# Compares the CUDA kernels of the work tree with those of a git revision, on a machine
# without a GPU (nvcc is enough):
#   scripts/cuda_symbols.sh [REV]        (REV: default HEAD)
# Compiles every nntile/cuda/*.cu (and *.cpp) of both with nvcc as setup.py does (for sm_90 unless
# NNTILE_CUDA_ARCHS says otherwise), links each side into a shared library, then compares
#   1. the exported symbols (nm -D): they must be the same, or the script exits 1;
#   2. where cuobjdump is found, the machine code (SASS) of every kernel, names aside: it
#      prints the kernels of REV whose code the work tree no longer has to the letter, and
#      of those, the ones that differ only in where their parameters sit (c[0x0][...]
#      offsets). A refactoring that keeps every kernel's SASS keeps its speed.
# Environment: NVCC (default: nvcc on PATH), CUBLAS_INCLUDE (folder with cublas_v2.h,
# which gemm.cu needs), CUOBJDUMP (default: cuobjdump on PATH), KEEP=1 keeps the build
# folder, JOBS (parallel nvcc, default 2).
set -euo pipefail
cd "$(dirname "$0")/.."
rev="${1:-HEAD}"
nvcc="${NVCC:-nvcc}"
cuobjdump="${CUOBJDUMP:-$(command -v cuobjdump || true)}"
archs="${NNTILE_CUDA_ARCHS:-90}"
jobs="${JOBS:-2}"
work="$(mktemp -d)"
[ "${KEEP:-0}" = 1 ] && echo "build folder: $work" || trap 'rm -rf "$work"' EXIT

home="$(dirname "$(dirname "$(realpath "$(command -v "$nvcc")")")")"
flags=(-O3 -std=c++17 -Xcompiler -fPIC -DNNTILE_HAVE_CUDA=1 "-I$home/include")
for a in ${archs//;/ }; do flags+=("-gencode=arch=compute_$a,code=sm_$a"); done
[ -n "${CUBLAS_INCLUDE:-}" ] && flags+=("-I$CUBLAS_INCLUDE")
# host files (*.cpp: cuDNN's attention) need cuDNN, its frontend and NVRTC headers; without
# them they are left out of both sides, with their exported symbols
if host_flags="$(python3 nntile/cuda/find_cudnn.py)"; then
    read -ra host_flags <<< "$host_flags"
    host_flags=(-O1 -std=c++17 -Xcompiler -fPIC,-fvisibility=hidden "-I$home/include"
                "${host_flags[@]}")
else
    echo "host files (nntile/cuda/*.cpp): left out"
    host_flags=()
fi

build() {  # build SIDE TREE: nntile/cuda of TREE -> $work/SIDE/libnntile_cuda.so
    local side="$1" tree="$2"
    mkdir -p "$work/$side"
    printf '%s\n' "$tree"/nntile/cuda/*.cu | xargs -P "$jobs" -I{} sh -c \
        'f="$1"; shift; exec "$@" -I"$(dirname "$f")/../_core" -c "$f" -o "'"$work/$side"'/$(basename "$f").o"' \
        _ {} "$nvcc" "${flags[@]}"
    if [ ${#host_flags[@]} -gt 0 ]; then
        for f in "$tree"/nntile/cuda/*.cpp; do
            [ -e "$f" ] && "$nvcc" "${host_flags[@]}" -I"$tree/nntile/_core" -c "$f" \
                -o "$work/$side/$(basename "$f").o"
        done
    fi
    "$nvcc" -shared -cudart none -o "$work/$side/libnntile_cuda.so" "$work/$side"/*.o
    nm -D --defined-only "$work/$side/libnntile_cuda.so" | awk '$2 == "T" {print $3}' \
        | sort > "$work/$side/symbols.txt"
}

mkdir -p "$work/base-tree"
git archive "$rev" nntile/cuda nntile/_core/kernels | tar xf - -C "$work/base-tree"
build base "$work/base-tree"
build new "$PWD"

status=0
if diff -u "$work/base/symbols.txt" "$work/new/symbols.txt" > "$work/symbols.diff"; then
    echo "exported symbols: $(wc -l < "$work/new/symbols.txt"), the same as $rev"
else
    echo "exported symbols differ from $rev:"; cat "$work/symbols.diff"; status=1
fi

if [ -z "$cuobjdump" ]; then
    echo "SASS: not compared (no cuobjdump; set CUOBJDUMP)"
    exit $status
fi
for side in base new; do
    "$cuobjdump" -sass "$work/$side/libnntile_cuda.so" > "$work/$side/sass.txt"
done
(python3 - "$work/base/sass.txt" "$work/new/sass.txt" "$rev" <<'EOF'
import re
import sys
from collections import Counter


def kernels(path):
    """[(kernel name, its instructions as text, the same with parameter offsets blanked)]
    (a template kernel that two .cu files instantiate stands twice)"""
    out, name, body, arch = [], None, [], 90
    for line in open(path):
        m = re.match(r"\s*arch = sm_(\d+)", line)
        if m:
            arch = int(m.group(1))
        m = re.match(r"\s*Function : (\S+)", line)
        if m:  # the arch heads the body, so that only code of one arch is matched
            name, body = f"{m.group(1)} (sm_{arch})", [f"sm_{arch}"]
            out.append((name, body, arch))
            continue
        m = re.match(r"\s*/\*[0-9a-f]{4,}\*/\s*(.*?);", line)
        if name and m:
            body.append(" ".join(m.group(1).split()))
    return [(k, "\n".join(v), re.sub(r"c\[0x0\]\[(0x[0-9a-f]+)\]",
                                      lambda m: blank_param(m, arch), "\n".join(v)))
            for k, v, arch in out]


def blank_param(m, arch):
    """c[0x0][offset] -> c[0x0][P] for kernel parameters (from 0x210 on sm_90, 0x160 before)"""
    return "c[0x0][P]" if int(m.group(1), 16) >= (0x210 if arch >= 90 else 0x160) else m.group(0)


base, new = kernels(sys.argv[1]), kernels(sys.argv[2])
exact = Counter(code for _, code, _ in new)
moved = Counter(code for _, _, code in new)
lost, shifted = [], []
for name, code, loose in sorted(base):
    if exact[code]:
        exact[code] -= 1
        moved[loose] -= 1
    elif moved[loose]:
        moved[loose] -= 1
        shifted.append(name)
    else:
        lost.append(name)
print(f"SASS: {len(base)} kernels in {sys.argv[3]}, {len(new)} in the work tree; "
      f"{len(base) - len(lost) - len(shifted)} found again to the letter, {len(shifted)} "
      f"but for parameter offsets, {len(lost)} not found")
for name in shifted:
    print(f"  parameter offsets only: {name}")
for name in lost:
    print(f"  not found: {name}")
EOF
) | c++filt
exit $status
