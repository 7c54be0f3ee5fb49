"""How fast this machine pins host memory, by each way a program can pin it: --gib GiB in
pieces of each --pieces MiB, then freed.

- alloc: cudaHostAlloc (portable), as StarPU allocates the host copies of the tiles it evicts
  from a GPU; with --threads N, N threads allocate their shares at once;
- register: anonymous mmap, transparent huge pages asked for (madvise), the pages touched by
  --threads threads, then cudaHostRegister (portable); the touch and the registration are
  timed apart;
With --contend, each way pins on a thread of its own while this one copies 4 MiB to the GPU
and waits, again and again, as the thread of StarPU's CUDA workers would: the copies' latency,
with and without the pinning beside them, tells whether pinning elsewhere still stalls the
GPU's thread (a lock in the driver).

Past GPU memory the first steps allocate this memory as tiles are first evicted
(docs/performance.md, "Step 1 past GPU memory").

    python3 bench/pinned_alloc.py --gib 8 --pieces 256 1024 --ways alloc register --threads 1 4
    python3 bench/pinned_alloc.py --gib 6 --pieces 1024 --ways alloc register --contend
"""
import argparse
import ctypes
import ctypes.util
import threading
import time

CUDA_HOST_ALLOC_PORTABLE = 1
CUDA_HOST_REGISTER_PORTABLE = 1
PROT_READ_WRITE, MAP_PRIVATE_ANONYMOUS, MADV_HUGEPAGE = 3, 0x22, 14


def cudart():
    for name in ("libcudart.so", "libcudart.so.13", "libcudart.so.12",
                 ctypes.util.find_library("cudart")):
        try:
            return ctypes.CDLL(name)
        except (OSError, TypeError):
            continue
    raise SystemExit("pinned_alloc: no CUDA runtime (libcudart) found")


def libc():
    lib = ctypes.CDLL(None, use_errno=True)
    lib.mmap.restype = ctypes.c_void_p
    lib.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int,
                         ctypes.c_int, ctypes.c_long]
    lib.madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    lib.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
    lib.memset.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_size_t]
    return lib


def check(rt, err, call):
    if err != 0:
        rt.cudaGetErrorString.restype = ctypes.c_char_p
        raise SystemExit(f"pinned_alloc: {call}: {rt.cudaGetErrorString(err).decode()}")


def in_threads(nthreads, items, work):
    """Run work(item) for every item, the items split between nthreads threads (ctypes
    releases the GIL during each foreign call)."""
    shares = [items[i::nthreads] for i in range(nthreads)]
    threads = [threading.Thread(target=lambda s=s: [work(x) for x in s]) for s in shares]
    for t in threads:
        t.start()
    for t in threads:
        t.join()


def by_alloc(rt, size, count, nthreads):
    ptrs = [ctypes.c_void_p() for _ in range(count)]
    start = time.perf_counter()
    in_threads(nthreads, ptrs, lambda ptr: check(rt, rt.cudaHostAlloc(
        ctypes.byref(ptr), ctypes.c_size_t(size), CUDA_HOST_ALLOC_PORTABLE), "cudaHostAlloc"))
    alloc = time.perf_counter() - start
    start = time.perf_counter()
    in_threads(nthreads, ptrs, rt.cudaFreeHost)
    return {"pin": alloc}, time.perf_counter() - start


def by_register(rt, size, count, nthreads):
    c = libc()
    start = time.perf_counter()
    ptrs = []
    for _ in range(count):
        ptr = c.mmap(None, size, PROT_READ_WRITE, MAP_PRIVATE_ANONYMOUS, -1, 0)
        if ptr in (None, ctypes.c_void_p(-1).value):
            raise SystemExit(f"pinned_alloc: mmap failed (errno {ctypes.get_errno()})")
        c.madvise(ptr, size, MADV_HUGEPAGE)  # a kernel without THP ignores it
        ptrs.append(ptr)
    # touch in 64 MiB slices so that every thread has work whatever the piece size
    slices = [(p + off, min(64 << 20, size - off)) for p in ptrs for off in range(0, size, 64 << 20)]
    in_threads(nthreads, slices, lambda s: c.memset(s[0], 0, s[1]))
    touch = time.perf_counter() - start
    start = time.perf_counter()
    in_threads(nthreads, ptrs, lambda p: check(rt, rt.cudaHostRegister(
        ctypes.c_void_p(p), ctypes.c_size_t(size), CUDA_HOST_REGISTER_PORTABLE),
        "cudaHostRegister"))
    register = time.perf_counter() - start
    start = time.perf_counter()
    for p in ptrs:
        rt.cudaHostUnregister(ctypes.c_void_p(p))
        c.munmap(p, size)
    return {"touch": touch, "register": register, "pin": touch + register}, \
        time.perf_counter() - start


