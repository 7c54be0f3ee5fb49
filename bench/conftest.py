import os

import pytest

import nntile

RATIOS = []


class _Runtime:
    """StarPU runs once per process at a time, with its workers fixed at start: a bench that
    needs other workers (GPU against CPU) restarts it, one that needs the same reuses it."""

    def __init__(self):
        self.context, self.settings = None, None

    def __call__(self, **settings):
        if self.context is not None and self.context.running and settings == self.settings:
            return self.context
        self.close()
        self.context, self.settings = nntile.Context(**settings), settings
        return self.context

    def close(self):
        if self.context is not None:
            self.context.shutdown()
            self.context = None


@pytest.fixture(scope="session")
def runtime():
    """runtime(ncpu=..., ncuda=..., ...): the running nntile.Context with these settings."""
    rt = _Runtime()
    yield rt
    rt.close()


@pytest.fixture
def ctx(runtime):
    # ncuda=0: CPU figures stay CPU figures on a machine that also has a GPU.
    return runtime(ncpu=int(os.environ.get("NNTILE_BENCH_NCPU", "2")), ncuda=0)


@pytest.fixture(scope="session")
def report():
    """Record a ratio measured side by side; all are printed at the end of the run."""
    def add(name, value, detail=""):
        RATIOS.append((name, value, detail))
    return add


def pytest_terminal_summary(terminalreporter):
    if RATIOS:
        terminalreporter.section("nntile ratios (side by side, this run)")
        for name, value, detail in RATIOS:
            terminalreporter.write_line(f"{name}: {value:.3f}  {detail}")
