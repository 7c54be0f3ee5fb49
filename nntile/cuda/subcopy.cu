/* Copy the box copy_shape at src_offset (in src of shape src_shape) to
 * dst_offset (in dst of shape dst_shape) (twin of
 * _core/kernels/subcopy.inc).  Trailing dimensions contiguous in both
 * tensors are merged; one outer dimension left is a cudaMemcpy2DAsync,
 * more are a gather kernel. */
#include "common.cuh"

NNTILE_CUDA_BEGIN

/* The gather kernel's op: copies element e of the box (the inner run
 * contiguous in both tensors, nd outer dimensions). */
struct SubcopyGather {
    int nd; /* outer dims */
    int64_t inner;
    int64_t shape[NNTILE_SUBCOPY_MAX_NDIM];
    int64_t sst[NNTILE_SUBCOPY_MAX_NDIM];
    int64_t dst_st[NNTILE_SUBCOPY_MAX_NDIM];
    template <typename T>
    __device__ void operator()(int64_t e, const T *src, T *dst) const
    {
        int64_t rest = e / inner;
        const int64_t in = e - rest * inner;
        int64_t so = in, dof = in;
        for (int d = nd - 1; d >= 0; --d) {
            const int64_t q = rest / shape[d];
            const int64_t id = rest - q * shape[d];
            rest = q;
            so += id * sst[d];
            dof += id * dst_st[d];
        }
        dst[dof] = src[so];
    }
};

template <typename T>
void subcopy(const nntile_subcopy_args *a, cudaStream_t s, const T *src,
             T *dst)
{
    const int64_t nd = a->ndim;
    if (nd < 0 || nd > NNTILE_SUBCOPY_MAX_NDIM) {
        fprintf(stderr, "nntile cuda subcopy: bad ndim %lld\n", (long long)nd);
        abort();
    }
    for (int64_t d = 0; d < nd; ++d)
        if (a->copy_shape[d] <= 0)
            return;
    if (nd == 0) {
        cudaMemcpyAsync(dst, src, sizeof(T), cudaMemcpyDeviceToDevice, s);
        return;
    }
    int64_t sst[NNTILE_SUBCOPY_MAX_NDIM], dst_st[NNTILE_SUBCOPY_MAX_NDIM];
    sst[nd - 1] = 1;
    dst_st[nd - 1] = 1;
    for (int64_t d = nd - 1; d > 0; --d) {
        sst[d - 1] = sst[d] * a->src_shape[d];
        dst_st[d - 1] = dst_st[d] * a->dst_shape[d];
    }
    int64_t soff = 0, doff = 0;
    for (int64_t d = 0; d < nd; ++d) {
        soff += a->src_offset[d] * sst[d];
        doff += a->dst_offset[d] * dst_st[d];
    }
    int64_t inner = a->copy_shape[nd - 1];
    int64_t outer_nd = nd - 1;
    while (outer_nd > 0 && a->copy_shape[outer_nd] == a->src_shape[outer_nd]
           && a->copy_shape[outer_nd] == a->dst_shape[outer_nd]) {
        inner *= a->copy_shape[outer_nd - 1];
        --outer_nd;
    }
    if (outer_nd == 0) {
        cudaMemcpyAsync(dst + doff, src + soff, (size_t)inner * sizeof(T),
                        cudaMemcpyDeviceToDevice, s);
        return;
    }
    if (outer_nd == 1) {
        cudaMemcpy2DAsync(dst + doff, (size_t)dst_st[0] * sizeof(T),
                          src + soff, (size_t)sst[0] * sizeof(T),
                          (size_t)inner * sizeof(T),
                          (size_t)a->copy_shape[0], cudaMemcpyDeviceToDevice,
                          s);
        return;
    }
    SubcopyGather gather;
    gather.nd = (int)outer_nd;
    gather.inner = inner;
    int64_t total = inner;
    for (int d = 0; d < NNTILE_SUBCOPY_MAX_NDIM; ++d) {
        gather.shape[d] = d < outer_nd ? a->copy_shape[d] : 1;
        gather.sst[d] = d < outer_nd ? sst[d] : 0;
        gather.dst_st[d] = d < outer_nd ? dst_st[d] : 0;
        if (d < outer_nd)
            total *= a->copy_shape[d];
    }
    launch_elementwise(total, gather, s, src + soff, dst + doff);
}

NNTILE_CUDA_END

NNTILE_CUDA_EXPORT(subcopy)
