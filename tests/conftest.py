import os
import subprocess
import sys
import textwrap
import zlib

import numpy as np
import pytest
from hypothesis import settings

import nntile

# CI replays the same examples every run: a red build then means a change broke something, not
# that the random search found a new corner (that search runs on developers' machines, with
# hypothesis's 100 examples where a test names no count; CI replays 40 of them, which keeps
# the suite inside its 15 minutes on two cores).
settings.register_profile("ci", derandomize=True, max_examples=40)
# on GPUs an example's first tasks also wait for the device's first launches: no deadline
settings.register_profile("gpu", derandomize=True, max_examples=40, deadline=None)
if int(os.environ.get("NNTILE_TEST_NCUDA", "0")):
    settings.load_profile("gpu")
elif os.environ.get("CI"):
    settings.load_profile("ci")


@pytest.fixture(scope="session")
def ctx():
    """One StarPU runtime for the whole test session (StarPU runs once per process at a time).
    NNTILE_TEST_NCPU and NNTILE_TEST_NCUDA give its workers (2 CPU, no GPU by default); on a
    GPU machine NNTILE_TEST_NCPU=0 NNTILE_TEST_NCUDA=1 runs the tests' tasks on the GPU's
    kernels, against the same references."""
    context = nntile.Context(ncpu=int(os.environ.get("NNTILE_TEST_NCPU", "2")),
                             ncuda=int(os.environ.get("NNTILE_TEST_NCUDA", "0")))
    yield context
    context.shutdown()


@pytest.fixture
def rng(request):
    """A generator seeded from the test's id, so a failure reproduces on the next run."""
    return np.random.default_rng(zlib.crc32(request.node.nodeid.encode()))


def run_python(code, timeout=120, env=None):
    """Run code in a fresh interpreter (for runtime start/stop behaviour); return the result."""
    full_env = dict(os.environ)
    full_env.update(env or {})
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True,
                          text=True, timeout=timeout, env=full_env)


def estimate_of_train_run(argv, **kwargs):
    """nntile.memory.estimate of what ``nntile-train argv`` runs (kwargs: distribution, rank)."""
    from nntile import memory
    from nntile.train import build_parser, resolve
    s = resolve(build_parser().parse_args([*argv, "--out", "unused"]))
    return memory.estimate(s.config, s.batch_size, s.seq_len, s.tiles, s.dtype,
                           grad_clip=bool(s.grad_clip), **kwargs)
