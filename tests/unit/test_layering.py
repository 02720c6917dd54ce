"""Imports only go downward: transport, placement -> actors -> store -> rayless/scripts.

Inside each package the subpackages form a DAG: no two of them import each other, directly or
through others (late imports count too). In actors/ the order is fixed: protocol/ (the typed
messages) and core/ (process-wide state: context, published entries, call stats, the
timeline) < control/ (head, agent, spawner) < launch/ < api/ (the user API) < host/ (the
actor process and the fork template, which run user classes through the api).

Everything imports our packages under the one root (``rayless.actors``, ...); a bare
``import actors`` would load a second copy of a module under another name (or a user's own
``actors.py``), so it fails this test anywhere in the repository.
"""

from __future__ import annotations

import ast
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
LAYERS = ("transport", "placement", "actors", "store", "weights")
# What each directory may import (layer names; "rayless" is the root package, its CLI and demo).
ALLOWED = {
    "transport": {"transport"},
    "placement": {"placement", "transport"},
    "actors": {"actors", "transport", "placement"},
    "store": {"store", "actors", "transport", "placement"},
    "weights": {"weights", "store", "actors", "transport", "placement"},
    "rayless": {"rayless", *LAYERS},
}
# placement may use only the error root of the transport.
PLACEMENT_FROM_TRANSPORT = {"rayless.transport.errors"}


def _imports(path: Path) -> list[tuple[int, str, list[str]]]:
    tree = ast.parse(path.read_text(), str(path))
    found: list[tuple[int, str, list[str]]] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                found.append((node.lineno, alias.name, []))
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.append((node.lineno, node.module, [a.name for a in node.names]))
    return found


def _layers(module: str, names: list[str]) -> set[str]:
    """The layers an import reaches (``rayless.store.x``: store; ``from rayless import actors``)."""
    parts = module.split(".")
    if parts[0] != "rayless":
        return set()
    if len(parts) > 1 and parts[1] in LAYERS:
        return {parts[1]}
    if len(parts) == 1:
        hit = {n for n in names if n in LAYERS}
        return hit or {"rayless"}
    return {"rayless"}


def violations(package: str, root: Path = ROOT) -> list[str]:
    """Every import in ``package`` that reaches a layer above or beside it, or a bare name."""
    bad = []
    for path in sorted((root / package).rglob("*.py")):
        for lineno, module, names in _imports(path):
            where = f"{path.relative_to(root)}:{lineno}"
            if module.split(".")[0] in LAYERS:
                bad.append(f"{where}: bare import of {module} (use rayless.{module})")
                continue
            for layer in _layers(module, names):
                ok = layer in ALLOWED[package]
                if package == "placement" and layer == "transport":
                    ok = module in PLACEMENT_FROM_TRANSPORT
                if not ok:
                    bad.append(f"{where}: imports {module} {names}")
    return bad


def subpackage_edges(package: str, root: Path = ROOT) -> dict[str, set[str]]:
    """Subpackage -> the other subpackages of ``package`` it imports (every import counts:
    in functions and under ``TYPE_CHECKING`` too)."""
    base = root / package
    subs = {p.name for p in base.iterdir() if p.is_dir() and (p / "__init__.py").exists()}
    dotted = f"rayless.{package}"
    edges: dict[str, set[str]] = {s: set() for s in subs}
    for sub in subs:
        for path in (base / sub).rglob("*.py"):
            for _, module, names in _imports(path):
                if module == dotted:
                    targets = {n for n in names if n in subs}
                elif module.startswith(dotted + "."):
                    first = module[len(dotted) + 1 :].split(".")[0]
                    targets = {first} if first in subs else set()
                else:
                    targets = set()
                edges[sub] |= targets - {sub}
    return edges


def subpackage_cycles(package: str, root: Path = ROOT) -> list[list[str]]:
    """The strongly connected components of more than one subpackage of ``package``."""
    edges = subpackage_edges(package, root)
    reach: dict[str, set[str]] = {}
    for start in edges:
        seen: set[str] = set()
        todo = [start]
        while todo:
            for nxt in edges[todo.pop()]:
                if nxt not in seen:
                    seen.add(nxt)
                    todo.append(nxt)
        reach[start] = seen
    components = {tuple(sorted({s} | {o for o in reach[s] if s in reach[o]})) for s in edges}
    return sorted(list(c) for c in components if len(c) > 1)


# The surfaces the layers above may use of the runtime and the transport: the public API, the
# errors, and the extension facades. Everything else under actors/ and transport/ is theirs.
EXPORTED = {
    "actors": {"rayless.actors", "rayless.actors.errors", "rayless.actors.ext"},
    "transport": {
        "rayless.transport",
        "rayless.transport.errors",
        "rayless.transport.ext",
        "rayless.transport.cuda_ipc",
    },
}
ABOVE = (
    "store",
    "weights",
    "rayless/demo",
    "rayless/single_controller",
    "rayless/ray",
    "rayless/transfer_queue",
)


