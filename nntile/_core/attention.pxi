# Ops of the attention and linear layers that work on several tensor dimensions at once:
# bias over trailing dimensions, per-head products between [B, T, H, D] activations and
# [B, H, Tq, Tk] score tensors (strided tile GEMMs, so no transposed copies are made), and the
# keys and values of grouped-query attention laid out per query head for those products.


cdef int _trailing_match(str op, Tensor small, str sname, Tensor big, str bname) except -1:
    cdef Py_ssize_t nd = small.traits.ndim
    if nd == 0 or nd > big.traits.ndim:
        raise ValueError(f"{op}: {sname} must have between 1 and {big.traits.ndim} dimensions")
    if small.traits.shape != big.traits.shape[big.traits.ndim - nd:]:
        raise ValueError(f"{op}: {sname}{small.traits.shape} does not match the trailing "
                         f"dimensions of {bname}{big.traits.shape}")
    if small.traits.basetile != big.traits.basetile[big.traits.ndim - nd:]:
        raise ValueError(f"{op}: {sname} is tiled {small.traits.basetile} but the trailing "
                         f"dimensions of {bname} are tiled {big.traits.basetile[big.traits.ndim - nd:]}")
    return 0


cdef _bias_loop(int op, int column, double alpha, Tensor bias, double beta, Tensor big,
                bint reduce):
    cdef Py_ssize_t nd = bias.traits.ndim, lead = big.traits.ndim - nd
    cdef Py_ssize_t coords[MAX_NDIM]
    cdef Py_ssize_t i, d, m, k, b_lin
    cdef starpu_data_handle_t h[2]
    cdef nntile_add_fiber_args args  # same layout as nntile_sum_fiber_args
    seen = set()
    for i in range(big.traits.ntiles):
        big.traits.tile_coords(i, coords)
        m = 1
        k = 1
        for d in range(lead):
            m *= big.traits.tile_dim(d, coords[d])
        for d in range(nd):
            k *= big.traits.tile_dim(lead + d, coords[lead + d])
        b_lin = bias.traits.tile_linear(&coords[lead])
        args.m = m
        args.k = k
        args.n = 1
        args.alpha = alpha
        if reduce:
            # the bias tile accumulates the sums of every tile that shares it
            args.beta = 1.0 if b_lin in seen else beta
            seen.add(b_lin)
            h[BUF_sum_fiber_src] = big.handles[i]
            h[BUF_sum_fiber_fiber] = bias.handles[b_lin]
        else:
            args.beta = beta
            h[BUF_add_fiber_fiber] = bias.handles[b_lin]
            h[BUF_add_fiber_dst] = big.handles[i]
        submit(op, column, 2, h, &args, sizeof(args))


def add_bias(alpha, Tensor bias, beta, Tensor dst):
    """dst[..., j] = alpha*bias[j] + beta*dst[..., j], bias spanning dst's trailing dims (bias
    may be fp32 where dst is bf16)."""
    cdef int column = _column("add_bias", [(dst, "dst")], [(bias, "bias")])
    _trailing_match("add_bias", bias, "bias", dst, "dst")
    _bias_loop(NNTILE_OP_add_fiber, column, alpha, bias, beta, dst, False)


def sum_bias(alpha, Tensor src, beta, Tensor bias):
    """bias[j] = alpha * sum over src's leading dims of src[..., j] + beta*bias[j] (bias may be
    fp32 where src is bf16)."""
    cdef int column = _column("sum_bias", [(src, "src")], [(bias, "bias")])
    _trailing_match("sum_bias", bias, "bias", src, "src")
    _bias_loop(NNTILE_OP_sum_fiber, column, alpha, bias, beta, src, True)


cdef int _check_heads(str op, Tensor X, str xname, Tensor S, str sname, int seq_axis_s) except -1:
    """X is [B, T, H, D] with D in one tile; S is [B, H, Tq, Tk]; T matches S's seq_axis_s."""
    _usable(X, xname)
    _same_dtype(op, X, xname, S, sname)
    _float_dtype(op, X, xname)
    if X.traits.ndim != 4 or S.traits.ndim != 4:
        raise ValueError(f"{op}: {xname} must be [batch, seq, heads, head_dim] and {sname} "
                         f"[batch, heads, seq_q, seq_k]")
    if X.traits.basetile[3] != X.traits.shape[3]:
        raise ValueError(f"{op}: the head dimension of {xname} must be one tile")
    pairs = ((0, 0, "batch"), (2, 1, "heads"), (1, seq_axis_s, "sequence"))
    for xa, sa, what in pairs:
        if X.traits.shape[xa] != S.traits.shape[sa] or X.traits.basetile[xa] != S.traits.basetile[sa]:
            raise ValueError(f"{op}: {what} of {xname}{X.traits.shape} tiled "
                             f"{X.traits.basetile} does not match {sname}{S.traits.shape} "
                             f"tiled {S.traits.basetile}")
    return 0


