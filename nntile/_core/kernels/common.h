/* Shared, dtype-independent helpers for the kernel implementations.
 * Internal: not part of the kernel API. */
#ifndef NNTILE_KERNELS_COMMON_H
#define NNTILE_KERNELS_COMMON_H

#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels.h"

/* GCC refuses to if-convert (and so to vectorise) loops containing
 * floating-point selects such as `x > hi ? hi : x` under the default
 * -ftrapping-math.  The kernels never rely on floating-point exception flags,
 * so trapping math is turned off for every function defined after this point
 * (results are unchanged; only FE_* flag behaviour may differ).  Clang
 * vectorises these selects without it.  (-fno-math-errno cannot be set this
 * way; pass it on the command line so that sqrt() loops vectorise.) */
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC optimize("no-trapping-math")
#endif

#define NNTILE_CAT_(a, b) a##b
#define NNTILE_CAT(a, b) NNTILE_CAT_(a, b)

/* Scratch buffer: a caller-provided stack array when large enough, heap
 * otherwise.  Kernels cannot report errors, so allocation failure aborts. */
#define NNTILE_STACK_BYTES 4096
static inline void *nntile_scratch_get(void *stackbuf, size_t stackbytes,
                                       size_t bytes)
{
    if (bytes <= stackbytes)
        return stackbuf;
    void *p = malloc(bytes);
    if (p == NULL) {
        fprintf(stderr, "nntile kernels: out of memory (%zu bytes)\n", bytes);
        abort();
    }
    return p;
}
static inline void nntile_scratch_put(void *p, void *stackbuf)
{
    if (p != stackbuf)
        free(p);
}

/* bfloat16 <-> float.  A bf16 value is the upper half of a float's bits.
 * bf16 -> float is exact.  float -> bf16 rounds to nearest, ties to even
 * (overflow gives +-inf as IEEE rounding does); a NaN stays a NaN of the same
 * sign (made quiet, so that truncation cannot turn it into an infinity).
 * Both are branch-free so that the loops that use them vectorise. */
static inline float nntile_bf16_to_float(uint16_t h)
{
    const uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

static inline uint16_t nntile_float_to_bf16(float f)
{
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    const uint32_t rounded = (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;
    const uint32_t quiet_nan = (u >> 16) | 0x40u;
    return (uint16_t)((u & 0x7fffffffu) > 0x7f800000u ? quiet_nan : rounded);
}

/* double -> bf16 rounded once (to nearest even), as the host conversion does:
 * double -> float rounded to odd keeps enough information for the final
 * rounding to be correct.  Used for scalars (fill), not in loops. */
static inline uint16_t nntile_double_to_bf16(double x)
{
    float t = (float)x;
    if (isnan(x) || isinf(x))
        return nntile_float_to_bf16(t);
    if (fabs((double)t) > fabs(x))
        t = nextafterf(t, 0.0f); /* truncate toward zero */
    if ((double)t != x) {
        uint32_t u;
        memcpy(&u, &t, sizeof u);
        u |= 1u; /* sticky bit: inexact */
        memcpy(&t, &u, sizeof t);
    }
    return nntile_float_to_bf16(t);
}

/* Index i is in [0, n) (one unsigned compare, no branch on sign). */
#define NNTILE_IN_RANGE(i, n) ((uint64_t)(i) < (uint64_t)(n))

/* Branch-free exp that the compilers vectorise (libm's exp/expf are scalar
 * calls).  Cody-Waite reduction x = n*ln2 + r, |r| <= ln2/2, Taylor
 * polynomial for exp(r), 2^n built in the exponent bits.  Accuracy: about
 * 1-2 ulp.  exp(-inf) = 0 exactly; results below the smallest normal number
 * flush to 0; a result above ~2^127.5 (float) / 2^1023.5 (double) gives +inf;
 * NaN propagates. */
/* One body for both precisions: F the floating type and U the integer type of
 * its bits, MANT its mantissa bits and BIAS its exponent bias; [lo, hi] the
 * range that neither flushes nor overflows; magic = 1.5 * 2^MANT (adding it
 * rounds to an integer); ln2 = ln2_hi + ln2_lo; then the Taylor coefficients,
 * highest degree first. */
#define NNTILE_VEXP(name, F, U, MANT, BIAS, lo_, hi_, magic_, log2e, ln2_hi,  \
                    ln2_lo, ...)                                              \
    static inline F name(F x)                                                 \
    {                                                                         \
        static const F coef[] = {__VA_ARGS__};                                \
        const F lo = lo_, hi = hi_;                                           \
        F xc = x > hi ? hi : x;                                               \
        xc = xc < lo ? lo : xc;                                               \
        const F magic = magic_;                                               \
        const F t = xc * log2e + magic;                                       \
        const F nf = t - magic;                                               \
        const F r = (xc - nf * ln2_hi) - nf * ln2_lo;                         \
        F p = coef[0];                                                        \
        for (size_t i = 1; i < sizeof coef / sizeof coef[0]; ++i)             \
            p = p * r + coef[i];                                              \
        U tb;                                                                 \
        memcpy(&tb, &t, sizeof tb);                                           \
        const U sb = (tb << MANT) + ((U)BIAS << MANT);                        \
        F scale;                                                              \
        memcpy(&scale, &sb, sizeof scale);                                    \
        F res = p * scale;                                                    \
        res = x > hi ? (F)INFINITY : res;                                     \
        res = x < lo ? (F)0 : res;                                            \
        return res;                                                           \
    }

/* magic 0x1.8p23; 1/7! .. 1/0! */
NNTILE_VEXP(nntile_vexpf, float, uint32_t, 23, 127, -87.33f, 88.37f,
            12582912.0f, 1.44269504088896341f, 0.693359375f, -2.12194440e-4f,
            1.0f / 5040, 1.0f / 720, 1.0f / 120, 1.0f / 24, 1.0f / 6, 0.5f,
            1.0f, 1.0f)

/* magic 0x1.8p52; 1/13! .. 1/0! */
NNTILE_VEXP(nntile_vexp, double, uint64_t, 52, 1023, -708.39, 709.43,
            6755399441055744.0, 1.44269504088896338700e+00,
            6.93147180369123816490e-01, 1.90821492927058770002e-10,
            1.0 / 6227020800.0, 1.0 / 479001600.0, 1.0 / 39916800.0,
            1.0 / 3628800.0, 1.0 / 362880.0, 1.0 / 40320.0, 1.0 / 5040.0,
            1.0 / 720.0, 1.0 / 120.0, 1.0 / 24.0, 1.0 / 6.0, 0.5, 1.0, 1.0)
#undef NNTILE_VEXP

#endif /* NNTILE_KERNELS_COMMON_H */
