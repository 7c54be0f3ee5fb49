"""How fast this machine pins host memory: cudaHostAlloc (portable, as StarPU allocates the host
copies of the tiles it evicts from a GPU) of --gib GiB in pieces of each --pieces MiB, then
cudaFreeHost. Past GPU memory the first steps allocate this memory as tiles are first evicted
(docs/performance.md, "Step 1 past GPU memory").

    python3 bench/pinned_alloc.py --gib 8 --pieces 64 160 640
"""
import argparse
import ctypes
import ctypes.util
import time

CUDA_HOST_ALLOC_PORTABLE = 1


def cudart():
    for name in ("libcudart.so", "libcudart.so.13", "libcudart.so.12",
                 ctypes.util.find_library("cudart")):
        try:
            return ctypes.CDLL(name)
        except (OSError, TypeError):
            continue
    raise SystemExit("pinned_alloc: no CUDA runtime (libcudart) found")


def check(rt, err, call):
    if err != 0:
        rt.cudaGetErrorString.restype = ctypes.c_char_p
        raise SystemExit(f"pinned_alloc: {call}: {rt.cudaGetErrorString(err).decode()}")


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--gib", type=int, default=8, help="GiB allocated per piece size")
    p.add_argument("--pieces", type=int, nargs="+", default=[64, 160, 640], metavar="MIB")
    args = p.parse_args()
    if args.gib < 1 or min(args.pieces) < 1:
        p.error("--gib and --pieces must be positive")
    rt = cudart()
    check(rt, rt.cudaFree(None), "cudaFree(0)")  # the context, outside the timing
    for mib in args.pieces:
        ptrs, start = [], time.perf_counter()
        try:
            for _ in range(max(1, args.gib * 1024 // mib)):
                ptr = ctypes.c_void_p()
                check(rt, rt.cudaHostAlloc(ctypes.byref(ptr), ctypes.c_size_t(mib << 20),
                                           CUDA_HOST_ALLOC_PORTABLE), "cudaHostAlloc")
                ptrs.append(ptr)
            alloc = time.perf_counter() - start
        finally:
            start = time.perf_counter()
            for ptr in ptrs:
                rt.cudaFreeHost(ptr)
            free = time.perf_counter() - start
        gib = len(ptrs) * mib / 1024
        print(f"pieces of {mib} MiB: {alloc / gib:.3f} s per GiB pinned, {free / gib:.3f} s per "
              f"GiB freed ({gib:.0f} GiB)")


if __name__ == "__main__":
    main()