cdef inline bint _masked_out(TensorTraits st, nntile_mask m, Py_ssize_t qi, Py_ssize_t ki):
    """True when no query of score tile row qi sees a key of tile column ki."""
    cdef Py_ssize_t q0 = qi * st._basetile[2]
    cdef (Py_ssize_t, Py_ssize_t) keys = _key_tiles(m, q0, q0 + st.tile_dim(2, qi),
                                                    st._shape[3], st._basetile[3])
    return not keys[0] <= ki < keys[1]


def mask_scores(Tensor dst, AttentionMask mask not None=_CAUSAL):
    """Set dst[..., q, k] = -inf where ``mask`` (an AttentionMask) hides key k from query q
    (queries on axis -2, keys on axis -1)."""
    _float_same("mask_scores", [(dst, "dst")])
    cdef Py_ssize_t nd = dst.traits.ndim
    if nd < 2:
        raise ValueError(f"mask_scores: dst must have at least 2 dimensions (queries, keys), "
                         f"got shape {dst.traits.shape}")
    cdef nntile_mask_scores_args args
    args.mask = mask.m
    cdef starpu_data_handle_t h[1]
    cdef Py_ssize_t coords[MAX_NDIM]
    cdef Py_ssize_t i, d, batch
    for i in range(dst.traits.ntiles):
        dst.traits.tile_coords(i, coords)
        args.tq = dst.traits.tile_dim(nd - 2, coords[nd - 2])
        args.tk = dst.traits.tile_dim(nd - 1, coords[nd - 1])
        args.q_offset = coords[nd - 2] * dst.traits._basetile[nd - 2]
        args.k_offset = coords[nd - 1] * dst.traits._basetile[nd - 1]
        if nntile_mask_whole(args.mask, args.q_offset, args.q_offset + args.tq, args.k_offset,
                             args.k_offset + args.tk):
            continue  # every key of this tile is visible from every query: nothing to mask
        batch = 1
        for d in range(nd - 2):
            batch *= dst.traits.tile_dim(d, coords[d])
        args.batch = batch
        h[BUF_mask_scores_dst] = dst.handles[i]
        submit(NNTILE_OP_mask_scores, dst.dtype_id, 1, h, &args, sizeof(args))


cdef _head_gemm(Tensor A, Py_ssize_t a_lin, Tensor B, Py_ssize_t b_lin, Tensor C,
                Py_ssize_t c_lin, nntile_gemm_args *args):
    cdef starpu_data_handle_t h[3]
    h[BUF_gemm_A] = A.handles[a_lin]
    h[BUF_gemm_B] = B.handles[b_lin]
    h[BUF_gemm_C] = C.handles[c_lin]
    submit(NNTILE_OP_gemm, C.dtype_id, 3, h, args, sizeof(nntile_gemm_args))


def attn_qk(alpha, Tensor X, Tensor Y, Tensor S, AttentionMask mask not None=_CAUSAL,
            masked_value=float("-inf")):
    """S[b, h, q, k] = alpha * sum_d X[b, q, h, d] * Y[b, k, h, d].

    Score tiles that ``mask`` (an AttentionMask) hides wholly are filled with
    ``masked_value`` instead of computed: -inf for scores (the mask inside the other tiles is
    applied by mask_scores), 0 for gradients of probabilities that are zero there.
    """
    cdef nntile_mask m = mask.m
    _usable(S, "S")
    _check_heads("attn_qk", X, "X", S, "S", 2)
    _check_heads("attn_qk", Y, "Y", S, "S", 3)
    _distinct("attn_qk", [(X, "X"), (S, "S")])
    _distinct("attn_qk", [(Y, "Y"), (S, "S")])
    cdef TensorTraits st = S.traits
    cdef Py_ssize_t c[4]
    cdef Py_ssize_t xc[4]
    cdef Py_ssize_t yc[4]
    cdef Py_ssize_t i, bt, ht, tq, tk, D = X.traits.shape[3]
    cdef nntile_gemm_args args
    cdef nntile_fill_args fargs
    cdef starpu_data_handle_t h[1]
    fargs.value = masked_value
    args.transA = 0
    args.transB = 1
    args.alpha = alpha
    args.beta = 0.0
    for i in range(st.ntiles):
        st.tile_coords(i, c)
        bt = st.tile_dim(0, c[0])
        ht = st.tile_dim(1, c[1])
        tq = st.tile_dim(2, c[2])
        tk = st.tile_dim(3, c[3])
        if _masked_out(st, m, c[2], c[3]):
            fargs.n = bt * ht * tq * tk
            h[BUF_fill_dst] = S.handles[i]
            submit(NNTILE_OP_fill, S.dtype_id, 1, h, &fargs, sizeof(fargs))
            continue
        xc[0] = c[0]; xc[1] = c[2]; xc[2] = c[1]; xc[3] = 0
        yc[0] = c[0]; yc[1] = c[3]; yc[2] = c[1]; yc[3] = 0
        args.M = tq
        args.N = tk
        args.K = D
        args.batch1 = bt
        args.batch2 = ht
        args.lda = ht * D
        args.ldb = ht * D
        args.ldc = tk
        args.strideA1 = tq * ht * D
        args.strideA2 = D
        args.strideB1 = tk * ht * D
        args.strideB2 = D
        args.strideC1 = ht * tq * tk
        args.strideC2 = tq * tk
        _head_gemm(X, X.traits.tile_linear(xc), Y, Y.traits.tile_linear(yc), S, i, &args)


