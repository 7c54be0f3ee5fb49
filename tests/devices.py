"""The few bounds that depend on where the tests' runtime computes: on CPU workers (CI), or on a
GPU's (NNTILE_TEST_NCPU=0 NNTILE_TEST_NCUDA=1, tests/conftest.py)."""
from nntile._core.core import current_context
from nntile.nn.layers import Embedding

# tf32 is fp32 on CPU workers, and a GPU GEMM mode: TF32 keeps 10 of each operand's 23
# mantissa bits (a rounding of up to 2**-11 of it), and a model's numbers hold a few of them
TF32_ON_GPU = 2 ** -8


def on_gpu():
    """Whether the running Context has CUDA workers."""
    return current_context().ncuda_workers > 0


def tf32_tol(cpu_tol):
    """The bound for tf32 against fp32: ``cpu_tol`` where tf32 is fp32, TF32_ON_GPU on GPUs."""
    return TF32_ON_GPU if on_gpu() else cpu_tol


def atomic_sums(model):
    """Names of ``model``'s parameters whose gradient adds a batch's rows in an order that a
    GPU does not fix: an embedding table's, where repeated ids add their rows with atomics
    (nntile/cuda/embedding.cu). Nothing on CPU workers, whose adds go row by row."""
    if not on_gpu():
        return set()
    return {f"{prefix}{name}" for prefix, module in model.named_modules()
            if isinstance(module, Embedding) for name, _ in module.named_parameters()}
