"""``rayless.actors`` and ``rayless.transport`` export lazily (``rayless.transport.lazy``):
a process that imports one module of them (the reaper, a node agent) does not import every
export, and every export, ``dir()`` and ``from package import submodule`` still work. The
import checks run in a fresh interpreter, so nothing this test process imported counts."""

from __future__ import annotations

import ast
import sys
from types import ModuleType
from typing import Any

import pytest

import rayless.actors as actors
import rayless.transport as transport
from rayless.transport import encode, lazy
from rayless.transport.lazy import _typing_imports, exports
from tests.drivers import run_fresh


def test_the_reaper_and_an_agent_import_only_what_they_use() -> None:
    # before: importing any module under rayless.actors imported the whole actor API (the
    # cluster, handles, the client runtime): 230 ms of the reaper's start
    loaded = run_fresh(
        """
        import sys
        import rayless.actors.control.reaper
        reaper = sorted(m for m in sys.modules if m.startswith("rayless."))
        import rayless.actors.control.agent
        print(" ".join(m for m in (
            "rayless.actors.api.cluster", "rayless.actors.api.handle",
            "rayless.transport.client", "rayless.transport.server",
        ) if m in reaper), "|", "rayless.actors.api.cluster" in sys.modules)
        """
    )
    assert loaded.strip() == "| False"


@pytest.mark.parametrize("package", [actors, transport])
def test_every_export_resolves_and_is_listed(package: ModuleType) -> None:
    names = package.__all__
    for name in names:
        assert getattr(package, name) is not None
        assert name in dir(package)
    with pytest.raises(AttributeError, match="has no attribute 'nothing_here'"):
        package.nothing_here  # noqa: B018


def test_aliases_and_submodules() -> None:
    from rayless.actors import BUILTIN_METHODS
    from rayless.actors.api.binding import BUILTINS
    from rayless.transport import codec  # a submodule, not an export: still importable

    assert BUILTIN_METHODS is BUILTINS
    assert codec.__name__ == "rayless.transport.codec"


def test_a_handle_decodes_where_its_module_was_never_imported() -> None:
    # a process that imported only rayless.transport meets an actor handle (an actor's
    # argument): the codec imports the module that registers it
    handle = actors.ActorHandle("a1", "c", "tcp://127.0.0.1:1", "Counter", {"add": False})
    frames = [bytes(f).hex() for f in encode(handle)]
    got = run_fresh(
        f"""
        import sys
        from rayless.transport import decode
        assert "rayless.actors.api.handle" not in sys.modules
        h = decode([bytes.fromhex(f) for f in {frames!r}])
        print(type(h).__name__, h.name, h.cls_name)
        """
    )
    assert got.strip() == "ActorHandle c Counter"


def test_a_package_without_typing_imports_exports_nothing(tmp_path: object) -> None:
    import types

    module = types.ModuleType("lazy_probe")
    path = f"{tmp_path}/lazy_probe.py"
    with open(path, "w", encoding="utf-8") as f:
        f.write("X = 1\n")
    module.__file__ = path
    sys.modules["lazy_probe"] = module
    try:
        getattr_, dir_ = exports("lazy_probe")
        with pytest.raises(AttributeError):
            getattr_("X")
        assert "X" not in dir_()
    finally:
        del sys.modules["lazy_probe"]


def test_the_export_table_matches_an_ast_reading_and_uses_no_ast(tmp_path: Any) -> None:
    """The table is read line by line (the lookup may run in any thread, and CPython 3.11's
    AST conversion is not safe beside another thread's): the same as what ast reads."""
    source = (
        "from __future__ import annotations\n"
        "from typing import TYPE_CHECKING\n"
        "import typing\n"
        "if TYPE_CHECKING:\n"
        "    from pkg.a import One, Two as Deux  # a comment\n"
        "    from pkg.b import (\n"
        "        Three,\n"
        "        Four as Quatre,\n"
        "    )\n"
        "    from pkg.c import \\\n"
        "        Five\n"
        "    from . import relative\n"
        "    import pkg.d\n"
        "\n"
        "    from pkg.e import Six\n"
        "x = 1\n"
        "    # an indented comment outside the block\n"
        "def f() -> None:\n"
        "    from pkg.f import Nope\n"
        "if typing.TYPE_CHECKING:\n"
        "    from pkg.g import Seven\n"
    )
    path = tmp_path / "m.py"
    path.write_text(source)
    expected: dict[str, tuple[str, str]] = {}
    for node in ast.parse(source).body:
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            for stmt in node.body:
                if isinstance(stmt, ast.ImportFrom) and stmt.module and not stmt.level:
                    for alias in stmt.names:
                        expected[alias.asname or alias.name] = (stmt.module, alias.name)
    assert _typing_imports(str(path)) == expected
    assert len(expected) == 7
    for package in (actors, transport):
        assert _typing_imports(package.__file__ or "").keys() == set(package.__all__)
    assert "ast" not in vars(lazy)
