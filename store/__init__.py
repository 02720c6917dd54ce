"""A sharded TensorDict data plane: a controller and storage units, all of them actors.

Imports ``actors``, ``transport`` and ``placement``. See docs/store.md.
"""

import importlib
import importlib.abc
import importlib.util
from collections.abc import Sequence
from importlib.machinery import ModuleSpec
from types import ModuleType
from typing import TYPE_CHECKING, Any

from rayless.store.errors import (
    CheckpointError,
    CheckpointNotFoundError,
    ForeignMetaError,
    PartialResultError,
    SchemaError,
    StaleMetaError,
    StoreError,
    StoreFullError,
    StoreInputError,
    StoreTimeoutError,
    UnitLostError,
    UnknownFieldError,
    UnknownKeyError,
    UnknownPartitionError,
    WriteTooLargeError,
)

if TYPE_CHECKING:
    from rayless.store.client.loader import StreamingDataset, StreamingLoader
    from rayless.store.client.store import DEFAULT_NAME, Store
    from rayless.store.client.sync import SyncStore
    from rayless.store.controller import samplers
    from rayless.store.controller.samplers import (
        GroupedSampler,
        RandomSampler,
        SeqlenBalancedSampler,
        SequentialSampler,
        make_sampler,
    )
    from rayless.store.data.meta import BatchMeta
    from rayless.store.data.schema import FieldSchema

# The rest loads on first use, so that ``rayless.store.errors`` (and ``rayless.errors``) stay
# light: the store's client imports torch and tensordict.
_LAZY = {
    "DEFAULT_NAME": "rayless.store.client.store",
    "Store": "rayless.store.client.store",
    "BatchMeta": "rayless.store.data.meta",
    "GroupedSampler": "rayless.store.controller.samplers",
    "RandomSampler": "rayless.store.controller.samplers",
    "SeqlenBalancedSampler": "rayless.store.controller.samplers",
    "SequentialSampler": "rayless.store.controller.samplers",
    "StreamingDataset": "rayless.store.client.loader",
    "StreamingLoader": "rayless.store.client.loader",
    "make_sampler": "rayless.store.controller.samplers",
    "FieldSchema": "rayless.store.data.schema",
    "SyncStore": "rayless.store.client.sync",
}


# Import paths that moved: they still work, with a DeprecationWarning naming the new path
# (rayless/api_paths.py lists them beside every public path). Modules: old -> new.
MOVED_MODULES = {
    "rayless.store.checkpoint": "rayless.store.client.checkpoint",
    "rayless.store.loader": "rayless.store.client.loader",
    "rayless.store.sync": "rayless.store.client.sync",
    "rayless.store.meta": "rayless.store.data.meta",
    "rayless.store.schema": "rayless.store.data.schema",
    "rayless.store.segments": "rayless.transport.segments",
    "rayless.store.weights": "rayless.weights.client",
    "rayless.store.weights_sync": "rayless.weights.sync",
    "rayless.store.weights_layout": "rayless.weights.layout",
}
# Other paths of a module, kept as they are (public, no warning).
MODULE_ALIASES = {"rayless.store.samplers": "rayless.store.controller.samplers"}
# Names of this package that moved: name -> the module that has it now (weight sync is its
# own package, above the store: named here by string only, loaded on first use).
MOVED_NAMES = {
    "WeightSync": "rayless.weights",
    "SyncWeightSync": "rayless.weights",
    "PublisherLostError": "rayless.weights",
    "WeightMismatchError": "rayless.weights",
    "WeightSyncError": "rayless.weights",
    "WeightTimeoutError": "rayless.weights",
    "WeightVersionError": "rayless.weights",
}


def moved(old: str, new: str) -> None:
    """Warn (DeprecationWarning, at the code that used ``old``) that ``old`` is now ``new``."""
    import sys
    import warnings

    level, frame = 2, sys._getframe(1)
    while frame.f_back is not None and _internal(frame.f_code.co_filename):
        if not frame.f_code.co_filename.startswith("<frozen importlib"):
            level += 1  # (warnings skips the import system's frames itself)
        frame = frame.f_back
    warnings.warn(
        f"{old} moved to {new}; import it from there", DeprecationWarning, stacklevel=level
    )


def _internal(filename: str) -> bool:
    """Frames of the import system and of the packages' ``__getattr__``, skipped by the
    warning so that it names the user's line."""
    import os

    if filename.startswith("<frozen importlib") or filename == importlib.__file__:
        return True
    here = os.path.dirname(__file__)
    return os.path.basename(filename) == "__init__.py" and os.path.dirname(filename) in (
        here,
        os.path.join(here, "client"),
    )


class _MovedModules(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """A meta path finder and loader: an old module path imports the module at its new path
    (the same module object), after a DeprecationWarning where it moved."""

    def find_spec(
        self, fullname: str, path: Sequence[str] | None, target: ModuleType | None = None
    ) -> ModuleSpec | None:
        if fullname not in MOVED_MODULES and fullname not in MODULE_ALIASES:
            return None
        return importlib.util.spec_from_loader(fullname, self)

    def create_module(self, spec: ModuleSpec) -> ModuleType:
        if spec.name in MODULE_ALIASES:
            return importlib.import_module(MODULE_ALIASES[spec.name])
        new = MOVED_MODULES[spec.name]
        moved(spec.name, new)
        return importlib.import_module(new)

    def exec_module(self, module: ModuleType) -> None:
        pass  # already executed, at its new path


def _install_finder() -> None:
    import sys

    if not any(isinstance(f, _MovedModules) for f in sys.meta_path):
        sys.meta_path.append(_MovedModules())


_install_finder()


def __getattr__(name: str) -> Any:
    if name == "samplers":
        return importlib.import_module("rayless.store.controller.samplers")
    if name in MOVED_NAMES:
        moved(f"rayless.store.{name}", f"{MOVED_NAMES[name]}.{name}")
        value = getattr(importlib.import_module(MOVED_NAMES[name]), name)
        globals()[name] = value  # warned once (``from rayless.store import X`` looks twice)
        return value
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'rayless.store' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


__all__ = [
    "DEFAULT_NAME",
    "BatchMeta",
    "FieldSchema",
    "CheckpointError",
    "CheckpointNotFoundError",
    "ForeignMetaError",
    "GroupedSampler",
    "PartialResultError",
    "RandomSampler",
    "SchemaError",
    "SeqlenBalancedSampler",
    "SequentialSampler",
    "StaleMetaError",
    "Store",
    "StoreError",
    "StoreFullError",
    "StoreInputError",
    "StoreTimeoutError",
    "StreamingDataset",
    "StreamingLoader",
    "SyncStore",
    "UnitLostError",
    "UnknownFieldError",
    "UnknownKeyError",
    "UnknownPartitionError",
    "WriteTooLargeError",
    "make_sampler",
    "samplers",
]
