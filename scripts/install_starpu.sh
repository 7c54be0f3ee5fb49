#!/usr/bin/env bash
# Build StarPU from a release tarball into a cache prefix that nntile links against.
#
#   scripts/install_starpu.sh            # build (or reuse) and print the prefix on the last line
#
# Environment:
#   STARPU_TARBALL        path to starpu-1.4.x tarball (else the official release is downloaded)
#   STARPU_VERSION        release to download when no tarball is given (default 1.4.10)
#   NNTILE_STARPU_PREFIX  install prefix (default: $HOME/.cache/nntile/starpu-<version>-<features>)
#   NNTILE_CUDA           auto|0|1: build StarPU's CUDA driver (auto: when nvcc and cuBLAS are found)
#   NNTILE_MPI            auto|0|1: build StarPU-MPI (auto: when mpicc is found)
#   JOBS                  parallel make jobs (default: nproc)
set -euo pipefail

version="${STARPU_VERSION:-1.4.10}"
want_cuda="${NNTILE_CUDA:-auto}"
want_mpi="${NNTILE_MPI:-auto}"
jobs="${JOBS:-$(nproc)}"

say() { echo "[install_starpu] $*" >&2; }
die() { echo "[install_starpu] error: $*" >&2; exit 1; }

find_cuda_home() {
    local nvcc_path
    nvcc_path="$(command -v nvcc 2>/dev/null || true)"
    [ -n "$nvcc_path" ] || return 1
    dirname "$(dirname "$(readlink -f "$nvcc_path")")"
}

# cuBLAS ships with the toolkit on GPU machines; elsewhere the nvidia-cublas wheel may carry it.
find_cublas_include() {
    local cuda_home="$1" d
    for d in "$cuda_home/include" "$cuda_home"/targets/*/include; do
        [ -f "$d/cublas_v2.h" ] && { echo "$d"; return 0; }
    done
    return 1
}

cuda=0
if [ "$want_cuda" != 0 ]; then
    if cuda_home="$(find_cuda_home)" && cublas_inc="$(find_cublas_include "$cuda_home")" \
        && ls "$cuda_home"/lib64/libcublas.so* "$cuda_home"/targets/*/lib/libcublas.so* >/dev/null 2>&1; then
        cuda=1
    elif [ "$want_cuda" = 1 ]; then
        die "NNTILE_CUDA=1 but nvcc with cuBLAS (headers and libcublas.so) was not found"
    fi
fi

mpi=0
if [ "$want_mpi" != 0 ]; then
    if command -v mpicc >/dev/null 2>&1; then
        mpi=1
    elif [ "$want_mpi" = 1 ]; then
        die "NNTILE_MPI=1 but no mpicc on PATH (Debian/Ubuntu: apt-get install libopenmpi-dev openmpi-bin)"
    fi
fi

pkg-config --exists hwloc 2>/dev/null \
    || die "hwloc development files not found (Debian/Ubuntu: apt-get install libhwloc-dev pkg-config)"

features="cpu"
[ "$mpi" = 1 ] && features="$features-mpi"
[ "$cuda" = 1 ] && features="$features-cuda"
prefix="${NNTILE_STARPU_PREFIX:-$HOME/.cache/nntile/starpu-$version-$features}"
stamp="$prefix/.nntile-build-stamp"
patches_dir="$(cd "$(dirname "$0")" && pwd)/starpu-patches"
patches=("$patches_dir"/*.patch)
config=(
    --prefix="$prefix"
    --disable-build-examples --disable-build-tests --disable-build-doc
    --disable-fortran --disable-opencl --disable-socl --disable-starpupy
    --disable-openmp --disable-fxt --disable-mlr --disable-starpurm --disable-julia
    --disable-starpufft --disable-max-fpga --disable-hip
    --enable-maxcudadev=8
    # fused attention's backward reads and writes 9 tiles in one task (StarPU's default: 8)
    --enable-maxbuffers=16
)
if [ "$mpi" = 1 ]; then
    config+=(--enable-mpi --with-mpicc="$(command -v mpicc)")
else
    config+=(--disable-mpi)
fi
if [ "$cuda" = 1 ]; then
    config+=(--enable-cuda --with-cuda-dir="$cuda_home")
else
    config+=(--disable-cuda)
fi

# a change of version, configuration or patches rebuilds
stamp_text="starpu=$version configure=${config[*]} patches=$(cat "${patches[@]}" | cksum | cut -d' ' -f1)"

if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$stamp_text" ] \
    && [ -f "$prefix/lib/pkgconfig/starpu-1.4.pc" ]; then
    say "StarPU $version ($features) already built in $prefix"
    echo "$prefix"
    exit 0
fi

tarball="${STARPU_TARBALL:-}"
work="$(mktemp -d "${TMPDIR:-/tmp}/nntile-starpu-build.XXXXXX")"
trap 'rm -rf "$work"' EXIT
if [ -z "$tarball" ]; then
    url="https://files.inria.fr/starpu/starpu-$version/starpu-$version.tar.gz"
    say "STARPU_TARBALL not set; downloading $url"
    tarball="$work/starpu-$version.tar.gz"
    if ! { command -v curl >/dev/null && curl -fsSL --retry 2 -o "$tarball" "$url"; } \
        && ! { command -v wget >/dev/null && wget -q -O "$tarball" "$url"; }; then
        die "could not download StarPU $version. Download starpu-$version.tar.gz from the StarPU \
website (https://starpu.gitlabpages.inria.fr/) on a machine with network access and run again with \
STARPU_TARBALL=/path/to/starpu-$version.tar.gz"
    fi
fi
[ -r "$tarball" ] || die "STARPU_TARBALL=$tarball is not a readable file"

say "building StarPU from $tarball into $prefix (mpi=$mpi cuda=$cuda, $jobs jobs)"
tar -xzf "$tarball" -C "$work"
src="$(find "$work" -mindepth 1 -maxdepth 1 -type d -name 'starpu-*' | head -n 1)"
[ -n "$src" ] && [ -x "$src/configure" ] || die "$tarball does not hold a StarPU release (no configure script)"

# Our changes to StarPU's sources (scripts/starpu-patches), one file per change; each
# file's header says why.
apply_patch() {
    if command -v patch >/dev/null; then patch -d "$src" -p1 --forward --quiet <"$1"
    elif command -v git >/dev/null; then (cd "$src" && git apply -p1 "$1")
    else die "neither patch nor git is installed (Debian/Ubuntu: apt-get install patch)"; fi
}
for p in "${patches[@]}"; do
    apply_patch "$p" || die "could not apply $p"
done

(
    cd "$src"
    ./configure "${config[@]}" >"$work/configure.log" 2>&1 \
        || { tail -n 40 "$work/configure.log" >&2; exit 1; }
    make -j"$jobs" >"$work/make.log" 2>&1 || { tail -n 60 "$work/make.log" >&2; exit 1; }
    rm -rf "$prefix"
    make install >"$work/install.log" 2>&1 || { tail -n 40 "$work/install.log" >&2; exit 1; }
) || die "StarPU build failed (log tail above)"

if [ "$mpi" = 1 ] && [ ! -f "$prefix/lib/pkgconfig/starpumpi-1.4.pc" ]; then
    die "StarPU-MPI was requested but libstarpumpi was not built"
fi
echo "$stamp_text" >"$stamp"
say "StarPU $version ($features) installed in $prefix"
echo "$prefix"
