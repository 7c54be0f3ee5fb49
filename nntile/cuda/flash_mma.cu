/* Fused attention on the tensor cores (flash.cu says what runs where):
 * FlashAttention-2's loop structure with warp-level mma.sync, for bf16
 * (m16n8k16, fp32 accumulators) and TF32 (m16n8k8 on fp32 storage, operands
 * rounded to TF32 with cvt.rna).
 *
 * A block is 4 warps; each warp owns 16 rows of the block's tile (queries in
 * the forward and dq kernels, keys in the dk/dv kernel) and keeps their
 * accumulators in registers.  Tiles come into shared memory with cp.async,
 * rows padded by 16 bytes (conflict-free ldmatrix and column reads), the
 * head dimension zero-padded to DP (32, 64, 96 or 128).  Operands are read
 * with ldmatrix; an mma's result becomes the next mma's A operand in
 * registers (P for P.V, dS for dS.K): for bf16 two accumulator tiles of 8
 * columns are one 16-wide A fragment as they stand; for TF32 an accumulator
 * tile holds columns (2t, 2t+1) where the A fragment wants (t, t+4), so the
 * k index of that product is permuted, and its B operand is read with the
 * same permutation (B rows 2t and 2t+1 for k = t and t + 4).  Softmax runs
 * in the exp2 domain (scale * log2 e folded in), online over key tiles, in
 * fp32.
 *
 * Forward: a block per (64 queries, head, batch); key tiles of BK rows, the
 * next key tile loading while P.V runs and the value tile while q.k^T does.
 * Backward: dk/dv per (64 keys, kv head, batch) over every query tile of
 * every query head of the group (query tiles double-buffered where shared
 * memory allows two blocks per SM), and dq per (64 queries, head, batch)
 * over the key tiles (key tiles double-buffered likewise). */
#include "flash.cuh"

NNTILE_CUDA_BEGIN

namespace {

constexpr int kThreads = 128; /* 4 warps */
constexpr int kRows = 64;     /* rows of the block's own tile: 16 per warp */
constexpr float kLog2e = 1.4426950408889634f;
constexpr float kLn2 = 0.6931471805599453f;
constexpr unsigned kFull = 0xffffffffu;

/* ---------------------------------------------------------------- PTX */

__device__ __forceinline__ uint32_t smem_addr(const void *p)
{
    return (uint32_t)__cvta_generic_to_shared(p);
}

/* 16 bytes global -> shared, asynchronously; bytes = 0 writes zeros */
__device__ __forceinline__ void cp_async16(void *dst, const void *src,
                                           int bytes)
{
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(
                     smem_addr(dst)),
                 "l"(src), "r"(bytes)
                 : "memory");
}

__device__ __forceinline__ void cp_commit()
{
    asm volatile("cp.async.commit_group;\n" ::: "memory");
}

/* wait until at most N committed groups are still in flight */
template <int N> __device__ __forceinline__ void cp_wait()
{
    asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
}

/* four 8x8 matrices of 16-bit elements: lanes 8i..8i+7 give the row
 * addresses of matrix i; register i gets matrix i's (row lane/4, columns
 * 2(lane%4), 2(lane%4)+1), or with .trans its (rows 2(lane%4), 2(lane%4)+1,
 * column lane/4) */
__device__ __forceinline__ void ldsm4(uint32_t (&r)[4], const void *p)
{
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, "
                 "[%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(smem_addr(p)));
}

__device__ __forceinline__ void ldsm4_trans(uint32_t (&r)[4], const void *p)
{
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, "
                 "%2, %3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(smem_addr(p)));
}

__device__ __forceinline__ uint32_t tf32_bits(float x)
{
    uint32_t r;
    asm("cvt.rna.tf32.f32 %0, %1;\n" : "=r"(r) : "f"(x));
    return r;
}

__device__ __forceinline__ uint32_t bf16_pair(float lo, float hi)
{
    const __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
    return *(const uint32_t *)&v;
}

/* ---------------------------------------------------------------- mma kinds
 * An accumulator tile is 16 x 8 floats: c[0], c[1] at (row g, columns 2t,
 * 2t+1), c[2], c[3] at row g + 8 (g = lane/4, t = lane%4).  A fragments are
 * 16 x KS, B fragments KS x 8 (two registers). */

/* c += a b by the mma.sync instruction INSTR: row-major A, column-major B,
 * f32 accumulators in place */
#define NNTILE_MMA_SYNC(INSTR)                                                \
    static __device__ __forceinline__ void mma(float (&c)[4],                 \
                                               const uint32_t (&a)[4],        \
                                               uint32_t b0, uint32_t b1)      \
    {                                                                         \
        asm(INSTR " {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "           \
                  "{%0, %1, %2, %3};\n"                                       \
            : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])                  \
            : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));  \
    }

