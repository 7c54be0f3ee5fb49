"""The precisions a model trains in, by the names users know them.

A precision gives two dtypes: the master dtype holds the parameters, their gradients, the
optimizer states, the residual stream and every statistic (layer-norm moments, softmax and
loss statistics, the gradient norm); the compute dtype holds the GEMM operands and the
activations between GEMMs. They differ only in bf16-mixed: fp32 masters, bf16 compute, as
PyTorch AMP, DeepSpeed, FSDP MixedPrecision and Megatron keep them. There every GEMM weight
also has a bf16 copy, which the optimizer refreshes after each update.
"""

PRECISIONS = {
    "fp32": ("fp32", "fp32"),
    "tf32": ("tf32", "tf32"),
    "fp64": ("fp64", "fp64"),
    "bf16": ("bf16", "bf16"),
    "bf16-mixed": ("fp32", "bf16"),
}


def precision_dtypes(name):
    """(master dtype, compute dtype) of a precision; ValueError for an unknown name."""
    try:
        return PRECISIONS[name]
    except (KeyError, TypeError):
        raise ValueError(f"precision {name!r}: use {', '.join(PRECISIONS)}") from None
