"""A sharded TensorDict data plane: a controller and storage units, all of them actors.

Imports ``actors``, ``transport`` and ``placement``. See docs/store.md.
"""

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


def __getattr__(name: str) -> Any:
    import importlib

    if name == "samplers":
        return importlib.import_module("rayless.store.controller.samplers")
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