struct Bf16Mma {
    typedef bf16 T;
    static constexpr int KS = 16;
    NNTILE_MMA_SYNC("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32")
    /* an operand register as loaded (bf16 pairs need no conversion) */
    static __device__ __forceinline__ uint32_t operand(uint32_t x)
    {
        return x;
    }
    /* a probability or score gradient as it will enter acc_a (rounded
     * there, to bf16 pairs) */
    static __device__ __forceinline__ float round_acc(float x) { return x; }
    /* A fragment of k step j from accumulator tiles 2j and 2j + 1 */
    template <int N>
    static __device__ __forceinline__ void acc_a(uint32_t (&a)[4],
                                                 const float (&c)[N][4], int j)
    {
        a[0] = bf16_pair(c[2 * j][0], c[2 * j][1]);
        a[1] = bf16_pair(c[2 * j][2], c[2 * j][3]);
        a[2] = bf16_pair(c[2 * j + 1][0], c[2 * j + 1][1]);
        a[3] = bf16_pair(c[2 * j + 1][2], c[2 * j + 1][3]);
    }
    /* B fragments of n tiles n0 and n0 + 8 ({b0, b1}, {b2, b3}) for the k
     * step at k0, B(k, n) = X[k][n] (X row-major, row stride ld) */
    static __device__ __forceinline__ void b_rows(uint32_t (&b)[4],
                                                  const T *X, int ld, int k0,
                                                  int n0, int lane)
    {
        ldsm4_trans(b, X + (k0 + (lane & 7) + ((lane >> 3) & 1) * 8) * ld + n0
                           + (lane >> 4) * 8);
    }
};

struct Tf32Mma {
    typedef float T;
    static constexpr int KS = 8;
    NNTILE_MMA_SYNC("mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32")
    static __device__ __forceinline__ uint32_t operand(uint32_t x)
    {
        return tf32_bits(__uint_as_float(x));
    }
    /* rounded to TF32 where it is computed, so that the registers hold
     * the operand itself (converting in acc_a kept both copies alive) */
    static __device__ __forceinline__ float round_acc(float x)
    {
        return __uint_as_float(tf32_bits(x));
    }
    /* A fragment (a0 (g, t), a1 (g+8, t), a2 (g, t+4), a3 (g+8, t+4)) of k
     * step j from accumulator tile j (values from round_acc), whose columns
     * 2t, 2t+1 stand for k = t, t + 4 */
    template <int N>
    static __device__ __forceinline__ void acc_a(uint32_t (&a)[4],
                                                 const float (&c)[N][4], int j)
    {
        a[0] = __float_as_uint(c[j][0]);
        a[1] = __float_as_uint(c[j][2]);
        a[2] = __float_as_uint(c[j][1]);
        a[3] = __float_as_uint(c[j][3]);
    }
    /* B (b0 at k = t, b1 at k = t + 4, column g) with acc_a's permutation:
     * rows k0 + 2t and k0 + 2t + 1 of X */
    static __device__ __forceinline__ void b_rows(uint32_t (&b)[4],
                                                  const T *X, int ld, int k0,
                                                  int n0, int lane)
    {
        const T *x = X + (k0 + 2 * (lane & 3)) * ld + n0 + (lane >> 2);
        b[0] = tf32_bits(x[0]);
        b[1] = tf32_bits(x[ld]);
        b[2] = tf32_bits(x[8]);
        b[3] = tf32_bits(x[ld + 8]);
    }
};

/* A fragment of rows r0..r0+15, k step at k0, of X row-major (row stride
 * ld): the four matrices are (rows +0, cols +0), (+8, +0), (+0, +E), (+8, +E)
 * with E the elements of 16 bytes (8 bf16, 4 floats: a float is a pair of
 * 16-bit halves, so ldmatrix moves TF32 operands too). */
template <class M>
__device__ __forceinline__ void a_frag(uint32_t (&a)[4],
                                       const typename M::T *X, int ld, int r0,
                                       int k0, int lane)
{
    constexpr int E = 16 / sizeof(typename M::T);
    ldsm4(a, X + (r0 + (lane & 7) + ((lane >> 3) & 1) * 8) * ld + k0
                 + (lane >> 4) * E);
#pragma unroll
    for (int i = 0; i < 4; ++i)
        a[i] = M::operand(a[i]);
}

/* B fragments of n tiles n0 and n0 + 8 ({b0, b1}, {b2, b3}), k step at k0,
 * B(k, n) = X[n][k] (X row-major: keys as rows for q.k^T) */
template <class M>
__device__ __forceinline__ void b_cols(uint32_t (&b)[4],
                                       const typename M::T *X, int ld, int n0,
                                       int k0, int lane)
{
    constexpr int E = 16 / sizeof(typename M::T);
    ldsm4(b, X + (n0 + (lane & 7) + (lane >> 4) * 8) * ld + k0
                 + ((lane >> 3) & 1) * E);
#pragma unroll
    for (int i = 0; i < 4; ++i)
        b[i] = M::operand(b[i]);
}

/* ---------------------------------------------------------------- tiles */

/* Zeros columns d..DP of a rows-row tile (cp.async never writes them). */
template <typename T, int DP, int LD>
__device__ __forceinline__ void zero_pad(T *tile, int rows, int d)
{
    const int w = DP - d;
    for (int i = threadIdx.x; i < rows * w; i += kThreads) {
        const int r = i / w;
        tile[r * LD + d + i - r * w] = T(0.0f);
    }
}

/* rows x d of src (row r at src + r * stride) into a tile, asynchronously;
 * rows past nrows are zero-filled (src is valid: nrows >= 1). */
template <typename T, int DP, int LD>
__device__ __forceinline__ void load_tile(T *tile, const T *src,
                                          int64_t stride, int64_t nrows,
                                          int rows, int d)
{
    constexpr int E = 16 / sizeof(T), CH = DP / E;
    const int dch = d / E;
    for (int i = threadIdx.x; i < rows * CH; i += kThreads) {
        const int r = i / CH, c = i - r * CH;
        if (c < dch) {
            const bool in = r < nrows;
            cp_async16(tile + r * LD + c * E, in ? src + r * stride + c * E : src,
                       in ? 16 : 0);
        }
    }
}

