# nntile with StarPU-MPI, and CUDA where the base image has the toolkit; set up by `make install`,
# so the image holds what `make test` and `make train` need. On a GPU machine, from the repository
# root (a StarPU release tarball in vendor/ saves the download):
#   docker build -t nntile --build-arg STARPU_TARBALL=vendor/starpu-1.4.10.tar.gz .
#   docker run --rm --gpus all -v "$PWD/checkpoints:/opt/nntile/checkpoints" nntile
# (nntile-train on the embedded corpus; its checkpoints, metrics and TensorBoard files land in
# ./checkpoints of the host). A command after the image name runs instead, e.g.
#   docker run --rm --gpus all -v "$PWD/checkpoints:/opt/nntile/checkpoints" nntile \
#     nntile-train --steps 5000 --out checkpoints/long
# A CPU image from a locally made Debian base, built and tested with podman where no registry can
# be reached: scripts/docker_check.sh.
# Fully qualified: podman, unlike docker, has no default registry for short names.
ARG BASE_IMAGE=docker.io/nvidia/cuda:13.0.0-devel-ubuntu24.04
FROM ${BASE_IMAGE}

# 1: CUDA is required (GPU image); 0: CPU only.
ARG NNTILE_CUDA=1
ARG STARPU_TARBALL=""
# Left unset unless given: pip's wheel folder (a CPU build of torch, say) and CA bundle (for a TLS
# proxy), both mounted at build time by scripts/docker_check.sh.
ARG PIP_FIND_LINKS
ARG PIP_CERT
ENV DEBIAN_FRONTEND=noninteractive \
    NNTILE_STARPU_PREFIX=/opt/starpu \
    PIP_BREAK_SYSTEM_PACKAGES=1 \
    PIP_NO_CACHE_DIR=1

# What the Makefile itself runs on; `make deps` installs the libraries it lists.
RUN apt-get update && apt-get install -y --no-install-recommends \
        python3 python3-dev python3-pip make gcc g++ perl patch curl ca-certificates \
    && rm -rf /var/lib/apt/lists/*

WORKDIR /opt/nntile
# StarPU first, in layers of their own, from what its build reads alone (the Makefile, its
# script and patches, the tarball): an edit of nntile's sources then rebuilds from `COPY . .` on, not StarPU.
COPY Makefile ./
COPY scripts/install_starpu.sh scripts/
COPY scripts/starpu-patches/ scripts/starpu-patches/
# the tarball when given; COPY needs a source, so otherwise the Makefile once more
COPY ${STARPU_TARBALL:-Makefile} /opt/starpu-src/
RUN tarball="${STARPU_TARBALL:+/opt/starpu-src/$(basename "$STARPU_TARBALL")}" \
    && STARPU_TARBALL="$tarball" make starpu \
    && rm -rf /opt/starpu-src /var/lib/apt/lists/*
COPY . .
RUN make install

CMD ["nntile-train"]
