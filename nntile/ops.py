"""Tensor operations; each validates its inputs and submits one StarPU task per tile."""
from contextlib import contextmanager

from nntile._core.core import (add_bias, sum_bias, attn_qk, attn_pv, attn_ptv, add, cast, copy, fill, gemm, scal, prod, gelu, gelutanh,
                              gelu_backward, gelutanh_backward, add_fiber, prod_fiber,
                              sum_fiber, sumprod_fiber, sum_slice, sumprod_slice, add_slice,
                              prod_slice, maxsumexp, softmax_inplace, softmax_backward,
                              mask_causal, logsumexp, embedding, embedding_backward,
                              layernorm_forward, layernorm_backward, cross_entropy,
                              cross_entropy_backward, sumsq, adam_step, sgd_step,
                              set_task_priority, set_task_workers)

__all__ = ["add_bias", "sum_bias", "attn_qk", "attn_pv", "attn_ptv", "add", "cast", "copy", "fill", "gemm", "scal", "prod", "gelu", "gelutanh", "gelu_backward",
           "gelutanh_backward", "add_fiber", "prod_fiber", "sum_fiber", "sumprod_fiber",
           "sum_slice", "sumprod_slice", "add_slice", "prod_slice", "maxsumexp",
           "softmax_inplace", "softmax_backward", "mask_causal", "logsumexp", "embedding",
           "embedding_backward", "layernorm_forward", "layernorm_backward", "cross_entropy",
           "cross_entropy_backward", "sumsq", "adam_step", "sgd_step", "set_task_priority",
           "set_task_workers", "task_priority", "task_workers"]


@contextmanager
def task_priority(priority):
    """Tasks submitted inside the block get ``priority`` (see ``set_task_priority``)."""
    previous = set_task_priority(priority)
    try:
        yield
    finally:
        set_task_priority(previous)


@contextmanager
def task_workers(kind):
    """Tasks submitted inside the block run only on ``kind`` workers (see
    ``set_task_workers``)."""
    previous = set_task_workers(kind)
    try:
        yield
    finally:
        set_task_workers(previous)