/* a pair of output elements (columns col, col + 1) */
__device__ __forceinline__ void store_pair(bf16 *p, float a, float b)
{
    *(uint32_t *)p = bf16_pair(a, b);
}
__device__ __forceinline__ void store_pair(float *p, float a, float b)
{
    *(float2 *)p = make_float2(a, b);
}
__device__ __forceinline__ float2 load_pair(const bf16 *p)
{
    return __bfloat1622float2(*(const __nv_bfloat162 *)p);
}
__device__ __forceinline__ float2 load_pair(const float *p)
{
    return *(const float2 *)p;
}

/* lse of query row `row` of head h in the exp2 domain, +inf where it is
 * -inf (no key: every probability 0) and for rows past the tile */
__device__ __forceinline__ float lse2_of(const FlashParams &p, int64_t b,
                                         int64_t h, int64_t row)
{
    if (row >= p.tq)
        return CUDART_INF_F;
    const float l = lse_load<float>(p.lse, (b * p.tq + row) * p.hq + h,
                                    p.lse_bf16);
    return l == -CUDART_INF_F ? CUDART_INF_F : l * kLog2e;
}

/* The mask of a (query tile at q0, key tile at k0) pair: key kl of the key
 * tile is masked for query ql of the query tile when kl >= nk (past tk) or
 * the mask hides it.  any: some element of the pair is masked. */
struct TileMask {
    const FlashParams &p;
    int64_t q0, k0;
    int nk;
    bool any;
    __device__ TileMask(const FlashParams &p_, int64_t q0_, int64_t k0_,
                        int qrows, int krows)
        : p(p_), q0(q0_), k0(k0_)
    {
        const int64_t left = p.tk - k0;
        nk = left < krows ? (int)left : krows;
        const int64_t qa = p.q_offset + q0, ka = p.k_offset + k0;
        any = nk < krows
              || !nntile_mask_whole(p.mask, qa, qa + qrows, ka, ka + krows);
    }
    __device__ __forceinline__ bool masked(int kl, int ql) const
    {
        return kl >= nk || !flash_visible(p, q0 + ql, k0 + kl);
    }
};

/* A block of the forward or dq kernel: its query tile of kRows rows and the
 * key tiles of BK rows that it sees, [lo, hi), of its kv head's k and v.
 * The strides and d are read from p once, up front: a field of p read after
 * a cp.async (an asm statement that clobbers memory) is loaded again, at a
 * cost in registers. */
template <typename T, int DP, int LD, int BK> struct QueryBlock : QueryTile {
    const T *k, *v;
    int64_t qstride, kstride, lo, hi;
    __device__ QueryBlock(const FlashParams &p)
        : QueryTile(p, kRows), k(kv<T>(p, p.k)), v(kv<T>(p, p.v)),
          qstride(p.hq * p.d), kstride(p.hkv * p.d)
    {
        const nntile_range r = flash_key_blocks(p, q0, nq, BK);
        lo = r.lo;
        hi = r.hi;
    }
    /* the query tile's rows of src (q or dout) into dst, asynchronously */
    __device__ __forceinline__ void load_queries(T *dst, const void *src,
                                                 const FlashParams &p,
                                                 int d) const
    {
        load_tile<T, DP, LD>(dst, (const T *)src + offset(p), qstride, nq,
                             kRows, d);
    }
    /* the key tile at key k0 of src (k or v) into dst, asynchronously */
    __device__ __forceinline__ void load_keys(T *dst, const T *src, int64_t k0,
                                              const FlashParams &p,
                                              int d) const
    {
        load_tile<T, DP, LD>(dst, src + k0 * kstride, kstride, p.tk - k0, BK,
                             d);
    }
};

/* delta = rowsum(dout * o) and the exp2-domain lse of the 64 query rows
 * [q0, q0 + 64) of head h into smem (dOs: those dout rows, row stride LD);
 * two threads a row. */
template <typename T, int LD>
__device__ __forceinline__ void row_stats(const FlashParams &p, int64_t b,
                                          int64_t h, int64_t q0, const T *dOs,
                                          float *lse_s, float *del_s,
                                          int rows)
{
    const int tpr = kThreads / rows; /* 2 or 4 */
    const int r = threadIdx.x / tpr, part = threadIdx.x % tpr;
    const int64_t row = q0 + r;
    float acc = 0.f;
    if (row < p.tq) {
        const T *o = (const T *)p.o_in + ((b * p.tq + row) * p.hq + h) * p.d;
        for (int c = part; c < p.d; c += tpr)
            acc += ld(o[c]) * ld(dOs[r * LD + c]);
    }
    for (int m = 1; m < tpr; m <<= 1)
        acc += __shfl_xor_sync(kFull, acc, m);
    if (part == 0) {
        lse_s[r] = lse2_of(p, b, h, row);
        del_s[r] = row < p.tq ? acc : 0.f;
    }
}

/* ---------------------------------------------------------------- products
 * The warp-level products every kernel is made of. */

/* acc = X Y^T for the warp's 16 rows r0.. of X against the NT * 8 rows of
 * Y, over the head dimension (both row-major tiles: q k^T, dout v^T, and
 * the transposes k q^T, v dout^T). */
