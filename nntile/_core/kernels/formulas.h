/* Per-element formulas, written once for the CPU kernels (the .inc bodies)
 * and their CUDA twins (the .cu files of ../../cuda): what an activation, a
 * derivative, an optimizer step or a normalisation computes of one element
 * (or one row's scalars), in the compute type C. A kernel loads its
 * operands, calls the formula and stores the result; how it loops, reduces
 * and stores stays with the kernel.
 *
 * The CPU includes this file once per dtype (instantiate_one.h), after the
 * dtype's macros: C, VEXP, ERF, EXP, LOG, SQRT, COS and SIN, and PRIV for
 * the names (PRIV(gelu) is nntile_priv_gelu_fp32 in the fp32 instantiation). CUDA
 * includes it once (common.cuh): each formula is then a __host__ __device__
 * template over C, named as the formula (gelu), and the math macros name
 * common.cuh's overloads (vexp, m_erf, ...). No include guard, on purpose. */
#ifdef __CUDACC__
#define NNTILE_FORMULA template <typename C> __host__ __device__ __forceinline__
#define NNTILE_F(name) name
#else
#define NNTILE_FORMULA static inline
#define NNTILE_F(name) PRIV(name)
#endif

/* a / b for a sigmoid's denominator b = 1 + exp(.) >= 1: no subnormal
 * quotient to guard, so CUDA divides without IEEE division's slow path
 * (fdiv_ge1: <= 2 ulp, branch-free, and the loads of an unrolled element-wise
 * kernel can then be issued together). */
#ifdef __CUDACC__
#define NNTILE_DIV_GE1(a, b) fdiv_ge1(a, b)
#else
#define NNTILE_DIV_GE1(a, b) ((a) / (b))
#endif

/* ---- activations and their derivatives */

/* GELU (exact): 0.5 x (1 + erf(x/sqrt(2))) */
NNTILE_FORMULA C NNTILE_F(gelu)(C x)
{
    const C inv_sqrt2 = (C)0.70710678118654752440;
    return (C)0.5 * x * ((C)1 + ERF(x * inv_sqrt2));
}

/* d/dx = Phi(x) + x phi(x) */
NNTILE_FORMULA C NNTILE_F(gelu_deriv)(C x)
{
    const C inv_sqrt2 = (C)0.70710678118654752440;
    const C inv_sqrt2pi = (C)0.39894228040143267794;
    return (C)0.5 * ((C)1 + ERF(x * inv_sqrt2))
         + x * inv_sqrt2pi * VEXP((C)-0.5 * x * x);
}

/* GELU tanh approximation ("gelu_new"):
 * 0.5 x (1 + tanh(u)), u = sqrt(2/pi) (x + 0.044715 x^3),
 * computed as x * sigmoid(2u) = x / (1 + exp(-2u)) (same function, no
 * cancellation, vectorisable exp). */
NNTILE_FORMULA C NNTILE_F(gelutanh)(C x)
{
    const C k2 = (C)(-2 * 0.79788456080286535588); /* -2 sqrt(2/pi) */
    const C k1 = (C)0.044715;
    return NNTILE_DIV_GE1(x, (C)1 + VEXP(k2 * (x + k1 * x * x * x)));
}

/* With s = sigmoid(2u): 0.5(1+tanh u) = s, 0.5(1-tanh^2 u) = 2 s (1-s),
 * gelutanh'(x) = s + 2 x s (1-s) sqrt(2/pi) (1 + 3*0.044715 x^2). */
NNTILE_FORMULA C NNTILE_F(gelutanh_deriv)(C x)
{
    const C k0 = (C)0.79788456080286535588;
    const C k2 = (C)(-2 * 0.79788456080286535588);
    const C k1 = (C)0.044715;
    const C k3 = (C)(3 * 0.044715);
    const C x2 = x * x;
    const C s = NNTILE_DIV_GE1((C)1, (C)1 + VEXP(k2 * (x + k1 * x2 * x)));
    return s + (C)2 * x * s * ((C)1 - s) * k0 * ((C)1 + k3 * x2);
}

/* SiLU (swish): x * sigmoid(x) = x / (1 + exp(-x)) */
NNTILE_FORMULA C NNTILE_F(silu)(C x)
{
    return NNTILE_DIV_GE1(x, (C)1 + VEXP(-x));
}

/* d/dx = s (1 + x (1 - s)), s = sigmoid(x) */
NNTILE_FORMULA C NNTILE_F(silu_deriv)(C x)
{
    const C s = NNTILE_DIV_GE1((C)1, (C)1 + VEXP(-x));
    return s * ((C)1 + x * ((C)1 - s));
}

/* ---- softmax and cross entropy */

/* The shift before exponentiation: the max, or 0 when the max is -inf
 * (a fully masked row), so that exp(-inf - shift) = 0 instead of NaN. */
NNTILE_FORMULA C NNTILE_F(exp_shift)(C max)
{
    return max == (C)(-INFINITY) ? (C)0 : max;
}

/* 1/sum of a row's exponentials, 0 for a fully masked row (sum 0): its
 * probabilities are 0, never NaN. */
NNTILE_FORMULA C NNTILE_F(inv_sum)(C sum)
{
    return sum > (C)0 ? (C)1 / sum : (C)0;
}

/* (max, sum) of a row's running softmax statistics, sum = sum exp(x - max),
 * merged with a tile's (m1, s1) (sums in double). */