def attn_pv(alpha, Tensor P, Tensor Y, Tensor O, AttentionMask mask not None=_CAUSAL):
    """O[b, q, h, :] = alpha * sum_k P[b, h, q, k] * Y[b, k, h, :]  (overwrites O); the
    tiles of P that ``mask`` hides wholly (attn_qk) are left out."""
    cdef nntile_mask m = mask.m
    _usable(P, "P")
    _usable(O, "O")
    _check_heads("attn_pv", Y, "Y", P, "P", 3)
    _check_heads("attn_pv", O, "O", P, "P", 2)
    _distinct("attn_pv", [(P, "P"), (O, "O")])
    _distinct("attn_pv", [(Y, "Y"), (O, "O")])
    _attn_sum(alpha, P, Y, O, m, False)


def attn_ptv(alpha, Tensor P, Tensor Y, Tensor O, AttentionMask mask not None=_CAUSAL):
    """O[b, k, h, :] = alpha * sum_q P[b, h, q, k] * Y[b, q, h, :]  (overwrites O); the
    tiles of P that ``mask`` hides wholly (attn_qk) are left out."""
    cdef nntile_mask m = mask.m
    _usable(P, "P")
    _usable(O, "O")
    _check_heads("attn_ptv", Y, "Y", P, "P", 2)
    _check_heads("attn_ptv", O, "O", P, "P", 3)
    _distinct("attn_ptv", [(P, "P"), (O, "O")])
    _distinct("attn_ptv", [(Y, "Y"), (O, "O")])
    _attn_sum(alpha, P, Y, O, m, True)


cdef _attn_sum(double alpha, Tensor P, Tensor Y, Tensor O, nntile_mask m, bint transposed):
    cdef TensorTraits pt = P.traits
    cdef TensorTraits ot = O.traits
    cdef Py_ssize_t oc[4]
    cdef Py_ssize_t pc[4]
    cdef Py_ssize_t yc[4]
    cdef Py_ssize_t i, r, bt, ht, to, tr, D = O.traits.shape[3]
    # The summed-over sequence axis of P: keys (3) for P @ Y, queries (2) for P^T @ Y.
    cdef int sum_axis = 2 if transposed else 3
    cdef int out_axis = 3 if transposed else 2
    cdef nntile_gemm_args args
    cdef nntile_fill_args fargs
    cdef starpu_data_handle_t h[1]
    cdef bint first
    args.transA = transposed
    args.transB = 0
    args.alpha = alpha
    for i in range(ot.ntiles):
        ot.tile_coords(i, oc)
        bt = ot.tile_dim(0, oc[0])
        ht = ot.tile_dim(2, oc[2])
        to = ot.tile_dim(1, oc[1])
        first = True
        for r in range(pt._grid[sum_axis]):
            pc[0] = oc[0]
            pc[1] = oc[2]
            pc[out_axis] = oc[1]
            pc[sum_axis] = r
            if _masked_out(pt, m, pc[2], pc[3]):
                continue
            tr = pt.tile_dim(sum_axis, r)
            yc[0] = oc[0]; yc[1] = r; yc[2] = oc[2]; yc[3] = 0
            args.M = to
            args.N = D
            args.K = tr
            args.batch1 = bt
            args.batch2 = ht
            args.lda = to if transposed else tr
            args.ldb = ht * D
            args.ldc = ht * D
            args.strideA1 = ht * to * tr
            args.strideA2 = to * tr
            args.strideB1 = tr * ht * D
            args.strideB2 = D
            args.strideC1 = to * ht * D
            args.strideC2 = D
            args.beta = 0.0 if first else 1.0
            first = False
            _head_gemm(P, pt.tile_linear(pc), Y, Y.traits.tile_linear(yc), O, i, &args)
        if first:  # the mask hides every pair of this output tile
            fargs.n = bt * to * ht * D
            fargs.value = 0.0
            h[BUF_fill_dst] = O.handles[i]
            submit(NNTILE_OP_fill, O.dtype_id, 1, h, &fargs, sizeof(fargs))