template <class M, int DP, int NT, int LD>
__device__ __forceinline__ void rows_dot(float (&acc)[NT][4],
                                         const typename M::T *X,
                                         const typename M::T *Y, int r0,
                                         int lane)
{
#pragma unroll
    for (int j = 0; j < NT; ++j)
        acc[j][0] = acc[j][1] = acc[j][2] = acc[j][3] = 0.f;
#pragma unroll
    for (int kk = 0; kk < DP / M::KS; ++kk) {
        uint32_t a[4];
        a_frag<M>(a, X, LD, r0, kk * M::KS, lane);
#pragma unroll
        for (int np = 0; np < NT / 2; ++np) {
            uint32_t bb[4];
            b_cols<M>(bb, Y, LD, np * 16, kk * M::KS, lane);
            M::mma(acc[2 * np], a, bb[0], bb[1]);
            M::mma(acc[2 * np + 1], a, bb[2], bb[3]);
        }
    }
}

/* acc += P X: P the warp's 16 x (NK * 8) accumulators (values from
 * M::round_acc), X a row-major tile of NK * 8 rows and NO * 8 columns
 * (P v, P^T dout, dS^T q, dS k). */
template <class M, int NK, int NO, int LD>
__device__ __forceinline__ void acc_times(float (&acc)[NO][4],
                                          const float (&pm)[NK][4],
                                          const typename M::T *X, int lane)
{
#pragma unroll
    for (int kk = 0; kk < NK * 8 / M::KS; ++kk) {
        uint32_t a[4];
        M::acc_a(a, pm, kk);
#pragma unroll
        for (int np = 0; np < NO / 2; ++np) {
            uint32_t bb[4];
            M::b_rows(bb, X, LD, kk * M::KS, np * 16, lane);
            M::mma(acc[2 * np], a, bb[0], bb[1]);
            M::mma(acc[2 * np + 1], a, bb[2], bb[3]);
        }
    }
}

/* Backward's probabilities and score gradients for the warp's 16 rows of
 * the pair (query tile at q0, key tile at k0), from X, dX (the block's own
 * tile of kRows rows: q and dout, or k and v) and Y, dY (the other side's, of
 * NT * 8 rows): s = P = exp2(X Y^T sl2 - lse) and dp = dS = P (dX dY^T -
 * delta).  KEY_ROWS: the rows are keys (dk/dv: P^T and dS^T) and lse and
 * delta hold a value per query column; else the rows are queries and lse
 * and delta hold the thread's two rows. */
template <class M, int DP, int NT, int LD, bool KEY_ROWS>
__device__ __forceinline__ void probs_and_grads(
    float (&s)[NT][4], float (&dp)[NT][4], const typename M::T *X,
    const typename M::T *Y, const typename M::T *dX, const typename M::T *dY,
    const FlashParams &p, int64_t q0, int64_t k0, const float *lse,
    const float *del, float sl2)
{
    const int lane = threadIdx.x & 31, r0 = (threadIdx.x >> 5) * 16;
    const int t = lane & 3;
    rows_dot<M, DP, NT, LD>(s, X, Y, r0, lane);
    rows_dot<M, DP, NT, LD>(dp, dX, dY, r0, lane);
    const TileMask mask(p, q0, k0, KEY_ROWS ? NT * 8 : kRows,
                        KEY_ROWS ? kRows : NT * 8);
#pragma unroll
    for (int j = 0; j < NT; ++j)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
            const int col = j * 8 + 2 * t + (e & 1);
            const int row = r0 + (lane >> 2) + (e >> 1) * 8;
            const int i = KEY_ROWS ? col : e >> 1;
            float pr = exp2f(s[j][e] * sl2 - lse[i]);
            if (mask.any
                && (KEY_ROWS ? mask.masked(row, col) : mask.masked(col, row)))
                pr = 0.f;
            dp[j][e] = M::round_acc(pr * (dp[j][e] - del[i]));
            s[j][e] = M::round_acc(pr);
        }
}

/* Row g + 8 rr of the warp's accumulators, times scale, into the first d
 * columns of a row of an output (plus what it holds, when add). */
template <typename T, int NO>
__device__ __forceinline__ void store_row(T *row, const float (&acc)[NO][4],
                                          int rr, float scale, bool add,
                                          int d, int t)
{
#pragma unroll
    for (int j = 0; j < NO; ++j) {
        if (j * 8 >= d)
            break;
        T *at = row + j * 8 + 2 * t;
        float v0 = scale * acc[j][2 * rr], v1 = scale * acc[j][2 * rr + 1];
        if (add) {
            const float2 old = load_pair(at);
            v0 += old.x;
            v1 += old.y;
        }
        store_pair(at, v0, v1);
    }
}

/* ---------------------------------------------------------------- forward */

