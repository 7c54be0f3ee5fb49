/* Cross-entropy kernels (twins of _core/kernels/xent.inc).  Logits tiles are
 * [rows, v] and cover vocabulary entries [v_offset, v_offset + v); labels
 * are global vocabulary indices (int64).  In mixed precision (the bf16_fp32
 * exports at the end) the logits are bf16 and the picked logits and row
 * statistics fp32: the same ops over two types. */
#include "common.cuh"

NNTILE_CUDA_BEGIN

/* picked[r] = logits[r, labels[r]] where this tile holds that entry */
struct XentPickedOp {
    int64_t v, v_offset;
    template <typename T, typename P>
    __device__ void operator()(int64_t r, const T *logits,
                               const int64_t *labels, P *picked) const
    {
        const int64_t c = labels[r] - v_offset;
        if ((uint64_t)c < (uint64_t)v)
            picked[r] = st<P>(ld(logits[r * v + c]));
    }
};

template <typename T, typename P>
void xent_picked(const nntile_xent_picked_args *a, cudaStream_t s,
                 const T *logits, const int64_t *labels, P *picked)
{
    if (a->v > 0)
        launch_elementwise(a->rows, XentPickedOp{a->v, a->v_offset}, s,
                           logits, labels, picked);
}

/* loss = alpha*(sum lse - sum picked) + beta*loss */
template <typename T> struct XentLossTerm {
    const T *lse, *picked;
    __device__ void operator()(int64_t i, double (&acc)[2]) const
    {
        acc[0] += (double)ld(lse[i]);
        acc[1] += (double)ld(picked[i]);
    }
};
template <typename T> struct XentLossEpi {
    T *loss;
    double alpha, beta;
    __device__ void operator()(const double (&acc)[2]) const
    {
        double s = alpha * (acc[0] - acc[1]);
        if (beta != 0.0)
            s += beta * (double)ld(loss[0]);
        loss[0] = st<T>((C_t<T>)s);
    }
};

template <typename T>
void xent_loss(const nntile_xent_loss_args *a, cudaStream_t s, const T *lse,
               const T *picked, T *loss)
{
    flat_reduce<2>(a->rows > 0 ? a->rows : 0, XentLossTerm<T>{lse, picked},
                   XentLossEpi<T>{loss, a->alpha, a->beta}, s);
}

/* logits = alpha*(softmax(logits) - onehot(label)), global row stats.
 * A group of threads per row: the row's shift, 1/sum and label column once
 * (per element, their division was most of the kernel's time), then the
 * row's elements in batches whose loads are issued together. */
template <typename C> struct XentGradRow {
    int64_t v, v_offset;
    C alpha;
    template <int TPR, typename S, typename T>
    __device__ void row(int64_t r, int tid, bool active, const S *stats,
                        const int64_t *labels, T *logits) const
    {
        if (!active)
            return;
        const C sh = exp_shift((C)ld(stats[2 * r]));
        const C inv = inv_sum((C)ld(stats[2 * r + 1]));
        const int64_t label = labels[r] - v_offset;
        T *row = logits + r * v;
        row_in_batches<TPR, C>(
            v, tid, [&](int64_t j) { return (C)ld(row[j]); },
            [&](int64_t j, C x) {
                row[j] = st<T>(xent_grad(vexp(x - sh), inv, alpha, j == label));
            });
    }
};

template <typename S, typename T>
void xent_grad_inplace(const nntile_xent_grad_inplace_args *a, cudaStream_t s,
                       const S *stats, const int64_t *labels, T *logits)
{
    if (a->v > 0)
        launch_rows(a->rows, a->v,
                    XentGradRow<C_t<T>>{a->v, a->v_offset, (C_t<T>)a->alpha}, s,
                    stats, labels, logits);
}

NNTILE_CUDA_END

NNTILE_CUDA_EXPORT(xent_picked)
NNTILE_CUDA_EXPORT(xent_loss)
NNTILE_CUDA_EXPORT(xent_grad_inplace)

NNTILE_CUDA_EXPORT_MIXED(xent_picked)
NNTILE_CUDA_EXPORT_MIXED(xent_grad_inplace)
