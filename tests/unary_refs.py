"""The float64 numpy reference of every unary op of kernels.h's op table (the lines marked
"unary:"): the one place a new unary op's test states what it computes. The CPU kernel test,
the tensor-op test and the CUDA test all read it, and the kernel test checks that its names
are the table's unary ops. Needs only numpy (the CUDA test has no nntile)."""
import math

import numpy as np

_erf = np.vectorize(math.erf)
_C_TANH = math.sqrt(2 / math.pi)


def gelu(x):
    return 0.5 * x * (1 + _erf(x / math.sqrt(2)))


def gelutanh(x):
    return 0.5 * x * (1 + np.tanh(_C_TANH * (x + 0.044715 * x ** 3)))


UNARY = {"gelu": gelu, "gelutanh": gelutanh}
