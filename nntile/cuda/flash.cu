/* Fused attention, forward and backward (twins of _core/kernels/flash.inc):
 * one call per (batch tile, head tile, query tile, key tile), the scores
 * never stored (flash.cuh says the layouts and the mask).
 *
 * Paths, by column:
 *   fp64        the plain kernels below, in double;
 *   fp32        the plain kernels, in float (no TF32);
 *   tf32        TF32 tensor cores (flash_mma.cu), fp32 storage;
 *   bf16        bf16 tensor cores (flash_mma.cu) with a bf16 lse;
 *   bf16_fp32   cuDNN's fused SDPA where it applies (cudnn_attention.cpp),
 *               else bf16 tensor cores with an fp32 lse.
 * The tensor-core kernels take head dimensions up to 128 whose rows are a
 * whole number of 16 bytes and 16-byte aligned buffers; anything else runs
 * the plain kernels in float.
 *
 * The plain kernels: a block of 128 threads holds one tile of bt queries (or
 * keys) and streams the other side through shared memory in tiles of bt,
 * every product a loop in shared memory (block_gemm), in the compute type.
 * Reference quality: simple, any head dimension whose tiles fit in shared
 * memory, but far from the tensor cores' speed.
 *
 * Backward, in both families, is two kernels that recompute the
 * probabilities from q, k and lse: one per key tile (dk, dv, over every query
 * tile and every query head of the kv head's group) and one per query tile
 * (dq, over the key tiles).  Recomputing costs two more products than
 * FlashAttention-2's atomic dq, but every output is written by exactly one
 * block, in a fixed order: results are deterministic (a resumed run repeats
 * itself bit for bit) and need no fp32 scratch for dq.  delta = rowsum(dout
 * * o) is computed by each block for its query rows. */
#include "flash.cuh"

NNTILE_CUDA_BEGIN