NNTILE_FORMULA void NNTILE_F(merge_maxsumexp)(C *max, double *sum, C m1,
                                              double s1)
{
    if (m1 > *max) {
        /* m1 > -inf here; *max may be -inf (then *sum == 0, exp -> 0) */
        *sum = *sum * exp((double)*max - (double)m1) + s1;
        *max = m1;
    } else if (m1 != (C)(-INFINITY)) {
        *sum = *sum + s1 * exp((double)m1 - (double)*max);
    }
    /* else: the tile is fully masked, nothing to merge */
}

/* The cross-entropy gradient of one logit, alpha (softmax - onehot), from
 * e = exp(logit - shift) and inv = 1/sum. */
NNTILE_FORMULA C NNTILE_F(xent_grad)(C e, C inv, C alpha, int is_label)
{
    return is_label ? alpha * (e * inv - (C)1) : e * (alpha * inv);
}

/* ---- the norms over a row of e_total elements: LayerNorm's statistic is
 * M2, the sum of squared deviations from the mean; RMSNorm's the sum of x^2 */

/* 1/sqrt(s / e_total + eps): LayerNorm's biased variance (as torch) or
 * RMSNorm's mean square, plus eps */
NNTILE_FORMULA C NNTILE_F(norm_rstd)(double s, int64_t e_total, double eps)
{
    return (C)(1.0 / sqrt(s / (double)e_total + eps));
}

/* ---- layer norm: stats (mean, M2) */

/* y = (x - mean) rstd gamma + beta */
NNTILE_FORMULA C NNTILE_F(ln_y)(C x, C mean, C rstd, C gamma, C beta)
{
    return (x - mean) * rstd * gamma + beta;
}

/* the input gradient from xhat, g = dy * gamma and the row's sums divided by
 * e_total: c0 = mean g, c1 = mean g * xhat */
NNTILE_FORMULA C NNTILE_F(ln_dx)(C rstd, C g, C xhat, C c0, C c1)
{
    return rstd * (g - c0 - xhat * c1);
}

/* ---- RMSNorm: stats = sum of x^2 */

/* the input gradient from xhat = x rstd, g = dy * weight and c = mean g xhat
 * (y = weight xhat, xhat = x / rms(x)) */
NNTILE_FORMULA C NNTILE_F(rms_dx)(C rstd, C g, C xhat, C c)
{
    return rstd * (g - xhat * c);
}

/* ---- rotary positions (the non-interleaved, rotate_half layout) */

/* cos and sin of the angle pos * inv_freq (computed in C), times the
 * attention scaling */
NNTILE_FORMULA void NNTILE_F(rope_cos_sin)(C pos, C inv_freq, C scale, C *c,
                                           C *s)
{
    const C angle = pos * inv_freq;
    *c = COS(angle) * scale;
    *s = SIN(angle) * scale;
}

/* the pair (x1, x2) = (x[j], x[j + head_dim/2]) rotated by the angle whose
 * cos and sin are c and s: x1 c - x2 s, x2 c + x1 s */
NNTILE_FORMULA void NNTILE_F(rope_rotate)(C x1, C x2, C c, C s, C *y1, C *y2)
{
    *y1 = x1 * c - x2 * s;
    *y2 = x2 * c + x1 * s;
}

/* ---- SwiGLU: h = silu(gate) up */

/* the gradients of gate and up from dh */
NNTILE_FORMULA void NNTILE_F(swiglu_grad)(C gate, C up, C dh, C *dgate,
                                          C *dup)
{
    const C s = NNTILE_DIV_GE1((C)1, (C)1 + VEXP(-gate));
    *dup = dh * gate * s;
    *dgate = dh * up * s * ((C)1 + gate * ((C)1 - s));
}

/* ---- optimizer steps (torch.optim, foreach=False) */

/* Gradient clipping as torch.nn.utils.clip_grad_norm_:
 * min(max_norm / (||g|| + 1e-6), 1) from the squared norm. */
NNTILE_FORMULA C NNTILE_F(clip_coef)(C normsq, double max_norm)
{
    const C coef = (C)max_norm / (SQRT(normsq) + (C)1e-6);
    return coef < (C)1 ? coef : (C)1;
}

/* One Adam(W) element: the moments m, v updated in place, the new parameter
 * returned. p has had the decoupled decay, g the clipping and the coupled
 * decay. The first moment is torch's lerp(m, g, w1): for w1 < 0.5 (low)
 * m + w1 (g - m), else g - (g - m)(1 - w1), with w1c = 1 - w1. */
NNTILE_FORMULA C NNTILE_F(adam)(C p, C g, C *m, C *v, C w1, C w1c, int low,
                                C b2, C w2, C bc2_sqrt, C eps,
                                C neg_step_size)
{
    *m = low ? *m + w1 * (g - *m) : g - (g - *m) * w1c;
    *v = *v * b2 + w2 * g * g;
    const C denom = SQRT(*v) / bc2_sqrt + eps;
    return p + neg_step_size * *m / denom;
}

/* One SGD element with momentum: buf updated in place (set to g at the first
 * step), the new parameter returned (g has had clipping and weight decay). */
NNTILE_FORMULA C NNTILE_F(sgd_momentum)(C p, C g, C *buf, C mom, C damp,
                                        C neg_lr, int first, int nesterov)
{
    *buf = first ? g : *buf * mom + damp * g;
    return p + neg_lr * (nesterov ? g + mom * *buf : *buf);
}

#undef NNTILE_FORMULA
#undef NNTILE_F
