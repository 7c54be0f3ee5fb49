import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest

import nntile


@pytest.fixture(scope="session")
def ctx():
    """One StarPU runtime for the whole test session (StarPU runs once per process at a time)."""
    context = nntile.Context(ncpu=int(os.environ.get("NNTILE_TEST_NCPU", "2")), ncuda=0)
    yield context
    context.shutdown()


@pytest.fixture
def rng():
    return np.random.default_rng()


def run_python(code, timeout=120, env=None):
    """Run code in a fresh interpreter (for runtime start/stop behaviour); return the result."""
    full_env = dict(os.environ)
    full_env.update(env or {})
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True,
                          text=True, timeout=timeout, env=full_env)