namespace {

constexpr int kPlainThreads = 128;

/* ---------------------------------------------------------------- plain */

/* rows x d tile of src (row r at src + r * stride) into dst (row stride ldd),
 * in the compute type; rows past nrows are zero */
template <typename T, typename C>
__device__ void plain_load(C *dst, int ldd, const T *src, int64_t stride,
                           int64_t nrows, int rows, int d)
{
    for (int i = threadIdx.x; i < rows * d; i += blockDim.x) {
        const int r = i / d, c = i - r * d;
        dst[r * ldd + c] = r < nrows ? (C)ld(src[r * stride + c]) : (C)0;
    }
}

/* Cm[m][n] (+)= sum_k A(m, k) B(k, n) over the block, for m < M, n < N:
 * A(m, k) = A[m * am + k * ak], B(k, n) = B[k * bk + n * bn] (strides make
 * the transposes), Cm row stride ldc.  A thread computes 2 x 2 outputs, so
 * that each value it reads from shared memory serves two products (rows or
 * columns past the edge read the last one again and are not stored). */
template <typename C>
__device__ void block_gemm(int M, int N, int K, const C *A, int am, int ak,
                           const C *B, int bk, int bn, C *Cm, int ldc,
                           bool accumulate)
{
    const int tn = (N + 1) / 2, tiles = (M + 1) / 2 * tn;
    for (int i = threadIdx.x; i < tiles; i += blockDim.x) {
        const int m = i / tn * 2, n = i % tn * 2;
        const bool m2 = m + 1 < M, n2 = n + 1 < N;
        const C *a0 = A + m * am, *a1 = A + (m2 ? m + 1 : m) * am;
        const C *b0 = B + n * bn, *b1 = B + (n2 ? n + 1 : n) * bn;
        C s00 = 0, s01 = 0, s10 = 0, s11 = 0;
        for (int k = 0; k < K; ++k) {
            const C x0 = a0[k * ak], x1 = a1[k * ak];
            const C y0 = b0[k * bk], y1 = b1[k * bk];
            s00 += x0 * y0;
            s01 += x0 * y1;
            s10 += x1 * y0;
            s11 += x1 * y1;
        }
        C *c0 = Cm + m * ldc + n, *c1 = c0 + ldc;
        c0[0] = accumulate ? c0[0] + s00 : s00;
        if (n2)
            c0[1] = accumulate ? c0[1] + s01 : s01;
        if (m2) {
            c1[0] = accumulate ? c1[0] + s10 : s10;
            if (n2)
                c1[1] = accumulate ? c1[1] + s11 : s11;
        }
    }
}

/* Shared memory of the plain kernels, in elements of the compute type, for
 * tiles of bt rows and head dimension d (row strides d + 1 and bt + 1 keep
 * the column walks off a single bank): each kernel's PlainSmem pieces. */
inline size_t plain_smem_forward(int bt, int64_t d)
{
    return (size_t)(4 * bt * (d + 1) + bt * (bt + 1) + 2 * bt);
}
inline size_t plain_smem_dkdv(int bt, int64_t d)
{
    return (size_t)(6 * bt * (d + 1) + 2 * bt * (bt + 1) + 2 * bt);
}
inline size_t plain_smem_dq(int bt, int64_t d)
{
    return (size_t)(5 * bt * (d + 1) + bt * (bt + 1) + 2 * bt);
}

/* A plain kernel's shared memory, handed out in order: tiles of bt rows of
 * the head dimension d (row stride rs = d + 1), bt x bt score tiles (row
 * stride lp = bt + 1) and vectors of bt. */
template <typename C> struct PlainSmem {
    int bt, d, rs, lp;
    C *next;
    __device__ PlainSmem(const FlashParams &p, int bt_)
        : bt(bt_), d((int)p.d), rs(d + 1), lp(bt_ + 1)
    {
        extern __shared__ double plain_smem[];
        next = (C *)plain_smem;
    }
    __device__ C *take(int n)
    {
        C *at = next;
        next += n;
        return at;
    }
    __device__ C *tile() { return take(bt * rs); }
    __device__ C *scores() { return take(bt * lp); }
    __device__ C *vec() { return take(bt); }
};

/* The online softmax of a (query tile at q0, key block at k0) pair, a warp per
 * row: Ss (row stride lp) holds the raw scores and gets exp(s - m), Os (row
 * stride rs) and the running max mrow and sum lrow are rescaled. */
template <typename C>
__device__ void plain_online_softmax(const FlashParams &p, int bt, int64_t q0,
                                     int64_t k0, C *Ss, int lp, C *Os, int rs,
                                     C *mrow, C *lrow)
{
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int nwarp = blockDim.x >> 5, d = (int)p.d;
    const C scale = (C)p.scale;
    for (int r = warp; r < bt; r += nwarp) {
        C mx = ninf<C>();
        for (int c = lane; c < bt; c += 32) {
            const int64_t key = k0 + c;
            const bool masked = key >= p.tk || !flash_visible(p, q0 + r, key);
            const C s = masked ? ninf<C>() : Ss[r * lp + c] * scale;
            Ss[r * lp + c] = s;
            mx = s > mx ? s : mx;
        }
        mx = warp_allreduce(mx, MaxOp());
        const C m_old = mrow[r];
        const C m_new = m_old > mx ? m_old : mx;
        const C shift = exp_shift(m_new);
        C sum = 0;
        for (int c = lane; c < bt; c += 32) {
            const C e = m_exp(Ss[r * lp + c] - shift);
            Ss[r * lp + c] = e;
            sum += e;
        }
        sum = warp_allreduce(sum, SumOp());
        const C alpha = m_exp(m_old - shift); /* 0 while nothing was seen */
        for (int c = lane; c < d; c += 32)
            Os[r * rs + c] *= alpha;
        __syncwarp(); /* every lane has read mrow[r] and lrow[r] */
        if (lane == 0) {
            lrow[r] = lrow[r] * alpha + sum;
            mrow[r] = m_new;
        }
    }
}

/* For each key block of bt keys that the query tile sees: the block's K and
 * V loaded into Ks and Vs (row stride rs), then body(k0, nk), every thread
 * of the block together. */
template <typename T, typename C, typename Body>
__device__ void plain_key_blocks(const FlashParams &p, const QueryTile &tile,
                                 int bt, C *Ks, C *Vs, int rs, Body body)
{
    const int64_t kstride = p.hkv * p.d;
    const T *kg = tile.kv<T>(p, p.k), *vg = tile.kv<T>(p, p.v);
    const nntile_range kbs = flash_key_blocks(p, tile.q0, tile.nq, bt);
    for (int64_t kb = kbs.lo; kb < kbs.hi; ++kb) {
        const int64_t k0 = kb * bt, nk = p.tk - k0 < bt ? p.tk - k0 : bt;
        __syncthreads(); /* the previous block's users are done */
        plain_load(Ks, rs, kg + k0 * kstride, kstride, nk, bt, (int)p.d);
        plain_load(Vs, rs, vg + k0 * kstride, kstride, nk, bt, (int)p.d);
        __syncthreads();
        body(k0, nk);
    }
}

/* Forward: a block per (query tile, head, batch); the query tiles of a
 * (batch, head) in reverse, so that the longest causal rows start first. */
template <typename T, typename C>
__global__ void __launch_bounds__(kPlainThreads)
plain_forward_k(FlashParams p, int bt)
{
    PlainSmem<C> sm(p, bt);
    C *Qs = sm.tile(), *Os = sm.tile();
    C *Ks = sm.tile(), *Vs = sm.tile(), *Ss = sm.scores();
    C *mrow = sm.vec(), *lrow = sm.vec();
    const int d = sm.d, rs = sm.rs, lp = sm.lp;
    const QueryTile tile(p, bt);
    const int64_t b = tile.b, h = tile.h, q0 = tile.q0, nq = tile.nq;
    const int64_t qstride = p.hq * p.d;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int nwarp = blockDim.x >> 5;
    plain_load(Qs, rs, (const T *)p.q + tile.offset(p), qstride, nq, bt, d);
    for (int i = threadIdx.x; i < bt * rs; i += blockDim.x)
        Os[i] = 0;
    for (int r = threadIdx.x; r < bt; r += blockDim.x) {
        mrow[r] = ninf<C>();
        lrow[r] = 0;
    }
    plain_key_blocks<T>(p, tile, bt, Ks, Vs, rs, [&](int64_t k0, int64_t) {
        block_gemm(bt, bt, d, Qs, rs, 1, Ks, 1, rs, Ss, lp, false);
        __syncthreads();
        plain_online_softmax(p, bt, q0, k0, Ss, lp, Os, rs, mrow, lrow);
        __syncthreads();
        block_gemm(bt, d, bt, Ss, lp, 1, Vs, rs, 1, Os, rs, true);
    });
    __syncthreads();
    for (int r = warp; r < nq; r += nwarp) {
        const C l = lrow[r];
        const C lse_t = l > 0 ? mrow[r] + m_log(l) : ninf<C>();
        const C inv = l > 0 ? (C)1 / l : (C)0;
        const int64_t row = (b * p.tq + q0 + r) * p.hq + h; /* lse index */
        T *orow = (T *)p.o + row * p.d;
        if (!p.accumulate) {
            for (int c = lane; c < d; c += 32)
                orow[c] = st<T>(Os[r * rs + c] * inv);
            if (lane == 0)
                lse_store<C>(p.lse, row, lse_t, p.lse_bf16);
            continue;
        }
        /* merge into the previous key tiles' (o, lse); o stays normalised */
        const C lse_o = lse_load<C>(p.lse, row, p.lse_bf16);
        const C M = lse_o > lse_t ? lse_o : lse_t;
        __syncwarp(); /* every lane has read lse before lane 0 writes it */
        if (M == ninf<C>())
            continue; /* nothing seen so far nor here: o = 0, lse = -inf */
        const C a_o = m_exp(lse_o - M), a_t = m_exp(lse_t - M);
        const C den = a_o + a_t, c_o = a_o / den, c_t = a_t * inv / den;
        for (int c = lane; c < d; c += 32) {
            const C old = c_o == 0 ? (C)0 : c_o * (C)ld(orow[c]);
            orow[c] = st<T>(old + c_t * Os[r * rs + c]);
        }
        if (lane == 0)
            lse_store<C>(p.lse, row, M + m_log(den), p.lse_bf16);
    }
}

/* Backward, the rows' lse (as +inf where -inf: no key seen, probabilities 0)
 * and delta = rowsum(dout * o) of query rows [q0, q0 + nq) of head h, into
 * lrow and drow; dOs holds dout's rows (row stride rs). */
template <typename T, typename C>
__device__ void plain_row_stats(const FlashParams &p, int64_t b, int64_t h,
                                int64_t q0, int64_t nq, int bt, const C *dOs,
                                int rs, C *lrow, C *drow)
{
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    for (int r = warp; r < bt; r += (int)(blockDim.x >> 5)) {
        const int64_t row = (b * p.tq + q0 + r) * p.hq + h;
        C acc = 0;
        if (r < nq) {
            const T *orow = (const T *)p.o_in + row * p.d;
            for (int c = lane; c < p.d; c += 32)
                acc += dOs[r * rs + c] * (C)ld(orow[c]);
        }
        acc = warp_allreduce(acc, SumOp());
        if (lane == 0) {
            const C l = r < nq ? lse_load<C>(p.lse, row, p.lse_bf16) : ninf<C>();
            lrow[r] = l == ninf<C>() ? -ninf<C>() : l;
            drow[r] = acc;
        }
    }
}

/* Probabilities and score gradients of a (query tile, key tile) pair:
 * Ps = P, dSs = P * (dout v^T - delta), row stride lp. */
template <typename C>
__device__ void plain_scores_backward(const FlashParams &p, int bt, int64_t q0,
                                      int64_t nq, int64_t k0, int64_t nk,
                                      const C *Qs, const C *dOs, const C *Ks,
                                      const C *Vs, int rs, const C *lrow,
                                      const C *drow, C *Ps, C *dSs, int lp)
{
    const C scale = (C)p.scale;
    const int d = (int)p.d;
    for (int i = threadIdx.x; i < bt * bt; i += blockDim.x) {
        const int r = i / bt, c = i - r * bt;
        const bool masked =
            r >= nq || c >= nk || !flash_visible(p, q0 + r, k0 + c);
        C s = 0, dp = 0;
        for (int e = 0; e < d; ++e) {
            s += Qs[r * rs + e] * Ks[c * rs + e];
            dp += dOs[r * rs + e] * Vs[c * rs + e];
        }
        const C pr = masked ? (C)0 : m_exp(s * scale - lrow[r]);
        Ps[r * lp + c] = pr;
        dSs[r * lp + c] = pr * (dp - drow[r]);
    }
}

/* dst rows [0, n) (row stride `stride`) = scale * src (row stride rs), or
 * += when acc: a gradient tile written out by the whole block. */
template <typename T, typename C>
__device__ void plain_store(T *dst, int64_t stride, const C *src, int rs,
                            int64_t n, int d, C scale, bool acc)
{
    for (int i = threadIdx.x; i < n * d; i += blockDim.x) {
        const int r = i / d, c = i - r * d;
        const int64_t at = r * stride + c;
        const C g = scale * src[r * rs + c];
        dst[at] = st<T>(acc ? g + (C)ld(dst[at]) : g);
    }
}

/* dk, dv: a block per (key tile, kv head, batch), over every query tile of
 * every query head of the group. */
template <typename T, typename C>
__global__ void __launch_bounds__(kPlainThreads)
plain_dkdv_k(FlashParams p, int bt)
{
    PlainSmem<C> sm(p, bt);
    C *Ks = sm.tile(), *Vs = sm.tile(), *dKs = sm.tile(), *dVs = sm.tile();
    C *Qs = sm.tile(), *dOs = sm.tile(), *Ps = sm.scores(), *dSs = sm.scores();
    C *lrow = sm.vec(), *drow = sm.vec();
    const int d = sm.d, rs = sm.rs, lp = sm.lp;
    const KeyTile tile(p, bt);
    const int64_t b = tile.b, hk = tile.hk, k0 = tile.k0, nk = tile.nk;
    const int64_t grp = p.hq / p.hkv;
    const int64_t qstride = p.hq * p.d, kstride = p.hkv * p.d;
    const int64_t koff = tile.offset(p);
    plain_load(Ks, rs, (const T *)p.k + koff, kstride, nk, bt, d);
    plain_load(Vs, rs, (const T *)p.v + koff, kstride, nk, bt, d);
    for (int i = threadIdx.x; i < bt * rs; i += blockDim.x)
        dKs[i] = dVs[i] = 0;
    const nntile_range qbs = flash_query_blocks(p, k0, nk, bt);
    for (int64_t hh = 0; hh < grp; ++hh) {
        const int64_t h = hk * grp + hh;
        for (int64_t qb = qbs.lo; qb < qbs.hi; ++qb) {
            const int64_t q0 = qb * bt, nq = p.tq - q0 < bt ? p.tq - q0 : bt;
            const int64_t qoff = ((b * p.tq + q0) * p.hq + h) * p.d;
            __syncthreads(); /* the previous query tile's users are done */
            plain_load(Qs, rs, (const T *)p.q + qoff, qstride, nq, bt, d);
            plain_load(dOs, rs, (const T *)p.dout + qoff, qstride, nq, bt, d);
            __syncthreads();
            plain_row_stats<T>(p, b, h, q0, nq, bt, dOs, rs, lrow, drow);
            __syncthreads();
            plain_scores_backward(p, bt, q0, nq, k0, nk, Qs, dOs, Ks, Vs, rs,
                                  lrow, drow, Ps, dSs, lp);
            __syncthreads();
            /* dV += P^T dout, dK += dS^T q (scaled at the end) */
            block_gemm(bt, d, bt, Ps, 1, lp, dOs, rs, 1, dVs, rs, true);
            block_gemm(bt, d, bt, dSs, 1, lp, Qs, rs, 1, dKs, rs, true);
        }
    }
    __syncthreads();
    const bool acc = (p.accumulate & 2) != 0;
    plain_store((T *)p.dk + koff, kstride, dKs, rs, nk, d, (C)p.scale, acc);
    plain_store((T *)p.dv + koff, kstride, dVs, rs, nk, d, (C)1, acc);
}

/* dq: a block per (query tile, head, batch), over the key tiles. */
template <typename T, typename C>
__global__ void __launch_bounds__(kPlainThreads)
plain_dq_k(FlashParams p, int bt)
{
    PlainSmem<C> sm(p, bt);
    C *Qs = sm.tile(), *dOs = sm.tile(), *dQs = sm.tile();
    /* the probabilities are not needed past dS: Ps and dSs share */
    C *Ks = sm.tile(), *Vs = sm.tile(), *dSs = sm.scores();
    C *lrow = sm.vec(), *drow = sm.vec();
    const int d = sm.d, rs = sm.rs, lp = sm.lp;
    const QueryTile tile(p, bt);
    const int64_t b = tile.b, h = tile.h, q0 = tile.q0, nq = tile.nq;
    const int64_t qstride = p.hq * p.d, qoff = tile.offset(p);
    plain_load(Qs, rs, (const T *)p.q + qoff, qstride, nq, bt, d);
    plain_load(dOs, rs, (const T *)p.dout + qoff, qstride, nq, bt, d);
    for (int i = threadIdx.x; i < bt * rs; i += blockDim.x)
        dQs[i] = 0;
    __syncthreads();
    plain_row_stats<T>(p, b, h, q0, nq, bt, dOs, rs, lrow, drow);
    plain_key_blocks<T>(p, tile, bt, Ks, Vs, rs, [&](int64_t k0, int64_t nk) {
        plain_scores_backward(p, bt, q0, nq, k0, nk, Qs, dOs, Ks, Vs, rs, lrow,
                              drow, dSs, dSs, lp);
        __syncthreads();
        block_gemm(bt, d, bt, dSs, lp, 1, Ks, rs, 1, dQs, rs, true);
    });
    __syncthreads();
    plain_store((T *)p.dq + qoff, qstride, dQs, rs, nq, d, (C)p.scale,
                (p.accumulate & 1) != 0);
}

/* The tile size of the plain kernels: the largest of 32, 16, 8, 4 rows whose
 * shared memory (the largest of the three kernels') the device allows;
 * 0 when none does. */
template <typename C> int plain_tile(int64_t d, size_t *bytes_max)
{
    int dev = 0, optin = 48 * 1024;
    if (cudaGetDevice(&dev) != cudaSuccess
        || cudaDeviceGetAttribute(&optin,
                                  cudaDevAttrMaxSharedMemoryPerBlockOptin,
                                  dev) != cudaSuccess) {
        (void)cudaGetLastError();
        optin = 48 * 1024;
    }
    for (int bt = 32; bt >= 4; bt /= 2) {
        size_t n = plain_smem_forward(bt, d);
        n = n > plain_smem_dkdv(bt, d) ? n : plain_smem_dkdv(bt, d);
        n = n > plain_smem_dq(bt, d) ? n : plain_smem_dq(bt, d);
        if (n * sizeof(C) <= (size_t)optin) {
            *bytes_max = n * sizeof(C);
            return bt;
        }
    }
    return 0;
}

/* plain_tile's size, or 0 after saying that the head dimension does not
 * fit. */
template <typename C> int plain_tile_of(const FlashParams &p, const char *what)
{
    size_t unused;
    const int bt = plain_tile<C>(p.d, &unused);
    if (bt == 0)
        fprintf(stderr, "nntile cuda %s: head dimension %lld does not fit in "
                        "shared memory\n", what, (long long)p.d);
    return bt;
}

/* Launches a plain kernel of tile size bt on `blocks` blocks, with `smem`
 * elements of C of shared memory; false (said) when it did not start. */
template <typename C>
bool plain_launch(void (*kernel)(FlashParams, int), int64_t blocks,
                  size_t smem, const FlashParams &p, int bt, cudaStream_t s,
                  const char *what)
{
    const size_t bytes = smem * sizeof(C);
    if (!flash_smem((const void *)kernel, bytes, what))
        return false;
    kernel<<<(unsigned)blocks, kPlainThreads, bytes, s>>>(p, bt);
    return flash_launched(what);
}

template <typename T, typename C>
void plain_forward(const FlashParams &p, cudaStream_t s)
{
    const int bt = plain_tile_of<C>(p, "flash_forward");
    if (bt > 0)
        plain_launch<C>(plain_forward_k<T, C>, cdiv(p.tq, bt) * p.hq * p.batch,
                        plain_smem_forward(bt, p.d), p, bt, s, "flash_forward");
}

template <typename T, typename C>
void plain_backward(const FlashParams &p, cudaStream_t s)
{
    const char *what = "flash_backward";
    const int bt = plain_tile_of<C>(p, what);
    if (bt == 0)
        return;
    if (p.tq > 0
        && !plain_launch<C>(plain_dq_k<T, C>, cdiv(p.tq, bt) * p.hq * p.batch,
                            plain_smem_dq(bt, p.d), p, bt, s, what))
        return;
    if (p.tk > 0)
        plain_launch<C>(plain_dkdv_k<T, C>, cdiv(p.tk, bt) * p.hkv * p.batch,
                        plain_smem_dkdv(bt, p.d), p, bt, s, what);
}

/* ---------------------------------------------------------------- dispatch */

/* The checks every path relies on; false (and a message) for arguments the
 * tensor op should have refused. */
bool flash_args_ok(const nntile_flash_args *a, const char *what)
{
    if (a->batch < 0 || a->tq < 0 || a->tk < 0 || a->d < 0 || a->hq < 1
        || a->hkv < 1 || a->hq % a->hkv != 0) {
        fprintf(stderr, "nntile cuda %s: bad tile extents (batch %lld, tq %lld, "
                        "tk %lld, hq %lld, hkv %lld, d %lld)\n",
                what, (long long)a->batch, (long long)a->tq, (long long)a->tk,
                (long long)a->hq, (long long)a->hkv, (long long)a->d);
        return false;
    }
    return true;
}

/* The parameters of a call on q, k, v and lse (what forward and backward
 * share); the caller sets its own outputs. */
FlashParams flash_params(const nntile_flash_args *a, const void *q,
                         const void *k, const void *v, const void *lse,
                         int lse_bf16)
{
    FlashParams p;
    memset(&p, 0, sizeof(p));
    p.q = q;
    p.k = k;
    p.v = v;
    p.lse = (void *)lse;
    p.lse_bf16 = lse_bf16;
    p.batch = a->batch;
    p.tq = a->tq;
    p.tk = a->tk;
    p.hq = a->hq;
    p.hkv = a->hkv;
    p.d = a->d;
    p.q_offset = a->q_offset;
    p.k_offset = a->k_offset;
    p.mask = a->mask;
    p.accumulate = (int)a->accumulate;
    p.scale = a->scale;
    return p;
}

/* T: storage, C: compute type of the plain kernels; mma: try the tensor
 * cores first (T = bf16 or float). */
template <typename T, typename C, bool MMA>
void forward(const nntile_flash_args *a, cudaStream_t s, const T *q,
             const T *k, const T *v, T *o, void *lse, int lse_bf16)
{
    if (!flash_args_ok(a, "flash_forward") || a->batch == 0 || a->tq == 0)
        return;
    FlashParams p = flash_params(a, q, k, v, lse, lse_bf16);
    p.o = o;
    if constexpr (MMA) {
        if (mma_forward<T>(p, s))
            return;
    }
    plain_forward<T, C>(p, s);
}

template <typename T, typename C, bool MMA>
void backward(const nntile_flash_args *a, cudaStream_t s, const T *q,
              const T *k, const T *v, const T *o, const T *dout,
              const void *lse, int lse_bf16, T *dq, T *dk, T *dv)
{
    if (!flash_args_ok(a, "flash_backward") || a->batch == 0
        || (a->tq == 0 && a->tk == 0))
        return;
    FlashParams p = flash_params(a, q, k, v, lse, lse_bf16);
    p.o_in = o;
    p.dout = dout;
    p.dq = dq;
    p.dk = dk;
    p.dv = dv;
    if constexpr (MMA) {
        if (mma_backward<T>(p, s))
            return;
    }
    plain_backward<T, C>(p, s);
}

/* ---------------------------------------------------------------- lse layout */

struct SwapInnerOp {
    int64_t n1, n2;
    __device__ void operator()(int64_t i, const float *__restrict__ src,
                               float *__restrict__ dst) const
    {
        const int64_t j = i % n2, r = i / n2, a = r % n1, b = r / n1;
        dst[(b * n2 + j) * n1 + a] = src[i];
    }
};

} // namespace

