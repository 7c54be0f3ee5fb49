"""Build of nntile's extension modules against StarPU (found through pkg-config).

Environment:
  NNTILE_STARPU_PREFIX  StarPU install prefix (else pkg-config's search path)
  NNTILE_CUDA           auto|0|1: compile nntile/cuda/*.cu and *.cpp with nvcc, link cuBLAS and
                        cuDNN (nntile/cuda/find_cudnn.py says where cuDNN, the cudnn-frontend
                        headers and NVRTC are looked for: CUDNN_HOME, CUDNN_INCLUDE, CUDNN_LIB,
                        CUDNN_FRONTEND_INCLUDE)
  NNTILE_MARCH          value of -march for the C kernels (default: native)
  NNTILE_MPI            auto|0|1: link StarPU-MPI (needs StarPU built with MPI, and mpicc)
"""
import glob
import os
import shlex
import shutil
import subprocess
import sys

import numpy
from Cython.Build import cythonize
from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

HERE = os.path.dirname(os.path.abspath(__file__))
CU_SOURCES = {}  # extension name -> CUDA sources compiled by nvcc
CUDNN_COMPILE = []  # nvcc flags of the cuDNN headers (cudnn_attention.cpp)


def fail(message):
    sys.exit(f"nntile build: {message}")


def pkg_config(*args):
    env = dict(os.environ)
    prefix = os.environ.get("NNTILE_STARPU_PREFIX")
    if prefix:
        env["PKG_CONFIG_PATH"] = os.pathsep.join(
            [os.path.join(prefix, "lib", "pkgconfig"), env.get("PKG_CONFIG_PATH", "")])
    try:
        out = subprocess.run(["pkg-config", *args], env=env, check=True,
                             capture_output=True, text=True).stdout
    except FileNotFoundError:
        fail("pkg-config is not installed (Debian/Ubuntu: apt-get install pkg-config)")
    except subprocess.CalledProcessError as err:
        return None
    return shlex.split(out)


def starpu_flags():
    cflags = pkg_config("--cflags", "starpu-1.4")
    libs = pkg_config("--libs", "starpu-1.4")
    if cflags is None or libs is None:
        fail("StarPU 1.4 was not found by pkg-config. Build it with scripts/install_starpu.sh "
             "and set NNTILE_STARPU_PREFIX to the prefix it prints (make does both).")
    libdir = pkg_config("--variable=libdir", "starpu-1.4")[0]
    incdir = [f[2:] for f in cflags if f.startswith("-I")]
    return incdir, libs, libdir


def starpu_has_cuda(incdirs):
    for d in incdirs:
        path = os.path.join(d, "starpu_config.h")
        if os.path.exists(path):
            with open(path) as f:
                return "#define STARPU_USE_CUDA 1" in f.read()
    return False


def mpi_flags():
    """(include dirs, link args) for StarPU-MPI, or None when the build goes without it."""
    mode = os.environ.get("NNTILE_MPI", "auto")
    if mode not in ("auto", "0", "1"):
        fail(f"NNTILE_MPI={mode!r}; use auto, 0 or 1")
    if mode == "0":
        return None
    libs = pkg_config("--libs", "starpumpi-1.4")
    mpicc = shutil.which("mpicc")
    if libs is None or mpicc is None:
        if mode == "1":
            fail("NNTILE_MPI=1 but StarPU-MPI (pkg-config starpumpi-1.4) or mpicc is missing; "
                 "install an MPI (Debian: libopenmpi-dev) and rebuild StarPU")
        return None
    try:
        compile_flags = subprocess.run([mpicc, "--showme:compile"], check=True,
                                       capture_output=True, text=True).stdout
        link_flags = subprocess.run([mpicc, "--showme:link"], check=True,
                                    capture_output=True, text=True).stdout
    except subprocess.CalledProcessError:  # MPICH spells it -compile-info / -link-info
        compile_flags = " ".join(subprocess.run([mpicc, "-compile-info"], check=True,
                                                capture_output=True, text=True).stdout.split()[1:])
        link_flags = " ".join(subprocess.run([mpicc, "-link-info"], check=True,
                                             capture_output=True, text=True).stdout.split()[1:])
    incdirs = [f[2:] for f in shlex.split(compile_flags) if f.startswith("-I")]
    return incdirs, libs + [f for f in shlex.split(link_flags) if f.startswith(("-L", "-l", "-Wl"))]


