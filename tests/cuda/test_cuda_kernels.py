"""CUDA kernels (nntile/cuda) against the CPU kernels (nntile/_core/kernels).

A session fixture builds two shared libraries in a temporary directory:
the .cu files with nvcc (for the GPU's own architecture, linked with cuBLAS)
and the CPU kernels with cc (linked with OpenBLAS when it can be found: the
scipy-openblas32 wheel the build links, else a system one; otherwise without
the CPU gemm, and GEMM is checked against numpy float64).
Each test runs the same random inputs through both (device memory from
cupy, launches on a non-blocking cupy stream, a cuBLAS handle created
through ctypes) and compares: fp32 1e-6 relative (GEMM 1e-5), fp64 1e-12,
tf32 2e-3, bf16 2e-2 (bf16 against the fp32 CPU kernel on bf16-rounded
inputs).  Destinations documented as not read (beta == 0, init) are
NaN-poisoned.

Skipped cleanly without nvcc, cupy or a CUDA device.  Needs only numpy,
cupy, nvcc, cuBLAS and cuDNN with the cudnn-frontend headers (no torch, no
hypothesis).  Environment overrides: NVCC, NNTILE_CUDA_ARCH (e.g. 90),
CUBLAS_INCLUDE, CUBLAS_LIB (a directory), and those of
nntile/cuda/find_cudnn.py.  test_flash.py shares the library (shared_env).
"""
import ctypes
import glob
import os
import shutil
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor

import numpy as np

from tests.kernel_header import args_structs, find_blas, op_buffers, op_table, value_structs
from tests.unary_refs import ACTIVATIONS
import pytest

pytestmark = pytest.mark.gpu

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
KERNEL_DIR = os.path.join(ROOT, "nntile", "_core", "kernels")
CUDA_DIR = os.path.join(ROOT, "nntile", "cuda")

try:
    import cupy as cp
    _NDEV = cp.cuda.runtime.getDeviceCount()
    _SKIP = None if _NDEV > 0 else "no CUDA device"
except Exception as exc:  # ImportError, CUDARuntimeError, driver missing
    cp = None
    _SKIP = f"cupy/CUDA unavailable: {type(exc).__name__}: {exc}"
if _SKIP:
    pytest.skip(_SKIP, allow_module_level=True)

DT = ["fp32", "fp64", "bf16"]


def _mixed_roles():
    """{op: a letter per buffer of its bf16_fp32 kernel}, from the op table's buffers
    (kernels.h): T for the data type (bf16 bits), A for the accumulator's (fp32), I for
    int64."""
    buffers = op_buffers()
    return {op: "".join("I" if "int64" in typ else "A" if "ACC" in typ else "T"
                        for typ, _, _ in buffers[op])
            for op, _, _, columns in op_table() if columns in ("MIXED", "MIXED_ONLY")}


MIXED = _mixed_roles()  # mixed precision: bf16 data, fp32 accumulators
RTOL = {"fp32": 1e-6, "fp64": 1e-12, "bf16": 2e-2, "tf32": 2e-3}
GEMM_RTOL = {"fp32": 1e-5, "fp64": 1e-12, "bf16": 2e-2, "tf32": 2e-3}


# ---------------------------------------------------------------- args structs

_CTYPES = {"int64": ctypes.c_int64, "double": ctypes.c_double,
           "int64[8]": ctypes.c_int64 * 8}


for _name, _fields in value_structs().items():  # held by value in args structs (nntile_mask)
    _CTYPES[f"struct {_name}"] = type(_name, (ctypes.Structure,),
                                      {"_fields_": [(n, _CTYPES[t]) for n, t in _fields]})


def _parse_structs():
    """ctypes structs for every nntile_<op>_args in kernels.h."""
    return {op: type(f"nntile_{op}_args", (ctypes.Structure,),
                     {"_fields_": [(name, _CTYPES[kind]) for name, kind in fields]})
            for op, fields in args_structs().items()}


STRUCTS = _parse_structs()


def make_args(op, args):
    cls = STRUCTS[op]
    names = {f for f, _ in cls._fields_}
    unknown = set(args) - names
    assert not unknown, (op, unknown)
    kw = {}
    for name, ct in cls._fields_:
        val = args.get(name, 0)
        if isinstance(val, (list, tuple)):
            val = [int(x) for x in val]
            val = (ctypes.c_int64 * 8)(*(val + [0] * (8 - len(val))))
        elif isinstance(ct, type) and issubclass(ct, ctypes.Structure):
            val = ct(**(val or {}))
        kw[name] = val
    return cls(**kw)


# ---------------------------------------------------------------- build

def _run(cmd):
    res = subprocess.run(cmd, capture_output=True, text=True)
    return res.returncode, res.stdout + res.stderr


def _find_nvcc():
    cands = [os.environ.get("NVCC"), shutil.which("nvcc")]
    for home in (os.environ.get("CUDA_HOME"), os.environ.get("CUDA_PATH"),
                 "/usr/local/cuda"):
        if home:
            cands.append(os.path.join(home, "bin", "nvcc"))
    for c in cands:
        if c and os.path.isfile(c) and os.access(c, os.X_OK):
            return c
    return None


def _site_nvidia_dirs():
    """nvidia/* folders of pip wheels (nvidia-cublas, torch's deps)."""
    out = []
    for p in sys.path:
        d = os.path.join(p, "nvidia")
        if os.path.isdir(d):
            out.append(d)
    return out


def _cublas_dirs(nvcc):
    home = os.path.dirname(os.path.dirname(os.path.realpath(nvcc)))
    inc_c = [os.environ.get("CUBLAS_INCLUDE"), os.path.join(home, "include"),
             os.path.join(home, "targets", "x86_64-linux", "include"),
             "/usr/local/cuda/include", "/usr/include"]
    lib_c = [os.environ.get("CUBLAS_LIB"), os.path.join(home, "lib64"),
             os.path.join(home, "lib"),
             os.path.join(home, "targets", "x86_64-linux", "lib"),
             "/usr/local/cuda/lib64", "/usr/lib/x86_64-linux-gnu"]
    for d in _site_nvidia_dirs():
        for sub in ("cu13", "cublas", "cu12"):
            inc_c.append(os.path.join(d, sub, "include"))
            lib_c.append(os.path.join(d, sub, "lib"))
    inc = next((d for d in inc_c
                if d and os.path.isfile(os.path.join(d, "cublas_v2.h"))), None)
    lib, libname = None, None
    for d in lib_c:
        if not d or not os.path.isdir(d):
            continue
        if os.path.exists(os.path.join(d, "libcublas.so")):
            lib, libname = d, "libcublas.so"
            break
        so = sorted(glob.glob(os.path.join(d, "libcublas.so.[0-9]*")))
        if so:
            lib, libname = d, os.path.basename(so[0])
            break
    return inc, lib, libname


def _arch():
    env = os.environ.get("NNTILE_CUDA_ARCH")
    if env:
        return env
    return cp.cuda.Device().compute_capability  # e.g. "90"


