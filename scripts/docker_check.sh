#!/usr/bin/env bash
# Builds the Dockerfile's CPU image and runs `make test` in a container from it, with podman from
# Debian's packages. Made for a machine like the CI's: root on Debian 12, Debian's mirror and PyPI
# reachable, no container registry, so the base image is Debian bookworm made here by debootstrap.
#
#   scripts/docker_check.sh          # base image (once), nntile image, make test in a container
#
# Environment:
#   STARPU_TARBALL  StarPU release tarball (default: ../shared/vendor/starpu-1.4.10+dfsg.tar.gz)
#   WHEELS          a folder of wheels pip prefers to PyPI, mounted into the build (default: the
#                   host's PIP_FIND_LINKS; on the CI machines it holds torch's CPU build)
#   CA_BUNDLE       the CA certificates pip trusts in the build (default: this machine's, which
#                   on the CI machines hold the CA of the proxy that PyPI is reached through)
#   DEBIAN_MIRROR   where debootstrap fetches bookworm (default: http://deb.debian.org/debian)
# Logs go to build/docker_check/.
set -euo pipefail
cd "$(dirname "$0")/.."

say() { echo "[docker_check] $*" >&2; }
die() { echo "[docker_check] error: $*" >&2; exit 1; }

tarball="${STARPU_TARBALL:-$(cd .. && pwd)/shared/vendor/starpu-1.4.10+dfsg.tar.gz}"
wheels="${WHEELS:-${PIP_FIND_LINKS:-}}"
ca_bundle="${CA_BUNDLE:-/etc/ssl/certs/ca-certificates.crt}"
mirror="${DEBIAN_MIRROR:-http://deb.debian.org/debian}"
base=localhost/nntile-base:bookworm
image=localhost/nntile:cpu
logs=build/docker_check

[ "$(id -u)" = 0 ] || die "run as root: debootstrap and rootful podman need it"
[ -r "$tarball" ] || die "no StarPU tarball at $tarball (set STARPU_TARBALL)"
[ -z "$wheels" ] || [ -d "$wheels" ] || die "WHEELS=$wheels is not a folder"
[ -r "$ca_bundle" ] || die "CA_BUNDLE=$ca_bundle is not a readable file"
mkdir -p "$logs"

# runc, not podman's default crun: crun 1.8 refuses to start a container when cgroup v1
# controllers sit beside a cgroup2 hierarchy that has controllers of its own (hybrid mode).
missing=""
for p in podman runc debootstrap; do dpkg -s "$p" >/dev/null 2>&1 || missing="$missing $p"; done
if [ -n "$missing" ]; then
    say "installing$missing"
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $missing >/dev/null
fi
say "$(podman --version), $(runc --version | head -n 1), storage $(podman info --format '{{.Store.GraphDriverName}}'), cgroups $(podman info --format '{{.Host.CgroupsVersion}}')"

if podman image exists "$base"; then
    say "base image $base exists"
else
    say "base image: debootstrap bookworm from $mirror"
    rootfs="$(mktemp -d "${TMPDIR:-/var/tmp}/nntile-rootfs.XXXXXX")"
    trap 'rm -rf "$rootfs"' EXIT
    debootstrap --variant=minbase bookworm "$rootfs" "$mirror" >"$logs/debootstrap.log" 2>&1 \
        || { tail -n 20 "$logs/debootstrap.log" >&2; die "debootstrap failed"; }
    tar -C "$rootfs" -c . | podman import --quiet - "$base" >/dev/null
    rm -rf "$rootfs"
fi

# The tarball travels in the build context's vendor/, which git ignores.
mkdir -p vendor
cp "$tarball" vendor/
build_args=(--build-arg BASE_IMAGE="$base" --build-arg NNTILE_CUDA=0
            --build-arg STARPU_TARBALL="vendor/$(basename "$tarball")"
            --volume "$ca_bundle:/opt/host-ca.crt:ro" --build-arg PIP_CERT=/opt/host-ca.crt)
[ -z "$wheels" ] || build_args+=(--volume "$wheels:/opt/wheels:ro" --build-arg PIP_FIND_LINKS=/opt/wheels)
say "building $image (log: $logs/build.log)"
start=$SECONDS
podman --runtime runc build "${build_args[@]}" -t "$image" . >"$logs/build.log" 2>&1 \
    || { tail -n 40 "$logs/build.log" >&2; die "podman build failed"; }
say "built $image in $((SECONDS - start)) s, $(podman image inspect --format '{{.Size}}' "$image" \
    | awk '{printf "%.2f GB", $1 / 1e9}')"

# podman asks for nofile=1048576 and nproc=4194304 in the container, which needs CAP_SYS_RESOURCE
# where the host's limits are lower; ask for what podman itself runs with (it caps nproc at 32768).
say "make test in a container (log: $logs/test.log)"
start=$SECONDS
status=0
podman --runtime runc run --rm --ulimit "nofile=$(ulimit -Hn):$(ulimit -Hn)" \
    --ulimit nproc=32768:32768 -e CI=true "$image" make test 2>&1 | tee "$logs/test.log" || status=$?
say "make test exited with $status after $((SECONDS - start)) s"
exit "$status"
