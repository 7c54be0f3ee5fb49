"""kernels.h as the build reads it (nntile/_core/kernels/kernel_header.py: args structs, op
table, buffers), loaded by its path so that the kernel tests need no compiled nntile."""
import importlib.util
import os

_PATH = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "nntile", "_core",
                     "kernels", "kernel_header.py")
_spec = importlib.util.spec_from_file_location("nntile_kernel_header", _PATH)
kernel_header = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(kernel_header)

args_structs = kernel_header.args_structs
op_table = kernel_header.op_table
op_buffers = kernel_header.op_buffers
activations = kernel_header.activations
