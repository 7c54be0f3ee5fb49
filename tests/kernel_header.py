"""The args structs declared in nntile/_core/kernels/kernels.h, read from the header itself
(field order is the kernels' ABI), for the ctypes-based kernel tests."""
import os
import re

KERNEL_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "nntile", "_core",
                          "kernels")
_KINDS = {"int64_t": "int64", "double": "double"}


def args_structs():
    """{op: [(field, kind)]} with kind "int64", "double" or "int64[8]"."""
    with open(os.path.join(KERNEL_DIR, "kernels.h")) as f:
        text = re.sub(r"/\*.*?\*/", "", f.read(), flags=re.S)
    structs = {}
    for m in re.finditer(r"struct nntile_(\w+)_args\s*\{(.*?)\};", text, re.S):
        fields = []
        for decl in filter(None, (d.strip() for d in m.group(2).split(";"))):
            typ, names = decl.split(None, 1)
            for name in (n.strip() for n in names.split(",")):
                array = re.fullmatch(r"(\w+)\[(\w+)\]", name)
                if array:
                    assert array.group(2) in ("8", "NNTILE_SUBCOPY_MAX_NDIM"), name
                    fields.append((array.group(1), _KINDS[typ] + "[8]"))
                else:
                    fields.append((name, _KINDS[typ]))
        structs[m.group(1)] = fields
    return structs
