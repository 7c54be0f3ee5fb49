"""Where the CUDA build finds what cudnn_attention.cpp needs: cuDNN 9 (headers and
libcudnn.so.9), the header-only cudnn-frontend, and NVRTC (the frontend includes nvrtc.h and
calls NVRTC for engines of its own).

Plain Python with no import of nntile: setup.py and the CUDA tests load this file by its path,
scripts/cuda_deps.sh and cuda_symbols.sh run it. Searched, in order:
  cuDNN headers   $CUDNN_INCLUDE, $CUDNN_HOME/include, the nvidia-cudnn-cu* wheel
                  (<site-packages>/nvidia/cudnn/include), the CUDA toolkit, /usr/include
  cuDNN library   $CUDNN_LIB, $CUDNN_HOME/lib64 and lib, the wheel's nvidia/cudnn/lib, the
                  toolkit, /usr/lib/x86_64-linux-gnu
  frontend        $CUDNN_FRONTEND_INCLUDE, vendor/cudnn_frontend/include (the Makefile puts the
                  nvidia-cudnn-frontend wheel's include/ there), an installed
                  nvidia-cudnn-frontend's (<site-packages>/include)
  NVRTC           the CUDA toolkit, the nvidia-cuda-nvrtc wheel (nvidia/cu13 or cuda_nvrtc)
"""
import glob
import os
import shutil
import site
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
VENDOR_FRONTEND = os.path.join(ROOT, "vendor", "cudnn_frontend", "include")


class NotFound(Exception):
    """What is missing and how to get it, in one line."""


def cuda_home():
    nvcc = os.environ.get("NVCC") or shutil.which("nvcc")
    if not nvcc:
        for home in (os.environ.get("CUDA_HOME"), os.environ.get("CUDA_PATH"), "/usr/local/cuda"):
            if home and os.path.exists(os.path.join(home, "bin", "nvcc")):
                return home
        return None
    return os.path.dirname(os.path.dirname(os.path.realpath(nvcc)))


def _site_dirs():
    dirs = list(sys.path)
    try:
        dirs += site.getsitepackages() + [site.getusersitepackages()]
    except AttributeError:  # virtualenvs of old
        pass
    seen, out = set(), []
    for d in dirs:
        if d and os.path.isdir(d) and d not in seen:
            seen.add(d)
            out.append(d)
    return out


def _toolkit_dirs(sub):
    home = cuda_home()
    if not home:
        return []
    return [os.path.join(home, sub), os.path.join(home, "targets", "x86_64-linux", sub)]


def _first_with(dirs, name):
    for d in dirs:
        if d and os.path.isfile(os.path.join(d, name)):
            return d
    return None


def _library(dirs, stem, major):
    """(directory, file name) of lib<stem>.so or lib<stem>.so.<major>, else None."""
    for d in dirs:
        if not d or not os.path.isdir(d):
            continue
        for name in (f"lib{stem}.so", f"lib{stem}.so.{major}"):
            if os.path.exists(os.path.join(d, name)):
                return d, name
    return None


def _env_home(var, *subs):
    home = os.environ.get(var)
    return [os.path.join(home, s) for s in subs] if home else []


def cudnn():
    """(include dir, (lib dir, lib file)) of cuDNN 9."""
    wheels = [os.path.join(d, "nvidia", "cudnn") for d in _site_dirs()]
    inc = _first_with([os.environ.get("CUDNN_INCLUDE"), *_env_home("CUDNN_HOME", "include"),
                       *[os.path.join(w, "include") for w in wheels],
                       *_toolkit_dirs("include"), "/usr/include"], "cudnn.h")
    lib = _library([os.environ.get("CUDNN_LIB"), *_env_home("CUDNN_HOME", "lib64", "lib"),
                    *[os.path.join(w, "lib") for w in wheels], *_toolkit_dirs("lib64"),
                    *_toolkit_dirs("lib"), "/usr/lib/x86_64-linux-gnu"], "cudnn", 9)
    if inc is None or lib is None:
        raise NotFound("cuDNN 9 was not found (headers: %s, library: %s); install the wheel that "
                       "matches CUDA (pip install nvidia-cudnn-cu13), or set CUDNN_HOME, or "
                       "CUDNN_INCLUDE and CUDNN_LIB" % (inc or "missing",
                                                        lib[0] if lib else "missing"))
    return inc, lib


def frontend():
    """The include dir of the header-only cudnn-frontend."""
    # the wheel's top-level include/ lands in site-packages itself
    installed = [os.path.join(d, "include") for d in _site_dirs()]
    inc = _first_with([os.environ.get("CUDNN_FRONTEND_INCLUDE"), VENDOR_FRONTEND, *installed],
                      "cudnn_frontend.h")
    if inc is None:
        raise NotFound("the cudnn-frontend headers were not found; run make (it unpacks the "
                       "nvidia-cudnn-frontend wheel's include/ into vendor/cudnn_frontend/), or "
                       "set CUDNN_FRONTEND_INCLUDE")
    return inc


def nvrtc():
    """(include dir, (lib dir, lib file)) of NVRTC."""
    wheels = [w for d in _site_dirs() for w in glob.glob(os.path.join(d, "nvidia", "*"))]
    inc = _first_with([*_toolkit_dirs("include"), *[os.path.join(w, "include") for w in wheels]],
                      "nvrtc.h")
    lib = _library([*_toolkit_dirs("lib64"), *_toolkit_dirs("lib"),
                    *[os.path.join(w, "lib") for w in wheels]], "nvrtc", 13) or \
        _library([os.path.join(w, "lib") for w in wheels], "nvrtc", 12)
    if inc is None or lib is None:
        raise NotFound("NVRTC was not found (the CUDA toolkit's, or pip install nvidia-cuda-nvrtc); "
                       "the cudnn-frontend headers need nvrtc.h and libnvrtc")
    return inc, lib


def build_flags():
    """(compile flags, link flags) for nvcc: the headers as system headers (their warnings are
    not ours), each library by its file name with an rpath to its directory."""
    cudnn_inc, cudnn_lib = cudnn()
    fe_inc = frontend()
    nvrtc_inc, nvrtc_lib = nvrtc()
    compile_flags = []
    for inc in dict.fromkeys([fe_inc, cudnn_inc, nvrtc_inc]):
        compile_flags += ["-isystem", inc]
    link = []
    for libdir, name in dict.fromkeys([cudnn_lib, nvrtc_lib]):
        link += [f"-L{libdir}", f"-l:{name}", f"-Wl,-rpath,{libdir}"]
    return compile_flags, link


def missing():
    """The parts not found: some of "cudnn", "frontend", "nvrtc"."""
    out = []
    for name, find in (("cudnn", cudnn), ("frontend", frontend), ("nvrtc", nvrtc)):
        try:
            find()
        except NotFound:
            out.append(name)
    return out


if __name__ == "__main__":
    # scripts/cuda_deps.sh and cuda_symbols.sh: "missing" prints the parts not found; else
    # the compile flags (--link: the link flags), or why not, exit 1
    if sys.argv[1:] == ["missing"]:
        print(" ".join(missing()))
        sys.exit(0)
    try:
        print(" ".join(build_flags()[0] if "--link" not in sys.argv else build_flags()[1]))
    except NotFound as err:
        print(f"nntile build: {err}", file=sys.stderr)
        sys.exit(1)
