"""Imports only go downward: transport, placement -> actors -> store -> rayless/scripts.

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