def _find_cudnn():
    """nntile/cuda/find_cudnn.py, loaded by its path (as setup.py does)."""
    import importlib.util
    spec = importlib.util.spec_from_file_location("nntile_find_cudnn",
                                                  os.path.join(CUDA_DIR, "find_cudnn.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _build_cuda(tmp):
    nvcc = _find_nvcc()
    if nvcc is None:
        pytest.skip("nvcc not found")
    inc, libdir, libname = _cublas_dirs(nvcc)
    if inc is None or libdir is None:
        pytest.skip(f"cuBLAS not found (include {inc}, lib {libdir})")
    find_cudnn = _find_cudnn()
    try:
        cudnn_compile, cudnn_link = find_cudnn.build_flags()
    except find_cudnn.NotFound as err:
        pytest.skip(str(err))
    arch = _arch()
    flags = ["-std=c++17", f"-gencode=arch=compute_{arch},code=sm_{arch}",
             "-I", KERNEL_DIR, "-I", os.path.join(ROOT, "nntile", "_core"), "-I", inc]
    srcs = sorted(glob.glob(os.path.join(CUDA_DIR, "*.cu"))
                  + glob.glob(os.path.join(CUDA_DIR, "*.cpp")))
    assert srcs, "no .cu files"
    objs = [os.path.join(tmp, os.path.basename(s) + ".o") for s in srcs]

    def compile_one(so):
        if so[0].endswith(".cpp"):  # host code around cudnn-frontend, as setup.py builds it
            extra = ["-O1", "-Xcompiler", "-fPIC,-Wall,-Wextra,-fvisibility=hidden",
                     *cudnn_compile]
        else:
            extra = ["-O3", "-Xcompiler", "-fPIC,-Wall,-Wextra"]
        return _run([nvcc, *flags, *extra, "-c", so[0], "-o", so[1]])

    with ThreadPoolExecutor(max_workers=min(len(srcs), os.cpu_count() or 4)) as ex:
        results = list(ex.map(compile_one, zip(srcs, objs)))
    logs = ""
    for (rc, log), s in zip(results, srcs):
        assert rc == 0, f"nvcc failed on {s}:\n{log}"
        logs += log
    out = os.path.join(tmp, "libnntile_cuda_test.so")
    link = "-lcublas" if libname == "libcublas.so" else f"-l:{libname}"
    nvcc_link = []  # find_cudnn's gcc flags, as nvcc takes them
    for f in cudnn_link:
        nvcc_link += ["-Xlinker", f[4:]] if f.startswith("-Wl,") else [f]
    rc, log = _run([nvcc, "-shared", "-o", out, *objs, "-L", libdir, link,
                    "-Xlinker", f"-rpath,{libdir}", *nvcc_link])
    assert rc == 0, f"link failed:\n{log}"
    lib = ctypes.CDLL(out)
    # the very cuBLAS library the kernels use (matched by soname)
    cublas = None
    for name in (libname, "libcublas.so.13", "libcublas.so.12", "libcublas.so",
                 os.path.join(libdir, libname)):
        try:
            cublas = ctypes.CDLL(name)
            break
        except OSError:
            continue
    assert cublas is not None
    return lib, cublas, logs


_STUB_CBLAS = """
#ifndef NNTILE_TEST_STUB_CBLAS_H
#define NNTILE_TEST_STUB_CBLAS_H
enum CBLAS_ORDER { CblasRowMajor = 101, CblasColMajor = 102 };
enum CBLAS_TRANSPOSE { CblasNoTrans = 111, CblasTrans = 112,
                       CblasConjTrans = 113 };
void cblas_sgemm(enum CBLAS_ORDER, enum CBLAS_TRANSPOSE, enum CBLAS_TRANSPOSE,
                 int, int, int, float, const float *, int, const float *, int,
                 float, float *, int);
void cblas_dgemm(enum CBLAS_ORDER, enum CBLAS_TRANSPOSE, enum CBLAS_TRANSPOSE,
                 int, int, int, double, const double *, int, const double *,
                 int, double, double *, int);
#endif
"""


def _build_cpu(tmp):
    """CPU kernels; returns (lib, has_gemm)."""
    cc = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        pytest.skip("no C compiler for the CPU reference kernels")
    srcs = sorted(glob.glob(os.path.join(KERNEL_DIR, "*.c")))
    base = [cc, "-std=c11", "-O2", "-fno-math-errno", "-fPIC", "-shared",
            "-I", KERNEL_DIR]
    stub = os.path.join(tmp, "stub")
    os.makedirs(stub, exist_ok=True)
    with open(os.path.join(stub, "cblas.h"), "w") as f:
        f.write(_STUB_CBLAS)
    sys_inc = [x for d in ("/usr/include/openblas",
                           "/usr/include/x86_64-linux-gnu/openblas-pthread")
               if os.path.isdir(d) for x in ("-I", d)]
    so0 = [p for d in ("/usr/lib/x86_64-linux-gnu", "/usr/lib64", "/usr/lib",
                       "/usr/local/lib")
           for p in glob.glob(os.path.join(d, "libopenblas*.so*"))]
    no_gemm = [s for s in srcs if os.path.basename(s) != "gemm.c"]
    attempts = [(sys_inc, srcs, ["-lopenblas"], True)]
    try:
        blas_compile, blas_link = find_blas.build_flags()  # the BLAS the build links
        attempts.insert(0, (blas_compile, srcs, blas_link, True))
    except find_blas.NotFound:
        pass
    if so0:
        attempts.append((["-I", stub], srcs, [so0[0]], True))
    attempts.append((["-I", stub], no_gemm, [], False))
    logs = []
    for i, (inc, ss, libs, has_gemm) in enumerate(attempts):
        out = os.path.join(tmp, f"libnntile_cpu{i}.so")
        rc, log = _run([*base, *inc, *ss, "-o", out, *libs, "-lm"])
        if rc == 0:
            try:
                return ctypes.CDLL(out), has_gemm
            except OSError as exc:
                log += str(exc)
        logs.append(log)
    pytest.fail("cannot build the CPU kernels:\n" + "\n".join(logs))


class Env:
    def __init__(self, tmp):
        self.cuda, self.cublas, self.nvcc_log = _build_cuda(tmp)
        self.cpu, self.cpu_gemm = _build_cpu(tmp)
        self.stream = cp.cuda.Stream(non_blocking=True)
        self.handle = ctypes.c_void_p()
        create = self.cublas.cublasCreate_v2
        create.argtypes = [ctypes.POINTER(ctypes.c_void_p)]
        assert create(ctypes.byref(self.handle)) == 0
        setst = self.cublas.cublasSetStream_v2
        setst.argtypes = [ctypes.c_void_p, ctypes.c_void_p]
        assert setst(self.handle, ctypes.c_void_p(self.stream.ptr)) == 0

    def close(self):
        self.stream.synchronize()
        destroy = self.cublas.cublasDestroy_v2
        destroy.argtypes = [ctypes.c_void_p]
        destroy(self.handle)


_SHARED = {}


def shared_env(tmp_path_factory):
    """The one Env of the session (built on first use), for this file and test_flash.py."""
    if "env" not in _SHARED:
        _SHARED["env"] = Env(str(tmp_path_factory.mktemp("nntile_cuda")))
    return _SHARED["env"]


@pytest.fixture(scope="session")
def env(tmp_path_factory):
    return shared_env(tmp_path_factory)


# ---------------------------------------------------------------- helpers

def bf16_bits(x):
    """float array -> bfloat16 bits (uint16), round to nearest even."""
    u = np.ascontiguousarray(x, dtype=np.float32).view(np.uint32).astype(np.uint64)
    nan = np.isnan(np.asarray(x, dtype=np.float32))
    r = ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)
    r[nan] = 0x7FC0
    return r


def bf16_to_f32(b):
    return (np.asarray(b, dtype=np.uint16).astype(np.uint32) << 16).view(np.float32)


def bf16_round(x):
    return bf16_to_f32(bf16_bits(x))


def cpu_dt(dt):
    return "fp64" if dt == "fp64" else "fp32"


def np_dt(dt):
    return np.float64 if dt == "fp64" else np.float32


def _ptr(a):
    return None if a is None else ctypes.c_void_p(a.ctypes.data)


def _dptr(a):
    return None if a is None else ctypes.c_void_p(a.data.ptr)


def run(env, op, dt, args, bufs, gemm_dt=None):
    """Run op on CPU and GPU from the same inputs.

    bufs: float arrays (any float dtype; cast to the storage type, rounded to
    bf16 for dt == 'bf16') or int64 arrays or None.  Returns
    (cpu_results, gpu_results) as float64/int64 numpy arrays, one per buffer
    (None stays None).  dt 'tf32' (gemm only) runs fp32 storage."""
    st_ = make_args(op, args)
    cdt = cpu_dt(dt)
    host, dev = [], []
    with env.stream:
        for b in bufs:
            if b is None:
                host.append(None)
                dev.append(None)
                continue
            b = np.asarray(b)
            if b.dtype == np.int64:
                host.append(np.ascontiguousarray(b.copy()))
                dev.append(cp.asarray(b))
                continue
            h = np.ascontiguousarray(b, dtype=np_dt(cdt)).copy()
            if dt == "bf16":
                h = bf16_round(h).reshape(h.shape)
                dev.append(cp.asarray(bf16_bits(h).reshape(h.shape)))
            else:
                dev.append(cp.asarray(h))
            host.append(h)
        cpu_fn = getattr(env.cpu, f"nntile_kernel_{op}_{cdt}", None)
        if cpu_fn is not None:
            cpu_fn.restype = None
            cpu_fn(ctypes.byref(st_), *[_ptr(h) for h in host])
        gdt = gemm_dt or dt
        gpu_fn = getattr(env.cuda, f"nntile_cuda_{op}_{gdt}")
        gpu_fn.restype = None
        first = env.handle if op == "gemm" else ctypes.c_void_p(
            cp.cuda.get_current_stream().ptr)
        gpu_fn(ctypes.byref(st_), first, *[_dptr(d) for d in dev])
        out = []
        for d in dev:
            if d is None:
                out.append(None)
                continue
            a = cp.asnumpy(d, stream=env.stream)
            if dt == "bf16" and a.dtype == np.uint16:
                a = bf16_to_f32(a).reshape(a.shape)
            out.append(a)
        env.stream.synchronize()
    cpu_out = [None if h is None else (h if h.dtype == np.int64
                                       else h.astype(np.float64)) for h in host]
    gpu_out = [None if a is None else (a if a.dtype == np.int64
                                       else a.astype(np.float64)) for a in out]
    return cpu_out, gpu_out


def close(got, ref, dt, mult=1.0, scale=None, rtol=None):
    got = np.asarray(got, dtype=np.float64)
    ref = np.asarray(ref, dtype=np.float64)
    rtol = (rtol if rtol is not None else RTOL[dt]) * mult
    if scale is None:
        fin = np.abs(ref[np.isfinite(ref)])
        scale = max(1.0, float(fin.max())) if fin.size else 1.0
    np.testing.assert_array_equal(np.isnan(got), np.isnan(ref))
    np.testing.assert_array_equal(np.isinf(got), np.isinf(ref))
    fin = np.isfinite(ref)
    np.testing.assert_array_equal(got[~fin], ref[~fin])
    np.testing.assert_allclose(got[fin], ref[fin], rtol=rtol, atol=rtol * scale)


def check(env, op, dt, args, bufs, outs, mult=1.0, scale=None):
    c, g = run(env, op, dt, args, bufs)
    for i in outs:
        sc = scale[i] if isinstance(scale, dict) else scale
        close(g[i], c[i], dt, mult=mult, scale=sc)
    return c, g


def R(rng, *shape, scale=1.0):
    return scale * rng.standard_normal(shape)


def nans(*shape):
    return np.full(shape, np.nan)


# ---------------------------------------------------------------- build / ABI

def test_build_clean_and_symbols(env):
    """Every op of kernels.h's table is exported for the dtypes its columns name."""
    assert "warning" not in env.nvcc_log.lower(), env.nvcc_log
    for op, _, kind, columns in op_table():
        dtypes = (["fp32", "fp64", "bf16"] if columns != "MIXED_ONLY" else []) + (
            ["bf16_fp32"] if columns != "PLAIN" else []) + (
            ["tf32"] if kind in ("X_BLAS", "X_TF32") else [])
        for dt in dtypes:
            getattr(env.cuda, f"nntile_cuda_{op}_{dt}")


def test_bf16_helpers():
    x = np.array([1.0, 1 + 2**-8, 1 + 3 * 2**-8, -2.5, 0.0, np.inf],
                 dtype=np.float32)
    np.testing.assert_array_equal(bf16_round(x),
                                  [1.0, 1.0, 1 + 4 * 2**-8, -2.5, 0.0, np.inf])


# ---------------------------------------------------------------- elementwise

# 1 << 20 and over: launch_elementwise's four items a thread, with a partial last block
UNROLLED = (1 << 20) + 777
SIZES = [1, 7, 256, 1000, 70001, UNROLLED]


@pytest.mark.parametrize("dt", DT)
@pytest.mark.parametrize("n", SIZES)
def test_elementwise(env, dt, n):
    rng = np.random.default_rng(n)
    check(env, "fill", dt, dict(n=n, value=-2.5), [nans(n)], [0])
    check(env, "copy", dt, dict(n=n), [R(rng, n), nans(n)], [1], mult=0)
    check(env, "scal", dt, dict(n=n, alpha=1.7), [R(rng, n)], [0])
    check(env, "prod", dt, dict(n=n, alpha=-0.5), [R(rng, n), R(rng, n),
                                                  nans(n)], [2])
    for beta in (0.0, 1.0, -0.75):
        dst = nans(n) if beta == 0 else R(rng, n)
        check(env, "add", dt, dict(n=n, alpha=0.3, beta=beta),
              [R(rng, n), dst], [1])
        check(env, "add_out", dt, dict(n=n, alpha=0.3, beta=beta),
              [R(rng, n), R(rng, n), nans(n)], [2])
    x = R(rng, n, scale=3.0)
    x[:3] = [0.0, -12.0, 12.0][:n]
    for name in ACTIVATIONS:  # the op table's activations
        check(env, name, dt, dict(n=n), [x, nans(n)], [1], mult=2)
        for beta in (0.0, 0.6):
            dx = nans(n) if beta == 0 else R(rng, n)
            check(env, name + "_backward", dt, dict(n=n, beta=beta),
                  [x, R(rng, n), dx], [2], mult=2)


@pytest.mark.parametrize("dt", DT)
@pytest.mark.parametrize("n", [0, 1, 5, 4097, 1 << 20])
@pytest.mark.parametrize("beta", [0.0, 1.0, -0.5])
def test_sumsq(env, dt, n, beta):
    rng = np.random.default_rng(n)
    out = nans(1) if beta == 0 else R(rng, 1)
    check(env, "sumsq", dt, dict(n=n, beta=beta), [R(rng, n), out], [1])


def test_fp32_sums_accumulate_in_double(env):
    x = np.full(1 << 20, 0.1, dtype=np.float32)
    exact = float(np.float32(0.1)) * x.size
    _, g = run(env, "sum_slice", "fp32",
               dict(m=1, k=x.size, n=1, alpha=1.0, beta=0.0), [x, nans(1)])
    assert abs(g[1][0] / exact - 1) < 2e-7
    _, g = run(env, "sum_fiber", "fp32",
               dict(m=x.size, k=1, n=1, alpha=1.0, beta=0.0), [x, nans(1)])
    assert abs(g[1][0] / exact - 1) < 2e-7
    _, g = run(env, "sum_fiber", "fp32",
               dict(m=1024, k=4, n=256, alpha=1.0, beta=0.0), [x, nans(4)])
    np.testing.assert_allclose(g[1], exact / 4, rtol=2e-7)


# ---------------------------------------------------------------- fiber / slice

MKN = [(1, 1, 1), (3, 5, 1), (2, 7, 3), (4, 33, 1), (5, 3, 40), (1, 1000, 1),
       (3000, 3, 1), (2000, 3, 5), (7, 300, 37), (1, 2, 70000), (600, 600, 1)]


def _red_scale(a):
    return max(1.0, float(np.abs(a).max()))


@pytest.mark.parametrize("dt", DT)
@pytest.mark.parametrize("m,k,n", MKN)
def test_fiber(env, dt, m, k, n):
    rng = np.random.default_rng(m * 1000 + k * 10 + n)
    for beta in (0.0, 1.0, -0.3):
        dst = nans(m, k, n) if beta == 0 else R(rng, m, k, n)
        check(env, "add_fiber", dt, dict(m=m, k=k, n=n, alpha=1.3, beta=beta),
              [R(rng, k), dst], [1])
    check(env, "prod_fiber", dt, dict(m=m, k=k, n=n, alpha=1.3),
          [R(rng, k), R(rng, m, k, n)], [1])
    s1, s2 = R(rng, m, k, n), R(rng, m, k, n)
    for beta in (0.0, 0.5):
        a = dict(m=m, k=k, n=n, alpha=1.3, beta=beta)
        out = nans(k) if beta == 0 else R(rng, k)
        check(env, "sum_fiber", dt, a, [s1, out], [1],
              scale=_red_scale(np.abs(s1).sum(axis=(0, 2))))
        out = nans(k) if beta == 0 else R(rng, k)
        check(env, "sumprod_fiber", dt, a, [s1, s2, out], [2],
              scale=_red_scale(np.abs(s1 * s2).sum(axis=(0, 2))))


@pytest.mark.parametrize("dt", DT)
@pytest.mark.parametrize("m,k,n", MKN)
def test_slice(env, dt, m, k, n):
    rng = np.random.default_rng(m * 1000 + k * 10 + n + 1)
    s1, s2 = R(rng, m, k, n), R(rng, m, k, n)
    for beta in (0.0, 1.0, 0.4):
        a = dict(m=m, k=k, n=n, alpha=-0.7, beta=beta)
        out = nans(m, n) if beta == 0 else R(rng, m, n)
        check(env, "sum_slice", dt, a, [s1, out], [1],
              scale=_red_scale(np.abs(s1).sum(axis=1)))
        out = nans(m, n) if beta == 0 else R(rng, m, n)
        check(env, "sumprod_slice", dt, a, [s1, s2, out], [2],
              scale=_red_scale(np.abs(s1 * s2).sum(axis=1)))
        dst = nans(m, k, n) if beta == 0 else R(rng, m, k, n)
        check(env, "add_slice", dt, a, [R(rng, m, n), dst], [1])
    check(env, "prod_slice", dt, dict(m=m, k=k, n=n, alpha=-0.7),
          [R(rng, m, n), R(rng, m, k, n)], [1])


# ---------------------------------------------------------------- softmax

@pytest.mark.parametrize("dt", DT)
@pytest.mark.parametrize("m,k,n", [(1, 1, 1), (3, 5, 1), (4, 30, 2),
                                   (5, 17, 5), (6, 3000, 1), (2, 700, 40),
                                   (300, 64, 1), (3, 1, 33), (3, 60000, 1)])
def test_maxsumexp_softmax(env, dt, m, k, n):
    rng = np.random.default_rng(m + k + n)
    x = R(rng, m, k, n, scale=4.0)
    x[rng.random((m, k, n)) < 0.3] = -np.inf
    x[0, :, 0] = -np.inf  # a fully masked row
    if m > 1:
        x[1, : (k + 1) // 2, :] = -np.inf
    x2 = R(rng, m, k, n, scale=4.0)
    x2[rng.random((m, k, n)) < 0.3] = -np.inf
    stats = nans(m, n, 2)
    c, g = check(env, "maxsumexp", dt, dict(m=m, k=k, n=n, init=1),
                 [x, stats], [1], mult=2)
    assert not np.isnan(g[1]).any()
    assert g[1][0, 0, 0] == -np.inf and g[1][0, 0, 1] == 0
    # merge a second tile into the same stats (init = 0)
    c2, g2 = check(env, "maxsumexp", dt, dict(m=m, k=k, n=n, init=0),
                   [x2, c[1]], [1], mult=4)
    st_ = c2[1]
    for xx in (x, x2):
        check(env, "softmax_inplace", dt, dict(m=m, k=k, n=n), [st_, xx], [1],
              mult=4)
    flat = np.ascontiguousarray(st_.reshape(-1, 2))
    with np.errstate(divide="ignore"):
        check(env, "logsumexp", dt, dict(n=m * n), [flat, nans(m * n)], [1])
    p = np.abs(R(rng, m, k, n))
    dp = R(rng, m, k, n)
    sums = (p * dp).sum(axis=1)
    check(env, "softmax_backward", dt, dict(m=m, k=k, n=n, alpha=0.5),
          [p, sums, dp], [2], mult=4,
          scale=max(1.0, float(np.abs(p).max() * (np.abs(dp).max()
                                                  + np.abs(sums).max()))))


@pytest.mark.parametrize("dt", ["fp32", "fp64"])
@pytest.mark.parametrize("n", [1, 2])
def test_exp_accuracy(env, dt, n):
    """softmax_inplace with stats (max=0, sum=1) computes exp(x) itself:
    element by element within 1e-6 (fp32) / 1e-12 (fp64) relative of the
    CPU kernel and within 4 ulp of exp, over the whole range; special values
    as on the CPU (-inf -> 0, overflow -> inf, NaN -> NaN)."""
    npdt = np_dt(dt)
    lo, hi = (-87.3, 88.3) if dt == "fp32" else (-708.3, 709.4)
    rng = np.random.default_rng(0)
    x = np.concatenate([np.linspace(lo, hi, 20000), rng.uniform(-1, 1, 4000),
                        rng.uniform(-30, 0, 4000), [0.0, -0.0, 1e-30, -1e-30],
                        [-np.inf, -1e6, 1e6, np.inf, np.nan, 0.0]])
    x = x[: x.size // n * n].astype(npdt)
    k = x.size // n
    stats = np.tile(np.array([0.0, 1.0]), (n, 1))
    c, g = run(env, "softmax_inplace", dt, dict(m=1, k=k, n=n),
               [stats, x.reshape(1, k, n)])
    got, ref = g[1].ravel(), c[1].ravel()
    np.testing.assert_array_equal(np.isnan(got), np.isnan(ref))
    np.testing.assert_array_equal(got[np.isinf(ref)], ref[np.isinf(ref)])
    fin = np.isfinite(ref) & (ref > 0)
    rel = np.abs(got[fin] - ref[fin]) / ref[fin]
    assert rel.max() <= RTOL[dt], rel.max()
    exact = np.exp(x.astype(np.longdouble))[fin]
    eps = np.finfo(npdt).eps
    assert float((np.abs(got[fin] - exact) / exact).max()) < 4 * eps
    assert (got[x == -np.inf] == 0).all() and (got[x == -1e6] == 0).all()


@pytest.mark.parametrize("dt", DT)
@pytest.mark.parametrize("batch,tq,tk,qo,ko,causal,offset", [
    (1, 1, 1, 0, 0, 1, 0), (2, 4, 4, 0, 0, 1, 0), (3, 5, 7, 4, 0, 1, 0), (1, 6, 3, 0, 3, 1, 0),
    (2, 3, 8, 10, 2, 1, 0), (1, 4, 4, 0, 8, 1, 0), (2, 70, 600, 100, 0, 1, 0),
    (2, 9, 40, 0, 0, 1, 31), (1, 5, 5, 0, 0, 0, 0)])
@pytest.mark.parametrize("window", [0, 3])
def test_mask_scores(env, dt, batch, tq, tk, qo, ko, causal, offset, window):
    rng = np.random.default_rng(tk)
    mask = dict(causal=causal, offset=offset, window=window if causal else 0)
    c, g = run(env, "mask_scores", dt, dict(batch=batch, tq=tq, tk=tk, q_offset=qo,
                                            k_offset=ko, mask=mask),
               [R(rng, batch, tq, tk)])
    np.testing.assert_array_equal(g[0], c[0])


# ---------------------------------------------------------------- xent

@pytest.mark.parametrize("dt", DT)
@pytest.mark.parametrize("rows,v,voff", [(1, 1, 0), (9, 50, 0), (9, 50, 20),
                                         (64, 3000, 1000), (5, 7, 100)])
def test_xent(env, dt, rows, v, voff):
    rng = np.random.default_rng(rows * v)
    logits = R(rng, rows, v, scale=3.0)
    labels = rng.integers(voff - 5, voff + v + 5, rows).astype(np.int64)
    labels[0] = voff  # at least one hit
    if rows > 2:
        labels[1] = -100  # ignored label
    stats = np.stack([logits.max(1) + 0.1, np.exp(logits - logits.max(1, keepdims=True)
                                                  - 0.1).sum(1)], axis=1)
    picked = np.full(rows, 12345.0)
    c, g = run(env, "xent_picked", dt, dict(rows=rows, v=v, v_offset=voff),
               [logits, labels, picked])
    np.testing.assert_array_equal(g[2], c[2])
    for alpha, beta in ((1.0 / rows, 0.0), (2.0, 1.0)):
        loss = nans(1) if beta == 0 else np.array([0.5])
        lse, pk = R(rng, rows), R(rng, rows)
        check(env, "xent_loss", dt, dict(rows=rows, alpha=alpha, beta=beta),
              [lse, pk, loss], [2],
              scale=max(1.0, abs(alpha) * np.abs(np.r_[lse, pk]).sum()))
    check(env, "xent_grad_inplace", dt,
          dict(rows=rows, v=v, v_offset=voff, alpha=0.25),
          [stats, labels, logits], [2], mult=4)


# ---------------------------------------------------------------- embedding

@pytest.mark.parametrize("dt", DT)
@pytest.mark.parametrize("rows,e,voff,v", [(1, 1, 0, 1), (7, 5, 3, 4),
                                           (16, 33, 0, 10), (9, 8, 10, 6),
                                           (300, 768, 0, 50), (40, 1000, 5, 3)])
def test_embedding(env, dt, rows, e, voff, v):
    rng = np.random.default_rng(rows + e)
    ids = rng.integers(-1, voff + v + 3, rows).astype(np.int64)
    ids[0] = voff
    check(env, "embedding", dt, dict(rows=rows, e=e, v_offset=voff, v=v),
          [ids, R(rng, v, e), R(rng, rows, e)], [2])
    # duplicates accumulate (atomics on the GPU; order-dependent rounding)
    check(env, "embedding_backward", dt,
          dict(rows=rows, e=e, v_offset=voff, v=v),
          [ids, R(rng, rows, e), R(rng, v, e)], [2], mult=4)


# ---------------------------------------------------------------- layernorm

@pytest.mark.parametrize("dt", DT)
@pytest.mark.parametrize("rows,e_total,ntiles", [(1, 1, 1), (6, 70, 3),
                                                 (3, 2000, 2), (1000, 40, 2),
                                                 (64, 768, 1), (5, 33, 4),
                                                 (3000, 1600, 1), (9, 3073, 1)])
def test_layernorm(env, dt, rows, e_total, ntiles):
    rng = np.random.default_rng(rows * e_total)
    eps = 1e-5
    x = R(rng, rows, e_total) * 2 + 3
    gamma, bet = R(rng, e_total), R(rng, e_total)
    dy = R(rng, rows, e_total)
    cuts = np.linspace(0, e_total, ntiles + 1).astype(int)
    sl = [slice(a, b) for a, b in zip(cuts[:-1], cuts[1:]) if b > a]
    c = np.ascontiguousarray
    # stats, tile by tile; GPU runs from the CPU's previous stats
    stats = nans(rows, 2)
    for s in sl:
        cs, _ = check(env, "layernorm_stats", dt,
                      dict(rows=rows, e=s.stop - s.start, e_offset=s.start),
                      [c(x[:, s]), stats], [1], mult=10,
                      scale=max(1.0, float((x ** 2).sum(1).max())) if dt == "bf16" else None)
        stats = cs[1]
    # e == 0 tile with e_offset 0 zeroes the stats
    _, g0 = run(env, "layernorm_stats", dt, dict(rows=rows, e=0, e_offset=0),
                [np.zeros(1), nans(rows, 2)])
    assert (g0[1] == 0).all()
    for s in sl:
        e = s.stop - s.start
        check(env, "layernorm_forward", dt,
              dict(rows=rows, e=e, e_total=e_total, eps=eps),
              [c(x[:, s]), stats, c(gamma[s]), c(bet[s]), nans(rows, e)], [4],
              mult=10)
    rowacc = nans(rows, 2)
    g_abs = float(np.abs(dy * gamma).sum(1).max() * 4)
    for t, s in enumerate(sl):
        e = s.stop - s.start
        cb, _ = check(env, "layernorm_backward_reduce", dt,
                      dict(rows=rows, e=e, e_total=e_total, eps=eps,
                           init=int(t == 0)),
                      [c(x[:, s]), c(dy[:, s]), stats, c(gamma[s]), rowacc,
                       R(rng, e), R(rng, e)], [4, 5, 6], mult=10,
                      scale={4: max(1.0, g_abs),
                             5: max(1.0, float(np.abs(dy).sum(0).max() * 4)),
                             6: max(1.0, float(np.abs(dy).sum(0).max()))})
        rowacc = cb[4]
    for beta in (0.0, 1.0):
        for s in sl:
            e = s.stop - s.start
            dx = nans(rows, e) if beta == 0 else R(rng, rows, e)
            check(env, "layernorm_backward", dt,
                  dict(rows=rows, e=e, e_total=e_total, eps=eps, beta=beta),
                  [c(x[:, s]), c(dy[:, s]), stats, c(gamma[s]), rowacc, dx],
                  [5], mult=50)
        if len(sl) == 1:  # a row in one tile: both in one op
            dw_abs = max(1.0, float(np.abs(dy).sum(0).max() * 4))
            check(env, "layernorm_backward_whole", dt,
                  dict(rows=rows, e=e_total, e_total=e_total, eps=eps, beta=beta),
                  [x, dy, stats, gamma, R(rng, e_total), R(rng, e_total),
                   nans(rows, e_total) if beta == 0 else R(rng, rows, e_total)],
                  [4, 5, 6], mult=50, scale={4: dw_abs, 5: dw_abs, 6: None})


# ---------------------------------------------------------------- Llama: RMSNorm, RoPE, SwiGLU

@pytest.mark.parametrize("dt", DT)
@pytest.mark.parametrize("rows,e_total,ntiles", [(1, 1, 1), (6, 70, 3), (3, 2000, 2),
                                                 (1000, 40, 2), (64, 2048, 1), (5, 33, 4),
                                                 (3000, 2048, 1), (17000, 64, 1), (40, 4096, 1),
                                                 (7, 4097, 1)])
def test_rmsnorm(env, dt, rows, e_total, ntiles):
    rng = np.random.default_rng(rows * e_total + 1)
    eps = 1e-5
    x = R(rng, rows, e_total) * 2 + 0.5
    w, dy = R(rng, e_total), R(rng, rows, e_total)
    cuts = np.linspace(0, e_total, ntiles + 1).astype(int)
    sl = [slice(a, b) for a, b in zip(cuts[:-1], cuts[1:]) if b > a]
    c = np.ascontiguousarray
    sumsq = float((x ** 2).sum(1).max())
    stats = nans(rows)  # GPU runs from the CPU's previous stats
    for t, s in enumerate(sl):
        cs, _ = check(env, "rmsnorm_stats", dt, dict(rows=rows, e=s.stop - s.start,
                                                     init=int(t == 0)),
                      [c(x[:, s]), stats], [1], mult=10, scale=max(1.0, sumsq))
        stats = cs[1]
    for s in sl:
        e = s.stop - s.start
        check(env, "rmsnorm_forward", dt, dict(rows=rows, e=e, e_total=e_total, eps=eps),
              [c(x[:, s]), stats, c(w[s]), nans(rows, e)], [3], mult=10)
    rowacc = nans(rows)
    g_abs = float(np.abs(dy * w).sum(1).max() * 4)
    for t, s in enumerate(sl):
        e = s.stop - s.start
        cb, _ = check(env, "rmsnorm_backward_reduce", dt,
                      dict(rows=rows, e=e, e_total=e_total, eps=eps, init=int(t == 0)),
                      [c(x[:, s]), c(dy[:, s]), stats, c(w[s]), rowacc, R(rng, e)], [4, 5],
                      mult=10, scale={4: max(1.0, g_abs),
                                      5: max(1.0, float(np.abs(dy).sum(0).max() * 4))})
        rowacc = cb[4]
    for beta in (0.0, 1.0):
        for s in sl:
            e = s.stop - s.start
            dx = nans(rows, e) if beta == 0 else R(rng, rows, e)
            check(env, "rmsnorm_backward", dt,
                  dict(rows=rows, e=e, e_total=e_total, eps=eps, beta=beta),
                  [c(x[:, s]), c(dy[:, s]), stats, c(w[s]), rowacc, dx], [5], mult=50)
        if len(sl) == 1:  # a row in one tile: both in one op
            check(env, "rmsnorm_backward_whole", dt,
                  dict(rows=rows, e=e_total, e_total=e_total, eps=eps, beta=beta),
                  [x, dy, stats, w, R(rng, e_total),
                   nans(rows, e_total) if beta == 0 else R(rng, rows, e_total)],
                  [4, 5], mult=50,
                  scale={4: max(1.0, float(np.abs(dy).sum(0).max() * 4)), 5: None})


@pytest.mark.parametrize("dt", DT)
@pytest.mark.parametrize("rows,heads,d,scale", [(1, 1, 2, 1.0), (5, 3, 8, 1.0),
                                                (7, 2, 64, 0.7), (1024, 16, 128, 1.0),
                                                (3, 4, 130, 1.0), (9, 6, 8, 1.0),
                                                (16391, 2, 128, 1.0)])
def test_rope(env, dt, rows, heads, d, scale):
    """the angle's cos and sin: float libm on the CPU, CUDA's sinf/cosf (2 ulp)"""
    rng = np.random.default_rng(rows + d)
    pos = rng.integers(0, 8192, rows)
    inv_freq = 1.0 / 10000.0 ** (np.arange(0, d, 2) / d)
    for op in ("rope_forward", "rope_backward"):
        check(env, op, dt, dict(rows=rows, heads=heads, head_dim=d, scale=scale),
              [pos, inv_freq, R(rng, rows, heads, d)], [2], mult=8)


@pytest.mark.parametrize("dt", DT)
@pytest.mark.parametrize("n", SIZES)
def test_swiglu(env, dt, n):
    rng = np.random.default_rng(n + 2)
    gate, up, dh = R(rng, n, scale=3.0), R(rng, n), R(rng, n)
    check(env, "swiglu_forward", dt, dict(n=n), [gate, up, nans(n)], [2], mult=2)
    check(env, "swiglu_backward", dt, dict(n=n), [gate, up, dh, nans(n), nans(n)], [3, 4],
          mult=2)


# ---------------------------------------------------------------- subcopy

@pytest.mark.parametrize("dt", DT)
@pytest.mark.parametrize("seed", range(12))
def test_subcopy(env, dt, seed):
    rng = np.random.default_rng(seed)
    ndim = [0, 1, 2, 3, 4, 5, 8][seed % 7]
    src_shape = list(rng.integers(1, 5 if ndim < 6 else 3, ndim))
    dst_shape = list(rng.integers(1, 5 if ndim < 6 else 3, ndim))
    cs, so, do = [], [], []
    for a, b in zip(src_shape, dst_shape):
        n = int(rng.integers(1, min(a, b) + 1))
        cs.append(n)
        so.append(int(rng.integers(0, a - n + 1)))
        do.append(int(rng.integers(0, b - n + 1)))
    if seed % 3 == 0 and ndim > 1:  # whole trailing axes: dimension merging
        dst_shape[1:] = src_shape[1:]
        cs[1:] = src_shape[1:]
        so[1:] = do[1:] = [0] * (ndim - 1)
    args = dict(ndim=ndim, src_shape=src_shape, dst_shape=dst_shape,
                copy_shape=cs, src_offset=so, dst_offset=do)
    c, g = run(env, "subcopy", dt, args,
               [R(rng, *src_shape), R(rng, *dst_shape)])
    np.testing.assert_array_equal(g[1], c[1])


# ---------------------------------------------------------------- optimizers

@pytest.mark.parametrize("dt", DT)
@pytest.mark.parametrize("decoupled,wd,max_norm,clip", [
    (0, 0.0, 0.0, False), (0, 0.1, 0.0, False), (1, 0.01, 0.0, False),
    (1, 0.1, 0.5, True), (0, 0.05, 100.0, True), (0, 0.0, 0.3, False)])
@pytest.mark.parametrize("n", [3001, UNROLLED])
def test_adam(env, dt, decoupled, wd, max_norm, clip, n):
    rng = np.random.default_rng(11)
    p, m, v = R(rng, n), np.zeros(n), np.zeros(n)
    for step in range(1, 4):
        g = R(rng, n)
        normsq = np.array([np.sum(g ** 2)]) if clip else None
        args = dict(n=n, step=step, lr=1e-2, beta1=0.9, beta2=0.95, eps=1e-8,
                    weight_decay=wd, decoupled=decoupled, max_norm=max_norm)
        c, _ = check(env, "adam_step", dt, args, [p, g, m, v, normsq],
                     [0, 2, 3], mult=4)
        p, m, v = c[0], c[2], c[3]
    # beta1 >= 0.5 lerp branch and beta1 < 0.5 branch
    args.update(beta1=0.3, step=2)
    check(env, "adam_step", dt, args, [p, R(rng, n), m, v, None], [0, 2, 3],
          mult=4)


@pytest.mark.parametrize("dt", DT)
@pytest.mark.parametrize("momentum,dampening,nesterov,wd,max_norm,step", [
    (0.0, 0.0, 0, 0.0, 0.0, 1), (0.9, 0.0, 0, 0.0, 0.0, 1),
    (0.9, 0.1, 0, 0.01, 0.0, 3), (0.8, 0.0, 1, 0.05, 0.0, 2),
    (0.0, 0.0, 0, 0.1, 0.7, 1), (0.9, 0.0, 1, 0.0, 0.5, 4)])
@pytest.mark.parametrize("n", [777, UNROLLED])
def test_sgd(env, dt, momentum, dampening, nesterov, wd, max_norm, step, n):
    rng = np.random.default_rng(12)
    g = R(rng, n)
    buf = nans(n) if (momentum == 0 or step <= 1) else R(rng, n)
    normsq = np.array([np.sum(g ** 2)]) if max_norm > 0 else None
    outs = [0] + ([2] if momentum != 0 else [])
    check(env, "sgd_step", dt, dict(n=n, step=step, lr=0.05, momentum=momentum,
                                    dampening=dampening, weight_decay=wd,
                                    nesterov=nesterov, max_norm=max_norm),
          [R(rng, n), g, buf, normsq], outs, mult=4)


# ---------------------------------------------------------------- gemm

GEMM_CASES = [
    # M, N, K, tA, tB, b1, b2, pad, beta, collapsible batch strides
    (1, 1, 1, 0, 0, 1, 1, 0, 0.0, False),
    (7, 5, 3, 1, 0, 2, 3, 1, 1.0, False),
    (9, 4, 11, 0, 1, 3, 2, 2, 0.5, False),
    (16, 33, 8, 1, 1, 1, 4, 0, 0.0, False),
    (5, 6, 7, 0, 0, 3, 1, 1, 0.0, False),
    (12, 10, 9, 1, 0, 2, 3, 0, 0.0, True),
    (6, 7, 0, 0, 0, 2, 2, 1, 0.0, False),   # K == 0, beta == 0
    (6, 7, 0, 1, 1, 2, 1, 1, 0.5, False),   # K == 0, beta != 0
    (130, 70, 300, 0, 0, 1, 2, 3, 0.0, False),
]


@pytest.mark.parametrize("dt", ["fp32", "fp64", "tf32", "bf16"])
@pytest.mark.parametrize("case", GEMM_CASES)
def test_gemm(env, dt, case):
    M, N, K, tA, tB, b1, b2, pad, beta, collapse = case
    rng = np.random.default_rng(M * N + K)
    ar, ac = (K, M) if tA else (M, K)
    br, bc = (N, K) if tB else (K, N)
    lda, ldb, ldc = max(ac, 1) + pad, max(bc, 1) + pad, N + pad
    sA2, sB2, sC2 = ar * lda + pad, br * ldb + pad, M * ldc + pad
    if collapse:
        sA1, sB1, sC1 = b2 * sA2, b2 * sB2, b2 * sC2
    else:  # independent batch1 strides (gaps between batch1 groups)
        sA1, sB1, sC1 = b2 * sA2 + 3, b2 * sB2 + 5, b2 * sC2 + 2
    A = R(rng, b1 * sA1 + 1)
    B = R(rng, b1 * sB1 + 1)
    C = R(rng, b1 * sC1 + 1)
    mask = np.zeros(C.size, dtype=bool)  # entries of the C matrices
    for i in range(b1):
        for j in range(b2):
            off = i * sC1 + j * sC2
            mask[off: off + M * ldc].reshape(M, ldc)[:, :N] = True
    if beta == 0:  # NaN inside the matrices only; padding keeps its values
        C[mask] = np.nan
    args = dict(transA=tA, transB=tB, M=M, N=N, K=K, alpha=0.8, beta=beta,
                batch1=b1, batch2=b2, lda=lda, ldb=ldb, ldc=ldc,
                strideA1=sA1, strideA2=sA2, strideB1=sB1, strideB2=sB2,
                strideC1=sC1, strideC2=sC2)
    sdt = "bf16" if dt == "bf16" else ("fp64" if dt == "fp64" else "fp32")
    c, g = run(env, "gemm", sdt, args, [A, B, C], gemm_dt=dt)
    Ain, Bin = c[0], c[1]  # inputs as stored (rounded), unchanged by gemm
    Cin = C.astype(np.float64 if sdt == "fp64" else np.float32)
    if sdt == "bf16":
        Cin = bf16_round(Cin)
    Cin = Cin.astype(np.float64)
    if env.cpu_gemm:
        ref = c[2]
    else:  # numpy float64 reference on the same (rounded) inputs
        ref = run_ref_gemm(Ain, Bin, Cin, args)
    # padding untouched, bit for bit
    np.testing.assert_array_equal(g[2][~mask], Cin[~mask])
    assert not np.isnan(g[2][mask]).any()
    # per-entry bound |alpha| sum |a||b| + |beta c|
    bound = run_ref_gemm(np.abs(Ain), np.abs(Bin),
                         np.where(np.isnan(Cin), 0.0, np.abs(Cin)),
                         dict(args, alpha=0.8, beta=abs(beta)))
    err = np.abs(g[2][mask] - ref[mask])
    tol = GEMM_RTOL[dt] * bound[mask]
    bad = err > tol
    assert not bad.any(), (f"{bad.sum()} of {bad.size} entries off; "
                           f"max err/bound {np.max(err / np.maximum(bound[mask], 1e-300))}")


def run_ref_gemm(A, B, C, a):
    ref = np.array(C, dtype=np.float64)
    M, N, K = a["M"], a["N"], a["K"]
    for i in range(a["batch1"]):
        for j in range(a["batch2"]):
            oa = i * a["strideA1"] + j * a["strideA2"]
            ob = i * a["strideB1"] + j * a["strideB2"]
            oc = i * a["strideC1"] + j * a["strideC2"]
            ar, ac = (K, M) if a["transA"] else (M, K)
            br, bc = (N, K) if a["transB"] else (K, N)
            am = (A[oa: oa + ar * a["lda"]].reshape(ar, a["lda"])[:, :ac]
                  if ar else np.zeros((ar, ac)))
            bm = (B[ob: ob + br * a["ldb"]].reshape(br, a["ldb"])[:, :bc]
                  if br else np.zeros((br, bc)))
            am = am.T if a["transA"] else am
            bm = bm.T if a["transB"] else bm
            cm = ref[oc: oc + M * a["ldc"]].reshape(M, a["ldc"])
            cm[:, :N] = a["alpha"] * (am @ bm) + (a["beta"] * cm[:, :N]
                                                   if a["beta"] else 0)
    return ref


# ---------------------------------------------------------------- bf16_fp32

def run_mixed(env, op, args, bufs):
    """The bf16_fp32 kernel of op on the CPU and the GPU from the same inputs: T buffers as
    bf16 bits, A buffers as float32, I as int64. Returns (cpu, gpu) float64 outputs."""
    roles = MIXED[op]
    st_ = make_args("adam_step" if op == "adam_step_refresh" else op, args)
    host, dev = [], []
    with env.stream:
        for role, b in zip(roles, bufs):
            if b is None:
                host.append(None)
                dev.append(None)
                continue
            h = np.ascontiguousarray(b, dtype={"T": np.float32, "A": np.float32,
                                                "I": np.int64}[role])
            if role == "T":
                h = bf16_bits(h).reshape(h.shape)
            host.append(h.copy())
            dev.append(cp.asarray(h))
        cpu_fn = getattr(env.cpu, f"nntile_kernel_{op}_bf16_fp32")
        cpu_fn.restype = None
        cpu_fn(ctypes.byref(st_), *[_ptr(h) for h in host])
        gpu_fn = getattr(env.cuda, f"nntile_cuda_{op}_bf16_fp32")
        gpu_fn.restype = None
        first = env.handle if op == "gemm" else ctypes.c_void_p(
            cp.cuda.get_current_stream().ptr)
        gpu_fn(ctypes.byref(st_), first, *[_dptr(d) for d in dev])
        out = [None if d is None else cp.asnumpy(d, stream=env.stream) for d in dev]
        env.stream.synchronize()

    def floats(role, a):
        if a is None or role == "I":
            return a
        return (bf16_to_f32(a).reshape(a.shape) if role == "T" else a).astype(np.float64)
    return ([floats(r, h) for r, h in zip(roles, host)],
            [floats(r, a) for r, a in zip(roles, out)])


def check_mixed(env, op, args, bufs, outs, rtol=1e-6, scale=None):
    """Accumulator outputs within rtol (fp32 arithmetic on both, double sums); data outputs
    within one bf16 rounding (the two sides round float values that may differ in the last
    float bits)."""
    c, g = run_mixed(env, op, args, bufs)
    for i in outs:
        close(g[i], c[i], "bf16", rtol=2 ** -8 if MIXED[op][i] == "T" else rtol,
              scale=scale)
    return c, g


@pytest.mark.parametrize("m,k,n", [(1, 1, 1), (3, 5, 1), (2, 7, 3), (300, 64, 1),
                                   (7, 300, 37), (4, 33000, 1), (3000, 3, 1),
                                   (1, UNROLLED, 1)])
def test_mixed_elementwise_and_reductions(env, m, k, n):
    rng = np.random.default_rng(m + k + n)
    x, y = R(rng, m, k, n), R(rng, m, k, n)
    mkn = dict(m=m, k=k, n=n)
    for beta in (0.0, 1.0, -0.5):
        check_mixed(env, "add", dict(n=x.size, alpha=0.3, beta=beta),
                    [x, nans(m, k, n) if beta == 0 else y], [1])
        check_mixed(env, "add_out", dict(n=x.size, alpha=0.3, beta=beta),
                    [x, y, nans(m, k, n)], [2])
        check_mixed(env, "add_fiber", dict(mkn, alpha=1.5, beta=beta),
                    [R(rng, k), nans(m, k, n) if beta == 0 else y], [1])
        check_mixed(env, "sum_fiber", dict(mkn, alpha=1.5, beta=beta),
                    [x, nans(k) if beta == 0 else R(rng, k)], [1],
                    scale=_red_scale(np.abs(x).sum(axis=(0, 2))))
        check_mixed(env, "sumprod_slice", dict(mkn, alpha=0.7, beta=beta),
                    [x, y, nans(m, n) if beta == 0 else R(rng, m, n)], [2],
                    scale=_red_scale(np.abs(x * y).sum(axis=1)))
    check_mixed(env, "cast", dict(n=x.size), [x, nans(m, k, n)], [1], rtol=0)
    check_mixed(env, "softmax_backward", dict(mkn, alpha=0.5), [x, R(rng, m, n), y], [2])
    s = 4 * x
    s[rng.random(s.shape) < 0.3] = -np.inf
    s[0, :, 0] = -np.inf  # a fully masked row
    for init in (1, 0):
        stats = nans(m, n, 2) if init else np.stack([R(rng, m, n), np.abs(R(rng, m, n))], -1)
        c, _ = check_mixed(env, "maxsumexp", dict(mkn, init=init), [s, stats], [1])
    check_mixed(env, "softmax_inplace", mkn, [c[1], s], [1])


@pytest.mark.parametrize("rows,v,voff", [(1, 1, 0), (5, 300, 0), (37, 1000, 500),
                                         (8, 50257, 0)])
def test_mixed_xent_and_layernorm(env, rows, v, voff):
    rng = np.random.default_rng(rows + v)
    logits = R(rng, rows, v, scale=3.0)
    labels = rng.integers(0, 2 * v + voff, rows)
    stats = np.stack([logits.max(1), np.exp(logits - logits.max(1, keepdims=True)).sum(1)], -1)
    args = dict(rows=rows, v=v, v_offset=voff)
    check_mixed(env, "xent_picked", args, [logits, labels, R(rng, rows)], [2])
    check_mixed(env, "xent_grad_inplace", dict(args, alpha=0.25), [stats, labels, logits], [2])
    x = R(rng, rows, v)
    ln = np.stack([x.mean(1), ((x - x.mean(1, keepdims=True)) ** 2).sum(1)], -1)
    check_mixed(env, "layernorm_forward", dict(rows=rows, e=v, e_total=v, eps=1e-5),
                [x, ln, R(rng, v), R(rng, v), nans(rows, v)], [4])
    check_mixed(env, "rmsnorm_forward", dict(rows=rows, e=v, e_total=v, eps=1e-5),
                [x, (x ** 2).sum(1), R(rng, v), nans(rows, v)], [3])
    if v % 2 == 0:
        for op in ("rope_forward", "rope_backward"):
            check_mixed(env, op, dict(rows=rows, heads=1, head_dim=v, scale=1.0),
                        [labels, 1.0 / 500.0 ** (np.arange(0, v, 2) / v), x], [2])


@pytest.mark.parametrize("case", GEMM_CASES)
def test_mixed_gemm_accumulates_into_fp32(env, case):
    """bf16 operands, fp32 C: both sides multiply the same bf16 values in fp32."""
    M, N, K, tA, tB, b1, b2, pad, beta, _ = case
    rng = np.random.default_rng(M * N + K + 1)
    ar, ac = (K, M) if tA else (M, K)
    br, bc = (N, K) if tB else (K, N)
    lda, ldb, ldc = max(ac, 1) + pad, max(bc, 1) + pad, N + pad
    sA2, sB2, sC2 = ar * lda + pad, br * ldb + pad, M * ldc + pad
    args = dict(transA=tA, transB=tB, M=M, N=N, K=K, alpha=0.8, beta=beta, batch1=b1,
                batch2=b2, lda=lda, ldb=ldb, ldc=ldc, strideA1=b2 * sA2, strideA2=sA2,
                strideB1=b2 * sB2, strideB2=sB2, strideC1=b2 * sC2, strideC2=sC2)
    C = R(rng, b1 * b2 * sC2 + 1)
    check_mixed(env, "gemm", args, [R(rng, b1 * b2 * sA2 + 1), R(rng, b1 * b2 * sB2 + 1), C],
                [2], rtol=GEMM_RTOL["fp32"], scale=max(1.0, K))


@pytest.mark.parametrize("max_norm", [0.0, 0.5])
@pytest.mark.parametrize("n", [3001, UNROLLED])
def test_mixed_adam_step_refresh(env, max_norm, n):
    rng = np.random.default_rng(4)
    g = R(rng, n)
    args = dict(n=n, step=3, lr=1e-2, beta1=0.9, beta2=0.95, eps=1e-8, weight_decay=0.1,
                decoupled=1, max_norm=max_norm)
    c, g_out = check_mixed(env, "adam_step_refresh", args,
                           [R(rng, n), g, R(rng, n) * 0.1, np.abs(R(rng, n)) * 0.01,
                            nans(n), np.array([np.sum(g ** 2)])], [0, 2, 3, 4], rtol=4e-6)
    np.testing.assert_array_equal(g_out[4], bf16_round(g_out[0]))  # the copy: p rounded
