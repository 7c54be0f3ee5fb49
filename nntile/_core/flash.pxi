# Fused attention (flash attention): softmax(scale q k^T, masked) v without the [T, T]
# scores. Only the output and each row's log-sum-exp are kept; backward recomputes the
# probabilities. q and o are [B, T, H, D] tiled (bt, tt, ht, D); k and v are
# [B, T + offset, Hkv, D] tiled (bt, tt, ht / g, D) with g = H / Hkv query heads per kv head
# (grouped-query attention: query head h reads kv head h / g, and query head tile j reads kv
# head tile j); lse is [B, T, H] tiled (bt, tt, ht), in fp32 for bf16 data and in the data's
# dtype otherwise. One task per (batch tile, head tile, query tile, key tile); the key tiles
# that the mask hides from a query tile entirely get no task (kernels/kernels.h,
# nntile_mask_keys).
from libc.math cimport isfinite


cdef int _check_flash(str op, list data, Tensor lse, tuple outputs, scale,
                      Py_ssize_t offset, bint cache=False) except -1:
    """Every check of flash_attention and its backward: ``data`` the (tensor, role) pairs of
    q, k, v, o and, for backward, dout, dq, dk, dv; ``outputs`` the roles written; ``cache``:
    k and v may be a key/value cache (_check_groups). Returns the op table column."""
    cdef int column = _column(op, data, [(lse, "lse")])
    cdef dict t = {role: tensor for tensor, role in data}
    cdef Tensor q = t["q"], k = t["k"]
    if q.dtype == "bf16" and lse.dtype != "fp32":
        raise TypeError(f"{op}: lse must be fp32 for bf16 data (the log-sum-exp of every row "
                        f"is kept in fp32), got {lse.dtype}")
    _check_groups(op, q, "q", k, "k", offset, cache)
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
                  nntile_mask mask, bint backward):
    """One task per (batch tile, head tile, query tile, key tile) that the mask leaves; the
    handles of each task's tiles come from ``tiles`` [(place, tensor, "q" | "k" | "lse")]
    (place: BUF_<op>_<buffer>), the outputs last. Forward's o and lse are written by the
    first key tile of their queries and merged into by the others; backward's dq is written
    by the first key tile of its queries, dk and dv by the first query tile of their keys
    (and filled with zeros where no query sees their keys)."""
    cdef TensorTraits qt = q.traits, kt = k.traits
    cdef Py_ssize_t c[4]
    cdef Py_ssize_t kc[4]
    cdef Py_ssize_t lc[3]
    cdef Py_ssize_t i, qi, ki
    cdef (Py_ssize_t, Py_ssize_t) keys
    cdef nntile_flash_args args
    cdef list kv_seen
    args.d = qt._shape[3]
    args.mask = mask
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
        kv_seen = [False] * kt._grid[1]
        for qi in range(qt._grid[1]):
            c[1] = qi
            lc[1] = qi
            args.tq = qt.tile_dim(1, qi)
            args.q_offset = qi * qt._basetile[1]
            keys = _key_tiles(mask, args.q_offset, args.q_offset + args.tq, kt._shape[1],
                              kt._basetile[1])
            for ki in range(keys[0], keys[1]):
                kc[1] = ki
                args.tk = kt.tile_dim(1, ki)
                args.k_offset = ki * kt._basetile[1]
                if backward:
                    args.accumulate = (1 if ki > keys[0] else 0) | (2 if kv_seen[ki] else 0)
                    kv_seen[ki] = True
                else:
                    args.accumulate = ki > keys[0]
                _flash_submit(op, column, tiles, qt.tile_linear(c), kt.tile_linear(kc),
                              lc, &args)
        if backward:
            _zero_unseen_keys(tiles[len(tiles) - 2:], kt, kc, kv_seen)
        c[1] = 0


cdef _flash_submit(int op, int column, list tiles, Py_ssize_t q_lin, Py_ssize_t k_lin,
                   Py_ssize_t *lc, nntile_flash_args *args):
    cdef starpu_data_handle_t h[9]
    for place, t, role in tiles:
        h[<int> place] = (<Tensor> t).handles[q_lin if role == "q" else k_lin if role == "k" else
                                    (<Tensor> t).traits.tile_linear(lc)]
    submit(op, column, len(tiles), h, args, sizeof(nntile_flash_args))