bool flash_smem(const void *kernel, size_t bytes, const char *what)
{
    const cudaError_t err = cudaFuncSetAttribute(
        kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)bytes);
    if (err != cudaSuccess) {
        (void)cudaGetLastError();
        fprintf(stderr, "nntile cuda %s: %zu bytes of shared memory: %s\n",
                what, bytes, cudaGetErrorString(err));
        return false;
    }
    return true;
}

bool flash_launched(const char *what)
{
    const cudaError_t err = cudaGetLastError();
    if (err != cudaSuccess) {
        fprintf(stderr, "nntile cuda %s: launch failed: %s\n", what,
                cudaGetErrorString(err));
        return false;
    }
    return true;
}

cudaError_t swap_inner_axes(const float *src, float *dst, int64_t batch,
                            int64_t n1, int64_t n2, cudaStream_t stream)
{
    launch_elementwise(batch * n1 * n2, SwapInnerOp{n1, n2}, stream, src, dst);
    return cudaGetLastError();
}

void flash_forward_bf16_fp32(const struct nntile_flash_args *args,
                             cudaStream_t stream, const uint16_t *q,
                             const uint16_t *k, const uint16_t *v,
                             uint16_t *o, float *lse)
{
    forward<bf16, float, true>(args, stream, storage(q), storage(k),
                               storage(v), storage(o), lse, 0);
}