cdef Py_ssize_t _check_groups(str op, Tensor q, str qrole, Tensor k, str krole,
                              Py_ssize_t offset=0, bint cache=False) except -1:
    """q [B, T, H, D] tiled (bt, tt, ht, D) and k [B, T + offset, Hkv, D] tiled
    (bt, tt, ht / g, D), g = H / Hkv query heads sharing each kv head (grouped-query
    attention), a head tile of q covering whole groups; returns g. ``cache``: k may be a
    key/value cache, longer than T + offset (keys past the last query's, which causal
    attention hides) and tiled apart along the sequence."""
    for t, role in ((q, qrole), (k, krole)):
        if t.traits.ndim != 4:
            raise ValueError(f"{op}: {role} has shape {t.traits.shape}; it must be "
                             "[batch, seq, heads, head_dim]")
    cdef tuple qs = q.traits.shape, qt = q.traits.basetile, ks = k.traits.shape
    if qt[3] != qs[3]:
        raise ValueError(f"{op}: {qrole} is tiled {qt}; its head dimension must be one tile")
    if ks[0] != qs[0] or ks[3] != qs[3] or not (
            ks[1] == qs[1] + offset or cache and ks[1] > qs[1] + offset):
        longer = " at least" if cache else ""
        raise ValueError(f"{op}: {krole}{ks} must match {qrole}{qs} in batch and head_dim, "
                         f"and its sequence must be{longer} {qrole}'s + the offset ({offset})")
    if qs[2] % ks[2]:
        raise ValueError(f"{op}: {qrole} has {qs[2]} heads, {krole} has {ks[2]}: the query "
                         "heads must be a whole number of groups of one kv head each")
    cdef Py_ssize_t g = qs[2] // ks[2]
    if qt[2] % g:
        raise ValueError(f"{op}: a head tile of {qt[2]} query heads does not cover whole "
                         f"groups of {g} (the heads that share a kv head); use a multiple of {g}")
    _expect_traits(op, k, krole, ks,
                   (qt[0], k.traits.basetile[1] if cache else qt[1], qt[2] // g, qt[3]),
                   f"{qrole}'s tiles, with {g} query heads per kv head")
    return g


cdef _kv_groups(str name, int op, Tensor src, str srole, Tensor dst, str drole, bint repeat):
    """One task per tile: a tile of the per-query-head tensor is [m, g, D] to the kernel and
    its kv tile [m, D] (m = batch x seq x kv heads of the tile): add_slice broadcasts the kv
    tile over the group, sum_slice sums the group into it."""
    _float_same(name, [(src, srole), (dst, drole)])
    _distinct(name, [(src, srole), (dst, drole)])
    cdef Tensor heads = dst if repeat else src, kv = src if repeat else dst
    cdef Py_ssize_t g = _check_groups(name, heads, drole if repeat else srole, kv,
                                      srole if repeat else drole)
    cdef nntile_add_slice_args args  # same layout as nntile_sum_slice_args
    cdef starpu_data_handle_t h[2]
    cdef Py_ssize_t i
    args.alpha = 1.0
    args.beta = 0.0
    args.k = g
    args.n = kv.traits.shape[3]
    for i in range(kv.traits.ntiles):
        args.m = _tile_nelems(kv, i) // args.n
        # the two grids are the same; add_slice's and sum_slice's buffers are (src, dst)
        h[BUF_add_slice_src] = src.handles[i]
        h[BUF_add_slice_dst] = dst.handles[i]
        submit(op, dst.dtype_id, 2, h, &args, sizeof(args))


def repeat_kv(Tensor kv, Tensor dst):
    """dst[b, t, h, :] = kv[b, t, h // g, :], g = dst's heads / kv's heads: the keys or values
    of grouped-query attention, one copy per query head, for attn_qk and attn_pv. dst is
    tiled as kv with head tiles g times larger (whole groups)."""
    _kv_groups("repeat_kv", NNTILE_OP_add_slice, kv, "kv", dst, "dst", True)


def sum_kv(Tensor src, Tensor kv):
    """kv[b, t, j, :] = the sum over the g query heads h of group j of src[b, t, h, :]
    (overwrites kv): the gradient of the keys or values that repeat_kv copied."""
    _kv_groups("sum_kv", NNTILE_OP_sum_slice, src, "src", kv, "kv", False)
