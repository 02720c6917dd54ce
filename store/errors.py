"""The store's errors: :class:`StoreError` and its refinements.

Every error here crosses processes intact (the error tree registers subclasses for the wire).
Errors of bad input also derive from :class:`ValueError`, and every operation that raises one
leaves the store exactly as it was::

    StoreError
    ├── StoreInputError (ValueError)   a request the store refuses; nothing changed
    │   ├── SchemaError                data that does not fit a field's schema or cannot be stored
    │   ├── UnknownFieldError          fields that a partition, shard or meta does not hold
    │   ├── UnknownPartitionError      a partition that does not exist
    │   ├── UnknownKeyError            KV keys that the store does not hold
    │   ├── StaleMetaError             a BatchMeta naming samples that were cleared since
    │   ├── ForeignMetaError           a BatchMeta made by another store
    │   └── CheckpointError            a checkpoint that cannot be loaded (nothing written)
    │       └── CheckpointNotFoundError (FileNotFoundError)  no checkpoint in that directory
    ├── StoreFullError                 a storage unit's byte capacity would be exceeded
    │   └── WriteTooLargeError         a write larger than the unit's whole capacity (never fits)
    ├── StoreTimeoutError (TimeoutError) a fetch's batch was not ready within its timeout
    └── UnitLostError                  a storage unit is gone, and the samples it held with it
        └── PartialResultError         a get lost some samples; it carries the live part
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from rayless.transport.errors import BrokenError, RaylessError

__all__ = [
    "CheckpointError",
    "CheckpointNotFoundError",
    "ForeignMetaError",
    "PartialResultError",
    "SchemaError",
    "StaleMetaError",
    "StoreError",
    "StoreFullError",
    "StoreInputError",
    "StoreTimeoutError",
    "UnitLostError",
    "UnknownFieldError",
    "WriteTooLargeError",
    "UnknownKeyError",
    "UnknownPartitionError",
]


class StoreError(RaylessError, wire="rayless.StoreError"):
    """The store cannot serve a request; the classes below say why."""


class StoreInputError(StoreError, ValueError, wire="rayless.StoreInputError"):
    """A request the store refuses (bad arguments, bad data); the store is left unchanged."""


class SchemaError(StoreInputError, wire="rayless.SchemaError"):
    """Data that does not fit a field's schema (dtype, kind, shape) or cannot be stored at all."""


class UnknownFieldError(StoreInputError, wire="rayless.UnknownFieldError"):
    """Fields that the partition, shard or meta in question does not hold."""


class UnknownPartitionError(StoreInputError, wire="rayless.UnknownPartitionError"):
    """A partition that does not exist (never created, or cleared)."""


class UnknownKeyError(StoreInputError, wire="rayless.UnknownKeyError"):
    """KV keys that the store does not hold."""


class StaleMetaError(StoreInputError, wire="rayless.StaleMetaError"):
    """A BatchMeta naming samples that were cleared (and maybe reused) since it was made."""


class ForeignMetaError(StoreInputError, wire="rayless.ForeignMetaError"):
    """A BatchMeta made by another store (its store id differs)."""


class CheckpointError(StoreInputError, wire="rayless.CheckpointError"):
    """A checkpoint that cannot be loaded into this store (a malformed manifest, a missing or
    unloadable data file, a partition that exists, units without room); nothing was written."""


class CheckpointNotFoundError(
    CheckpointError, FileNotFoundError, wire="rayless.CheckpointNotFoundError"
):
    """No checkpoint manifest in the directory given to ``load_checkpoint`` (also a
    ``FileNotFoundError``, as TransferQueue raises); nothing was written."""


class StoreFullError(StoreError, wire="rayless.StoreFullError"):
    """A write would take a storage unit past its byte capacity; nothing was written.

    Attributes: ``unit`` (its id), ``needed`` (bytes the write needs), ``available`` (bytes free),
    ``reason`` (set when the host ran out of memory before the capacity, e.g. ``/dev/shm``).
    """

    def __init__(
        self, unit: str, needed: int, available: int, capacity: int, *, reason: str = ""
    ) -> None:
        self.unit = unit
        self.needed = needed
        self.available = available
        self.capacity = capacity
        self.reason = reason
        why = reason or f"the write needs {needed} bytes, {available} of {capacity} are free"
        super().__init__(f"storage unit {unit!r} is full: {why}")


class WriteTooLargeError(StoreFullError, wire="rayless.WriteTooLargeError"):
    """A write whose rows alone exceed the unit's whole capacity: it can never fit, so it
    fails at once instead of waiting for room. Same attributes as StoreFullError."""


class StoreTimeoutError(StoreError, TimeoutError, wire="rayless.StoreTimeoutError"):
    """A ``get_meta`` whose batch did not become ready within its timeout; nothing changed."""


class UnitLostError(StoreError, BrokenError, wire="rayless.UnitLostError"):
    """A storage unit is gone; the samples it held are lost. ``unit`` names it.

    A ``BrokenError`` too (the lost-peer family, with ``ActorDiedError``)."""

    def __init__(self, unit: str, reason: str = "") -> None:
        self.unit = unit
        self.reason = reason
        text = f"storage unit {unit!r} is lost"
        super().__init__(f"{text}: {reason}" if reason else text)


class PartialResultError(UnitLostError, wire="rayless.PartialResultError"):
    """A ``get`` whose meta spans a lost unit: the samples on live units were read anyway.

    ``data`` holds their TensorDict, ``meta`` their BatchMeta (positions in the original meta's
    order), ``lost`` the BatchMeta of the samples that died with ``unit`` (``units``: every
    unit lost). The live samples stay consumed by the task that fetched them (their data is
    here); ``Store.reset_consumption(task, meta=err.meta)`` hands them back instead. Across
    processes only the plain attributes travel (``data``/``meta`` as text).
    """

    def __init__(
        self,
        unit: str,
        reason: str = "",
        *,
        data: Any = None,
        meta: Any = None,
        lost: Any = None,
        units: Sequence[str] = (),
    ) -> None:
        super().__init__(unit, reason)
        self.data = data
        self.meta = meta
        self.lost = lost
        self.units = list(units) or [unit]
