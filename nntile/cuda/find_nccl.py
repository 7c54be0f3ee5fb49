"""Where replicas find NCCL, which nntile opens at run time (nntile/_core/collective.c):
$NNTILE_NCCL_LIBRARY, else the nvidia-nccl-cu* wheel that PyTorch installs
(<site-packages>/nvidia/nccl/lib), else the system's libnccl.so.2 (the loader's search)."""
import glob
import os

from nntile.cuda.find_cudnn import _site_dirs

LIBRARY = "libnccl.so.2"


def nccl_library():
    given = os.environ.get("NNTILE_NCCL_LIBRARY")
    if given:
        if not os.path.exists(given):
            raise FileNotFoundError(f"NNTILE_NCCL_LIBRARY={given}: no such file")
        return given
    for site_dir in _site_dirs():
        found = sorted(glob.glob(os.path.join(site_dir, "nvidia", "nccl", "lib", LIBRARY)))
        if found:
            return found[0]
    return LIBRARY
