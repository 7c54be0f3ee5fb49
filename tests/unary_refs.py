"""The float64 numpy reference of every activation of kernels.h's op table (its X_ACT lines):
the one place a new activation's test states what it computes, its value and its derivative.
The CPU kernel test, the tensor-op test and the CUDA test all read it, and the kernel test
checks that its names are the table's activations. Needs only numpy (the CUDA test has no
nntile)."""
import math

import numpy as np

_erf = np.vectorize(math.erf)
_C_TANH = math.sqrt(2 / math.pi)


def gelu(x):
    return 0.5 * x * (1 + _erf(x / math.sqrt(2)))


def gelu_deriv(x):
    return 0.5 * (1 + _erf(x / math.sqrt(2))) + x * np.exp(-0.5 * x * x) / math.sqrt(2 * math.pi)


def gelutanh(x):
    return 0.5 * x * (1 + np.tanh(_C_TANH * (x + 0.044715 * x ** 3)))


def gelutanh_deriv(x):
    t = np.tanh(_C_TANH * (x + 0.044715 * x ** 3))
    return 0.5 * (1 + t) + 0.5 * x * (1 - t * t) * _C_TANH * (1 + 3 * 0.044715 * x * x)


def silu(x):
    return x / (1 + np.exp(-x))


def silu_deriv(x):
    s = 1 / (1 + np.exp(-x))
    return s * (1 + x * (1 - s))


# activation: (value, derivative)
ACTIVATIONS = {"gelu": (gelu, gelu_deriv), "gelutanh": (gelutanh, gelutanh_deriv),
               "silu": (silu, silu_deriv)}
