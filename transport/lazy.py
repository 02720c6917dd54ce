"""Lazy package exports (PEP 562): a package's ``__init__`` imports its exports only for type
checkers, in an ``if TYPE_CHECKING:`` block, and a name's module is imported when the name is
first read.

The runtime's small processes (the reaper, the head, a node agent) need one or two modules of
a package; importing every export of ``rayless.actors`` and ``rayless.transport`` with them
cost each of those processes 0.05-0.2 CPU-s at its start. The block is the one list of
exports: :func:`exports` reads it from the package's source (its ``from M import a, b as c``
lines) when the first name is looked up::

    if TYPE_CHECKING:
        from rayless.transport.client import Client

    __getattr__, __dir__ = exports(__name__)
"""

from __future__ import annotations

import ast
import importlib
import sys
from collections.abc import Callable
from typing import Any

__all__ = ["exports"]


def exports(package: str) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """The ``__getattr__`` and ``__dir__`` of ``package``: a name its ``if TYPE_CHECKING:``
    block imports is imported from there when first read, then kept in the package.

    Raises (from ``__getattr__``):
        AttributeError: a name the block does not import (also how ``from package import
            submodule`` falls back to importing the submodule).
    """
    table: dict[str, tuple[str, str]] = {}

    def where() -> dict[str, tuple[str, str]]:
        if not table:
            table.update(_typing_imports(sys.modules[package].__file__ or ""))
        return table

    def __getattr__(name: str) -> Any:
        found = where().get(name)
        if found is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        module, attr = found
        value = getattr(importlib.import_module(module), attr)
        setattr(sys.modules[package], name, value)
        return value

    def __dir__() -> list[str]:
        return sorted({*vars(sys.modules[package]), *where()})

    return __getattr__, __dir__


def _typing_imports(path: str) -> dict[str, tuple[str, str]]:
    """``{name: (module, attribute)}`` of the ``from M import ...`` lines inside the
    ``if TYPE_CHECKING:`` blocks of the module at ``path``."""
    with open(path, encoding="utf-8") as f:
        tree = ast.parse(f.read(), path)
    found: dict[str, tuple[str, str]] = {}
    for node in tree.body:
        if isinstance(node, ast.If) and _is_type_checking(node.test):
            for stmt in node.body:
                if isinstance(stmt, ast.ImportFrom) and stmt.module and not stmt.level:
                    for alias in stmt.names:
                        found[alias.asname or alias.name] = (stmt.module, alias.name)
    return found


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )
