"""Tensor operations; each validates its inputs and submits one StarPU task per tile."""
from nntile._core.core import add, copy, fill, gemm, scal

__all__ = ["add", "copy", "fill", "gemm", "scal"]
