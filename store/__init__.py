"""A sharded TensorDict data plane: a controller and storage units, all of them actors.

Imports ``actors``, ``transport`` and ``placement``. See docs/store.md.
"""

from rayless.store import samplers
from rayless.store.client import DEFAULT_NAME, Store
from rayless.store.errors import (
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
from rayless.store.meta import BatchMeta
from rayless.store.samplers import GroupedSampler, RandomSampler, SequentialSampler, make_sampler
from rayless.store.schema import FieldSchema
from rayless.store.sync import SyncStore

__all__ = [
    "DEFAULT_NAME",
    "BatchMeta",
    "FieldSchema",
    "ForeignMetaError",
    "GroupedSampler",
    "PartialResultError",
    "RandomSampler",
    "SchemaError",
    "SequentialSampler",
    "StaleMetaError",
    "Store",
    "StoreError",
    "StoreFullError",
    "StoreInputError",
    "StoreTimeoutError",
    "SyncStore",
    "UnitLostError",
    "UnknownFieldError",
    "UnknownKeyError",
    "UnknownPartitionError",
    "WriteTooLargeError",
    "make_sampler",
    "samplers",
]
