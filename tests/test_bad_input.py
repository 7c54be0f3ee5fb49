"""Bad input raises a Python exception naming the problem before any task is submitted."""
import numpy as np
import pytest

import nntile
from tests.conftest import run_python


def t(shape, tiles, dtype="fp32"):
    return nntile.Tensor(shape, tiles, dtype)


def test_gemm_wrong_shapes(ctx):
    with pytest.raises(ValueError, match="contracted"):
        nntile.ops.gemm(1.0, t((4, 5), (2, 5)), "N", t((6, 3), (6, 3)), "N", 0.0, t((4, 3), (2, 3)))
    with pytest.raises(ValueError, match="M dimensions"):
        nntile.ops.gemm(1.0, t((4, 5), (2, 5)), "N", t((5, 3), (5, 3)), "N", 0.0, t((6, 3), (2, 3)))
    with pytest.raises(ValueError, match="inconsistent"):
        nntile.ops.gemm(1.0, t((4, 5), (2, 5)), "N", t((5, 3), (5, 3)), "N", 0.0, t((4, 3, 1), (2, 3, 1)))


def test_gemm_mismatched_tilings(ctx):
    with pytest.raises(ValueError, match="tiled differently"):
        nntile.ops.gemm(1.0, t((4, 6), (2, 3)), "N", t((6, 3), (2, 3)), "N", 0.0, t((4, 3), (2, 3)))


def test_gemm_mixed_dtypes(ctx):
    with pytest.raises(TypeError, match="fp64"):
        nntile.ops.gemm(1.0, t((4, 5), (2, 5)), "N", t((5, 3), (5, 3), "fp64"), "N", 0.0,
                        t((4, 3), (2, 3)))


def test_gemm_bad_transpose_flag(ctx):
    with pytest.raises(ValueError, match="transA"):
        nntile.ops.gemm(1.0, t((4, 5), (2, 5)), "X", t((5, 3), (5, 3)), "N", 0.0, t((4, 3), (2, 3)))


def test_int_tensor_in_float_op(ctx):
    with pytest.raises(TypeError, match="floating-point"):
        nntile.ops.scal(2.0, t((3,), (3,), "int64"))


def test_add_mismatches(ctx):
    with pytest.raises(ValueError, match="shape"):
        nntile.ops.add(1.0, t((3, 4), (3, 4)), 1.0, t((4, 3), (4, 3)))
    with pytest.raises(ValueError, match="tilings must match"):
        nntile.ops.add(1.0, t((4, 4), (2, 4)), 1.0, t((4, 4), (4, 2)))
    a = t((4, 4), (2, 4))
    with pytest.raises(ValueError, match="tilings must match"):
        nntile.ops.add_out(1.0, a, 1.0, t((4, 4), (2, 4)), t((4, 4), (4, 2)))
    with pytest.raises(ValueError, match="to add in place, use add"):
        nntile.ops.add_out(1.0, a, 1.0, a, a)


def test_unregistered_tensor(ctx):
    x = t((4, 4), (2, 2))
    x.unregister()
    for action in (lambda: x.to_array(), lambda: x.fill(0), lambda: nntile.ops.scal(2, x),
                   lambda: x.write(np.zeros((4, 4)))):
        with pytest.raises(RuntimeError, match="unregistered"):
            action()


def test_write_and_from_array_errors(ctx):
    x = t((4, 4), (2, 2))
    with pytest.raises(ValueError, match="shape"):
        x.write(np.zeros((4, 5)))
    with pytest.raises(TypeError, match="nntile dtype"):
        nntile.Tensor.from_array(np.zeros(3, dtype=np.complex64))
    with pytest.raises(ValueError, match="unknown dtype"):
        nntile.Tensor((3,), (3,), "fp8")
    with pytest.raises(ValueError, match="not an integer"):
        t((2,), (2,), "int64").fill(0.5)


def test_context_argument_errors():
    with pytest.raises(ValueError, match="ncpu"):
        nntile.Context(ncpu=-1, start=False)
    with pytest.raises(TypeError, match="ncuda"):
        nntile.Context(ncuda=1.5, start=False)
    with pytest.raises(ValueError, match="sched"):
        nntile.Context(sched="", start=False)


def test_tensor_from_closed_context_and_second_start():
    result = run_python("""
        import numpy as np, nntile
        ctx = nntile.Context(ncpu=1)
        try:
            nntile.Context(ncpu=1)
        except RuntimeError as e:
            print("second:", e)
        x = nntile.Tensor.from_array(np.ones((3, 3), np.float32), (2, 2))
        ctx.shutdown()
        for action in (x.to_array, lambda: nntile.ops.scal(2.0, x)):
            try:
                action()
            except RuntimeError as e:
                print("closed:", e)
        try:
            nntile.Tensor((2, 2), (2, 2))
        except RuntimeError as e:
            print("nocontext:", e)
        with nntile.Context(ncpu=1):
            try:
                x.to_array()
            except RuntimeError as e:
                print("restarted:", e)
        print("clean exit")
    """)
    assert result.returncode == 0, result.stderr
    out = result.stdout
    assert "second: another nntile.Context is already running" in out
    assert out.count("closed:") == 2 and "shut down" in out
    assert "nocontext: no nntile.Context is running" in out
    assert "restarted:" in out and "shut down" in out.split("restarted:")[1]
    assert "clean exit" in out