void flash_backward_bf16_fp32(const struct nntile_flash_args *args,
                              cudaStream_t stream, const uint16_t *q,
                              const uint16_t *k, const uint16_t *v,
                              const uint16_t *o, const uint16_t *dout,
                              const float *lse, uint16_t *dq, uint16_t *dk,
                              uint16_t *dv)
{
    backward<bf16, float, true>(args, stream, storage(q), storage(k),
                                storage(v), storage(o), storage(dout), lse, 0,
                                storage(dq), storage(dk), storage(dv));
}

NNTILE_CUDA_END

/* ---------------------------------------------------------------- exports
 * (bf16_fp32: cudnn_attention.cpp; tf32: the op table's X_TF32) */

using nntile_cuda::storage;

/* forward and backward of a column S (ABI types A, ACC): the plain kernels in
 * C, or the tensor cores first (MMA); LSE_BF16: lse is stored in bf16 */
#define NNTILE_FLASH_EXPORTS(S, A, ACC, C, MMA, LSE_BF16)                     \
    extern "C" NNTILE_CUDA_SIGNATURE(flash_forward, A, ACC, S,               \
                                      NNTILE_BUFFERS_flash_forward)          \
    {                                                                        \
        nntile_cuda::forward<nntile_cuda::Storage<A>::type, C, MMA>(         \
            args, stream, storage(q), storage(k), storage(v), storage(o),    \
            lse, LSE_BF16);                                                  \
    }                                                                        \
    extern "C" NNTILE_CUDA_SIGNATURE(flash_backward, A, ACC, S,              \
                                      NNTILE_BUFFERS_flash_backward)         \
    {                                                                        \
        nntile_cuda::backward<nntile_cuda::Storage<A>::type, C, MMA>(        \
            args, stream, storage(q), storage(k), storage(v), storage(o),    \
            storage(dout), lse, LSE_BF16, storage(dq), storage(dk),          \
            storage(dv));                                                    \
    }

NNTILE_FLASH_EXPORTS(fp32, float, float, float, false, 0)
NNTILE_FLASH_EXPORTS(tf32, float, float, float, true, 0)
NNTILE_FLASH_EXPORTS(fp64, double, double, double, false, 0)
NNTILE_FLASH_EXPORTS(bf16, uint16_t, uint16_t, float, true, 1)
