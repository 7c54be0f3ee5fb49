"""What this machine offers a run, or a described one (nntile.plan plans for another): the
GPUs this process may use and their memory, the host memory still available (capped by a
cgroup limit), its cores, and the disk swap the STARPU_DISK_SWAP* variables ask for.
"""
import contextlib
import os
import re
import shutil
import subprocess
from dataclasses import dataclass

from nntile._core.core import HAVE_CUDA
from nntile.distributed import local_rank, local_rank_gpus, one_core_rank, rank_cores
from nntile.declare import GiB, MiB
from nntile.policy import Machine

DISK_SWAP_MIN = 16 << 20           # StarPU asserts (aborts) on a smaller disk (core/disk.c)


def _visible(entries):
    """Indices or UUIDs in CUDA_VISIBLE_DEVICES (None: all devices)."""
    value = os.environ.get("CUDA_VISIBLE_DEVICES")
    if value is None:
        return entries
    chosen = []
    for item in (x.strip() for x in value.split(",")):
        if not item:
            continue
        match = [g for g in entries if g[0] == item or (item.startswith("GPU-")
                                                          and g[1].startswith(item))]
        if not match:
            break  # CUDA stops at the first invalid entry
        chosen += match
    return chosen


def gpu_memory():
    """Total memory in bytes of each GPU this process may use: the described machine's
    (``described``), else nvidia-smi (no CUDA context in this process), else CuPy; [] when
    neither answers."""
    if _described is not None:
        return list(_described.gpus)
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=index,uuid,memory.total",
                              "--format=csv,noheader,nounits"], capture_output=True,
                             text=True, timeout=20)
        entries = []
        for line in out.stdout.splitlines():
            fields = [f.strip() for f in line.split(",")]
            if len(fields) == 3 and fields[2].isdigit():
                entries.append((fields[0], fields[1], int(fields[2]) * MiB))
        if out.returncode == 0 and entries:
            return [g[2] for g in _visible(entries)]
    except (OSError, subprocess.SubprocessError):
        pass
    try:
        import cupy
        runtime = cupy.cuda.runtime
        return [runtime.getDeviceProperties(d)["totalGlobalMem"]
                for d in range(runtime.getDeviceCount())]
    except Exception:  # no CuPy, no driver, no device
        return []


