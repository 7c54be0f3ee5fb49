"""Tensor operations; each validates its inputs and submits one StarPU task per tile."""
from nntile._core.core import (add_bias, sum_bias, attn_qk, attn_pv, attn_ptv, add, copy, fill, gemm, scal, prod, gelu, gelutanh,
                              gelu_backward, gelutanh_backward, add_fiber, prod_fiber,
                              sum_fiber, sumprod_fiber, sum_slice, sumprod_slice, add_slice,
                              prod_slice, maxsumexp, softmax_inplace, softmax_backward,
                              mask_causal, logsumexp, embedding, embedding_backward,
                              layernorm_forward, layernorm_backward, cross_entropy,
                              cross_entropy_backward, sumsq, adam_step, sgd_step)

__all__ = ["add_bias", "sum_bias", "attn_qk", "attn_pv", "attn_ptv", "add", "copy", "fill", "gemm", "scal", "prod", "gelu", "gelutanh", "gelu_backward",
           "gelutanh_backward", "add_fiber", "prod_fiber", "sum_fiber", "sumprod_fiber",
           "sum_slice", "sumprod_slice", "add_slice", "prod_slice", "maxsumexp",
           "softmax_inplace", "softmax_backward", "mask_causal", "logsumexp", "embedding",
           "embedding_backward", "layernorm_forward", "layernorm_backward", "cross_entropy",
           "cross_entropy_backward", "sumsq", "adam_step", "sgd_step"]
