"""Attention in float64 numpy, building the whole [T, T] score matrix: the reference of the
fused-attention kernels, its tensor ops and the attention core."""
import numpy as np


def visible(nq, nk, causal, q_offset=0, k_offset=0, offset=0, window=0):
    """[nq, nk] booleans: key k_offset + j is visible from query q_offset + i, which sits at
    key position q_offset + i + offset (the mask of kernels.h, nntile_mask; with a window,
    transformers' sliding window: only the last ``window`` keys up to that position)."""
    qpos = q_offset + offset + np.arange(nq)[:, None]
    kpos = k_offset + np.arange(nk)[None, :]
    keep = np.ones((nq, nk), dtype=bool)
    if causal:
        keep &= kpos <= qpos
    if window:
        keep &= kpos > qpos - window
    return keep


def reference(q, k, v, scale, causal, q_offset=0, k_offset=0, offset=0, window=0):
    """o, lse of softmax(scale q k^T, masked) v in float64; q [B, Tq, H, D], k and v
    [B, Tk, Hkv, D]. A row with every key masked has lse -inf and o 0."""
    g = q.shape[2] // k.shape[2]
    kk, vv = np.repeat(k, g, axis=2), np.repeat(v, g, axis=2)
    s = scale * np.einsum("bqhd,bkhd->bhqk", q, kk)
    s = np.where(visible(q.shape[1], k.shape[1], causal, q_offset, k_offset, offset, window),
                 s, -np.inf)
    mx = s.max(axis=-1, keepdims=True)
    shift = np.where(np.isfinite(mx), mx, 0.0)
    e = np.exp(s - shift)
    total = e.sum(axis=-1, keepdims=True)
    with np.errstate(divide="ignore", invalid="ignore"):
        p = np.where(total > 0, e / total, 0.0)
        lse = np.where(total[..., 0] > 0, shift[..., 0] + np.log(total[..., 0]), -np.inf)
    o = np.einsum("bhqk,bkhd->bqhd", p, vv)
    return o, lse.transpose(0, 2, 1), p


def reference_backward(q, k, v, do, scale, causal, q_offset=0, k_offset=0, offset=0,
                       window=0):
    """dq, dk, dv of sum(o * do), from the probabilities of ``reference``."""
    B, Tk, Hkv, D = k.shape
    g = q.shape[2] // Hkv
    kk, vv = np.repeat(k, g, axis=2), np.repeat(v, g, axis=2)
    _, _, p = reference(q, k, v, scale, causal, q_offset, k_offset, offset, window)
    dp = np.einsum("bqhd,bkhd->bhqk", do, vv)
    ds = p * (dp - (p * dp).sum(axis=-1, keepdims=True))
    dq = scale * np.einsum("bhqk,bkhd->bqhd", ds, kk)
    dk = scale * np.einsum("bhqk,bqhd->bkhd", ds, q)
    dv = np.einsum("bhqk,bqhd->bkhd", p, do)
    fold = lambda x: x.reshape(B, Tk, Hkv, g, D).sum(axis=3)  # noqa: E731
    return dq, fold(dk), fold(dv)
