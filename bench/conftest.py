import os

import pytest

import nntile

RATIOS = []


@pytest.fixture(scope="session")
def ctx():
    context = nntile.Context(ncpu=int(os.environ.get("NNTILE_BENCH_NCPU", "2")))
    yield context
    context.shutdown()


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