def unexported_imports(folder: str, root: Path = ROOT) -> list[str]:
    """Imports in ``folder`` of actors/ or transport/ modules that are not exported to it."""
    bad = []
    for path in sorted((root / folder).rglob("*.py")):
        for lineno, module, names in _imports(path):
            parts = module.split(".")
            if len(parts) < 2 or parts[0] != "rayless" or parts[1] not in EXPORTED:
                continue
            if module not in EXPORTED[parts[1]]:
                bad.append(f"{path.relative_to(root)}:{lineno}: imports {module} {names}")
    return bad


def bare_imports(root: Path = ROOT) -> list[str]:
    """Bare ``import actors|store|transport|placement`` in any tracked Python file."""
    files = subprocess.run(
        ["git", "ls-files", "*.py"], cwd=root, capture_output=True, text=True, check=True
    ).stdout.split()
    bad = []
    for name in files:
        path = root / name
        if not path.exists():
            continue
        for lineno, module, _ in _imports(path):
            if module.split(".")[0] in LAYERS:
                bad.append(f"{name}:{lineno}: bare import of {module}")
    return bad


@pytest.mark.parametrize("package", sorted(ALLOWED))
def test_imports_go_only_downward(package: str) -> None:
    assert violations(package) == []


def test_no_bare_imports_of_our_packages_anywhere() -> None:
    assert bare_imports() == []


@pytest.mark.parametrize("package", ["actors", "store", "weights"])
def test_subpackages_form_a_dag(package: str) -> None:
    assert subpackage_edges(package)  # (the check sees the subpackages)
    assert subpackage_cycles(package) == []


@pytest.mark.parametrize("folder", ABOVE)
def test_layers_above_use_only_what_actors_and_transport_export(folder: str) -> None:
    assert unexported_imports(folder) == []


def test_unexported_check_catches_a_deep_import(tmp_path: Path) -> None:
    (tmp_path / "store").mkdir()
    (tmp_path / "store" / "x.py").write_text(
        "from rayless.actors.ext import spawn_all\n"
        "def f():\n    from rayless.actors.api.blocking import call_limit\n"
        "from rayless.transport._cuda import open_ipc\n"
    )
    assert sorted(unexported_imports("store", tmp_path)) == [
        "store/x.py:3: imports rayless.actors.api.blocking ['call_limit']",
        "store/x.py:4: imports rayless.transport._cuda ['open_ipc']",
    ]


# The actors subpackages, lowest first: each may import only those before it.
ACTORS_ORDER = ("protocol", "core", "control", "launch", "api", "host")


def test_actors_subpackages_import_only_those_below() -> None:
    edges = subpackage_edges("actors")
    assert set(edges) == set(ACTORS_ORDER)
    upward = {
        (sub, target)
        for sub, targets in edges.items()
        for target in targets
        if ACTORS_ORDER.index(target) > ACTORS_ORDER.index(sub)
    }
    assert upward == set()


def test_subpackage_check_catches_a_cycle_through_a_late_import(tmp_path: Path) -> None:
    for sub in ("data", "unit", "samehost", "client"):
        (tmp_path / "store" / sub).mkdir(parents=True)
        (tmp_path / "store" / sub / "__init__.py").write_text("")
    (tmp_path / "store" / "unit" / "actor.py").write_text(
        "from rayless.store.data.meta import BatchMeta\n"
        "def shard():\n    from rayless.store.samehost.columns import ShmDense\n"
    )
    (tmp_path / "store" / "samehost" / "columns.py").write_text(
        "from rayless.store.unit.columns import Dense\n"
    )
    (tmp_path / "store" / "client" / "store.py").write_text(
        "from rayless.store import unit, samehost\n"
    )
    assert subpackage_edges("store", tmp_path) == {
        "data": set(),
        "unit": {"data", "samehost"},
        "samehost": {"unit"},
        "client": {"unit", "samehost"},
    }
    assert subpackage_cycles("store", tmp_path) == [["samehost", "unit"]]


def test_checker_catches_an_upward_import(tmp_path: Path) -> None:
    (tmp_path / "actors").mkdir()
    (tmp_path / "actors" / "bad.py").write_text(
        "from rayless.store import Store\nfrom rayless import store\n"
    )
    (tmp_path / "placement").mkdir()
    (tmp_path / "placement" / "bad.py").write_text("from rayless.transport import Server\n")
    (tmp_path / "transport").mkdir()
    (tmp_path / "transport" / "bad.py").write_text("import actors\nfrom rayless.cli import main\n")
    assert violations("actors", tmp_path) == [
        "actors/bad.py:1: imports rayless.store ['Store']",
        "actors/bad.py:2: imports rayless ['store']",
    ]
    assert violations("placement", tmp_path) == [
        "placement/bad.py:1: imports rayless.transport ['Server']"
    ]
    assert violations("transport", tmp_path) == [
        "transport/bad.py:1: bare import of actors (use rayless.actors)",
        "transport/bad.py:2: imports rayless.cli ['main']",
    ]
