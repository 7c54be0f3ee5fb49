# Tensor ops: validate everything, then loop over tiles and submit one task per tile piece.
from libc.stdlib cimport malloc
from libc.string cimport memcpy
from nntile._core.kernel_args cimport *

include "codelet_table.pxi"

DEF NMAXBUFS = 8

# The priority of the tasks submitted from now on: models raise it for the layers that come
# first on the step's critical path (see GPT2LMHead), so that a scheduler whose queues sort by
# priority runs, and fetches tiles for, the next layer before work that can wait.
cdef int _task_priority = 0
# The kind of worker the tasks submitted from now on may run on (0: any the codelet has), so
# that a program can keep, say, the optimizer next to its states in host memory.
cdef int _task_where = 0
_WORKER_KINDS = {None: 0, "cpu": STARPU_CPU, "cuda": STARPU_CUDA}


def set_task_priority(int priority):
    """Give the tasks submitted after this call ``priority`` (higher runs first where several
    are ready; 0 is the default); returns the previous value."""
    global _task_priority
    previous, _task_priority = _task_priority, priority
    return previous


def set_task_workers(kind):
    """Run the tasks submitted after this call only on ``kind`` workers ("cpu", "cuda", or
    None for any); returns the previous kind. The workers must exist when tasks are
    submitted (see Context's ncpu and ncuda)."""
    global _task_where
    if kind not in _WORKER_KINDS:
        raise ValueError(f"task workers {kind!r}: use 'cpu', 'cuda' or None")
    previous = next(k for k, v in _WORKER_KINDS.items() if v == _task_where)
    _task_where = _WORKER_KINDS[kind]
    return previous


cdef int submit(int op, int dtype, int nbuf, starpu_data_handle_t *handles,
                starpu_data_access_mode *modes, const void *args, size_t argsize) except -1:
    """Submit one task of ``op`` on ``nbuf`` tiles; the only place tasks are created."""
    cdef starpu_codelet *cl = nntile_codelet(op, dtype)
    if cl == NULL:
        raise TypeError(f"op {nntile_op_name(op).decode()} has no kernel for dtype "
                        f"{_DTYPE_NAMES[dtype]}")
    cdef starpu_task *task = starpu_task_create()
    if task == NULL:
        raise MemoryError("starpu_task_create")
    cdef int i, ret
    task.cl = cl
    task.nbuffers = nbuf
    for i in range(nbuf):
        task.handles[i] = handles[i]
        task.modes[i] = modes[i]
    task.cl_arg = malloc(argsize)
    if task.cl_arg == NULL:
        nntile_task_discard(task)
        raise MemoryError()
    memcpy(task.cl_arg, args, argsize)
    task.cl_arg_size = argsize
    task.cl_arg_free = 1
    task.priority = _task_priority
    if _task_where:
        task.where = _task_where
    if _mpi_on:
        # owner computes: runs here only if this rank owns the written tiles, else this
        # rank just sends what it owns of the task's inputs (the call consumes the task)
        with nogil:
            ret = nntile_mpi_submit(task)
        return check(ret, "starpu-mpi task submission")
    with nogil:
        ret = starpu_task_submit(task)
    if ret != 0:
        nntile_task_discard(task)
    return check(ret, "starpu_task_submit")


_DTYPE_NAMES = {v[0]: k for k, v in DTYPES.items() if k != "tf32"}
_DTYPE_NAMES[NNTILE_TF32] = "tf32"
_DTYPE_NAMES[NNTILE_BF16_FP32] = "bf16 with fp32 accumulators"


# ---- validation shared by every op ---------------------------------------------------------

cdef int _usable(Tensor t, str role) except -1:
    if t is None:
        raise TypeError(f"{role} must be an nntile.Tensor, got None")
    return t.check_usable(role)


cdef int _same_dtype(str op, Tensor a, str role_a, Tensor b, str role_b) except -1:
    if a.dtype != b.dtype:
        raise TypeError(f"{op}: {role_a} is {a.dtype} but {role_b} is {b.dtype}; "
                        "convert one of them first")
    return 0


cdef int _float_dtype(str op, Tensor t, str role) except -1:
    if t.dtype not in FLOAT_DTYPES:
        raise TypeError(f"{op}: {role} must be a floating-point tensor, got {t.dtype}")
    return 0