template <class M, int DP, int BK>
__global__ void __launch_bounds__(kThreads) mma_forward_k(FlashParams p)
{
    typedef typename M::T T;
    constexpr int E = 16 / sizeof(T), LD = DP + E;
    constexpr int NS = BK / 8, NO = DP / 8, KQ = DP / M::KS;
    extern __shared__ __align__(16) unsigned char mma_smem[];
    T *Qs = (T *)mma_smem, *Ks = Qs + kRows * LD, *Vs = Ks + BK * LD;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int g = lane >> 2, t = lane & 3, d = (int)p.d;
    const QueryBlock<T, DP, LD, BK> blk(p);

    zero_pad<T, DP, LD>(Qs, kRows, d);
    zero_pad<T, DP, LD>(Ks, BK, d);
    zero_pad<T, DP, LD>(Vs, BK, d);
    blk.load_queries(Qs, p.q, p, d);
    if (blk.lo < blk.hi)
        blk.load_keys(Ks, blk.k, blk.lo * BK, p, d);
    cp_commit();
    cp_wait<0>();
    __syncthreads();
    /* q stays in registers, as A fragments */
    uint32_t qf[KQ][4];
#pragma unroll
    for (int kk = 0; kk < KQ; ++kk)
        a_frag<M>(qf[kk], Qs, LD, warp * 16, kk * M::KS, lane);

    float o[NO][4];
#pragma unroll
    for (int j = 0; j < NO; ++j)
        o[j][0] = o[j][1] = o[j][2] = o[j][3] = 0.f;
    float m_r[2] = {-CUDART_INF_F, -CUDART_INF_F}, l_r[2] = {0.f, 0.f};
    const float sl2 = (float)p.scale * kLog2e;
    const int qrow = warp * 16 + g; /* the thread's rows: qrow, qrow + 8 */

    for (int64_t kb = blk.lo; kb < blk.hi; ++kb) {
        const int64_t k0 = kb * BK;
        blk.load_keys(Vs, blk.v, k0, p, d);
        cp_commit();
        /* S = q k^T */
        float s[NS][4];
#pragma unroll
        for (int j = 0; j < NS; ++j)
            s[j][0] = s[j][1] = s[j][2] = s[j][3] = 0.f;
#pragma unroll
        for (int kk = 0; kk < KQ; ++kk)
#pragma unroll
            for (int np = 0; np < NS / 2; ++np) {
                uint32_t bb[4];
                b_cols<M>(bb, Ks, LD, np * 16, kk * M::KS, lane);
                M::mma(s[2 * np], qf[kk], bb[0], bb[1]);
                M::mma(s[2 * np + 1], qf[kk], bb[2], bb[3]);
            }
        /* scale into the exp2 domain; mask past tk and above the diagonal */
        const TileMask mask(p, blk.q0, k0, kRows, BK);
#pragma unroll
        for (int j = 0; j < NS; ++j)
#pragma unroll
            for (int e = 0; e < 4; ++e)
                s[j][e] = mask.any && mask.masked(j * 8 + 2 * t + (e & 1),
                                                  qrow + (e >> 1) * 8)
                              ? -CUDART_INF_F
                              : s[j][e] * sl2;
        /* online softmax of rows g and g + 8 (4 threads a row) */
#pragma unroll
        for (int rr = 0; rr < 2; ++rr) {
            float mx = -CUDART_INF_F;
#pragma unroll
            for (int j = 0; j < NS; ++j)
                mx = fmaxf(mx, fmaxf(s[j][2 * rr], s[j][2 * rr + 1]));
            mx = fmaxf(mx, __shfl_xor_sync(kFull, mx, 1));
            mx = fmaxf(mx, __shfl_xor_sync(kFull, mx, 2));
            const float m_new = fmaxf(m_r[rr], mx);
            const float shift = m_new == -CUDART_INF_F ? 0.f : m_new;
            const float alpha = exp2f(m_r[rr] - shift);
            m_r[rr] = m_new;
            float sum = 0.f;
#pragma unroll
            for (int j = 0; j < NS; ++j) {
                const float p0 = exp2f(s[j][2 * rr] - shift);
                const float p1 = exp2f(s[j][2 * rr + 1] - shift);
                sum += p0 + p1;
                s[j][2 * rr] = M::round_acc(p0);
                s[j][2 * rr + 1] = M::round_acc(p1);
            }
            l_r[rr] = l_r[rr] * alpha + sum; /* this thread's columns */
#pragma unroll
            for (int j = 0; j < NO; ++j) {
                o[j][2 * rr] *= alpha;
                o[j][2 * rr + 1] *= alpha;
            }
        }
        cp_wait<0>();
        __syncthreads(); /* V in; every warp done with K */
        if (kb + 1 < blk.hi)
            blk.load_keys(Ks, blk.k, k0 + BK, p, d);
        cp_commit();
        acc_times<M, NS, NO, LD>(o, s, Vs, lane); /* O += P v */
        cp_wait<0>();
        __syncthreads(); /* next K in; every warp done with V */
    }

    /* epilogue: normalise, or merge into the previous key tiles' o and lse */
    float lse_o[2], lsum[2];
#pragma unroll
    for (int rr = 0; rr < 2; ++rr) {
        float l = l_r[rr];
        l += __shfl_xor_sync(kFull, l, 1);
        l += __shfl_xor_sync(kFull, l, 2);
        lsum[rr] = l;
        const int64_t row = blk.q0 + qrow + rr * 8;
        lse_o[rr] = p.accumulate && row < p.tq
                        ? lse_load<float>(p.lse,
                                          (blk.b * p.tq + row) * p.hq + blk.h,
                                          p.lse_bf16)
                        : -CUDART_INF_F;
    }
    __syncwarp(); /* every lane has read lse before any writes it */
#pragma unroll
    for (int rr = 0; rr < 2; ++rr) {
        const int64_t row = blk.q0 + qrow + rr * 8;
        if (row >= p.tq)
            continue;
        const float l = lsum[rr];
        const float lse_t = l > 0.f ? (m_r[rr] + log2f(l)) * kLn2 : -CUDART_INF_F;
        const float inv = l > 0.f ? 1.f / l : 0.f;
        const int64_t at = (blk.b * p.tq + row) * p.hq + blk.h;
        T *orow = (T *)p.o + at * p.d;
        if (!p.accumulate) {
            store_row<T, NO>(orow, o, rr, inv, false, d, t);
            if (t == 0)
                lse_store<float>(p.lse, at, lse_t, p.lse_bf16);
            continue;
        }
        /* o = (a_o o_old + a_t O / l) / (a_o + a_t), a = exp(lse - max) */
        const float mx = fmaxf(lse_o[rr], lse_t);
        if (mx == -CUDART_INF_F)
            continue; /* nothing seen so far nor here */
        const float a_o = expf(lse_o[rr] - mx), a_t = expf(lse_t - mx);
        const float den = a_o + a_t, c_o = a_o / den;
        if (c_o != 0.f) { /* o_old is only read where it counts */
#pragma unroll
            for (int j = 0; j < NO; ++j) {
                if (j * 8 >= d)
                    break;
                T *at_o = orow + j * 8 + 2 * t;
                const float2 old = load_pair(at_o);
                store_pair(at_o, c_o * old.x, c_o * old.y);
            }
        }
        store_row<T, NO>(orow, o, rr, a_t * inv / den, c_o != 0.f, d, t);
        if (t == 0)
            lse_store<float>(p.lse, at, mx + logf(den), p.lse_bf16);
    }
}

