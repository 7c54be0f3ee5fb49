/* Scratch memory of a call, ordered on its stream (internal, host code: the
 * .cu kernels and cudnn_attention.cpp include it). */
#ifndef NNTILE_CUDA_SCRATCH_H
#define NNTILE_CUDA_SCRATCH_H

#include <cuda_runtime.h>
#include <string.h>

#include <mutex>

#pragma GCC visibility push(hidden)
namespace nntile_cuda {

/* Stream-ordered scratch memory (no host synchronisation): the partial sums
 * of split reductions, cuDNN's attention workspace.  Memory in use on one
 * stream is never handed to another, so calls that overlap on the device (a
 * StarPU thread drives several workers of a GPU, one stream each) never
 * share it.  It comes from a memory pool of our own per device that keeps
 * its memory (release threshold: unlimited), so that an allocation after a
 * synchronisation does not go back to the driver (the default pool returns
 * its memory at every synchronisation).  ptr is NULL when allocation
 * failed; callers then take a path without scratch. */
inline cudaMemPool_t scratch_pool()
{
    constexpr int kMaxDev = 64;
    static std::mutex mu;
    static cudaMemPool_t pools[kMaxDev];
    static bool tried[kMaxDev];
    int dev = 0;
    if (cudaGetDevice(&dev) != cudaSuccess || dev < 0 || dev >= kMaxDev) {
        (void)cudaGetLastError();
        return nullptr;
    }
    std::lock_guard<std::mutex> lock(mu);
    if (!tried[dev]) {
        tried[dev] = true;
        cudaMemPoolProps props;
        memset(&props, 0, sizeof(props));
        props.allocType = cudaMemAllocationTypePinned;
        props.handleTypes = cudaMemHandleTypeNone;
        props.location.type = cudaMemLocationTypeDevice;
        props.location.id = dev;
        if (cudaMemPoolCreate(&pools[dev], &props) == cudaSuccess) {
            uint64_t keep = UINT64_MAX;
            cudaMemPoolSetAttribute(pools[dev],
                                    cudaMemPoolAttrReleaseThreshold, &keep);
        } else {
            pools[dev] = nullptr;
            (void)cudaGetLastError();
        }
    }
    return pools[dev];
}

struct Scratch {
    void *ptr = nullptr;
    cudaStream_t stream;
    Scratch(size_t bytes, cudaStream_t s) : stream(s)
    {
        cudaMemPool_t pool = scratch_pool();
        const cudaError_t err =
            pool ? cudaMallocFromPoolAsync(&ptr, bytes, pool, s)
                 : cudaMallocAsync(&ptr, bytes, s);
        if (err != cudaSuccess) {
            ptr = nullptr;
            (void)cudaGetLastError();
        }
    }
    ~Scratch()
    {
        if (ptr)
            cudaFreeAsync(ptr, stream);
    }
    Scratch(const Scratch &) = delete;
    Scratch &operator=(const Scratch &) = delete;
};

} // namespace nntile_cuda
#pragma GCC visibility pop

#endif