def cuda_home():
    nvcc = shutil.which("nvcc")
    return os.path.dirname(os.path.dirname(os.path.realpath(nvcc))) if nvcc else None


def use_cuda(starpu_incdirs):
    mode = os.environ.get("NNTILE_CUDA", "auto")
    if mode not in ("auto", "0", "1"):
        fail(f"NNTILE_CUDA={mode!r}; use auto, 0 or 1")
    if mode == "0":
        return False
    home = cuda_home()
    found = bool(home) and starpu_has_cuda(starpu_incdirs) and bool(
        glob.glob(os.path.join(home, "lib64", "libcublas.so*"))
        or glob.glob(os.path.join(home, "targets", "*", "lib", "libcublas.so*")))
    if mode == "1" and not found:
        fail("NNTILE_CUDA=1 but nvcc, cuBLAS or a StarPU built with CUDA is missing "
             "(rebuild StarPU with scripts/install_starpu.sh on a machine with CUDA)")
    return found


class BuildWithNvcc(build_ext):
    """Compiles nntile/cuda/*.cu with nvcc into objects linked into the core module."""

    def build_extension(self, ext):
        cu_sources = CU_SOURCES.get(ext.name, [])
        if cu_sources:
            home = cuda_home()
            objdir = os.path.join(self.build_temp, "cuda")
            os.makedirs(objdir, exist_ok=True)
            include = [f"-I{d}" for d in ext.include_dirs]
            archs = os.environ.get("NNTILE_CUDA_ARCHS", "80;90").split(";")
            gencode = [f"-gencode=arch=compute_{a},code=sm_{a}" for a in archs]
            headers = glob.glob("nntile/cuda/*.h*") + glob.glob("nntile/_core/kernels/*.h")
            newest_header = max((os.path.getmtime(h) for h in headers), default=0)

            def compile_one(src):
                obj = os.path.join(objdir, os.path.basename(src) + ".o")
                if (not os.path.exists(obj)
                        or os.path.getmtime(obj) < max(os.path.getmtime(src), newest_header)):
                    # .cpp: host code around the header-only cudnn-frontend, whose templates
                    # make -O3 slow for nothing; its symbols hidden (cudnn_attention.cpp)
                    host = src.endswith(".cpp")
                    cmd = [os.path.join(home, "bin", "nvcc"), "-c", src, "-o", obj,
                           "-O1" if host else "-O3", "-std=c++17", "-Xcompiler",
                           "-fPIC,-fvisibility=hidden" if host else "-fPIC",
                           "-DNNTILE_HAVE_CUDA=1", *gencode, *include,
                           *(CUDNN_COMPILE if host else [])]
                    print(" ".join(cmd))
                    subprocess.run(cmd, check=True)
                return obj

            # nvcc is slow and single-threaded: compile the files side by side.
            from concurrent.futures import ThreadPoolExecutor
            with ThreadPoolExecutor(max_workers=os.cpu_count() or 1) as pool:
                ext.extra_objects.extend(pool.map(compile_one, cu_sources))
        super().build_extension(ext)


def load_by_path(name, *path):
    """A plain-Python module of the tree, loaded by its path (nntile itself is not built yet)."""
    import importlib.util
    spec = importlib.util.spec_from_file_location(name, os.path.join(HERE, *path))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def write_cython_headers():
    """kernel_args.pxd and op_enum.pxi, the Cython copies of kernels.h's args structs and op
    table, and activations.pxi, the tensor ops of its activations, written by
    nntile/_core/kernels/kernel_header.py (loaded by its path: nntile itself is not built
    yet)."""
    kernel_header = load_by_path("nntile_kernel_header", "nntile", "_core", "kernels",
                                 "kernel_header.py")
    kernel_header.write_cython(os.path.join(HERE, "nntile", "_core"))


