"""Every public import path works (rayless/api_paths.py), and every moved one still does,
with a DeprecationWarning naming its new path.

Before: ``import rayless.store.loader``, ``rayless.store.WeightSync``,
``rayless.store.client.Store`` and ``import rayless.store.samplers`` failed after moves.
"""

from __future__ import annotations

import importlib
import sys
import warnings
from typing import Any

import pytest

from rayless.api_paths import MOVED, PACKAGES, PATHS


def _resolve(path: str) -> Any:
    module, _, name = path.partition(":")
    obj = importlib.import_module(module)
    return getattr(obj, name) if name else obj


def _forget(path: str) -> None:
    """Make the next import or attribute look-up of an old ``path`` go through its alias."""
    module, _, name = path.partition(":")
    parent, _, child = module.rpartition(".")
    if name:
        vars(importlib.import_module(module)).pop(name, None)
    else:
        sys.modules.pop(module, None)
        if parent in sys.modules:
            vars(sys.modules[parent]).pop(child, None)


@pytest.mark.parametrize("package", PACKAGES)
def test_every_name_of_a_public_package_imports(package: str) -> None:
    module = importlib.import_module(package)
    with warnings.catch_warnings():
        warnings.simplefilter("error", DeprecationWarning)
        for name in module.__all__:
            assert getattr(module, name) is not None, f"{package}.{name}"


@pytest.mark.parametrize("path", PATHS)
def test_every_public_path_imports_without_a_warning(path: str) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("error", DeprecationWarning)
        assert _resolve(path) is not None


@pytest.mark.parametrize(("old", "new"), sorted(MOVED.items()))
def test_a_moved_path_works_and_names_its_new_one(old: str, new: str) -> None:
    target = _resolve(new)
    _forget(old)
    shown = new.replace(":", ".")
    with pytest.warns(DeprecationWarning, match=f"moved to {shown}; import it from there"):
        assert _resolve(old) is target
    _forget(old)
    with pytest.warns(DeprecationWarning) as record:
        if ":" in old:  # the statement users write
            module, _, name = old.partition(":")
            exec(f"from {module} import {name}", {})
        else:
            exec(f"import {old}", {})
    assert [str(w.filename) for w in record] == ["<string>"]  # at the user's line, once


def test_the_old_module_path_is_the_same_module() -> None:
    import rayless.store.client.loader as new

    _forget("rayless.store.loader")
    with pytest.warns(DeprecationWarning):
        import rayless.store.loader as old  # type: ignore[import-not-found]
    assert old is new
    import rayless.store.samplers as aliased  # type: ignore[import-not-found]
    from rayless.store import samplers

    assert aliased is samplers is importlib.import_module("rayless.store.controller.samplers")
