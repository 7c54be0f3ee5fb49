"""What the build reads in nntile/_core/kernels, loaded by path so that the kernel tests need no
compiled nntile: kernels.h as kernel_header.py parses it (args structs, op table, buffers), and
the BLAS the kernels link (find_blas.py)."""
import importlib.util
import os

_KERNELS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "nntile", "_core",
                        "kernels")


def _load(name):
    spec = importlib.util.spec_from_file_location(f"nntile_{name}",
                                                  os.path.join(_KERNELS, f"{name}.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


kernel_header = _load("kernel_header")
find_blas = _load("find_blas")

args_structs = kernel_header.args_structs
value_structs = kernel_header.value_structs
op_table = kernel_header.op_table
op_buffers = kernel_header.op_buffers
activations = kernel_header.activations
accumulates = kernel_header.accumulates
