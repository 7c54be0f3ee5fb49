"""The CPU kernels compiled once per test session (the fixtures of every kernel test file)."""
import ctypes
import glob
import os
import shutil
import subprocess

import pytest

from tests.kernel_header import find_blas
from tests.kernels.test_cpu_kernels import CFLAGS, KERNEL_DIR, Kernels


@pytest.fixture(scope="session")
def kernel_lib(tmp_path_factory):
    cc = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        pytest.skip("no C compiler")
    out = str(tmp_path_factory.mktemp("nntile_kernels") / "libnntile_kernels.so")
    srcs = sorted(glob.glob(os.path.join(KERNEL_DIR, "*.c")))
    flags = os.environ.get("NNTILE_KERNEL_CFLAGS")
    flags = flags.split() if flags else CFLAGS
    blas_compile, blas_link = find_blas.build_flags()  # the BLAS the build links
    cmd = [cc, *flags, *blas_compile, "-shared", "-I", KERNEL_DIR, *srcs, "-o", out,
           *blas_link, "-lm"]
    res = subprocess.run(cmd, capture_output=True, text=True)
    assert res.returncode == 0, f"{' '.join(cmd)}\n{res.stderr}"
    return ctypes.CDLL(out), res.stderr


@pytest.fixture(scope="session")
def K(kernel_lib):
    return Kernels(kernel_lib[0])
