/* Fused attention internals shared by flash.cu (the plain kernels, the
 * dispatch and the exports) and flash_mma.cu (the tensor-core kernels).
 *
 * Layouts (kernels.h, nntile_flash_args): q, o, dq [batch, tq, hq, d];
 * k, v, dk, dv [batch, tk, hkv, d]; lse [batch, tq, hq].  Query head h reads
 * kv head h / (hq / hkv).  Key k_offset + key is masked for query
 * q_offset + query where nntile_mask_visible (kernels.h) says so.  lse is the
 * natural log of the sum of exp(scale * q.k) over the row's unmasked keys
 * (-inf for none). */
#ifndef NNTILE_CUDA_FLASH_CUH
#define NNTILE_CUDA_FLASH_CUH

#include "common.cuh"
#include "flash.h"

NNTILE_CUDA_BEGIN

struct FlashParams {
    const void *q, *k, *v;
    const void *o_in, *dout; /* backward: the forward's output, its gradient */
    void *o;                 /* forward: the output (read too when merging) */
    void *lse;               /* forward: written (read when merging);
                                backward: read */
    void *dq, *dk, *dv;
    int64_t batch, tq, tk, hq, hkv, d, q_offset, k_offset;
    nntile_mask mask;
    int accumulate;
    int lse_bf16; /* lse holds bf16 (the bf16 column), else the compute type */
    double scale;
};

/* lse element i as the compute type C (float, or double for fp64) */
template <typename C>
__device__ __forceinline__ C lse_load(const void *lse, int64_t i, int bf)
{
    if (bf)
        return (C)__bfloat162float(((const bf16 *)lse)[i]);
    return ((const C *)lse)[i];
}

template <typename C>
__device__ __forceinline__ void lse_store(void *lse, int64_t i, C x, int bf)
{
    if (bf)
        ((bf16 *)lse)[i] = __float2bfloat16_rn((float)x);
    else
        ((C *)lse)[i] = x;
}

/* ceil(a / b) for a >= 0, b > 0, in host and device code */
__host__ __device__ inline int64_t cdiv(int64_t a, int64_t b)
{
    return (a + b - 1) / b;
}

/* Key `key` of the tile is visible from query `row` of the tile. */
__host__ __device__ inline bool flash_visible(const FlashParams &p, int64_t row,
                                              int64_t key)
{
    return nntile_mask_visible(p.mask, p.q_offset + row, p.k_offset + key);
}

/* The blocks of size bs of a tile whose row 0 is at position `first` that
 * hold some position of r: [lo, hi). */
__host__ __device__ inline nntile_range flash_blocks(nntile_range r, int64_t first,
                                                     int64_t bs)
{
    r.lo = r.lo > first ? (r.lo - first) / bs : 0;
    r.hi = r.hi > first ? cdiv(r.hi - first, bs) : 0;
    return r;
}

/* The key blocks of size bk that queries [q0, q0 + nq) of a tile see. */
__host__ __device__ inline nntile_range flash_key_blocks(const FlashParams &p,
                                                         int64_t q0, int64_t nq,
                                                         int64_t bk)
{
    const int64_t first = p.q_offset + q0;
    return flash_blocks(nntile_mask_keys(p.mask, first, first + nq, p.k_offset + p.tk),
                        p.k_offset, bk);
}

/* The query blocks of size bq that see some key of [k0, k0 + nk) of a tile. */
__host__ __device__ inline nntile_range flash_query_blocks(const FlashParams &p,
                                                           int64_t k0, int64_t nk,
                                                           int64_t bq)
{
    const int64_t k = p.k_offset + k0, end = p.q_offset + p.tq;
    return flash_blocks(nntile_mask_queries(p.mask, k, k + nk, end), p.q_offset, bq);
}

/* The query tile of a block of the forward and dq kernels: blocks run over
 * (query tile of `rows`, head, batch), the query tiles of a (batch, head) in
 * reverse so that the longest causal rows start first. */
struct QueryTile {
    int64_t b, h, hk, q0, nq;
    __device__ QueryTile(const FlashParams &p, int64_t rows)
    {
        const int64_t nqb = cdiv(p.tq, rows);
        int64_t x = blockIdx.x;
        q0 = (nqb - 1 - x % nqb) * rows;
        x /= nqb;
        h = x % p.hq;
        b = x / p.hq;
        hk = h / (p.hq / p.hkv);
        nq = p.tq - q0 < rows ? p.tq - q0 : rows;
    }
    /* offset of row 0 of this tile in q, o, dout, dq */
    __device__ int64_t offset(const FlashParams &p) const
    {
        return ((b * p.tq + q0) * p.hq + h) * p.d;
    }
    /* key 0 of this tile's kv head in k or v (`base`) */
    template <typename T>
    __device__ const T *kv(const FlashParams &p, const void *base) const
    {
        return (const T *)base + (b * p.tk * p.hkv + hk) * p.d;
    }
};

/* The key tile of a block of the dk/dv kernels: blocks run over (key tile
 * of `rows`, kv head, batch). */
struct KeyTile {
    int64_t b, hk, k0, nk;
    __device__ KeyTile(const FlashParams &p, int64_t rows)
    {
        const int64_t nkb = cdiv(p.tk, rows);
        int64_t x = blockIdx.x;
        k0 = x % nkb * rows;
        x /= nkb;
        hk = x % p.hkv;
        b = x / p.hkv;
        nk = p.tk - k0 < rows ? p.tk - k0 : rows;
    }
    /* offset of key 0 of this tile in k, v, dk, dv */
    __device__ int64_t offset(const FlashParams &p) const
    {
        return ((b * p.tk + k0) * p.hkv + hk) * p.d;
    }
};

/* Tensor-core kernels (flash_mma.cu) for storage T = bf16 (bf16 mma) or
 * float (TF32 mma).  false: the shapes or pointers do not suit them (head
 * dimension over 128 or not a multiple of 16 bytes, unaligned buffers) or
 * the launch failed; nothing was enqueued then. */
template <typename T> bool mma_forward(const FlashParams &p, cudaStream_t s);
template <typename T> bool mma_backward(const FlashParams &p, cudaStream_t s);

/* Sets a kernel's dynamic shared memory limit and reports a failure. */
bool flash_smem(const void *kernel, size_t bytes, const char *what);
/* The launch just made: true when it started, else reports the error. */
bool flash_launched(const char *what);

NNTILE_CUDA_END

#endif /* NNTILE_CUDA_FLASH_CUH */
