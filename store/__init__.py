"""A sharded TensorDict data plane: a controller and storage units, all of them actors.

Imports ``actors``, ``transport`` and ``placement``. See docs/store.md.
"""

from typing import TYPE_CHECKING, Any

from rayless.store.errors import (
    CheckpointError,
    CheckpointNotFoundError,
    ForeignMetaError,
    PartialResultError,
    PublisherLostError,
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
    WeightMismatchError,
    WeightSyncError,
    WeightTimeoutError,
    WeightVersionError,
    WriteTooLargeError,
)

if TYPE_CHECKING:
    from rayless.store import samplers
    from rayless.store.client import DEFAULT_NAME, Store
    from rayless.store.loader import StreamingDataset, StreamingLoader
    from rayless.store.meta import BatchMeta
    from rayless.store.samplers import (
        GroupedSampler,
        RandomSampler,
        SeqlenBalancedSampler,
        SequentialSampler,
        make_sampler,
    )
    from rayless.store.schema import FieldSchema
    from rayless.store.sync import SyncStore
    from rayless.store.weights import WeightSync
    from rayless.store.weights_sync import SyncWeightSync

# The rest loads on first use, so that ``rayless.store.errors`` (and ``rayless.errors``) stay
# light: the store's client imports torch and tensordict.
_LAZY = {
    "DEFAULT_NAME": "rayless.store.client",
    "Store": "rayless.store.client",
    "BatchMeta": "rayless.store.meta",
    "GroupedSampler": "rayless.store.samplers",
    "RandomSampler": "rayless.store.samplers",
    "SeqlenBalancedSampler": "rayless.store.samplers",
    "SequentialSampler": "rayless.store.samplers",
    "StreamingDataset": "rayless.store.loader",
    "StreamingLoader": "rayless.store.loader",
    "make_sampler": "rayless.store.samplers",
    "FieldSchema": "rayless.store.schema",
    "SyncStore": "rayless.store.sync",
    "WeightSync": "rayless.store.weights",
    "SyncWeightSync": "rayless.store.weights_sync",
}


def __getattr__(name: str) -> Any:
    import importlib

    if name == "samplers":
        return importlib.import_module("rayless.store.samplers")
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
    "PublisherLostError",
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
    "SyncWeightSync",
    "UnitLostError",
    "UnknownFieldError",
    "UnknownKeyError",
    "UnknownPartitionError",
    "WeightMismatchError",
    "WeightSync",
    "WeightSyncError",
    "WeightTimeoutError",
    "WeightVersionError",
    "WriteTooLargeError",
    "make_sampler",
    "samplers",
]
