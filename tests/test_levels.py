"""The package's levels: every import, at module level or inside a function, and every
Cython cimport and include, points to the same level or a lower one, and no modules import
each other in a circle. The level order below is the one statement of it (docs/architecture.md
describes it); a module missing from it fails the test, so a new module is placed on purpose.
Also: no function of the package's Python files is longer than 100 lines."""
import ast
import re
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parent.parent / "nntile"

# lowest first; a module belongs to the level of the longest prefix that names it
LEVELS = (
    ("_core", ("nntile._core", "nntile.cuda", "nntile.ops", "nntile.declare", "nntile.precision",
               "nntile.errors", "nntile.startup")),
    ("nn", ("nntile.nn",)),
    ("models", ("nntile.models",)),
    ("optim, checkpoint", ("nntile.optim", "nntile.checkpoint")),
    ("memory", ("nntile.memory",)),
    ("policy", ("nntile.policy",)),
    ("context", ("nntile.context", "nntile.machine", "nntile.fit", "nntile.distributed",
                 "nntile.parallel")),
    ("programs", ("nntile", "nntile.cli_common", "nntile.train", "nntile.train_config",
                  "nntile.training", "nntile.generate", "nntile.evaluate", "nntile.convert",
                  "nntile.data", "nntile.events", "nntile.transformers_io", "nntile.plan",
                  "nntile.pretrained")),
)
MAX_FUNCTION_LINES = 100
_CYTHON_IMPORT = re.compile(r"^\s*(?:from\s+([\w.]+)\s+c?import\s+\(?([\w\s,*]+)"
                            r"|c?import\s+([\w.]+)|include\s+\"([\w.]+)\")")


def level_of(module):
    """The index in LEVELS of the longest prefix naming ``module`` (None: no level)."""
    best, found = -1, None
    for index, (_, prefixes) in enumerate(LEVELS):
        for prefix in prefixes:
            if (module == prefix or module.startswith(prefix + ".")) and len(prefix) > best:
                best, found = len(prefix), index
    return found


def module_name(path):
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _is_module(name):
    path = PACKAGE.parent.joinpath(*name.split("."))
    return path.is_dir() or any(path.with_suffix(s).exists() for s in (".py", ".pyx", ".pxd"))


def _targets(base, names):
    """The modules that ``from base import names`` reads: a submodule where a name is one,
    else ``base`` itself."""
    return {f"{base}.{n}" if _is_module(f"{base}.{n}") else base for n in names} or {base}


def python_imports(path):
    """Every nntile module a .py file imports, anywhere in it."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                package = module_name(path).split(".")
                if path.name != "__init__.py":
                    package = package[:-1]
                base = ".".join(package[:len(package) - node.level + 1] + ([base] if base else []))
            found |= _targets(base, [alias.name for alias in node.names])
    return {m for m in found if m == "nntile" or m.startswith("nntile.")}


def cython_imports(path, seen=None):
    """Every nntile module a .pyx, .pxd or .pxi file imports or cimports, following its
    includes (an included .pxi is part of the module that includes it)."""
    found = set()
    for line in path.read_text().splitlines():
        match = _CYTHON_IMPORT.match(line)
        if not match:
            continue
        base, names, plain, include = match.groups()
        if include:
            found |= cython_imports(path.parent / include)
        elif base:
            found |= _targets(base, re.findall(r"\w+", names))
        else:
            found.add(plain)
    return {m for m in found if m == "nntile" or m.startswith("nntile.")}


def import_graph():
    """{module: modules it imports}, every module of the package (a .pxd joins its .pyx)."""
    graph = {}
    for path in sorted(PACKAGE.rglob("*")):
        if path.suffix == ".py":
            graph.setdefault(module_name(path), set()).update(python_imports(path))
        elif path.suffix in (".pyx", ".pxd"):
            graph.setdefault(module_name(path), set()).update(cython_imports(path))
    return {m: {t for t in targets if t != m} for m, targets in graph.items()}


def test_every_module_has_a_level():
    assert [m for m in import_graph() if level_of(m) is None] == []


def test_imports_point_to_the_same_level_or_below():
    upward = [f"{m} ({LEVELS[level_of(m)][0]}) imports {t} ({LEVELS[level_of(t)][0]})"
              for m, targets in import_graph().items() for t in sorted(targets)
              if level_of(t) is not None and level_of(m) is not None
              and level_of(t) > level_of(m)]
    assert upward == []


def circles(graph):
    """The strongly connected components of more than one module (Tarjan's algorithm)."""
    index, low, stack, on_stack, found = {}, {}, [], set(), []

    def visit(node):
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for target in graph.get(node, ()):
            if target not in index:
                visit(target)
                low[node] = min(low[node], low[target])
            elif target in on_stack:
                low[node] = min(low[node], index[target])
        if low[node] == index[node]:
            component = set()
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.add(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def test_no_import_circle():
    assert circles(import_graph()) == []


def test_the_walk_sees_imports_inside_functions_and_cimports():
    """The graph is not empty by mistake: it holds edges of each kind the test must see."""
    graph = import_graph()
    assert "nntile.fit" in graph["nntile.train"]          # inside a function
    assert "nntile.nn.module" in graph["nntile.nn.attention"]  # a cimport
    assert "nntile._core.kernel_args" in graph["nntile._core.core"]  # through an include
    assert circles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


@pytest.mark.parametrize("path", sorted(PACKAGE.rglob("*.py")), ids=lambda p: p.name)
def test_no_function_longer_than_100_lines(path):
    long = [f"{node.name}: {node.end_lineno - node.lineno + 1} lines"
            for node in ast.walk(ast.parse(path.read_text()))
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
            and node.end_lineno - node.lineno + 1 > MAX_FUNCTION_LINES]
    assert long == []
