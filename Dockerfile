# nntile with CUDA and MPI. Build from the repository root:
#   docker build -t nntile --build-arg STARPU_TARBALL=vendor/starpu-1.4.10.tar.gz .
# (put the StarPU release tarball in vendor/ first; without it the script downloads it).
# Kept in step with scripts/install_starpu.sh and the Makefile; it cannot be built in CI,
# which has no Docker engine.
FROM nvidia/cuda:13.0.0-devel-ubuntu24.04

ARG STARPU_TARBALL=""
ENV DEBIAN_FRONTEND=noninteractive \
    NNTILE_STARPU_PREFIX=/opt/starpu \
    PIP_BREAK_SYSTEM_PACKAGES=1

RUN apt-get update && apt-get install -y --no-install-recommends \
        python3 python3-dev python3-pip git make gcc g++ curl perl \
        libhwloc-dev pkg-config libopenmpi-dev openmpi-bin libopenblas-dev \
    && rm -rf /var/lib/apt/lists/*

WORKDIR /opt/nntile
COPY . .
RUN STARPU_TARBALL="${STARPU_TARBALL:+/opt/nntile/$STARPU_TARBALL}" NNTILE_CUDA=1 \
        scripts/install_starpu.sh
RUN python3 -m pip install setuptools wheel Cython numpy mpi4py \
    && NNTILE_CUDA=1 python3 -m pip install --no-build-isolation -e ".[test]"

CMD ["nntile-train", "--ncuda", "1"]
