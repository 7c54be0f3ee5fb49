"""What nntile/_core/kernels/kernels.h declares, read from the header itself: the args structs
(field order is the kernels' ABI), the op table (NNTILE_OPS, with its unary ops) and each
op's buffers (NNTILE_BUFFERS_<op>, with the access of each).

The build (setup.py) writes the Cython copies of the structs and of the op enum, and the
tensor ops of the unary ops, from it (write_cython), and the kernel tests build their ctypes
structs from it. Plain Python with no import of nntile: setup.py and the tests load this file
by its path."""
import os
import re

KERNELS_H = os.path.join(os.path.dirname(os.path.abspath(__file__)), "kernels.h")
_KINDS = {"int64_t": "int64", "double": "double"}
_CYTHON_TYPES = {"int64": "int64_t", "double": "double", "int64[8]": "int64_t"}
# an entry of NNTILE_OPS: kind, op, buffer count, columns
_ENTRY = r"\b(X|X_OPT|X_BLAS)\(\s*(\w+)\s*,\s*(\d+)\s*,\s*(\w+)\s*\)"


def _text(path=KERNELS_H):
    """The header without its comments."""
    with open(path) as f:
        return re.sub(r"/\*.*?\*/", "", f.read(), flags=re.S)


def _macro(text, head):
    """The body of the macro whose definition starts with head, continuation lines joined."""
    m = re.search(r"^#define " + re.escape(head) + r"((?:.*\\\n)*.*)$", text, re.M)
    if m is None:
        raise ValueError(f"kernels.h: no #define {head}")
    return m.group(1).replace("\\\n", " ")


def args_structs(path=KERNELS_H):
    """{op: [(field, kind)]} with kind "int64", "double" or "int64[8]", in the header's
    order."""
    structs = {}
    for m in re.finditer(r"struct nntile_(\w+)_args\s*\{(.*?)\};", _text(path), re.S):
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


def op_table(path=KERNELS_H):
    """[(op, nbuf, kind, columns)] of NNTILE_OPS in order (the op enum's order); kind is "X",
    "X_OPT" or "X_BLAS", columns "PLAIN", "MIXED" or "MIXED_ONLY"."""
    body = _macro(_text(path), "NNTILE_OPS(X, X_OPT, X_BLAS)")
    entries = re.findall(_ENTRY, body)
    if re.sub(r"\b(X|X_OPT|X_BLAS)\([^)]*\)", "", body).strip():
        raise ValueError(f"kernels.h: NNTILE_OPS has an entry not of the form X(op, nbuf, "
                         f"columns): {body!r}")
    return [(op, int(nbuf), kind, columns) for kind, op, nbuf, columns in entries]


def unary_ops(path=KERNELS_H):
    """{op: docstring} of the op table's lines that end with a comment "unary: <docstring>",
    in the table's order. Each must be an X op of 2 buffers, P(const T *, src) P(T *, dst),
    with args { int64_t n; }: its tensor op is then the plain one of unary_ops.pxi."""
    with open(path) as f:
        body = _macro(f.read(), "NNTILE_OPS(X, X_OPT, X_BLAS)")
    found = re.findall(_ENTRY + r"\s*/\*\s*unary:\s*(.*?)\s*\*/", body, re.S)
    if len(found) != body.count("unary:"):
        raise ValueError("kernels.h: a \"unary:\" comment of NNTILE_OPS does not follow an "
                         "entry X(op, nbuf, columns)")
    structs, buffers = args_structs(path), op_buffers(path)
    ops = {}
    for kind, op, nbuf, _, doc in found:
        doc = " ".join(doc.split())
        if (kind, nbuf) != ("X", "2") or structs.get(op) != [("n", "int64")] \
                or buffers.get(op) != [("const T *", "src", "R"), ("T *", "dst", "W")]:
            raise ValueError(f"kernels.h: unary op {op} must be X({op}, 2, ...) with args "
                             f"{{ int64_t n; }} and buffers P(const T *, src) W(T *, dst)")
        if not doc or '"' in doc or "\\" in doc:
            raise ValueError(f"kernels.h: unary op {op}: its docstring must be non-empty, "
                             f"without quotes or backslashes: {doc!r}")
        ops[op] = doc
    return ops


