"""A sharded TensorDict data plane: a controller and storage units, all of them actors.

Imports ``actors``, ``transport`` and ``placement``. See docs/store.md.
"""

from store import samplers
from store.client import DEFAULT_NAME, Store
from store.errors import (
    ForeignMetaError,
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
)
from store.meta import BatchMeta
from store.samplers import GroupedSampler, RandomSampler, SequentialSampler, make_sampler
from store.schema import FieldSchema
from store.sync import SyncStore

__all__ = [
    "DEFAULT_NAME",
    "BatchMeta",
    "FieldSchema",
    "ForeignMetaError",
    "GroupedSampler",
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
    "make_sampler",
    "samplers",
]
