/* Fused attention (flash_forward / flash_backward): what flash.cu gives
 * cudnn_attention.cpp, in plain C++ (no device code), so that the cuDNN
 * file compiles with the host compiler alone.
 *
 * The bf16_fp32 column (bf16 q, k, v, o and gradients, fp32 lse) runs cuDNN's
 * fused SDPA where cuDNN applies and these kernels of ours otherwise. */
#ifndef NNTILE_CUDA_FLASH_H
#define NNTILE_CUDA_FLASH_H

#include <stdint.h>
#include <cuda_runtime_api.h>

#include "cuda_kernels.h"

namespace nntile_cuda {

/* Our bf16 tensor-core kernels with an fp32 lse (the bf16_fp32 column). */
void flash_forward_bf16_fp32(const struct nntile_flash_args *args,
                             cudaStream_t stream, const uint16_t *q,
                             const uint16_t *k, const uint16_t *v,
                             uint16_t *o, float *lse);
void flash_backward_bf16_fp32(const struct nntile_flash_args *args,
                              cudaStream_t stream, const uint16_t *q,
                              const uint16_t *k, const uint16_t *v,
                              const uint16_t *o, const uint16_t *dout,
                              const float *lse, uint16_t *dq, uint16_t *dk,
                              uint16_t *dv);

/* Our lse is [batch, t, h]; cuDNN's softmax statistics are [batch, h, t]
 * (cuDNN reads other layouts wrongly before 9.26).  dst = src with its two
 * inner axes swapped: src [batch, n1, n2] -> dst [batch, n2, n1]. */
cudaError_t swap_inner_axes(const float *src, float *dst, int64_t batch,
                            int64_t n1, int64_t n2, cudaStream_t stream);

} // namespace nntile_cuda

#endif /* NNTILE_CUDA_FLASH_H */