/* ---------------------------------------------------------------- backward */

/* dk, dv: a block per (64 keys, kv head, batch); items are (query head of
 * the group, query tile of BQ rows), nstage = 2 double-buffers them. */
template <class M, int DP, int BQ>
__global__ void __launch_bounds__(kThreads)
mma_dkdv_k(FlashParams p, int nstage)
{
    typedef typename M::T T;
    constexpr int E = 16 / sizeof(T), LD = DP + E;
    constexpr int NQ = BQ / 8, NO = DP / 8;
    extern __shared__ __align__(16) unsigned char mma_smem[];
    T *Ks = (T *)mma_smem, *Vs = Ks + kRows * LD, *stage0 = Vs + kRows * LD;
    float *lse_s = (float *)(stage0 + nstage * 2 * BQ * LD), *del_s = lse_s + BQ;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int g = lane >> 2, t = lane & 3, d = (int)p.d;
    const KeyTile tile(p, kRows);
    const int64_t b = tile.b, hk = tile.hk, k0 = tile.k0, grp = p.hq / p.hkv;
    const int64_t qstride = p.hq * p.d, kstride = p.hkv * p.d;
    const nntile_range qbs = flash_query_blocks(p, k0, tile.nk, BQ);
    const int64_t qb0 = qbs.lo;
    const int64_t nqi = qbs.hi > qb0 ? qbs.hi - qb0 : 0, items = grp * nqi;

    zero_pad<T, DP, LD>(Ks, kRows, d);
    zero_pad<T, DP, LD>(Vs, kRows, d);
    zero_pad<T, DP, LD>(stage0, nstage * 2 * BQ, d);
    load_tile<T, DP, LD>(Ks, (const T *)p.k + tile.offset(p), kstride,
                         tile.nk, kRows, d);
    load_tile<T, DP, LD>(Vs, (const T *)p.v + tile.offset(p), kstride,
                         tile.nk, kRows, d);
    /* item it: query head and tile; into stage st (q, then dout) */
    auto item_head = [&](int64_t it) { return hk * grp + it / nqi; };
    auto item_q0 = [&](int64_t it) { return (qb0 + it % nqi) * BQ; };
    auto issue = [&](int64_t it, int st) {
        const int64_t q0 = item_q0(it);
        const int64_t qoff = ((b * p.tq + q0) * p.hq + item_head(it)) * p.d;
        T *Qs = stage0 + st * 2 * BQ * LD;
        load_tile<T, DP, LD>(Qs, (const T *)p.q + qoff, qstride, p.tq - q0,
                             BQ, d);
        load_tile<T, DP, LD>(Qs + BQ * LD, (const T *)p.dout + qoff, qstride,
                             p.tq - q0, BQ, d);
    };
    if (items > 0)
        issue(0, 0);
    cp_commit();

    float dk[NO][4], dv[NO][4];
#pragma unroll
    for (int j = 0; j < NO; ++j)
#pragma unroll
        for (int e = 0; e < 4; ++e)
            dk[j][e] = dv[j][e] = 0.f;
    const float sl2 = (float)p.scale * kLog2e;
    const int krow = warp * 16 + g; /* the thread's keys: krow, krow + 8 */

    for (int64_t it = 0; it < items; ++it) {
        const int st = nstage == 2 ? (int)(it & 1) : 0;
        if (nstage == 2 && it + 1 < items) {
            issue(it + 1, st ^ 1);
            cp_commit();
            cp_wait<1>();
        } else {
            if (nstage == 1 && it > 0) {
                issue(it, 0);
                cp_commit();
            }
            cp_wait<0>();
        }
        __syncthreads();
        const int64_t q0 = item_q0(it);
        const T *Qs = stage0 + st * 2 * BQ * LD, *dOs = Qs + BQ * LD;
        row_stats<T, LD>(p, b, item_head(it), q0, dOs, lse_s, del_s, BQ);
        __syncthreads();
        /* P^T and dS^T: rows the warp's keys */
        float pT[NQ][4], dsT[NQ][4];
        probs_and_grads<M, DP, NQ, LD, true>(pT, dsT, Ks, Qs, Vs, dOs, p, q0,
                                             k0, lse_s, del_s, sl2);
        acc_times<M, NQ, NO, LD>(dv, pT, dOs, lane); /* dV += P^T dout */
        acc_times<M, NQ, NO, LD>(dk, dsT, Qs, lane); /* dK += dS^T q */
        __syncthreads(); /* every warp done with this stage and the stats */
    }
    cp_wait<0>(); /* no query tile at all: k and v may still be arriving */

#pragma unroll
    for (int rr = 0; rr < 2; ++rr) {
        const int64_t kr = k0 + krow + rr * 8;
        if (kr >= p.tk)
            continue;
        const int64_t at = ((b * p.tk + kr) * p.hkv + hk) * p.d;
        const bool add = (p.accumulate & 2) != 0;
        store_row<T, NO>((T *)p.dk + at, dk, rr, (float)p.scale, add, d, t);
        store_row<T, NO>((T *)p.dv + at, dv, rr, 1.f, add, d, t);
    }
}

