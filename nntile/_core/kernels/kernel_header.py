"""What nntile/_core/kernels/kernels.h declares, read from the header itself: the args structs
(field order is the kernels' ABI), the op table (NNTILE_OPS, with its activations) and each
op's buffers (NNTILE_BUFFERS_<op>, with the access of each).

The build (setup.py) writes the Cython copies of the structs and of the op enum, and the
tensor ops of the activations, from it (write_cython), and the kernel tests build their ctypes
structs from it. Plain Python with no import of nntile: setup.py and the tests load this file
by its path."""
import os
import re

KERNELS_H = os.path.join(os.path.dirname(os.path.abspath(__file__)), "kernels.h")
_KINDS = {"int64_t": "int64", "double": "double"}
_CYTHON_TYPES = {"int64": "int64_t", "double": "double", "int64[8]": "int64_t"}
_OPS = "NNTILE_OPS(X, X_OPT, X_BLAS, X_TF32, X_ACT)"
# an entry of NNTILE_OPS: kind, op, buffer count, columns; or an activation: X_ACT, act, columns
_ENTRY = r"\b(X|X_OPT|X_BLAS|X_TF32)\(\s*(\w+)\s*,\s*(\d+)\s*,\s*(\w+)\s*\)"
_ACT = r"\b(X_ACT)\(\s*X\s*,\s*(\w+)\s*,\s*(\w+)\s*\)"


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
    order (then the activations' structs, from NNTILE_ACT_ARGS)."""
    text = _text(path)
    structs = {op: fields for op, fields in _structs(text).items() if "#" not in op}
    act_structs = _structs(_macro(text, "NNTILE_ACT_ARGS(X, act, columns)"))
    for act in activations(path):
        structs.update((name.replace("##act##", act), fields)
                       for name, fields in act_structs.items())
    # an op whose args are another struct: #define nntile_<op>_args nntile_<other>_args
    for op, other in re.findall(r"^#define nntile_(\w+)_args nntile_(\w+)_args", text, re.M):
        structs[op] = structs[other]
    return structs


def _structs(text):
    """{name: fields} of the structs nntile_<name>_args in text (name may be a macro's
    ##act##...)."""
    structs = {}
    for m in re.finditer(r"struct nntile_([\w#]+)_args\s*\{(.*?)\};", text, re.S):
        structs[m.group(1)] = _fields(m.group(2))
    return structs


def value_structs(path=KERNELS_H):
    """{name: fields} of the other structs (nntile_mask, ...), which args structs hold as
    fields of kind ``struct <name>``."""
    return {m.group(1): _fields(m.group(2))
            for m in re.finditer(r"struct (nntile_\w+)\s*\{(.*?)\};", _text(path), re.S)
            if not m.group(1).endswith("_args")}


def _fields(body):
    """[(name, kind)] of a struct's body."""
    fields = []
    for decl in filter(None, (d.strip() for d in body.split(";"))):
        typ, names = decl.split(None, 1)
        if typ == "struct":  # a struct held by value: its kind is "struct nntile_<name>"
            name, names = names.split(None, 1)
            fields.append((names.strip(), f"struct {name}"))
            continue
        for field in (n.strip() for n in names.split(",")):
            array = re.fullmatch(r"(\w+)\[(\w+)\]", field)
            if array:
                assert array.group(2) in ("8", "NNTILE_SUBCOPY_MAX_NDIM"), field
                fields.append((array.group(1), _KINDS[typ] + "[8]"))
            else:
                fields.append((field, _KINDS[typ]))
    return fields


def op_table(path=KERNELS_H):
    """[(op, nbuf, kind, columns)] of NNTILE_OPS in order (the op enum's order); kind is "X",
    "X_OPT", "X_BLAS" or "X_TF32", columns "PLAIN", "MIXED" or "MIXED_ONLY". An activation
    gives two entries of kind "X": act (2 buffers) and act_backward (3)."""
    body = _macro(_text(path), _OPS)
    if re.sub(_ENTRY + "|" + _ACT, "", body).strip():
        raise ValueError(f"kernels.h: NNTILE_OPS has an entry not of the form X(op, nbuf, "
                         f"columns) or X_ACT(X, act, columns): {body!r}")
    table = []
    for m in re.finditer(_ENTRY + "|" + _ACT, body):
        kind, op, nbuf, columns, act, act_columns = m.group(1, 2, 3, 4, 6, 7)
        if act:
            table += [(act, 2, "X", act_columns), (act + "_backward", 3, "X", act_columns)]
        else:
            table.append((op, int(nbuf), kind, columns))
    return table


def activations(path=KERNELS_H):
    """{act: docstring} of the op table's activations, X_ACT(X, act, columns) followed by a
    comment "activation: <docstring>", in the table's order."""
    with open(path) as f:
        body = _macro(f.read(), _OPS)
    found = re.findall(_ACT + r"\s*/\*\s*activation:\s*(.*?)\s*\*/", body, re.S)
    if len(found) != len(re.findall(_ACT, body)):
        raise ValueError("kernels.h: an X_ACT entry of NNTILE_OPS has no comment "
                         "\"activation: <docstring>\"")
    acts = {}
    for _, act, _, doc in found:
        doc = " ".join(doc.split())
        if not doc or '"' in doc or "\\" in doc:
            raise ValueError(f"kernels.h: activation {act}: its docstring must be non-empty, "
                             f"without quotes or backslashes: {doc!r}")
        acts[act] = doc
    return acts


def op_buffers(path=KERNELS_H):
    """{op: [(type, name, access)]} of the NNTILE_BUFFERS_<op>(P, W, T, ACC) lines (and of
    the activations, NNTILE_ACT_BUFFERS and NNTILE_ACT_BACKWARD_BUFFERS), types as written
    (in T and ACC); access is "R" for a const buffer, "W" for one marked W (written; read
    too where a task accumulates into it), "RW" for the others."""
    text = _text(path)
    lists = {op: f"NNTILE_BUFFERS_{op}(P, W, T, ACC)"
             for op in re.findall(r"^#define NNTILE_BUFFERS_(\w+)\(P, W, T, ACC\)", text, re.M)}
    # an op whose buffers are a list of several ops: #define NNTILE_BUFFERS_<op> NNTILE_<list>
    lists.update((op, f"{shared}(P, W, T, ACC)") for op, shared in
                 re.findall(r"^#define NNTILE_BUFFERS_(\w+) (NNTILE_\w+_BUFFERS)$", text, re.M))
    for act in activations(path):
        lists[act] = "NNTILE_ACT_BUFFERS(P, W, T, ACC)"
        lists[act + "_backward"] = "NNTILE_ACT_BACKWARD_BUFFERS(P, W, T, ACC)"
    ops = {}
    for op, head in lists.items():
        buffers = []
        for marker, typ, name in re.findall(r"\b([PW])\(\s*([^,]+?)\s*,\s*(\w+)\s*\)",
                                            _macro(text, head)):
            const = typ.startswith("const ")
            if const and marker == "W":
                raise ValueError(f"kernels.h: buffer {name} of {op} is const but marked W")
            buffers.append((typ, name, "R" if const else marker.replace("P", "RW")))
        ops[op] = buffers
    return ops


def buffer_places(path=KERNELS_H):
    """{name: [buffer names]} in the order of a task's handles, of every op and of every list
    that several ops share (NNTILE_<LIST>_BUFFERS, named <list> in lower case)."""
    text = _text(path)
    places = {op: [name for _, name, _ in buffers] for op, buffers in op_buffers(path).items()}
    for shared in re.findall(r"^#define NNTILE_(\w+)_BUFFERS\(P, W, T, ACC\)", text, re.M):
        body = _macro(text, f"NNTILE_{shared}_BUFFERS(P, W, T, ACC)")
        places[shared.lower()] = re.findall(r"\b[PW]\(\s*[^,]+?\s*,\s*(\w+)\s*\)", body)
    return places


def accumulates(path=KERNELS_H):
    """{op: [(bit, buffer, when)]} of NNTILE_ACCUMULATES, in the op table's order: the W
    buffers of op that a task reads too where the C condition ``when`` holds, bit j for the
    op's j-th W buffer (act_backward: every activation's backward)."""
    buffers, body = op_buffers(path), _macro(_text(path), "NNTILE_ACCUMULATES(X)")
    entry = r"\bX\(\s*(\w+)\s*,\s*(\w+)\s*,\s*([^()]*)\)"
    if re.sub(entry, "", body).strip():
        raise ValueError(f"kernels.h: NNTILE_ACCUMULATES has an entry not of the form "
                         f"X(op, buffer, when) with no parentheses in when: {body!r}")
    rules = {}
    for op, buffer, when in re.findall(entry, body):
        ops = [a + "_backward" for a in activations(path)] if op == "act_backward" else [op]
        for op in ops:
            written = [name for _, name, access in buffers.get(op, []) if access == "W"]
            if buffer not in written:
                raise ValueError(f"kernels.h: NNTILE_ACCUMULATES names {buffer} of {op}, "
                                 f"which is not one of its W buffers {written}")
            if any(b == buffer for _, b, _ in rules.get(op, [])):
                raise ValueError(f"kernels.h: NNTILE_ACCUMULATES names {buffer} of {op} twice")
            rules.setdefault(op, []).append((written.index(buffer), buffer, when.strip()))
    return {op: rules[op] for op, _, _, _ in op_table(path) if op in rules}


def _accumulate_c(path):
    """The C function nntile_op_accumulate(op, args, caller) of NNTILE_ACCUMULATES, and
    nntile_op_caller[op], 1 where an op's rule reads the caller's flag."""
    rules = accumulates(path)
    lines = ["    static unsigned nntile_op_accumulate(int op, const void *args, int caller)",
             "    {", "        (void)args; (void)caller;", "        switch (op) {"]
    for op, rule in rules.items():
        lines.append(f"        case NNTILE_OP_{op}: {{")
        if any("a->" in when for _, _, when in rule):
            lines.append(f"            const struct nntile_{op}_args *a = args;")
        terms = [f"(({when}) ? {1 << bit}u : 0u)" for bit, _, when in rule]
        lines += ["            return " + "\n                 | ".join(terms) + ";", "        }"]
    lines += ["        default:", "            return 0;", "        }", "    }",
              "    static const char nntile_op_caller[] = {"]
    lines += [f"        {int(any('caller' in w for _, _, w in rules.get(op, [])))},  /* {op} */"
              for op, _, _, _ in op_table(path)]
    return lines + ["    };"]


def cython_args(path=KERNELS_H):
    """kernel_args.pxd: the args structs for the tensor ops."""
    lines = ["# Generated by setup.py from kernels/kernels.h (kernel_header.py): do not edit.",
             "from libc.stdint cimport int64_t", "",
             'cdef extern from "kernels/kernels.h" nogil:']
    structs = {name: fields for name, fields in value_structs(path).items()}
    structs.update((f"nntile_{op}_args", fields) for op, fields in args_structs(path).items())
    for struct, fields in structs.items():
        lines.append(f"    struct {struct}:")
        lines += [f"        {_cython_type(kind)} {name}{'[8]' if kind.endswith('[8]') else ''}"
                  for name, kind in fields]
    return "\n".join(lines) + "\n"


def _cython_type(kind):
    return kind.split()[1] if kind.startswith("struct ") else _CYTHON_TYPES[kind]


def cython_op_enum(path=KERNELS_H):
    """op_enum.pxi: the op enum of codelets.h, in the op table's order, the access of each
    op's buffers (nntile_op_access[op], a letter a buffer: R, W, or M for read and written)
    that submit gives its tasks, the buffers a task takes at the least (nntile_op_nbuf),
    which W buffers a task reads too (nntile_op_accumulate, from NNTILE_ACCUMULATES), and
    the place of each buffer among a task's handles (BUF_<op>_<buffer>)."""
    table, buffers = op_table(path), op_buffers(path)
    lines = ["# Generated by setup.py from kernels/kernels.h (kernel_header.py): do not edit.",
             'cdef extern from "codelets.h" nogil:', "    enum nntile_op:"]
    lines += [f"        NNTILE_OP_{op}" for op, _, _, _ in table]
    lines += ["        NNTILE_OP_COUNT", "", "cdef extern from *:", '    """',
              "    static const char *const nntile_op_access[] = {"]
    lines += [f'        "{"".join("M" if a == "RW" else a for _, _, a in buffers[op])}",  '
              f"/* {op} */" for op, _, _, _ in table]
    lines += ["    };", "    static const int nntile_op_nbuf[] = {"]
    lines += [f"        {nbuf},  /* {op} */" for op, nbuf, _, _ in table]
    lines += ["    };"] + _accumulate_c(path)
    lines += ['    """', "    const char *const nntile_op_access[]",
              "    const int nntile_op_nbuf[]",
              "    unsigned nntile_op_accumulate(int op, const void *args, int caller)",
              "    const char nntile_op_caller[]", "",
              "# The place of each buffer among the handles of a task, in the op table's order:",
              "# BUF_<op>_<buffer>, and BUF_<list>_<buffer> of a list of buffers that several",
              "# ops share (NNTILE_<LIST>_BUFFERS)", "cdef enum:"]
    lines += [f"    BUF_{owner}_{name} = {place}" for owner, names in buffer_places(path).items()
              for place, name in enumerate(names)]
    return "\n".join(lines) + "\n"


def cython_activations(path=KERNELS_H):
    """activations.pxi: the two tensor ops of every activation of the table (included by
    nn_ops.pxi, which defines _unary and _unary_backward: checks, then one task per tile)."""
    lines = ["# Generated by setup.py from kernels/kernels.h (kernel_header.py): do not edit."]
    for act, doc in activations(path).items():
        lines += ["", "", f"def {act}(Tensor src, Tensor dst):", f'    """dst = f(src), f = {doc}"""',
                  f'    _unary("{act}", NNTILE_OP_{act}, src, dst)',
                  "", "", f"def {act}_backward(Tensor x, Tensor dy, beta, Tensor dx):",
                  f'    """dx = dy * f\'(x) + beta * dx, f = {doc}"""',
                  f'    _unary_backward("{act}_backward", NNTILE_OP_{act}_backward, x, dy, beta, '
                  "dx)"]
    return "\n".join(lines) + "\n"


def write_cython(core_dir):
    """Writes kernel_args.pxd, op_enum.pxi and activations.pxi into core_dir where their text has
    changed (an unchanged file keeps its time, so that Cython does not rebuild)."""
    for name, text in (("kernel_args.pxd", cython_args()), ("op_enum.pxi", cython_op_enum()),
                       ("activations.pxi", cython_activations())):
        path = os.path.join(core_dir, name)
        if os.path.exists(path):
            with open(path) as f:
                if f.read() == text:
                    continue
        with open(path, "w") as f:
            f.write(text)