def extensions():
    write_cython_headers()
    incdirs, libs, libdir = starpu_flags()
    cuda = use_cuda(incdirs)
    find_blas = load_by_path("nntile_find_blas", "nntile", "_core", "kernels", "find_blas.py")
    try:
        blas_compile, blas_link = find_blas.build_flags()
    except find_blas.NotFound as err:
        fail(str(err))
    march = os.environ.get("NNTILE_MARCH", "native")
    mpi = mpi_flags()
    c_sources = sorted(glob.glob("nntile/_core/kernels/*.c")) + ["nntile/_core/codelets.c",
                                                                  "nntile/_core/host_arena.c",
                                                                  "nntile/_core/mpi_glue.c",
                                                                  "nntile/_core/collective.c"]
    include_dirs = ["nntile/_core", numpy.get_include(), *incdirs]
    macros = [("NNTILE_HAVE_CUDA", "1" if cuda else "0"), ("NNTILE_HAVE_MPI", "1" if mpi else "0"),
              ("NPY_NO_DEPRECATED_API", "NPY_1_7_API_VERSION")]
    link_args = [*libs, *blas_link, "-lm", f"-Wl,-rpath,{libdir}"]
    if mpi:
        include_dirs += mpi[0]
        link_args = mpi[1] + link_args
    cu_sources = []
    if cuda:
        home = cuda_home()
        include_dirs.append(os.path.join(home, "include"))
        find_cudnn = load_by_path("nntile_find_cudnn", "nntile", "cuda", "find_cudnn.py")
        try:
            cudnn_compile, cudnn_link = find_cudnn.build_flags()
        except find_cudnn.NotFound as err:
            fail(f"CUDA is on, but {err} (NNTILE_CUDA=0 builds without CUDA)")
        CUDNN_COMPILE[:] = cudnn_compile
        link_args += [f"-L{os.path.join(home, 'lib64')}", "-lcudart", "-lcublas", *cudnn_link,
                      # the shared C++ runtime, named by its file: with a bare -lstdc++ the
                      # linker Python names (the GPU image's /opt/gcc) copied a static one
                      # into the module, a second runtime in the process, and cuDNN's graph
                      # build segfaulted in a stream insertion that called a wrong facet
                      "-l:libstdc++.so.6", f"-Wl,-rpath,{os.path.join(home, 'lib64')}"]
        cu_sources = sorted(glob.glob("nntile/cuda/*.cu") + glob.glob("nntile/cuda/*.cpp"))
    core = Extension(
        "nntile._core.core",
        sources=["nntile/_core/core.pyx", *c_sources],
        include_dirs=include_dirs,
        define_macros=macros,
        extra_compile_args=["-O3", f"-march={march}", "-fno-math-errno", "-Wno-unused-function",
                            # an unchecked StarPU call does not build (starpu_checked.h)
                            "-Werror=unused-result", *blas_compile],
        extra_link_args=link_args,
        # relink when CUDA sources or any header change, not only the listed sources
        depends=sorted(glob.glob("nntile/cuda/*") + glob.glob("nntile/_core/kernels/*")
                       + glob.glob("nntile/_core/*.h") + glob.glob("nntile/_core/*.p*")),
    )
    CU_SOURCES[core.name] = cu_sources  # cythonize() copies extensions, so keep them aside
    # Layers and models are typed Cython classes that only call the core module's ops.
    python_level = [Extension(name, [path], include_dirs=include_dirs, define_macros=macros)
                    for name, path in (("nntile.nn.module", "nntile/nn/module.pyx"),
                                       ("nntile.nn.layers", "nntile/nn/layers.pyx"),
                                       ("nntile.nn.attention", "nntile/nn/attention.pyx"),
                                       ("nntile.models.causal_lm", "nntile/models/causal_lm.pyx"),
                                       ("nntile.models.gpt2", "nntile/models/gpt2.pyx"),
                                       ("nntile.models.llama", "nntile/models/llama.pyx"))]
    print(f"nntile build: StarPU from {libdir}, CUDA {'on' if cuda else 'off'}, "
          f"MPI {'on' if mpi else 'off'}")
    return cythonize([core, *python_level], compiler_directives={"language_level": "3"})


setup(ext_modules=extensions(), cmdclass={"build_ext": BuildWithNvcc})