/* dq: a block per (64 queries, head, batch) over key tiles of BK rows,
 * nstage = 2 double-buffers them. */
template <class M, int DP, int BK>
__global__ void __launch_bounds__(kThreads) mma_dq_k(FlashParams p, int nstage)
{
    typedef typename M::T T;
    constexpr int E = 16 / sizeof(T), LD = DP + E;
    constexpr int NS = BK / 8, NO = DP / 8;
    extern __shared__ __align__(16) unsigned char mma_smem[];
    T *Qs = (T *)mma_smem, *dOs = Qs + kRows * LD, *stage0 = dOs + kRows * LD;
    float *lse_s = (float *)(stage0 + nstage * 2 * BK * LD);
    float *del_s = lse_s + kRows;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int g = lane >> 2, t = lane & 3, d = (int)p.d;
    const QueryBlock<T, DP, LD, BK> blk(p);

    zero_pad<T, DP, LD>(Qs, kRows, d);
    zero_pad<T, DP, LD>(dOs, kRows, d);
    zero_pad<T, DP, LD>(stage0, nstage * 2 * BK, d);
    blk.load_queries(Qs, p.q, p, d);
    blk.load_queries(dOs, p.dout, p, d);
    auto issue = [&](int64_t kb, int st) {
        const int64_t k0 = kb * BK;
        T *Ks = stage0 + st * 2 * BK * LD;
        blk.load_keys(Ks, blk.k, k0, p, d);
        blk.load_keys(Ks + BK * LD, blk.v, k0, p, d);
    };
    if (blk.lo < blk.hi)
        issue(blk.lo, 0);
    cp_commit();
    cp_wait<0>();
    __syncthreads();
    row_stats<T, LD>(p, blk.b, blk.h, blk.q0, dOs, lse_s, del_s, kRows);
    __syncthreads();
    const int qrow = warp * 16 + g; /* the thread's rows: qrow, qrow + 8 */
    const float lse_r[2] = {lse_s[qrow], lse_s[qrow + 8]};
    const float del_r[2] = {del_s[qrow], del_s[qrow + 8]};

    float dq[NO][4];
#pragma unroll
    for (int j = 0; j < NO; ++j)
        dq[j][0] = dq[j][1] = dq[j][2] = dq[j][3] = 0.f;
    const float sl2 = (float)p.scale * kLog2e;

    for (int64_t kb = blk.lo; kb < blk.hi; ++kb) {
        const int st = nstage == 2 ? (int)((kb - blk.lo) & 1) : 0;
        if (nstage == 2) {
            if (kb + 1 < blk.hi) {
                issue(kb + 1, st ^ 1);
                cp_commit();
                cp_wait<1>();
            } else
                cp_wait<0>();
        } else if (kb > blk.lo) {
            issue(kb, 0);
            cp_commit();
            cp_wait<0>();
        }
        __syncthreads();
        const int64_t k0 = kb * BK;
        const T *Ks = stage0 + st * 2 * BK * LD, *Vs = Ks + BK * LD;
        float pr[NS][4], ds[NS][4]; /* P is not needed past dS */
        probs_and_grads<M, DP, NS, LD, false>(pr, ds, Qs, Ks, dOs, Vs, p,
                                              blk.q0, k0, lse_r, del_r, sl2);
        acc_times<M, NS, NO, LD>(dq, ds, Ks, lane); /* dQ += dS k */
        __syncthreads(); /* every warp done with this stage */
    }

#pragma unroll
    for (int rr = 0; rr < 2; ++rr) {
        const int64_t row = blk.q0 + qrow + rr * 8;
        if (row < p.tq)
            store_row<T, NO>(
                (T *)p.dq + ((blk.b * p.tq + row) * p.hq + blk.h) * p.d, dq, rr,
                (float)p.scale, (p.accumulate & 1) != 0, d, t);
    }
}

/* ---------------------------------------------------------------- launch */

template <class M> struct MmaOf;
template <> struct MmaOf<bf16> { typedef Bf16Mma type; };
template <> struct MmaOf<float> { typedef Tf32Mma type; };

/* The second tile of each kernel (key tile of the forward and dq kernels,
 * query tile of the dk/dv kernel): 64 rows, or 32 where 64 would spill
 * (TF32 fragments take twice the registers of bf16 ones; dk/dv holds two
 * accumulators of the head dimension). */
template <typename T, int DP> constexpr int key_tile()
{
    return sizeof(T) == 4 && DP > 64 ? 32 : 64;
}
template <typename T, int DP> constexpr int query_tile()
{
    return DP > 64 || (sizeof(T) == 4 && DP > 32) ? 32 : 64;
}

/* Two stages where two blocks still fit an SM (227 KB of shared memory),
 * else one; 0 when not even one fits. */
inline int stages_for(size_t one, size_t two)
{
    return two <= 110 * 1024 ? 2 : (one <= 227 * 1024 ? 1 : 0);
}

