/* Optimizer steps mirroring torch.optim (twins of _core/kernels/optim.inc):
 * element math in the compute type with scalars rounded to it; the step
 * scalars are computed on the host in double exactly as on the CPU.
 * Gradient clipping (max_norm > 0 and normsq != NULL): normsq is a DEVICE
 * pointer to the squared global norm, read inside the kernel. */
#include "common.cuh"

NNTILE_CUDA_BEGIN

template <typename T>
__device__ __forceinline__ C_t<T> clip(int on, double max_norm, const T *normsq)
{
    return on ? clip_coef(ld(normsq[0]), max_norm) : (C_t<T>)1;
}

template <typename C> struct AdamScalars {
    C p_scale, c_wd, w1, w1c, b2, w2, neg_step_size, bc2_sqrt, eps;
    int lerp_low; /* torch lerp: weight < 0.5 */
    int clip;
    double max_norm;
};

/* The update, element-wise.  copy (may be null): receives the new p rounded
 * to its type TC, the refresh of mixed precision's bf16 copy fused into the
 * update.  p, m and v are updated in place, so a thread loads all its items
 * first (LoadsFirst, common.cuh). */
template <typename C> struct AdamOp {
    AdamScalars<C> k;
    struct Item {
        C p, g, m, v;
    };
    template <typename T, typename TC>
    __device__ Item load(int64_t i, T *p, const T *g, T *m, T *v, const T *,
                         TC *) const
    {
        return {ld(p[i]), ld(g[i]), ld(m[i]), ld(v[i])};
    }
    template <typename T, typename TC>
    __device__ void store(int64_t i, Item it, T *p, const T *, T *m, T *v,
                          const T *normsq, TC *copy) const
    {
        const C pi = it.p * k.p_scale;
        const C gi = it.g * clip(k.clip, k.max_norm, normsq) + k.c_wd * pi;
        const C pn = adam(pi, gi, &it.m, &it.v, k.w1, k.w1c, k.lerp_low, k.b2,
                          k.w2, k.bc2_sqrt, k.eps, k.neg_step_size);
        m[i] = st<T>(it.m);
        v[i] = st<T>(it.v);
        p[i] = st<T>(pn);
        if (copy != nullptr)
            copy[i] = st<TC>(pn);
    }
};

template <typename T, typename TC = T>
void adam_step(const nntile_adam_step_args *a, cudaStream_t s, T *p,
               const T *g, T *m, T *v, const T *normsq, TC *copy = nullptr)
{
    typedef C_t<T> C;
    if (a->n <= 0)
        return;
    const double lr = a->lr, beta1 = a->beta1, beta2 = a->beta2;
    const double wd = a->weight_decay;
    const double step = (double)a->step;
    AdamScalars<C> k;
    k.clip = a->max_norm > 0.0 && normsq != nullptr;
    k.max_norm = a->max_norm;
    k.p_scale = a->decoupled ? (C)(1.0 - lr * wd) : (C)1;
    k.c_wd = a->decoupled ? (C)0 : (C)wd;
    k.w1 = (C)(1.0 - beta1);
    k.w1c = (C)1 - k.w1;
    k.b2 = (C)beta2;
    k.w2 = (C)(1.0 - beta2);
    const double bc1 = 1.0 - pow(beta1, step);
    const double bc2 = 1.0 - pow(beta2, step);
    k.neg_step_size = (C)(-(lr / bc1));
    k.bc2_sqrt = (C)sqrt(bc2);
    k.eps = (C)a->eps;
    k.lerp_low = fabs(1.0 - beta1) < 0.5;
    launch_elementwise(a->n, AdamOp<C>{k}, s, p, g, m, v, normsq, copy);
}

/* SGD, element-wise, with momentum where mom != 0 (buf: the momentum
 * buffer, not read at the first step).  p and buf are updated in place, so a
 * thread loads all its items first (LoadsFirst, common.cuh). */
template <typename C> struct SgdOp {
    C wd, mom, damp, neg_lr;
    int use_momentum, first, nesterov, clip_on;
    double max_norm;
    struct Item {
        C p, g, buf;
    };
    template <typename T>
    __device__ Item load(int64_t i, T *p, const T *g, T *buf, const T *) const
    {
        return {ld(p[i]), ld(g[i]), use_momentum && !first ? ld(buf[i]) : (C)0};
    }
    template <typename T>
    __device__ void store(int64_t i, Item it, T *p, const T *, T *buf,
                          const T *normsq) const
    {
        const C gi = it.g * clip(clip_on, max_norm, normsq) + wd * it.p;
        if (!use_momentum) {
            p[i] = st<T>(it.p + neg_lr * gi);
            return;
        }
        C bi = it.buf;
        const C pn = sgd_momentum(it.p, gi, &bi, mom, damp, neg_lr, first, nesterov);
        buf[i] = st<T>(bi);
        p[i] = st<T>(pn);
    }
};

template <typename T>
void sgd_step(const nntile_sgd_step_args *a, cudaStream_t s, T *p,
              const T *g, T *buf, const T *normsq)
{
    typedef C_t<T> C;
    if (a->n <= 0)
        return;
    const SgdOp<C> op{(C)a->weight_decay, (C)a->momentum, (C)(1.0 - a->dampening),
                      (C)(-a->lr), a->momentum != 0.0, a->step <= 1, a->nesterov != 0,
                      a->max_norm > 0.0 && normsq != nullptr, a->max_norm};
    launch_elementwise(a->n, op, s, p, g, buf, normsq);
}

NNTILE_CUDA_END

NNTILE_CUDA_EXPORT(adam_step)
NNTILE_CUDA_EXPORT(sgd_step)

using namespace nntile_cuda;

/* Mixed precision: the fp32 master update and the refresh of its bf16 copy
 * in one pass (see mixed.cu for what else is fused). */
extern "C" void nntile_cuda_adam_step_refresh_bf16_fp32(
    const struct nntile_adam_step_args *args, cudaStream_t stream, float *p,
    const float *g, float *m, float *v, uint16_t *copy, const float *normsq)
{
    adam_step(args, stream, p, g, m, v, normsq, (bf16 *)copy);
}
