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

import importlib
import re
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
    """``{name: (module, attribute)}`` of the ``from M import ...`` lines inside the top-level
    ``if TYPE_CHECKING:`` blocks of the module at ``path``.

    Read line by line, not with :mod:`ast`: the first lookup may come from any thread, and
    CPython 3.11's AST conversion keeps its recursion depth per interpreter, so a parse here
    while another thread compiles (pytest rewriting a test module, an import) can fail the
    other with ``SystemError: AST constructor recursion depth mismatch``.
    """
    with open(path, encoding="utf-8") as f:
        lines = f.read().splitlines()
    found: dict[str, tuple[str, str]] = {}
    inside, statement = False, ""
    for line in lines:
        code = line.split("#", 1)[0].rstrip()
        if not code:
            continue
        if not code[0].isspace():  # a top-level line: a block starts or ends here
            inside = _TYPE_CHECKING.fullmatch(code) is not None
            statement = ""
            continue
        if not inside:
            continue
        statement = f"{statement} {code.strip().rstrip(chr(92))}"
        if statement.count("(") > statement.count(")") or code.endswith(chr(92)):
            continue  # the statement goes on
        match = _FROM_IMPORT.fullmatch(statement.strip())
        statement = ""
        if match is None:
            continue
        module = match.group(1)
        for part in match.group(2).strip("() ").split(","):
            words = part.split()
            if len(words) == 1:
                found[words[0]] = (module, words[0])
            elif len(words) == 3 and words[1] == "as":
                found[words[2]] = (module, words[0])
    return found


_TYPE_CHECKING = re.compile(r"if\s+(?:[A-Za-z_][\w.]*\.)?TYPE_CHECKING\s*:")
_FROM_IMPORT = re.compile(r"from\s+([A-Za-z_][\w.]*)\s+import\s+(.+)")
