"""``rayless.actors`` and ``rayless.transport`` export lazily (``rayless.transport.lazy``):
a process that imports one module of them (the reaper, a node agent) does not import every
export, and every export, ``dir()`` and ``from package import submodule`` still work. The
import checks run in a fresh interpreter, so nothing this test process imported counts."""

from __future__ import annotations

import sys
from types import ModuleType

import pytest

import rayless.actors as actors
import rayless.transport as transport
from rayless.transport import encode
from rayless.transport.lazy import exports
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
