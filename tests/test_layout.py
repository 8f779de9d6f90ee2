"""The package's shape, checked from the sources: bitlora's modules import each other
without cycles, and the wheel the browser installs holds no benchmark or native-only
code and imports nothing that Pyodide lacks (numpy, torch, ...)."""
from __future__ import annotations

import ast
import io
import pathlib
import tomllib
import zipfile

ROOT = pathlib.Path(__file__).resolve().parent.parent
NATIVE_ONLY = {"numpy", "torch", "transformers", "peft", "gguf", "safetensors", "tokenizers", "tqdm"}


def package_dirs() -> dict[str, pathlib.Path]:
    """pyproject's package-dir: package name -> its source folder."""
    conf = tomllib.loads((ROOT / "pyproject.toml").read_text())
    return {pkg: ROOT / d for pkg, d in conf["tool"]["setuptools"]["package-dir"].items()}


def sources() -> dict[str, tuple[pathlib.Path, bool]]:
    """module name -> (file, is a package __init__) for every bitlora module."""
    out = {}
    for pkg, folder in package_dirs().items():
        for path in folder.rglob("*.py"):
            parts = path.relative_to(folder).with_suffix("").parts
            is_pkg = parts[-1] == "__init__"
            name = ".".join((pkg, *parts[:-1])) if is_pkg else ".".join((pkg, *parts))
            out[name] = (path, is_pkg)
    return out


def import_nodes(tree, module_level: bool):
    """Import statements of a module: all of them, or only those run at import time
    (not inside a function body, not under `if TYPE_CHECKING`)."""
    todo = list(tree.body)
    while todo:
        node = todo.pop()
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            yield node
        if module_level:
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
                continue
            if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
                todo.extend(node.orelse)
                continue
        todo.extend(ast.iter_child_nodes(node))


def imported(node, name: str, is_pkg: bool) -> list[str]:
    """Absolute dotted names an import statement in module `name` refers to."""
    if isinstance(node, ast.Import):
        return [a.name for a in node.names]
    if node.level:
        base = name.split(".") if is_pkg else name.split(".")[:-1]
        base = base[:len(base) - (node.level - 1)]
        base = ".".join(base + ([node.module] if node.module else []))
    else:
        base = node.module
    return [f"{base}.{a.name}" for a in node.names] + [base]


def import_graph() -> dict[str, set[str]]:
    """module -> the bitlora modules it imports at import time. `from pkg import x`
    counts as importing pkg.x when that is a module, else as importing pkg; importing
    pkg.x also runs pkg's __init__ first, which counts for importers outside pkg (for
    a module inside pkg, pkg is already being imported)."""
    mods = sources()
    graph = {}
    for name, (path, is_pkg) in mods.items():
        edges = set()
        for node in import_nodes(ast.parse(path.read_text()), module_level=True):
            names = imported(node, name, is_pkg)
            if isinstance(node, ast.ImportFrom):
                subs = [n for n in names[:-1] if n in mods]
                names = subs if len(subs) == len(names) - 1 else subs + [names[-1]]
            for n in names:
                while n and n not in mods:          # an attribute of a module: the module
                    n = n.rpartition(".")[0]
                while n and n != name and not name.startswith(n + "."):
                    edges.add(n)
                    n = n.rpartition(".")[0]
        graph[name] = edges
    return graph


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    state, stack = {}, []

    def visit(n):
        state[n] = "open"
        stack.append(n)
        for m in sorted(graph.get(n, ())):
            if state.get(m) == "open":
                return stack[stack.index(m):] + [m]
            if m not in state:
                found = visit(m)
                if found:
                    return found
        stack.pop()
        state[n] = "done"
        return None

    for n in sorted(graph):
        if n not in state:
            found = visit(n)
            if found:
                return found
    return None


def test_import_graph_sees_the_package():
    g = import_graph()
    assert {"bitlora.model", "bitlora.formats.gguf", "bitlora.app.cli", "bitlora.bench.train"} <= set(g)
    assert "bitlora.bitnet" in g["bitlora.formats.gguf"] and "bitlora.formats.checkpoint" in g["bitlora.formats.gguf"]
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]


def test_no_import_cycles():
    cycle = find_cycle(import_graph())
    assert cycle is None, "import cycle: " + " -> ".join(cycle)


def test_browser_wheel_is_pure_library():
    """The wheel `bitlora serve` hands to Pyodide: no bitlora.app, no bitlora.bench, and
    no module that imports a native-only package (at module level or in a function)."""
    from bitlora.app.wheel import build_wheel

    _, data = build_wheel()
    with zipfile.ZipFile(io.BytesIO(data)) as zf:
        names = zf.namelist()
        assert "bitlora/model.py" in names and "bitlora/formats/gguf.py" in names
        assert not [n for n in names if n.startswith(("bitlora/app/", "bitlora/bench/"))]
        bad = []
        for n in names:
            if not n.endswith(".py"):
                continue
            tree = ast.parse(zf.read(n).decode())
            mod = n[:-3].replace("/", ".")
            for node in import_nodes(tree, module_level=False):
                if isinstance(node, ast.ImportFrom) and node.level:
                    continue                                     # within bitlora
                top = {x.split(".")[0] for x in imported(node, mod, False)}
                bad += [f"{n}: {t}" for t in top & NATIVE_ONLY]
    assert not bad, bad