inline bool grid_fits(int64_t blocks, const char *what)
{
    if (blocks <= 0x7fffffff)
        return true;
    fprintf(stderr, "nntile cuda %s: %lld blocks is too many\n", what,
            (long long)blocks);
    return false;
}

template <typename T, int DP>
bool forward_dp(const FlashParams &p, cudaStream_t s)
{
    typedef typename MmaOf<T>::type M;
    constexpr int BK = key_tile<T, DP>(), LD = DP + 16 / sizeof(T);
    const size_t bytes = (size_t)(kRows + 2 * BK) * LD * sizeof(T);
    const int64_t blocks = cdiv(p.tq, kRows) * p.hq * p.batch;
    if (!grid_fits(blocks, "flash_forward")
        || !flash_smem((const void *)mma_forward_k<M, DP, BK>, bytes,
                       "flash_forward"))
        return false;
    mma_forward_k<M, DP, BK><<<(unsigned)blocks, kThreads, bytes, s>>>(p);
    return flash_launched("flash_forward");
}

/* Both kernels are set up before either is launched, so that false means
 * that nothing ran (the caller then runs the plain kernels, and an
 * accumulating dq is not added twice). */
template <typename T, int DP>
bool backward_dp(const FlashParams &p, cudaStream_t s)
{
    typedef typename MmaOf<T>::type M;
    constexpr int BK = key_tile<T, DP>(), BQ = query_tile<T, DP>();
    constexpr int LD = DP + 16 / sizeof(T);
    const size_t own = (size_t)2 * kRows * LD * sizeof(T); /* q, dout / k, v */
    const size_t dq_stage = (size_t)2 * BK * LD * sizeof(T);
    const size_t dq_stats = (size_t)2 * kRows * sizeof(float);
    const size_t kv_stage = (size_t)2 * BQ * LD * sizeof(T);
    const size_t kv_stats = (size_t)2 * BQ * sizeof(float);
    const int dq_ns = stages_for(own + dq_stage + dq_stats,
                                 own + 2 * dq_stage + dq_stats);
    const int kv_ns = stages_for(own + kv_stage + kv_stats,
                                 own + 2 * kv_stage + kv_stats);
    const size_t dq_bytes = own + dq_ns * dq_stage + dq_stats;
    const size_t kv_bytes = own + kv_ns * kv_stage + kv_stats;
    const int64_t dq_blocks = cdiv(p.tq, kRows) * p.hq * p.batch;
    const int64_t kv_blocks = cdiv(p.tk, kRows) * p.hkv * p.batch;
    if (dq_ns == 0 || kv_ns == 0 || !grid_fits(dq_blocks, "flash_backward")
        || !grid_fits(kv_blocks, "flash_backward")
        || !flash_smem((const void *)mma_dq_k<M, DP, BK>, dq_bytes,
                       "flash_backward")
        || !flash_smem((const void *)mma_dkdv_k<M, DP, BQ>, kv_bytes,
                       "flash_backward"))
        return false;
    if (dq_blocks > 0) {
        mma_dq_k<M, DP, BK><<<(unsigned)dq_blocks, kThreads, dq_bytes, s>>>(
            p, dq_ns);
        if (!flash_launched("flash_backward"))
            return false;
    }
    if (kv_blocks > 0) {
        mma_dkdv_k<M, DP, BQ><<<(unsigned)kv_blocks, kThreads, kv_bytes, s>>>(
            p, kv_ns);
        flash_launched("flash_backward"); /* reported; dq has run already */
    }
    return true;
}

/* The head dimension padded to 32, 64, 96 or 128; 0 when the tensor cores
 * do not take this call. */
template <typename T> int mma_dp(const FlashParams &p)
{
    /* whole 16-byte rows of bf16 (8 elements); TF32 with a head dimension of 4
     * mod 8 (20) gave wrong results on an H100, so it takes the same rule */
    constexpr int E = 8;
    if (p.d <= 0 || p.d > 128 || p.d % E != 0)
        return 0;
    const void *ptrs[] = {p.q, p.k, p.v, p.o_in, p.dout, p.o, p.dq, p.dk, p.dv};
    for (const void *q : ptrs)
        if ((uintptr_t)q % 16 != 0)
            return 0;
    return (int)((p.d + 31) / 32 * 32);
}

/* f(std::integral_constant<int, DP>()) for the call's padded head dimension
 * DP (mma_dp), or false when the tensor cores do not take the call. */
template <typename T, typename F> bool with_dp(const FlashParams &p, F f)
{
    switch (mma_dp<T>(p)) {
    case 32: return f(std::integral_constant<int, 32>());
    case 64: return f(std::integral_constant<int, 64>());
    case 96: return f(std::integral_constant<int, 96>());
    case 128: return f(std::integral_constant<int, 128>());
    default: return false;
    }
}

} // namespace

template <typename T> bool mma_forward(const FlashParams &p, cudaStream_t s)
{
    return with_dp<T>(p, [&](auto dp) {
        return forward_dp<T, decltype(dp)::value>(p, s);
    });
}

template <typename T> bool mma_backward(const FlashParams &p, cudaStream_t s)
{
    return with_dp<T>(p, [&](auto dp) {
        return backward_dp<T, decltype(dp)::value>(p, s);
    });
}

template bool mma_forward<bf16>(const FlashParams &, cudaStream_t);
template bool mma_forward<float>(const FlashParams &, cudaStream_t);
template bool mma_backward<bf16>(const FlashParams &, cudaStream_t);
template bool mma_backward<float>(const FlashParams &, cudaStream_t);

NNTILE_CUDA_END
