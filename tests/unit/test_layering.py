"""Imports only go downward: transport, placement -> actors -> store -> rayless/scripts."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
OURS = {"transport", "placement", "actors", "store", "rayless"}
ALLOWED = {
    "transport": {"transport"},
    "placement": {"placement", "transport.errors"},
    "actors": {"actors", "transport", "placement"},
    "store": {"store", "actors", "transport", "placement"},
    "rayless": OURS,
}
# placement may name transport's error types through the package too.
TRANSPORT_ERROR_NAMES = {
    "RaylessError",
    "PlacementError",
    "TransportError",
    "Timeout",
    "ProtocolError",
}


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


def violations(package: str, root: Path = ROOT) -> list[str]:
    """Every import in ``package`` that reaches a layer above or beside it."""
    bad = []
    for path in sorted((root / package).rglob("*.py")):
        for lineno, module, names in _imports(path):
            top = module.split(".")[0]
            if top not in OURS:
                continue
            allowed = ALLOWED[package]
            ok = top in allowed or module in allowed
            if package == "placement" and module == "transport":
                ok = set(names) <= TRANSPORT_ERROR_NAMES
            if not ok:
                bad.append(f"{path.relative_to(root)}:{lineno}: imports {module} {names}")
    return bad


@pytest.mark.parametrize("package", sorted(ALLOWED))
def test_imports_go_only_downward(package: str) -> None:
    assert violations(package) == []


def test_checker_catches_an_upward_import(tmp_path: Path) -> None:
    (tmp_path / "actors").mkdir()
    (tmp_path / "actors" / "bad.py").write_text("from store import Store\n")
    (tmp_path / "placement").mkdir()
    (tmp_path / "placement" / "bad.py").write_text("from transport import Server\n")
    assert violations("actors", tmp_path) == ["actors/bad.py:1: imports store ['Store']"]
    assert violations("placement", tmp_path) == ["placement/bad.py:1: imports transport ['Server']"]
