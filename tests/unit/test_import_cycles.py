"""No import cycles among our modules.

Every import counts, also one inside a function (a late import still ties the two modules
together) and ``importlib.import_module("rayless...")`` with a literal name; only imports under
``if TYPE_CHECKING`` (annotations) are left out.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = {
    "transport": "rayless.transport",
    "placement": "rayless.placement",
    "actors": "rayless.actors",
    "store": "rayless.store",
    "weights": "rayless.weights",
    "rayless": "rayless",
}


def _modules(root: Path = ROOT) -> dict[str, Path]:
    found = {}
    for folder, dotted in PACKAGES.items():
        for path in (root / folder).rglob("*.py"):
            parts = list(path.relative_to(root / folder).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            found[".".join([dotted, *parts])] = path
    return found


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _top_level(body: list[ast.stmt]) -> list[ast.Import | ast.ImportFrom]:
    """Every import statement of a module (in functions too), but not under TYPE_CHECKING;
    ``importlib.import_module("x")`` counts as ``import x``."""
    out: list[ast.Import | ast.ImportFrom] = []

    def visit(node: ast.AST) -> None:
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            out.append(node)
            return
        if isinstance(node, ast.If) and _is_type_checking(node.test):
            for child in node.orelse:
                visit(child)
            return
        if (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr == "import_module"
            and node.args
            and isinstance(node.args[0], ast.Constant)
            and isinstance(node.args[0].value, str)
        ):
            out.append(ast.Import(names=[ast.alias(name=node.args[0].value)]))
        for child in ast.iter_child_nodes(node):
            visit(child)

    for stmt in body:
        visit(stmt)
    return out


def graph(root: Path = ROOT) -> dict[str, set[str]]:
    """Module -> the modules of ours it imports at load time."""
    modules = _modules(root)
    edges: dict[str, set[str]] = {}
    for name, path in modules.items():
        targets: set[str] = set()
        is_pkg = path.name == "__init__.py"
        for node in _top_level(ast.parse(path.read_text(), str(path)).body):
            if isinstance(node, ast.Import):
                candidates = [a.name for a in node.names]
            else:
                base = node.module or ""
                if node.level:
                    anchor = name.split(".")
                    anchor = anchor[: len(anchor) - node.level + (1 if is_pkg else 0)]
                    base = ".".join([*anchor, base] if base else anchor)
                candidates = [f"{base}.{a.name}" for a in node.names] + [base]
            for cand in candidates:
                if cand in modules:
                    targets.add(cand)
                    break  # `from pkg import sub` names the submodule; else the package
        # importing a.b.c first runs a and a.b; those parents are not edges of a cycle we own
        edges[name] = {t for t in targets if t != name}
    return edges


def cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components with more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in edges.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                found.append(sorted(comp))

    for v in sorted(edges):
        if v not in index:
            visit(v)
    return found


def test_the_finder_sees_a_cycle(tmp_path: Path) -> None:
    pkg = tmp_path / "transport"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "a.py").write_text("from rayless.transport import b\n")
    (pkg / "b.py").write_text("from typing import TYPE_CHECKING\nimport rayless.transport.a\n")
    (pkg / "c.py").write_text(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from rayless.transport import a\n"
    )
    (pkg / "d.py").write_text(
        "def f():\n    import importlib\n    importlib.import_module('rayless.transport.e')\n"
    )
    (pkg / "e.py").write_text("def g():\n    from rayless.transport import d\n")
    for other in ("placement", "actors", "store", "weights", "rayless"):
        (tmp_path / other).mkdir()
    assert cycles(graph(tmp_path)) == [
        ["rayless.transport.a", "rayless.transport.b"],
        ["rayless.transport.d", "rayless.transport.e"],
    ]


KNOWN: list[list[str]] = []  # none left; add nothing here


def test_no_import_cycles() -> None:
    found = [c for c in cycles(graph()) if c not in KNOWN]
    assert not found, "import cycles:\n" + "\n".join(" <-> ".join(c) for c in found)
