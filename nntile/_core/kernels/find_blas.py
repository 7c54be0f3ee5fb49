"""The BLAS of the CPU kernels: OpenBLAS from the scipy-openblas32 wheel, the build numpy's wheels
ship (theirs with 64-bit indices). It picks its kernels for the CPU it runs on among those of
every x86 generation (DYNAMIC_ARCH), and it is as current as PyPI, where a distribution's
OpenBLAS is as old as the distribution, and one that does not recognise a CPU runs the kernels
of an older one (at worst the SSE3 "Prescott" ones).

Plain Python with no import of nntile: setup.py and the kernel tests load this file by its path.
"""
import shlex

PACKAGE = "scipy-openblas32"


class NotFound(Exception):
    """What is missing and how to get it, in one line."""


def build_flags():
    """(compile args, link args) of the kernels' BLAS. The compile args define the wheel's
    symbol prefix (BLAS_SYMBOL_PREFIX, for blas.h); the link args embed the library's
    directory as rpath, so that no LD_LIBRARY_PATH is needed."""
    try:
        import scipy_openblas32 as wheel
    except ImportError:
        raise NotFound(f"the {PACKAGE} wheel is not installed (pip install {PACKAGE})") from None
    libdir = wheel.get_lib_dir()
    # the wheel's pkg-config text is where it says which macros its headers need
    cflags = next(line.split(":", 1)[1] for line in wheel.get_pkg_config().splitlines()
                  if line.startswith("Cflags:"))
    macros = [flag for flag in shlex.split(cflags) if flag.startswith("-D")]
    return ([f"-I{wheel.get_include_dir()}", *macros],
            [f"-L{libdir}", f"-l{wheel.get_library()}", f"-Wl,-rpath,{libdir}"])