def copy_latencies(rt, seconds, stop=None):
    """Latencies (s) of 4 MiB host-to-GPU copies and their waits, for ``seconds`` or until
    ``stop`` is set."""
    size, host, dev, stream = 4 << 20, ctypes.c_void_p(), ctypes.c_void_p(), ctypes.c_void_p()
    check(rt, rt.cudaHostAlloc(ctypes.byref(host), ctypes.c_size_t(size), 0), "cudaHostAlloc")
    check(rt, rt.cudaMalloc(ctypes.byref(dev), ctypes.c_size_t(size)), "cudaMalloc")
    check(rt, rt.cudaStreamCreate(ctypes.byref(stream)), "cudaStreamCreate")
    lat, end = [], time.perf_counter() + seconds
    while time.perf_counter() < end and not (stop and stop.is_set()):
        t = time.perf_counter()
        rt.cudaMemcpyAsync(dev, host, ctypes.c_size_t(size), 1, stream)
        rt.cudaStreamSynchronize(stream)
        lat.append(time.perf_counter() - t)
    rt.cudaStreamDestroy(stream), rt.cudaFree(dev), rt.cudaFreeHost(host)
    return sorted(lat)


def contended(rt, way, size, count, nthreads):
    """``way`` on a thread of its own, with copy_latencies here meanwhile."""
    quiet = copy_latencies(rt, 1.0)
    done, result = threading.Event(), {}

    def pin():
        result["times"], result["free"] = way(rt, size, count, nthreads)
        done.set()
    pinner = threading.Thread(target=pin)
    pinner.start()
    busy = copy_latencies(rt, 1e9, done)
    pinner.join()
    for name, lat in (("quiet", quiet), ("pinning beside", busy)):
        print(f"  copy latency, {name}: median {1e3 * lat[len(lat) // 2]:.2f} ms, p99 "
              f"{1e3 * lat[int(0.99 * (len(lat) - 1))]:.2f} ms, max {1e3 * lat[-1]:.2f} ms, "
              f"{len(lat)} copies", flush=True)
    return result["times"], result["free"]


WAYS = {"alloc": by_alloc, "register": by_register}


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--gib", type=int, default=8, help="GiB pinned per way and piece size")
    p.add_argument("--pieces", type=int, nargs="+", default=[160, 640], metavar="MIB")
    p.add_argument("--ways", nargs="+", choices=sorted(WAYS), default=["alloc"])
    p.add_argument("--threads", type=int, nargs="+", default=[1])
    p.add_argument("--contend", action="store_true",
                   help="copy to the GPU from this thread meanwhile, and time the copies")
    args = p.parse_args()
    if args.gib < 1 or min(args.pieces) < 1 or min(args.threads) < 1:
        p.error("--gib, --pieces and --threads must be positive")
    rt = cudart()
    check(rt, rt.cudaFree(None), "cudaFree(0)")  # the context, outside the timing
    for way in args.ways:
        for nthreads in args.threads:
            for mib in args.pieces:
                count = max(1, args.gib * 1024 // mib)
                if args.contend:
                    times, free = contended(rt, WAYS[way], mib << 20, count, nthreads)
                else:
                    times, free = WAYS[way](rt, mib << 20, count, nthreads)
                gib = count * mib / 1024
                parts = ", ".join(f"{k} {v / gib:.3f}" for k, v in times.items())
                print(f"RESULT way={way} contend={args.contend} threads={nthreads} piece_mib={mib} "
                      f"s_per_gib_pinned={times['pin'] / gib:.3f} ({parts}) "
                      f"s_per_gib_freed={free / gib:.3f} gib={gib:.0f}", flush=True)


if __name__ == "__main__":
    main()
