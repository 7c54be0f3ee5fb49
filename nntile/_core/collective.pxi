# Collectives of tiles across data-parallel ranks, each running its own StarPU (collective.h):
# the gradient all-reduce (or, with sharded updates, reduce to owners and broadcast of the
# updated weights), submitted as tasks that run once the tiles are final, on NCCL (CUDA
# workers) or MPI (CPU workers). Declared in runtime.pxi, which stops them at shutdown.

# MPI counts are C ints
_MPI_COUNT_MAX = 2 ** 31 - 1


def collective_start_mpi(intptr_t comm_handle):
    """Collectives through MPI on a duplicate of the communicator (an mpi4py handle value)."""
    CHKERR(nntile_collective_start_mpi(comm_handle), "MPI collectives (this nntile has no MPI?)")


def nccl_open(str library_path, bint make_id):
    """Open NCCL; on the rank that makes it, return a new unique id (bytes), else None."""
    cdef char error[256]
    cdef char unique[128]
    error[0] = 0
    if nntile_nccl_open(library_path.encode(), make_id, unique, error, sizeof(error)) != 0:
        raise RuntimeError(f"NCCL: {error.decode(errors='replace')}")
    return unique[:NNTILE_NCCL_ID_BYTES] if make_id else None


def nccl_start(bytes unique_id, int nranks, int rank):
    """Join the NCCL communicator of unique_id on this process's first CUDA worker's GPU
    (StarPU running): the collectives then run there."""
    cdef char error[256]
    cdef int ret
    cdef const char *unique = unique_id
    if len(unique_id) != NNTILE_NCCL_ID_BYTES:
        raise ValueError(f"an NCCL unique id has {NNTILE_NCCL_ID_BYTES} bytes")
    error[0] = 0
    with nogil:
        ret = nntile_nccl_start(unique, nranks, rank, error, sizeof(error))
    if ret != 0:
        raise RuntimeError(f"NCCL: {error.decode(errors='replace')}")


def collective_stop():
    """Leave the communicators (every rank, with no collective in flight)."""
    nntile_collective_stop()


def collective_bytes():
    """Bytes of tiles handed to collectives since they started."""
    return nntile_collective_bytes()


def collective_check():
    """Raise if a collective failed inside a task since the collectives started."""
    cdef const char *error = nntile_collective_error()
    if error != NULL:
        raise RuntimeError(f"collective failed: {error.decode(errors='replace')}")


cdef int _submit_bucket(int kind, list handles, list roots, int dtype, int priority) except -1:
    cdef Py_ssize_t n = len(handles), i
    cdef starpu_data_handle_t *array = <starpu_data_handle_t *> malloc(
        n * sizeof(starpu_data_handle_t))
    cdef int *root_array = <int *> malloc(n * sizeof(int))
    try:
        if array == NULL or root_array == NULL:
            raise MemoryError()
        for i in range(n):
            array[i] = <starpu_data_handle_t> <intptr_t> handles[i]
            root_array[i] = roots[i]
        CHKERR(nntile_collective_submit(kind, array, root_array, n, dtype, priority),
               "collective submission")
    finally:
        free(array)
        free(root_array)
    return 0


cdef int _collective(int kind, tensors, roots, Py_ssize_t bucket_bytes, int priority) except -1:
    """Submit ``kind`` on the tiles of ``tensors`` in buckets of one dtype up to
    ``bucket_bytes`` (a tile larger goes alone), in the order given: every rank must pass the
    same tensors in the same order. ``roots``: per tensor, the root rank of each tile (None
    for an all-reduce). Each bucket is one task, which runs once its tiles are final (data
    dependencies), so buckets of the last layers travel while earlier layers still run
    backward."""
    cdef Tensor t
    cdef Py_ssize_t i, size, filled = 0
    cdef int dtype = -1
    cdef list bucket = [], bucket_roots = []
    tensors = list(tensors)
    roots = [None] * len(tensors) if roots is None else list(roots)
    if len(roots) != len(tensors):
        raise ValueError(f"{len(roots)} lists of roots for {len(tensors)} tensors")
    for t, tile_roots in zip(tensors, roots):
        t.check_usable("collective operand")
        if t.dtype not in FLOAT_DTYPES:
            raise TypeError(f"collectives take float tensors, not {t.dtype}")
        if tile_roots is not None and len(tile_roots) != t.traits.ntiles:
            raise ValueError(f"{len(tile_roots)} roots for {t.traits.ntiles} tiles")
        for i in range(t.traits.ntiles):
            size = starpu_data_get_size(t.handle(i))
            if size // t.itemsize > _MPI_COUNT_MAX:
                raise ValueError(f"a tile of {size // t.itemsize} elements is past MPI's "
                                 f"count limit; use smaller tiles")
            kind_dtype = NNTILE_FP32 if t.dtype_id == NNTILE_TF32 else t.dtype_id
            if bucket and (kind_dtype != dtype or filled + size > bucket_bytes):
                _submit_bucket(kind, bucket, bucket_roots, dtype, priority)
                bucket, bucket_roots, filled = [], [], 0
            bucket.append(<intptr_t> t.handle(i))
            bucket_roots.append(0 if tile_roots is None else int(tile_roots[i]))
            dtype, filled = kind_dtype, filled + size
    if bucket:
        _submit_bucket(kind, bucket, bucket_roots, dtype, priority)
    return 0


def allreduce_sum(tensors, Py_ssize_t bucket_bytes, int priority=0):
    """Replace every tile of ``tensors`` by its sum over the data-parallel ranks, in buckets
    of tiles (see _collective)."""
    _collective(NNTILE_ALLREDUCE, tensors, None, bucket_bytes, priority)


def reduce_sum(tensors, roots, Py_ssize_t bucket_bytes, int priority=0):
    """Sum each tile of ``tensors`` over the data-parallel ranks into the tile of its root
    rank (``roots``: per tensor, a rank per tile); the other ranks' tiles are only read, in
    buckets of tiles (see _collective)."""
    _collective(NNTILE_REDUCE, tensors, roots, bucket_bytes, priority)


def broadcast(tensors, roots, Py_ssize_t bucket_bytes, int priority=0):
    """Copy each tile of ``tensors`` from its root rank (``roots``: per tensor, a rank per
    tile) to the other ranks, whose tiles are only written, in buckets of tiles (see
    _collective)."""
    _collective(NNTILE_BROADCAST, tensors, roots, bucket_bytes, priority)
