"""Runtime start and stop, each in its own interpreter (StarPU runs once per process)."""
from tests.conftest import run_python


def test_context_reports_workers_and_settings():
    result = run_python("""
        import nntile
        with nntile.Context(ncpu=2, sched="eager", verbose=True) as ctx:
            print(ctx.workers)
            print(ctx.ncpu_workers)
            print(ctx.settings()["sched"])
    """)
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines[1] == "2"
    assert "eager" in lines[2] and "argument" in lines[2]
    assert "StarPU 1.4" in result.stderr and "sched = eager (argument)" in result.stderr


def test_environment_fallback():
    result = run_python("""
        import nntile
        with nntile.Context() as ctx:
            print(ctx.ncpu_workers, ctx.settings()["ncpu"])
    """, env={"STARPU_NCPU": "1"})
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "1 ('1', '$STARPU_NCPU')"


def test_settings_belong_to_their_context():
    """What a Context sets for StarPU (arguments and defaults) is undone at shutdown, and
    after a failed start: a later Context, or a child process, sees the caller's values."""
    result = run_python("""
        import os, subprocess, sys
        import nntile
        def starpu_env():
            return sorted((k, v) for k, v in os.environ.items() if k.startswith("STARPU_"))
        before = starpu_env()
        with nntile.Context(ncpu=1, sched="eager"):
            print(os.environ["STARPU_NCPU"], os.environ["STARPU_SCHED"])
        print(starpu_env() == before)
        try:
            nntile.Context(ncpu=0).start()
        except RuntimeError:
            pass
        print(starpu_env() == before)
        with nntile.Context() as ctx:
            print(ctx.settings()["ncpu"], ctx.settings()["sched"][0])
        child = "import os; print(os.environ.get('STARPU_SCHED'))"
        print(subprocess.run([sys.executable, "-c", child], capture_output=True,
                             text=True).stdout.strip())
    """, env={"STARPU_NCPU": "2"})
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines[:3] == ["1 eager", "True", "True"]
    assert lines[3].startswith("('2', '$STARPU_NCPU')") and lines[3].endswith("lws")
    assert lines[4] == "None"


def test_exception_inside_context_shuts_down_cleanly():
    result = run_python("""
        import numpy as np, nntile
        try:
            with nntile.Context(ncpu=1) as ctx:
                x = nntile.Tensor.from_array(np.ones((4, 4)), (2, 2))
                nntile.ops.scal(2.0, x)
                raise KeyError("boom")
        except KeyError:
            pass
        print("running:", ctx.running, nntile.current_context())
        with nntile.Context(ncpu=1):
            y = nntile.Tensor.from_array(np.arange(4.0), (3,))
            print(y.to_array().sum())
    """)
    assert result.returncode == 0, result.stderr
    assert "running: False None" in result.stdout
    assert "6.0" in result.stdout


def test_exit_without_shutdown_does_not_hang():
    result = run_python("""
        import numpy as np, nntile
        ctx = nntile.Context(ncpu=1)
        x = nntile.Tensor.from_array(np.ones((4, 4)), (2, 2))
        nntile.ops.scal(2.0, x)
        print("bye")
    """, timeout=60)
    assert result.returncode == 0, result.stderr
    assert "bye" in result.stdout


def test_no_workers_is_a_clear_error():
    result = run_python("""
        import nntile
        try:
            nntile.Context(ncpu=0, ncuda=0)
        except RuntimeError as e:
            print("error:", e)
    """)
    assert result.returncode == 0, result.stderr
    assert "error: StarPU found no worker" in result.stdout


def test_default_scheduler_follows_the_situation():
    """The measured choices of docs/performance.md, "Defaults at scale": lws without GPUs and
    on several GPUs alone; dmdas on one GPU alone and wherever CPU workers join GPUs."""
    from nntile._core.core import _default_sched
    assert _default_sched(0, True)[0] == "lws"
    assert _default_sched(1, True)[0] == "dmdas"
    assert _default_sched(4, True)[0] == "dmdas"
    assert _default_sched(1, False)[0] == "dmdas"
    assert _default_sched(2, False)[0] == "lws"
    assert "4 GPUs" in _default_sched(4, False)[1]


def test_workers_per_gpu_follow_the_situation():
    """Two per GPU; four on one GPU that cannot hold the run (docs/performance.md,
    "Activations dropped after backward"); two where the run's size is not known."""
    from nntile._core.core import _default_workers_per_gpu
    GiB = 2**30
    assert _default_workers_per_gpu(1, 50 * GiB, 76 * GiB)[0] == 2
    assert _default_workers_per_gpu(1, 175 * GiB, 76 * GiB)[0] == 4
    assert "cannot hold" in _default_workers_per_gpu(1, 175 * GiB, 76 * GiB)[1]
    assert _default_workers_per_gpu(2, 175 * GiB, 76 * GiB)[0] == 2  # several: not measured
    assert _default_workers_per_gpu(1, None, 76 * GiB)[0] == 2
    assert _default_workers_per_gpu(1, 175 * GiB, None)[0] == 2
    import pytest
    import nntile
    with pytest.raises(ValueError, match="run_bytes"):
        nntile.Context(start=False, run_bytes=-1)


def test_cpu_only_build_keeps_cpu_workers_and_lws(monkeypatch):
    import pytest
    import nntile
    if nntile.HAVE_CUDA:
        pytest.skip("a CUDA build on a GPU machine defaults to GPU workers only")
    for name in ("STARPU_NCPU", "STARPU_NCUDA", "STARPU_SCHED"):  # set by earlier Contexts
        monkeypatch.delenv(name, raising=False)
    settings = nntile.Context(start=False).settings()
    assert settings["ncpu"] == (None, "StarPU default")
    assert settings["sched"][0] == "lws"


def test_subpackages_work_after_a_plain_import():
    result = run_python("""
        import sys
        import nntile
        print(sorted(m for m in ("nntile.models", "nntile.nn", "nntile.optim", "nntile.memory",
                                 "nntile.checkpoint") if m in sys.modules))
        print(nntile.models.GPT2LMHead.__name__, nntile.optim.AdamW.__name__,
              callable(nntile.memory.estimate), nntile.distributed.Distribution.__name__,
              nntile.nn.__name__, "models" in dir(nntile))
        try:
            nntile.no_such_thing
        except AttributeError as exc:
            print(exc)
    """)
    assert result.returncode == 0, result.stderr
    lazy, used, missing = result.stdout.splitlines()
    assert lazy == "[]"  # nothing loaded until used
    assert used == "GPT2LMHead AdamW True Distribution nntile.nn True"
    assert missing == "module 'nntile' has no attribute 'no_such_thing'"
