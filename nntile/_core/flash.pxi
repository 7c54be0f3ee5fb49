# Fused attention (flash attention): softmax(scale q k^T, causal mask) v without the [T, T]
# scores. Only the output and each row's log-sum-exp are kept; backward recomputes the
# probabilities. q and o are [B, T, H, D] tiled (bt, tt, ht, D); k and v are [B, T, Hkv, D]
# tiled (bt, tt, ht / g, D) with g = H / Hkv query heads per kv head (grouped-query
# attention: query head h reads kv head h / g, and query head tile j reads kv head tile j);
# lse is [B, T, H] tiled (bt, tt, ht), in fp32 for bf16 data and in the data's dtype
# otherwise. One task per (batch tile, head tile, query tile, key tile); the key tiles that
# causality masks out for a query tile entirely get no task (kernels/kernels.h, flash_args).
from libc.math cimport isfinite


cdef int _check_flash(str op, list data, Tensor lse, tuple outputs, scale) except -1:
    """Every check of flash_attention and its backward: ``data`` the (tensor, role) pairs of
    q, k, v, o and, for backward, dout, dq, dk, dv; ``outputs`` the roles written. Returns the
    op table column."""
    cdef int column = _column(op, data, [(lse, "lse")])
    cdef dict t = {role: tensor for tensor, role in data}
    cdef Tensor q = t["q"], k = t["k"]
    if q.dtype == "bf16" and lse.dtype != "fp32":
        raise TypeError(f"{op}: lse must be fp32 for bf16 data (the log-sum-exp of every row "
                        f"is kept in fp32), got {lse.dtype}")
    _check_groups(op, q, "q", k, "k")
    if lse.traits.ndim != 3:
        raise ValueError(f"{op}: lse has shape {lse.traits.shape}; it must be "
                         "[batch, seq, heads]")
    cdef tuple qs = q.traits.shape, qt = q.traits.basetile
    for tensor, role in data:
        if role in ("k", "v", "dk", "dv"):
            _same_traits(op, k, "k", tensor, role)
        else:
            _same_traits(op, q, "q", tensor, role)
    _expect_traits(op, lse, "lse", qs[:3], qt[:3], "q's without head_dim")
    for out in data + [(lse, "lse")]:
        if out[1] in outputs:
            for other in data + [(lse, "lse")]:
                if other[1] != out[1]:
                    _distinct(op, [other, out])
    if isinstance(scale, bool) or not isinstance(scale, (int, float)) or not isfinite(scale):
        raise ValueError(f"{op}: scale must be a finite number, got {scale!r}")
    return column


cdef _flash_tasks(int op, int column, Tensor q, Tensor k, list tiles, double scale,
                  bint causal, bint backward):
    """One task per (batch tile, head tile, query tile, key tile) that causality leaves; the
    handles of each task's tiles come from ``tiles`` [(tensor, "q" | "k" | "lse")], in the
    kernel's buffer order, the outputs last. Forward's o and lse are written by the first key
    tile of their queries and merged into by the others; backward's dq is written by the
    first key tile of its queries, dk and dv by the first query tile of their keys."""
    cdef TensorTraits qt = q.traits, kt = k.traits
    cdef Py_ssize_t c[4]
    cdef Py_ssize_t kc[4]
    cdef Py_ssize_t lc[3]
    cdef Py_ssize_t i, qi, ki, n, nbuf = len(tiles)
    cdef Py_ssize_t tt = qt._basetile[1], nseq = qt._grid[1]
    cdef starpu_data_handle_t h[9]
    cdef nntile_flash_args args
    cdef list kv_seen
    args.d = qt._shape[3]
    args.causal = causal
    args.scale = scale
    for i in range(qt.ntiles):
        qt.tile_coords(i, c)
        if c[1] != 0:
            continue  # each (batch tile, head tile) once; its sequence tiles below
        kc[0] = c[0]; kc[2] = c[2]; kc[3] = 0
        lc[0] = c[0]; lc[2] = c[2]
        args.batch = qt.tile_dim(0, c[0])
        args.hq = qt.tile_dim(2, c[2])
        args.hkv = kt.tile_dim(2, c[2])
        kv_seen = [False] * nseq
        for qi in range(nseq):
            c[1] = qi
            lc[1] = qi
            args.tq = qt.tile_dim(1, qi)
            args.q_offset = qi * tt
            for ki in range(nseq):
                if causal and ki * tt > args.q_offset + args.tq - 1:
                    break  # this key tile and the later ones come after every query
                kc[1] = ki
                args.tk = kt.tile_dim(1, ki)
                args.k_offset = ki * tt
                if backward:
                    args.accumulate = (1 if ki > 0 else 0) | (2 if kv_seen[ki] else 0)
                    kv_seen[ki] = True
                else:
                    args.accumulate = ki > 0
                for n in range(nbuf):
                    t, role = tiles[n]
                    h[n] = (<Tensor> t).handles[qt.tile_linear(c) if role == "q" else
                                                kt.tile_linear(kc) if role == "k" else
                                                (<Tensor> t).traits.tile_linear(lc)]
                # which W buffers the task reads too (submit): o and lse, or dq | dk and dv
                submit(op, column, nbuf, h, &args, sizeof(args),
                       (args.accumulate & 1) | (6 if args.accumulate & 2 else 0) if backward
                       else (3 if args.accumulate else 0))
        c[1] = 0


def flash_attention(Tensor q, Tensor k, Tensor v, Tensor o, Tensor lse, scale,
                    bint causal=True):
    """o = softmax(scale * q k^T) v per head, keys after their query masked when ``causal``;
    lse = the log of each row's sum of exp of its scaled, masked scores (what backward
    needs). q, o [batch, seq, heads, head_dim]; k, v [batch, seq, kv_heads, head_dim] with
    heads a multiple of kv_heads (grouped-query attention; query head h reads kv head
    h // (heads // kv_heads)); lse [batch, seq, heads], fp32 for bf16 data. Tilings: the
    head dimension whole; k and v tiled as q, with head tiles of ht // group where q's
    are ht, a whole number of groups."""
    cdef int column = _check_flash("flash_attention", [(q, "q"), (k, "k"), (v, "v"), (o, "o")],
                                   lse, ("o", "lse"), scale)
    _flash_tasks(NNTILE_OP_flash_forward, column, q, k,
                 [(q, "q"), (k, "k"), (v, "k"), (o, "q"), (lse, "lse")], scale, causal, False)


def flash_attention_backward(Tensor q, Tensor k, Tensor v, Tensor o, Tensor dout, Tensor lse,
                             Tensor dq, Tensor dk, Tensor dv, scale, bint causal=True):
    """dq, dk, dv (overwritten) of flash_attention's o = attention(q, k, v), given dout, the
    gradient of o, and forward's o and lse; the query heads of a group sum into the dk and
    dv of their kv head. Shapes, tilings and dtypes as flash_attention's."""
    cdef int column = _check_flash(
        "flash_attention_backward", [(q, "q"), (k, "k"), (v, "v"), (o, "o"), (dout, "dout"),
                                     (dq, "dq"), (dk, "dk"), (dv, "dv")],
        lse, ("dq", "dk", "dv"), scale)
    _flash_tasks(NNTILE_OP_flash_backward, column, q, k,
                 [(q, "q"), (k, "k"), (v, "k"), (o, "q"), (dout, "q"), (lse, "lse"),
                  (dq, "q"), (dk, "k"), (dv, "k")], scale, causal, True)
