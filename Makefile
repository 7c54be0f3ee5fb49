# Two entry points: `make train` and `make test`. Each does all set-up first.
PYTHON ?= python3
PIP := $(PYTHON) -m pip
STAMP := build/.stamps
APT_PACKAGES := libhwloc-dev pkg-config patch libopenmpi-dev openmpi-bin libopenblas-dev

CHECKPOINTS ?= checkpoints
TRAIN_ARGS ?=

.PHONY: train train-run test setup deps starpu install bench clean

train: setup train-run

# each run in a directory of its own, $(CHECKPOINTS)/latest naming the newest: no run
# replaces an earlier one
train-run:
	@mkdir -p $(CHECKPOINTS)
	@run=$$(mktemp -d $(CHECKPOINTS)/run-$$(date +%Y%m%d-%H%M%S)-XXXX) && \
	  $(PYTHON) -m nntile.train --out $$run $(TRAIN_ARGS) && \
	  ln -sfn $$(basename $$run) $(CHECKPOINTS)/latest

test: setup
	$(PYTHON) -m pytest -q -p no:cacheprovider tests
	bash bench/run_quick.sh   # the benches at CI size: they must run; ratios are printed

bench: setup
	$(PYTHON) -m pytest -q bench --benchmark-only

setup: install

# System packages: installed when missing and we are allowed to (root, or sudo without a password).
deps:
	@missing=""; for p in $(APT_PACKAGES); do dpkg -s $$p >/dev/null 2>&1 || missing="$$missing $$p"; done; \
	if [ -n "$$missing" ]; then \
	  if [ "$$(id -u)" = 0 ]; then SUDO=""; elif sudo -n true 2>/dev/null; then SUDO="sudo -n"; \
	  else echo "missing system packages:$$missing (install them: sudo apt-get install$$missing)"; exit 1; fi; \
	  echo "installing system packages:$$missing"; \
	  $$SUDO apt-get update -qq && DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y -qq $$missing >/dev/null; \
	fi

# StarPU, built once into a cache prefix; the prefix is recorded for the package build.
starpu: deps
	@mkdir -p $(STAMP)
	scripts/install_starpu.sh > $(STAMP)/starpu-prefix.tmp   # a failed build stops here
	@tail -n 1 $(STAMP)/starpu-prefix.tmp > $(STAMP)/starpu-prefix && rm $(STAMP)/starpu-prefix.tmp
	@echo "StarPU prefix: $$(cat $(STAMP)/starpu-prefix)"

install: starpu
	@$(PYTHON) -c "import torch" 2>/dev/null || $(PIP) install -q torch==2.13.0
	$(PIP) install -q setuptools wheel Cython numpy
	PYTHON=$(PYTHON) NNTILE_STARPU_PREFIX=$$(cat $(STAMP)/starpu-prefix) scripts/cuda_deps.sh
	NNTILE_STARPU_PREFIX=$$(cat $(STAMP)/starpu-prefix) $(PIP) install -q --no-build-isolation -e ".[test]"

# everything setup.py generates or builds (.gitignore lists the same files)
clean:
	rm -rf build *.egg-info nntile/_core/core.c nntile/nn/*.c nntile/models/*.c \
	  nntile/_core/op_enum.pxi nntile/_core/kernel_args.pxd nntile/_core/activations.pxi
	find nntile -name '*.so' -delete
