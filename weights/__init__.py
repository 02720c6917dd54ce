"""Weight sync: a trainer publishes versioned state dicts; rollout workers pull them in place.

Imports ``actors`` and ``transport`` (its buckets are ``rayless.transport.segments``); it sits
above ``store`` in the layering. See docs/weights.md.
"""

from typing import TYPE_CHECKING, Any

from rayless.weights.errors import (
    PublisherLostError,
    WeightChecksumError,
    WeightInputError,
    WeightMismatchError,
    WeightSyncError,
    WeightTimeoutError,
    WeightVersionError,
)

if TYPE_CHECKING:
    from rayless.weights.client import WeightSync
    from rayless.weights.engines import ModuleEngine, UpdatableEngine
    from rayless.weights.messages import ShardSpec
    from rayless.weights.sync import SyncWeightSync

# The clients load on first use, so that ``rayless.weights.errors`` (and ``rayless.errors``)
# stay light: they import torch.
_LAZY = {
    "WeightSync": "rayless.weights.client",
    "SyncWeightSync": "rayless.weights.sync",
    "ShardSpec": "rayless.weights.messages",
    "ModuleEngine": "rayless.weights.engines",
    "UpdatableEngine": "rayless.weights.engines",
}


def __getattr__(name: str) -> Any:
    import importlib

    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'rayless.weights' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


__all__ = [
    "ModuleEngine",
    "PublisherLostError",
    "ShardSpec",
    "SyncWeightSync",
    "UpdatableEngine",
    "WeightChecksumError",
    "WeightMismatchError",
    "WeightInputError",
    "WeightSync",
    "WeightSyncError",
    "WeightTimeoutError",
    "WeightVersionError",
]