cdef _zero_unseen_keys(list dkv, TensorTraits kt, Py_ssize_t *kc, list kv_seen):
    """dk and dv are 0 on the key tiles of kc's (batch, head) tile that no query sees."""
    cdef nntile_fill_args fargs
    cdef starpu_data_handle_t h[1]
    cdef Py_ssize_t ki
    fargs.value = 0.0
    for ki in range(kt._grid[1]):
        if kv_seen[ki]:
            continue
        kc[1] = ki
        fargs.n = kt.tile_dim(0, kc[0]) * kt.tile_dim(1, ki) * kt.tile_dim(2, kc[2]) * kt._shape[3]
        for _, t, _ in dkv:
            h[BUF_fill_dst] = (<Tensor> t).handles[kt.tile_linear(kc)]
            submit(NNTILE_OP_fill, (<Tensor> t).dtype_id, 1, h, &fargs, sizeof(fargs))


def flash_attention(Tensor q, Tensor k, Tensor v, Tensor o, Tensor lse, scale,
                    AttentionMask mask not None=_CAUSAL):
    """o = softmax(scale * q k^T) v per head, with the keys each query does not see masked
    (``mask``, an AttentionMask: causal by default; its offset is the key position of query
    0, when k and v hold that many keys more than q); causal attention also takes a
    key/value cache as k and v: longer than q's + offset (the keys past the last query's
    are hidden) and with sequence tiles of its own;
    lse = the log of each row's sum of exp of its scaled, masked scores (what backward
    needs). q, o [batch, seq, heads, head_dim]; k, v [batch, seq, kv_heads, head_dim] with
    heads a multiple of kv_heads (grouped-query attention; query head h reads kv head
    h // (heads // kv_heads)); lse [batch, seq, heads], fp32 for bf16 data. Tilings: the
    head dimension whole; k and v tiled as q, with head tiles of ht // group where q's
    are ht, a whole number of groups."""
    cdef int column = _check_flash("flash_attention", [(q, "q"), (k, "k"), (v, "v"), (o, "o")],
                                   lse, ("o", "lse"), scale, mask.m.offset, mask.m.causal)
    _flash_tasks(NNTILE_OP_flash_forward, column, q, k,
                 [(BUF_flash_forward_q, q, "q"), (BUF_flash_forward_k, k, "k"),
                  (BUF_flash_forward_v, v, "k"), (BUF_flash_forward_o, o, "q"),
                  (BUF_flash_forward_lse, lse, "lse")], scale, mask.m, False)


def flash_attention_backward(Tensor q, Tensor k, Tensor v, Tensor o, Tensor dout, Tensor lse,
                             Tensor dq, Tensor dk, Tensor dv, scale,
                             AttentionMask mask not None=_CAUSAL):
    """dq, dk, dv (overwritten) of flash_attention's o = attention(q, k, v), given dout, the
    gradient of o, and forward's o and lse; the query heads of a group sum into the dk and
    dv of their kv head. Shapes, tilings and dtypes as flash_attention's."""
    cdef int column = _check_flash(
        "flash_attention_backward", [(q, "q"), (k, "k"), (v, "v"), (o, "o"), (dout, "dout"),
                                     (dq, "dq"), (dk, "dk"), (dv, "dv")],
        lse, ("dq", "dk", "dv"), scale, mask.m.offset)
    _flash_tasks(NNTILE_OP_flash_backward, column, q, k,
                 [(BUF_flash_backward_q, q, "q"), (BUF_flash_backward_k, k, "k"),
                  (BUF_flash_backward_v, v, "k"), (BUF_flash_backward_o, o, "q"),
                  (BUF_flash_backward_dout, dout, "q"), (BUF_flash_backward_lse, lse, "lse"),
                  (BUF_flash_backward_dq, dq, "q"), (BUF_flash_backward_dk, dk, "k"),
                  (BUF_flash_backward_dv, dv, "k")], scale, mask.m, True)
