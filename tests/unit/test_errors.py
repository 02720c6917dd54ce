"""``rayless.errors``: every error of every layer is there, wire names are stable, it is light."""

from __future__ import annotations

import importlib
import pkgutil
import subprocess
import sys

import rayless
import rayless.errors
from rayless.transport.errors import RaylessError, wire_name

HEAVY = ("torch", "numpy", "tensordict")


def _import_all() -> None:
    """Import every module of ours (so every error class is defined)."""
    for info in pkgutil.walk_packages(rayless.__path__, "rayless."):
        if info.name.endswith("__main__"):
            continue
        try:
            importlib.import_module(info.name)
        except ModuleNotFoundError as exc:  # an optional third-party extra (the demo's)
            if (exc.name or "").startswith("rayless"):
                raise


def _subclasses(cls: type) -> set[type]:
    found: set[type] = set()
    for sub in cls.__subclasses__():
        found |= {sub, *_subclasses(sub)}
    return found


def _ours() -> list[type]:
    _import_all()
    return sorted(
        (c for c in _subclasses(RaylessError) if c.__module__.startswith("rayless.")),
        key=lambda c: c.__qualname__,
    )


def test_every_error_of_ours_is_in_rayless_errors() -> None:
    # classes marked wire=None (e.g. the RemoteError[T] an actor call makes) are not API
    public = [c for c in _ours() if not c.__name__.startswith("_") and wire_name(c) is not None]
    assert public
    missing = [
        f"{c.__module__}.{c.__qualname__}"
        for c in [RaylessError, *public]
        if getattr(rayless.errors, c.__name__, None) is not c
    ]
    assert not missing, f"not re-exported by rayless.errors: {missing}"
    assert sorted(rayless.errors.__all__) == sorted(
        {RaylessError.__name__, *(c.__name__ for c in public)}
    )


def test_wire_names_are_rayless_strings_and_unique() -> None:
    names: dict[str, type] = {}
    for cls in [RaylessError, *_ours()]:
        name = wire_name(cls)
        if name is None:  # travels as its parent
            continue
        assert name.startswith("rayless."), (cls, name)
        assert name not in names, f"{name!r} names both {names[name]} and {cls}"
        names[name] = cls


def test_importing_rayless_errors_stays_light() -> None:
    code = f"import sys, rayless.errors\nprint(sorted(m for m in {HEAVY!r} if m in sys.modules))\n"
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "[]"


def test_a_subclass_with_a_foreign_class_first_travels_as_its_nearest_registered_class() -> None:
    # as Ray's errors are mixed in (rayless.ray.exceptions: RayTaskError first, then the
    # rayless error): walking __mro__[1] from such a class ran off its end (IndexError), and
    # the server sent no reply at all
    from rayless.transport.errors import RemoteError, error_from_state, error_to_state

    class Foreign(Exception):
        pass

    class Mixed(Foreign, RemoteError, wire=None):
        pass

    exc = Mixed.__new__(Mixed)
    exc.args = ("boom",)
    exc.remote_type = "builtins.ValueError"
    state = error_to_state(exc)
    assert state["type"] == wire_name(RemoteError)
    back = error_from_state(state)
    assert type(back) is RemoteError and back.remote_type == "builtins.ValueError"