cdef int _column(str op, list data, list acc) except -1:
    """The op table column that runs an op on these tensors. Kernels have data buffers and
    accumulator buffers (statistics, reductions, GEMM outputs that accumulate; see
    kernels/kernels.h); ``data`` and ``acc`` are the (tensor, role) pairs of each kind. One
    dtype for all selects that dtype's column; bf16 data with fp32 accumulators select the
    mixed-precision column."""
    for t, role in data + acc:
        _usable(t, role)
        _float_dtype(op, t, role)
    for group in (data, acc):
        for t, role in group[1:]:
            _same_dtype(op, group[0][0], group[0][1], t, role)
    cdef Tensor d = (data or acc)[0][0]
    cdef Tensor a = (acc or data)[0][0]
    if d.dtype == a.dtype:
        return d.dtype_id
    if d.dtype == "bf16" and a.dtype == "fp32":
        return NNTILE_BF16_FP32
    raise TypeError(f"{op}: {(data or acc)[0][1]} is {d.dtype} but {(acc or data)[0][1]} is "
                    f"{a.dtype}; use one dtype, or bf16 with fp32 accumulators (mixed "
                    "precision)")


cdef int _same_traits(str op, Tensor a, str role_a, Tensor b, str role_b) except -1:
    if a.traits.shape != b.traits.shape:
        raise ValueError(f"{op}: {role_a} has shape {a.traits.shape} but {role_b} has shape "
                         f"{b.traits.shape}")
    if a.traits.basetile != b.traits.basetile:
        raise ValueError(f"{op}: {role_a} is tiled {a.traits.basetile} but {role_b} is tiled "
                         f"{b.traits.basetile}; tilings must match")
    return 0


cdef Py_ssize_t _tile_nelems(Tensor t, Py_ssize_t linear):
    cdef Py_ssize_t coords[MAX_NDIM]
    t.traits.tile_coords(linear, coords)
    return t.traits.tile_nelems_c(coords)


# ---- elementwise ---------------------------------------------------------------------------

def fill(value, Tensor dst):
    """Set every element of ``dst`` to ``value``."""
    _usable(dst, "dst")
    cdef nntile_fill_args args
    cdef starpu_data_handle_t h[1]
    cdef starpu_data_access_mode m[1]
    args.value = float(value)
    if dst.dtype == "int64":
        if args.value != int(value):
            raise ValueError(f"fill: {value!r} is not an integer, and dst is int64")
        # Integer tensors hold token ids, written from the host; filling them there keeps
        # every task kernel floating-point (and runnable on any worker).
        dst.write(np.full(dst.traits.shape, int(value), dtype=np.int64))
        return
    m[0] = STARPU_W
    cdef Py_ssize_t i
    for i in range(dst.traits.ntiles):
        args.n = _tile_nelems(dst, i)
        h[0] = dst.handles[i]
        submit(NNTILE_OP_fill, dst.dtype_id, 1, h, m, &args, sizeof(args))


def copy(Tensor src, Tensor dst):
    """dst = src; the two may be tiled differently (tiles are re-cut)."""
    _usable(src, "src")
    _usable(dst, "dst")
    _same_dtype("copy", src, "src", dst, "dst")
    if src.traits.shape != dst.traits.shape:
        raise ValueError(f"copy: src has shape {src.traits.shape} but dst has shape "
                         f"{dst.traits.shape}")
    cdef starpu_data_handle_t h[2]
    cdef starpu_data_access_mode m[2]
    cdef nntile_copy_args args
    cdef Py_ssize_t i
    if src.traits.basetile == dst.traits.basetile:
        m[0] = STARPU_R
        m[1] = STARPU_W
        for i in range(src.traits.ntiles):
            args.n = _tile_nelems(src, i)
            h[0] = src.handles[i]
            h[1] = dst.handles[i]
            submit(NNTILE_OP_copy, src.dtype_id, 2, h, m, &args, sizeof(args))
        return
    _copy_retile(src, dst)