def _meminfo(key):
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith(key + ":"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


def _cgroup_free():
    """Bytes left under this process's cgroup memory limit (None when unlimited)."""
    for limit_path, usage_path in (("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory.current"),
                                   ("/sys/fs/cgroup/memory/memory.limit_in_bytes",
                                    "/sys/fs/cgroup/memory/memory.usage_in_bytes")):
        try:
            with open(limit_path) as f:
                limit = f.read().strip()
            with open(usage_path) as f:
                usage = int(f.read().strip())
        except (OSError, ValueError):
            continue
        if limit.isdigit() and int(limit) < (1 << 60):
            return max(0, int(limit) - usage)
    return None


def host_memory():
    """Host bytes this process can still use: the described machine's, else MemAvailable,
    capped by a cgroup limit."""
    if _described is not None:
        return _described.host
    free = _meminfo("MemAvailable") or _meminfo("MemTotal") or 0
    cgroup = _cgroup_free()
    return min(free, cgroup) if cgroup is not None else free


def probe(mpi=False):
    """What this process may use, as nntile.policy's rules read it: its cores, the memory of
    each visible GPU (none in a build without CUDA), whether it is an MPI rank of one core."""
    cuda = cuda_built()
    cores = _described.cores if _described is not None and _described.cores else None
    return Machine(cores=cores or len(rank_cores()), gpus=tuple(gpu_memory()) if cuda else (),
                   mpi=mpi, one_core=mpi and (cores == 1 if cores else one_core_rank()),
                   cuda_built=cuda)


# ---- a described machine: plans for another machine than this one ------------------------

@dataclass(frozen=True)
class Described:
    """A machine to plan for instead of this one: bytes of each GPU, host bytes available,
    cores (None: this machine's). nntile.plan sets it; gpu_memory, host_memory and machine
    then answer with it, so every rule reads it where it reads this machine."""
    gpus: tuple = ()
    host: int = 0
    cores: int = None


_described = None
_UNITS = {"": 1, "b": 1, "kib": 1 << 10, "mib": MiB, "gib": GiB, "tib": 1 << 40,
          "kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12}


def parse_bytes(text):
    """Bytes of "80GiB", "81559 MiB", "80GB" or a number of bytes; ValueError otherwise."""
    match = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([kmgt]i?b|b)?\s*", str(text), re.I)
    if not match:
        raise ValueError(f"{text!r} is not a size (e.g. 80GiB, 81559MiB, 128GB)")
    return int(float(match[1]) * _UNITS[(match[2] or "").lower()])


def _gpu_list(text):
    """(bytes, ...) of "1x80GiB", "2x80GiB+1x40GiB", "none" or a JSON list of sizes."""
    if isinstance(text, (list, tuple)):
        return tuple(parse_bytes(g) for g in text)
    if str(text).strip().lower() in ("0", "none", ""):
        return ()
    gpus = []
    for part in str(text).split("+"):
        count, _, size = part.rpartition("x")
        if not count.strip().isdigit():
            raise ValueError(f"gpus {part!r}: write COUNTxSIZE, e.g. 1x80GiB")
        gpus += [parse_bytes(size)] * int(count)
    return tuple(gpus)


def parse_machine(text):
    """A Described machine of "gpus=1x80GiB,host=128GiB[,cores=16]" or of the same keys as
    JSON ({"gpus": "1x80GiB", "host": "128GiB"}; sizes may be numbers of bytes). Left out:
    gpus none, host this machine's available memory. ValueError names what is wrong."""
    import json
    text = text.strip()
    if text.startswith("{"):
        try:
            fields = json.loads(text)
        except ValueError as exc:
            raise ValueError(f"--machine: not JSON: {exc}") from None
    else:
        pairs = [p.partition("=") for p in text.split(",") if p.strip()]
        fields = {key.strip(): value for key, eq, value in pairs if eq}
        if len(fields) != len(pairs):
            raise ValueError(f"--machine {text!r}: write KEY=VALUE pairs, e.g. "
                             "gpus=1x80GiB,host=128GiB")
    unknown = set(fields) - {"gpus", "host", "cores"}
    if unknown:
        raise ValueError(f"--machine: unknown key(s) {', '.join(sorted(unknown))}: use gpus, "
                         "host and cores")
    cores = fields.get("cores")
    if cores is not None and not (str(cores).isdigit() and int(cores) > 0):
        raise ValueError(f"--machine: cores {cores!r} should be a whole number (1 or more)")
    host = parse_bytes(fields["host"]) if "host" in fields else host_memory()
    return Described(_gpu_list(fields.get("gpus", ())), host, int(cores) if cores else None)


@contextlib.contextmanager
def described(machine):
    """Within it, this process plans for ``machine`` (a Described; None: this machine)."""
    global _described
    before, _described = _described, machine
    try:
        yield machine
    finally:
        _described = before


def cuda_built():
    """Whether StarPU would drive GPUs: a described machine with GPUs, else this build."""
    if _described is not None:
        return bool(_described.gpus)
    return HAVE_CUDA


def available(ncuda=None):
    """(GPU bytes, host bytes): the total memory of the GPUs StarPU would use (the first
    ``ncuda`` visible ones; 0 without GPUs) and the host memory available now."""
    gpus = gpu_memory()
    if ncuda is not None:
        gpus = gpus[:ncuda]
    return sum(gpus), host_memory()


def env_int(name):
    """An integer environment variable (None when unset or not a number)."""
    value = os.environ.get(name, "").strip()
    return int(value) if re.fullmatch(r"\d+", value) else None


def check_ncuda(ncuda):
    """Raise ValueError where ``ncuda`` asks for more GPUs than this process sees (StarPU
    would start with fewer, and say so only in a warning)."""
    if not ncuda or _described is not None or not HAVE_CUDA:
        return
    visible = len(gpu_memory())
    if visible and int(ncuda) > visible:
        shown = os.environ.get("CUDA_VISIBLE_DEVICES")
        raise ValueError(f"ncuda={ncuda} asks for {ncuda} GPUs, but this process sees {visible}"
                         + (f" (CUDA_VISIBLE_DEVICES={shown})" if shown is not None else ""))


def check_disk_swap_env():
    """Raise ValueError for a STARPU_DISK_SWAP_SIZE StarPU would abort on (below 16 MiB,
    or not a number of MiB) while STARPU_DISK_SWAP asks for a disk swap."""
    if not os.environ.get("STARPU_DISK_SWAP"):
        return
    text = os.environ.get("STARPU_DISK_SWAP_SIZE", "").strip()
    if not text:
        return
    if not re.fullmatch(r"\d+", text):
        raise ValueError(f"STARPU_DISK_SWAP_SIZE={text!r} should be a whole number of MiB")
    if int(text) * MiB < DISK_SWAP_MIN:
        raise ValueError(f"STARPU_DISK_SWAP_SIZE={text} MiB: StarPU needs a disk swap of at "
                         f"least {DISK_SWAP_MIN // MiB} MiB (it aborts on less)")


def use_disk_swap(directory, size_mib=None, backend=None, unaligned_tiles=0):
    """Give StarPU a disk swap in `directory`, through the STARPU_DISK_SWAP variables it reads
    when it starts: size_mib MiB (default: the directory's free space) and `backend` (default
    unistd_o_direct, or unistd where `unaligned_tiles` of the run are not whole pages, which
    unistd_o_direct aborts on: src/core/disk_ops/disk_unistd_o_direct.c). Returns the
    backend."""
    if backend is None:
        backend = "unistd" if unaligned_tiles else "unistd_o_direct"
    os.environ["STARPU_DISK_SWAP"] = os.path.abspath(directory)
    os.environ["STARPU_DISK_SWAP_BACKEND"] = backend
    if size_mib:
        os.environ["STARPU_DISK_SWAP_SIZE"] = str(size_mib)
    else:
        os.environ.pop("STARPU_DISK_SWAP_SIZE", None)
    check_disk_swap_env()  # a size StarPU would abort on makes no directory
    os.makedirs(directory, exist_ok=True)
    return backend


def disk_swap_bytes():
    """The disk swap StarPU will register from STARPU_DISK_SWAP[_SIZE] (0 without)."""
    path = os.environ.get("STARPU_DISK_SWAP")
    if not path:
        return 0
    check_disk_swap_env()
    size = env_int("STARPU_DISK_SWAP_SIZE")
    try:
        free = shutil.disk_usage(path).free
    except OSError:
        return 0
    return min(size * MiB, free) if size is not None else free


def gpus_of_this_process(ncuda):
    """Memory of each GPU StarPU will use in this process: the visible ones, or under mpirun
    with several ranks on the node the ones its local rank takes (the Context's choice)."""
    if _described is not None:  # another machine: this one's StarPU variables say nothing of it
        return list(_described.gpus)[:ncuda] if ncuda is not None else list(_described.gpus)
    if ncuda is None:
        ncuda = env_int("STARPU_NCUDA")
    gpus = gpu_memory() if cuda_built() and ncuda != 0 else []
    chosen = local_rank_gpus(ncuda)
    named = os.environ.get("STARPU_WORKERS_CUDAID", "").replace(",", " ").split()
    if chosen is None and all(n.isdigit() for n in named) and named:
        chosen = [int(n) for n in named]
    if chosen is not None:
        gpus = [gpus[i] for i in chosen if i < len(gpus)]
    return gpus[:ncuda] if ncuda is not None else gpus


def host_memory_of_this_process():
    """Host memory available now, shared equally among the ranks of this node."""
    local = local_rank()
    return host_memory() // (local[1] if local else 1)
