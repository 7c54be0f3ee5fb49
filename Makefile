# Two entry points: `make train` and `make test`. Each does all set-up first.
PYTHON ?= python3
PIP := $(PYTHON) -m pip
STAMP := build/.stamps
APT_PACKAGES := libhwloc-dev pkg-config patch libopenmpi-dev openmpi-bin

CHECKPOINTS ?= checkpoints
TRAIN_ARGS ?=

.PHONY: train train-run test setup deps starpu install bench clean

train: setup train-run

# each run in a directory of its own (mode 0777 less the umask, not mktemp's 0700), the file
# $(CHECKPOINTS)/LATEST naming the newest that holds a checkpoint (nntile.checkpoint.LATEST_RUN;
# a link would make TensorBoard list the run twice): no run replaces an earlier one. A
# run refused before it wrote anything leaves no directory. --resume continues a run in
# its own directory (--resume latest: the one LATEST names).
train-run:
	@mkdir -p $(CHECKPOINTS)
	@case " $(TRAIN_ARGS) " in \
	  *" --resume latest "*) exec $(PYTHON) -m nntile.train --out $(CHECKPOINTS) $(TRAIN_ARGS);; \
	  *" --resume"*) exec $(PYTHON) -m nntile.train $(TRAIN_ARGS);; \
	esac; \
	run=$$(mktemp -d $(CHECKPOINTS)/run-$$(date +%Y%m%d-%H%M%S)-XXXX) && chmod $$(umask -S) $$run || exit 1; \
	$(PYTHON) -m nntile.train --out $$run $(TRAIN_ARGS); status=$$?; \
	if ls $$run/ckpt-*.h5 >/dev/null 2>&1; then \
	  echo $$(basename $$run) > $(CHECKPOINTS)/LATEST.tmp && mv $(CHECKPOINTS)/LATEST.tmp $(CHECKPOINTS)/LATEST; \
	  if [ -L $(CHECKPOINTS)/latest ]; then rm $(CHECKPOINTS)/latest; fi; \
	else rmdir $$run 2>/dev/null; fi; \
	exit $$status

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

# StarPU, built once into a cache prefix; the prefix is recorded for the package build (the
# file rewritten only when it changes: install compares its age).
starpu: deps
	@mkdir -p $(STAMP)
	scripts/install_starpu.sh > $(STAMP)/starpu-prefix.tmp   # a failed build stops here
	@tail -n 1 $(STAMP)/starpu-prefix.tmp > $(STAMP)/starpu-prefix.new && rm $(STAMP)/starpu-prefix.tmp
	@cmp -s $(STAMP)/starpu-prefix.new $(STAMP)/starpu-prefix \
	  && rm $(STAMP)/starpu-prefix.new || mv $(STAMP)/starpu-prefix.new $(STAMP)/starpu-prefix
	@echo "StarPU prefix: $$(cat $(STAMP)/starpu-prefix)"

# `pip install -e` (a minute) runs again only when what it builds from changed since the last
# one: the package's metadata, the sources of its extension modules, or the StarPU build
# (its prefix, or the stamp the build leaves there); or when this Python's nntile is not the
# editable install of this directory. Python files need nothing: the install is editable.
INSTALL_INPUTS = setup.py pyproject.toml $$(find nntile -name '*.pyx' -o -name '*.pxd' \
  -o -name '*.pxi' -o -name '*.c' -o -name '*.h' -o -name '*.inc' -o -name '*.cu' \
  -o -name '*.cuh') $(STAMP)/starpu-prefix $$(cat $(STAMP)/starpu-prefix)/.nntile-build-stamp
INSTALLED_HERE = $(PYTHON) -c "import json, os, sys, importlib.metadata as m; \
  url = json.loads(m.distribution('nntile').read_text('direct_url.json'))['url']; \
  sys.exit(not os.path.samefile(url.removeprefix('file://'), '.'))"

install: starpu
	@if [ -f $(STAMP)/installed ] && $(INSTALLED_HERE) 2>/dev/null \
	    && [ -z "$$(find $(INSTALL_INPUTS) -newer $(STAMP)/installed 2>/dev/null)" ]; then \
	  echo "nntile: installed, and nothing it is built from changed since: no pip install"; \
	else \
	  rm -f $(STAMP)/installed; \
	  $(PYTHON) -c "import torch" 2>/dev/null || $(PIP) install -q torch==2.13.0; \
	  $(PIP) install -q setuptools wheel Cython numpy scipy-openblas32 && \
	  PYTHON=$(PYTHON) NNTILE_STARPU_PREFIX=$$(cat $(STAMP)/starpu-prefix) scripts/cuda_deps.sh && \
	  NNTILE_STARPU_PREFIX=$$(cat $(STAMP)/starpu-prefix) \
	    $(PIP) install -q --no-build-isolation -e ".[test]" && touch $(STAMP)/installed; \
	fi

# everything setup.py generates or builds (.gitignore lists the same files)
clean:
	rm -rf build *.egg-info nntile/_core/core.c nntile/nn/*.c nntile/models/*.c \
	  nntile/_core/op_enum.pxi nntile/_core/kernel_args.pxd nntile/_core/activations.pxi
	find nntile -name '*.so' -delete