cdef _copy_retile(Tensor src, Tensor dst):
    cdef Py_ssize_t ndim = src.traits.ndim
    if ndim > 8:
        raise ValueError(f"copy between different tilings supports at most 8 dimensions, "
                         f"got {ndim}")
    if src.dtype == "int64":
        raise TypeError("copy between different tilings is not available for int64 tensors")
    cdef nntile_subcopy_args args
    cdef starpu_data_handle_t h[2]
    cdef starpu_data_access_mode m[2]
    cdef Py_ssize_t d, j
    args.ndim = ndim
    m[0] = STARPU_R
    for j in range(dst.traits.ntiles):
        dst_off = dst.traits.tile_offset(j)
        dst_shape = dst.traits.tile_shape(j)
        # Source tiles that overlap this destination tile, along each axis.
        ranges = [range(dst_off[d] // src.traits.basetile[d],
                        (dst_off[d] + dst_shape[d] - 1) // src.traits.basetile[d] + 1)
                  for d in range(ndim)]
        first = True
        for src_index in _product(ranges):
            src_off = src.traits.tile_offset(src_index)
            src_shape = src.traits.tile_shape(src_index)
            for d in range(ndim):
                lo = max(src_off[d], dst_off[d])
                hi = min(src_off[d] + src_shape[d], dst_off[d] + dst_shape[d])
                args.src_shape[d] = src_shape[d]
                args.dst_shape[d] = dst_shape[d]
                args.copy_shape[d] = hi - lo
                args.src_offset[d] = lo - src_off[d]
                args.dst_offset[d] = lo - dst_off[d]
            h[0] = src.handles[src.traits.index_to_linear(src_index)]
            h[1] = dst.handles[j]
            # The pieces cover the whole destination tile, so the first need not read it.
            m[1] = STARPU_W if first else STARPU_RW
            first = False
            submit(NNTILE_OP_subcopy, src.dtype_id, 2, h, m, &args, sizeof(args))


def _product(ranges):
    import itertools
    return itertools.product(*ranges)


def add(alpha, Tensor src, beta, Tensor dst):
    """dst = alpha*src + beta*dst (dst may be fp32 where src is bf16)."""
    cdef int column = _column("add", [(src, "src")], [(dst, "dst")])
    _same_traits("add", src, "src", dst, "dst")
    cdef nntile_add_args args
    cdef starpu_data_handle_t h[2]
    cdef starpu_data_access_mode m[2]
    args.alpha = alpha
    args.beta = beta
    m[0] = STARPU_R
    m[1] = STARPU_W if args.beta == 0 else STARPU_RW
    cdef Py_ssize_t i
    for i in range(dst.traits.ntiles):
        args.n = _tile_nelems(dst, i)
        h[0] = src.handles[i]
        h[1] = dst.handles[i]
        submit(NNTILE_OP_add, column, 2, h, m, &args, sizeof(args))


def cast(Tensor src, Tensor dst):
    """dst = src rounded to dst's dtype: fp32 to bf16 (one task per tile), or a copy where
    the dtypes are the same."""
    if src is not None and dst is not None and src.dtype == dst.dtype:
        return copy(src, dst)
    cdef int column = _column("cast", [(dst, "dst")], [(src, "src")])
    _same_traits("cast", src, "src", dst, "dst")
    cdef nntile_cast_args args
    cdef starpu_data_handle_t h[2]
    cdef starpu_data_access_mode m[2]
    m[0] = STARPU_R
    m[1] = STARPU_W
    cdef Py_ssize_t i
    for i in range(dst.traits.ntiles):
        args.n = _tile_nelems(dst, i)
        h[0] = src.handles[i]
        h[1] = dst.handles[i]
        submit(NNTILE_OP_cast, column, 2, h, m, &args, sizeof(args))


def scal(alpha, Tensor dst):
    """dst *= alpha."""
    _usable(dst, "dst")
    _float_dtype("scal", dst, "dst")
    cdef nntile_scal_args args
    cdef starpu_data_handle_t h[1]
    cdef starpu_data_access_mode m[1]
    args.alpha = alpha
    m[0] = STARPU_RW
    cdef Py_ssize_t i
    for i in range(dst.traits.ntiles):
        args.n = _tile_nelems(dst, i)
        h[0] = dst.handles[i]
        submit(NNTILE_OP_scal, dst.dtype_id, 1, h, m, &args, sizeof(args))


# ---- GEMM ----------------------------------------------------------------------------------

cdef bint _trans_flag(object value, str name) except -1:
    if isinstance(value, str):
        if value.upper() in ("N", "NOTRANS"):
            return False
        if value.upper() in ("T", "TRANS"):
            return True
        raise ValueError(f"gemm: {name}={value!r}; use 'N' or 'T' (or False/True)")
    if isinstance(value, (bool, int)) and value in (0, 1):
        return bool(value)
    raise ValueError(f"gemm: {name}={value!r}; use 'N' or 'T' (or False/True)")


def gemm(alpha, Tensor A, transA, Tensor B, transB, beta, Tensor C, int ndim=1,
         int batch_ndim=0):
    """C = alpha * op(A) @ op(B) + beta * C over tiles, row-major.

    The leading ``batch_ndim`` dimensions of A, B and C are batch dimensions. ``ndim``
    dimensions are contracted: op(A) has shape batch + M + K and op(B) batch + K + N, where
    K is ``ndim`` dimensions and M, N any number; C has shape batch + M + N. Transposing A
    stores it as batch + K + M (B as batch + N + K). The partial products over the tiles of
    K are accumulated into each C tile in an order StarPU enforces. C may be fp32 where A and
    B are bf16 (fp32 accumulation either way).
    """
    cdef int column = _column("gemm", [(A, "A"), (B, "B")], [(C, "C")])
    # C's tiles are written while other tasks still read A's and B's
    _distinct("gemm", [(A, "A"), (C, "C")])
    _distinct("gemm", [(B, "B"), (C, "C")])
    cdef bint ta = _trans_flag(transA, "transA")
    cdef bint tb = _trans_flag(transB, "transB")
    if ndim < 1 or batch_ndim < 0:
        raise ValueError(f"gemm: ndim={ndim} must be >= 1 and batch_ndim={batch_ndim} >= 0")
    cdef Py_ssize_t m_ndim = A.traits.ndim - batch_ndim - ndim
    cdef Py_ssize_t n_ndim = B.traits.ndim - batch_ndim - ndim
    if m_ndim < 0 or n_ndim < 0 or C.traits.ndim != batch_ndim + m_ndim + n_ndim:
        raise ValueError(
            f"gemm: with batch_ndim={batch_ndim} and ndim={ndim}, A{A.traits.shape}, "
            f"B{B.traits.shape} and C{C.traits.shape} have inconsistent numbers of dimensions")
    cdef Py_ssize_t nb = batch_ndim
    # Axes of each operand grouped as (batch, M, K) and so on, in storage order.
    a_batch = list(range(nb))
    a_m = list(range(nb + ndim, nb + ndim + m_ndim)) if ta else list(range(nb, nb + m_ndim))
    a_k = list(range(nb, nb + ndim)) if ta else list(range(nb + m_ndim, nb + m_ndim + ndim))
    b_k = list(range(nb + n_ndim, nb + n_ndim + ndim)) if tb else list(range(nb, nb + ndim))
    b_n = list(range(nb, nb + n_ndim)) if tb else list(range(nb + ndim, nb + ndim + n_ndim))
    c_m = list(range(nb, nb + m_ndim))
    c_n = list(range(nb + m_ndim, nb + m_ndim + n_ndim))

    def pair_check(what, Tensor X, xaxes, str xname, Tensor Y, yaxes, str yname):
        xs = tuple(X.traits.shape[i] for i in xaxes)
        ys = tuple(Y.traits.shape[i] for i in yaxes)
        if xs != ys:
            raise ValueError(f"gemm: {what} dimensions differ: {xname}{X.traits.shape} has "
                             f"{xs}, {yname}{Y.traits.shape} has {ys}")
        xt = tuple(X.traits.basetile[i] for i in xaxes)
        yt = tuple(Y.traits.basetile[i] for i in yaxes)
        if xt != yt:
            raise ValueError(f"gemm: {what} dimensions are tiled differently: {xname} tiles "
                             f"{xt}, {yname} tiles {yt}")

    pair_check("batch", A, a_batch, "A", C, list(range(nb)), "C")
    pair_check("batch", B, list(range(nb)), "B", C, list(range(nb)), "C")
    pair_check("M", A, a_m, "A", C, c_m, "C")
    pair_check("N", B, b_n, "B", C, c_n, "C")
    pair_check("contracted (K)", A, a_k, "A", B, b_k, "B")

    cdef nntile_gemm_args args
    cdef starpu_data_handle_t h[3]
    cdef starpu_data_access_mode m[3]
    cdef Py_ssize_t c_lin, k_lin, d, Mt, Nt, Kt, Bt
    cdef Py_ssize_t c_coords[MAX_NDIM]
    cdef Py_ssize_t a_coords[MAX_NDIM]
    cdef Py_ssize_t b_coords[MAX_NDIM]
    cdef Py_ssize_t k_coords[MAX_NDIM]
    k_grid = TensorTraits(tuple(A.traits.shape[i] for i in a_k),
                          tuple(A.traits.basetile[i] for i in a_k)) 
    cdef TensorTraits kg = k_grid
    args.transA = ta
    args.transB = tb
    args.alpha = alpha
    args.batch2 = 1
    args.strideA2 = args.strideB2 = args.strideC2 = 0
    m[0] = STARPU_R
    m[1] = STARPU_R
    cdef double beta_value = beta
    for c_lin in range(C.traits.ntiles):
        C.traits.tile_coords(c_lin, c_coords)
        Bt = 1
        Mt = 1
        Nt = 1
        for d in range(nb):
            Bt *= C.traits.tile_dim(d, c_coords[d])
            a_coords[d] = c_coords[d]
            b_coords[d] = c_coords[d]
        for d in range(m_ndim):
            Mt *= C.traits.tile_dim(nb + d, c_coords[nb + d])
            a_coords[<Py_ssize_t> a_m[d]] = c_coords[nb + d]
        for d in range(n_ndim):
            Nt *= C.traits.tile_dim(nb + m_ndim + d, c_coords[nb + m_ndim + d])
            b_coords[<Py_ssize_t> b_n[d]] = c_coords[nb + m_ndim + d]
        for k_lin in range(kg.ntiles):
            kg.tile_coords(k_lin, k_coords)
            Kt = 1
            for d in range(ndim):
                Kt *= kg.tile_dim(d, k_coords[d])
                a_coords[<Py_ssize_t> a_k[d]] = k_coords[d]
                b_coords[<Py_ssize_t> b_k[d]] = k_coords[d]
            args.M = Mt
            args.N = Nt
            args.K = Kt
            args.batch1 = Bt
            args.lda = Mt if ta else Kt
            args.ldb = Kt if tb else Nt
            args.ldc = Nt
            args.strideA1 = Mt * Kt
            args.strideB1 = Kt * Nt
            args.strideC1 = Mt * Nt
            # The first partial product overwrites C when beta is 0; later ones accumulate.
            args.beta = beta_value if k_lin == 0 else 1.0
            m[2] = STARPU_W if args.beta == 0 else STARPU_RW
            h[0] = A.handles[A.traits.tile_linear(a_coords)]
            h[1] = B.handles[B.traits.tile_linear(b_coords)]
            h[2] = C.handles[c_lin]
            submit(NNTILE_OP_gemm, column, 3, h, m, &args, sizeof(args))


def _bench_bare_task_insert(Tensor dst, Py_ssize_t ntasks):
    """Baseline for the per-task overhead benchmark: a C loop of starpu_task_insert calls
    running the same scal kernel on one tile, with no Python per task."""
    _usable(dst, "dst")
    _float_dtype("scal", dst, "dst")
    cdef starpu_codelet *cl = nntile_codelet(NNTILE_OP_scal, dst.dtype_id)
    cdef starpu_data_handle_t h = dst.handles[0]
    cdef nntile_scal_args *args
    cdef Py_ssize_t i
    cdef int ret = 0
    cdef int rw = STARPU_RW
    with nogil:
        for i in range(ntasks):
            args = <nntile_scal_args *> malloc(sizeof(nntile_scal_args))
            args.n = 1
            args.alpha = 1.0
            ret = starpu_task_insert(cl, rw, h, STARPU_CL_ARGS, args, sizeof(nntile_scal_args), 0)
            if ret != 0:
                break
    check(ret, "starpu_task_insert")
