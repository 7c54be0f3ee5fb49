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
        try:  # no worker at all, on any machine
            nntile.Context(ncpu=0, ncuda=0).start()
        except RuntimeError:
            pass
        print(starpu_env() == before)
        with nntile.Context(ncuda=0) as ctx:  # CPU workers: lws by default
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


def test_run_bytes_must_be_a_byte_count():
    import pytest
    import nntile
    with pytest.raises(ValueError, match="run_bytes"):
        nntile.Context(start=False, run_bytes=-1)


def test_write_behind_is_on_or_off():
    import pytest
    import nntile
    with pytest.raises(ValueError, match="write_behind"):
        nntile.Context(start=False, write_behind="yes")
    assert nntile.Context(start=False, write_behind=True).settings()["write_behind"] == (
        1, "argument")


def test_cuda_pool_is_on_or_off():
    import pytest
    import nntile
    with pytest.raises(ValueError, match="cuda_pool"):
        nntile.Context(start=False, cuda_pool=2)
    assert nntile.Context(start=False, cuda_pool=False).settings()["cuda_pool"] == (
        0, "argument")


def test_cpu_update_is_a_share_and_needs_a_gpu_beside_cpu_workers():
    """A share of the update on CPU workers is refused before StarPU starts where it cannot
    run (no GPU here), as is a value that is no share, or a precision nntile does not have."""
    import pytest
    import nntile
    for bad in ("half", 1.5, -1, True):
        with pytest.raises(ValueError, match="cpu_update"):
            nntile.Context(start=False, cpu_update=bad)
    with pytest.raises(ValueError, match="precision 'fp16'"):
        nntile.Context(start=False, training="fp16")
    assert nntile.Context(start=False, cpu_update=0.5).settings()["cpu_update"] == (
        0.5, "argument")
    result = run_python("""
        import nntile
        ctx = nntile.Context(start=False, cpu_update=0.5, ncpu=1, ncuda=0)
        try:
            ctx.start()
        except ValueError as exc:
            print("refused:", exc)
        print(ctx.running, nntile.current_context())
        # without GPUs the rule keeps the whole update with the step, training or not
        with nntile.Context(ncpu=1, training="tf32", run_bytes=10**12) as ctx:
            print(ctx.settings()["cpu_update"][0], ctx.cpu_update_share)
    """)
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines() == [
        "refused: cpu_update 0.5 (argument) runs part of the update on CPU workers beside "
        "GPUs, but this run has no GPU", "False None", "0 0.0"]


def test_unknown_scheduler_is_refused_with_the_list():
    """StarPU warns and falls back to its default on a scheduler it lacks; nntile refuses it,
    from the argument and from STARPU_SCHED, before StarPU starts."""
    import pytest
    import nntile
    with pytest.raises(ValueError, match="'no-such-sched' does not exist; StarPU has: .*lws"):
        nntile.Context(sched="no-such-sched", start=False)
    result = run_python("""
        import nntile
        try:
            nntile.Context(ncpu=1)
        except ValueError as exc:
            print("refused:", exc)
        print(nntile.current_context())
    """, env={"STARPU_SCHED": "no-such-sched"})
    assert result.returncode == 0, result.stderr
    assert "refused: scheduler 'no-such-sched' does not exist; StarPU has:" in result.stdout
    assert result.stdout.splitlines()[-1] == "None"


def test_programs_refuse_an_unknown_scheduler_in_one_line():
    import subprocess
    import sys
    result = subprocess.run([sys.executable, "-m", "nntile.train", "--sched", "no-such-scheduler"],
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "'no-such-scheduler' does not exist; StarPU has:" in lines[0]
    assert "dmdas" in lines[0] and "lws" in lines[0]


def test_starpu_variables_starpu_would_abort_on_are_refused():
    """STARPU_NCPU=-1 and STARPU_CALIBRATE=abc made StarPU abort (exit 134): one line now."""
    for name, value in (("STARPU_NCPU", "-1"), ("STARPU_CALIBRATE", "abc")):
        result = run_python("""
            import nntile
            try:
                nntile.Context()
            except ValueError as exc:
                print("refused:", exc)
        """, env={name: value})
        assert result.returncode == 0, result.stderr
        assert f"refused: {name}={value!r} should be" in result.stdout


def test_a_tensor_larger_than_starpu_may_use_is_refused(ctx):
    """It used to be registered, and the first task on it waited for room for ever."""
    import pytest
    import nntile
    with pytest.raises(MemoryError, match="more than StarPU may use in all its memory nodes"):
        nntile.Tensor((2**40,), (2**28,))
    assert nntile.Tensor((4,), (2,)).to_array().tolist() == [0, 0, 0, 0]


def test_a_tile_larger_than_starpu_may_use_is_refused():
    """A tile one element past the largest memory node. Host memory is limited to 64 MiB:
    on a node of 32 GiB or more an fp64 tile that large would hold 2**32 elements, which
    Tensor refuses first, for another reason."""
    result = run_python("""
        import nntile
        with nntile.Context(ncpu=1, ncuda=0, limit_cpu_mem=64) as ctx:
            elements = max(n["total"] for n in ctx.memory_nodes()) // 8 + 1
            try:
                nntile.Tensor((2, elements), (1, elements), "fp64", zero=False)
            except MemoryError as e:
                print(e)
            print(nntile.Tensor((4,), (2,)).to_array().tolist())
    """)
    assert result.returncode == 0, result.stderr[-3000:]
    refusal, after = result.stdout.strip().splitlines()
    assert "more than StarPU may use" in refusal and "64.0 MiB" in refusal, refusal
    assert after == "[0.0, 0.0, 0.0, 0.0]"


def test_shutdown_checks_what_it_calls():
    """A clean shutdown raises nothing and leaves nothing running; a second is a no-op."""
    result = run_python("""
        import numpy as np, nntile
        ctx = nntile.Context(ncpu=1)
        x = nntile.Tensor.from_array(np.ones((4, 4)), (2, 2))
        ctx.shutdown()
        ctx.shutdown()
        print(ctx.running, nntile.current_context())
    """)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "False None"


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


def test_more_gpus_than_visible_is_refused(monkeypatch):
    """StarPU would start on the GPUs there are and only warn; nntile says so before."""
    import pytest
    from nntile import machine
    monkeypatch.setattr(machine, "HAVE_CUDA", True)
    monkeypatch.setattr(machine, "gpu_memory", lambda: [80 << 30] * 2)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0,1")
    machine.check_ncuda(2)
    with pytest.raises(ValueError, match=r"ncuda=4 asks for 4 GPUs, but this process sees 2 "
                                         r"\(CUDA_VISIBLE_DEVICES=0,1\)"):
        machine.check_ncuda(4)