def op_buffers(path=KERNELS_H):
    """{op: [(type, name, access)]} of the NNTILE_BUFFERS_<op>(P, W, T, ACC) lines, types as
    written (in T and ACC); access is "R" for a const buffer, "W" for one marked W (written;
    read too where a task accumulates into it), "RW" for the others."""
    text = _text(path)
    ops = {}
    for op in re.findall(r"^#define NNTILE_BUFFERS_(\w+)\(P, W, T, ACC\)", text, re.M):
        buffers = []
        for marker, typ, name in re.findall(r"\b([PW])\(\s*([^,]+?)\s*,\s*(\w+)\s*\)",
                                            _macro(text, f"NNTILE_BUFFERS_{op}(P, W, T, ACC)")):
            const = typ.startswith("const ")
            if const and marker == "W":
                raise ValueError(f"kernels.h: buffer {name} of {op} is const but marked W")
            buffers.append((typ, name, "R" if const else marker.replace("P", "RW")))
        ops[op] = buffers
    return ops


def cython_args(path=KERNELS_H):
    """kernel_args.pxd: the args structs for the tensor ops."""
    lines = ["# Generated by setup.py from kernels/kernels.h (kernel_header.py): do not edit.",
             "from libc.stdint cimport int64_t", "",
             'cdef extern from "kernels/kernels.h" nogil:']
    for op, fields in args_structs(path).items():
        lines.append(f"    struct nntile_{op}_args:")
        lines += [f"        {_CYTHON_TYPES[kind]} {name}{'[8]' if kind.endswith('[8]') else ''}"
                  for name, kind in fields]
    return "\n".join(lines) + "\n"


def cython_op_enum(path=KERNELS_H):
    """op_enum.pxi: the op enum of codelets.h, in the op table's order, and the access of each
    op's buffers (nntile_op_access[op], a letter a buffer: R, W, or M for read and written)
    that submit gives its tasks."""
    table, buffers = op_table(path), op_buffers(path)
    lines = ["# Generated by setup.py from kernels/kernels.h (kernel_header.py): do not edit.",
             'cdef extern from "codelets.h" nogil:', "    enum nntile_op:"]
    lines += [f"        NNTILE_OP_{op}" for op, _, _, _ in table]
    lines += ["        NNTILE_OP_COUNT", "", "cdef extern from *:", '    """',
              "    static const char *const nntile_op_access[] = {"]
    lines += [f'        "{"".join("M" if a == "RW" else a for _, _, a in buffers[op])}",  '
              f"/* {op} */" for op, _, _, _ in table]
    lines += ["    };", '    """', "    const char *const nntile_op_access[]"]
    return "\n".join(lines) + "\n"


def cython_unary_ops(path=KERNELS_H):
    """unary_ops.pxi: the tensor op of every unary op of the table (included by nn_ops.pxi,
    which defines _unary: checks, then one task per tile)."""
    lines = ["# Generated by setup.py from kernels/kernels.h (kernel_header.py): do not edit."]
    for op, doc in unary_ops(path).items():
        lines += ["", "", f"def {op}(Tensor src, Tensor dst):", f'    """{doc}"""',
                  f'    _unary("{op}", NNTILE_OP_{op}, src, dst)']
    return "\n".join(lines) + "\n"


def write_cython(core_dir):
    """Writes kernel_args.pxd, op_enum.pxi and unary_ops.pxi into core_dir where their text has
    changed (an unchanged file keeps its time, so that Cython does not rebuild)."""
    for name, text in (("kernel_args.pxd", cython_args()), ("op_enum.pxi", cython_op_enum()),
                       ("unary_ops.pxi", cython_unary_ops())):
        path = os.path.join(core_dir, name)
        if os.path.exists(path):
            with open(path) as f:
                if f.read() == text:
                    continue
        with open(path, "w") as f:
            f.write(text)
