"""The store's status documents: what its controller and storage units report about themselves.

Each is a frozen dataclass registered with the codec (``actors.protocol.wire.message``) under
the wire name ``store.<Name>``, so the answers of the actors' monitoring methods are checked
field by field on decode like every other store message. Each has ``as_dict()``: the plain
dict the store's public API returns (``Store.stats()``, ``metrics()``,
``production_status()``, ``kv_list()``, checkpoints, ``rayless status --store``).

- :class:`Rate`: a counter and its rate per second (puts, gets, fetches).
- :class:`ShardStats`, :class:`UnitStats`: a storage unit's bytes and rows (its shard's part),
  and all it reports (``StorageUnit.stats``).
- :class:`StateStats`, :class:`ControllerStats`: the controller's index counts (its state's
  part), and all it reports (``StoreController.stats``).
- :class:`ProductionStatus`: a partition's samples, ready counts and schemas
  (``production_status``).
- :class:`PartitionMetrics`, :class:`ControllerMetrics`: the controller's monitoring counters
  (``metrics``).
- :class:`KeyListing`: the KV keys with their tags (``kv_list``).
- :class:`ExportedSample`, :class:`PartitionExport`: a partition's samples and consumption
  for a checkpoint (``export_partition``).

User data inside them (custom sample metadata, KV tags, group values) is ``Any``: it is the
user's, carried as they gave it, not the protocol's. This module does not import torch.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from rayless.actors.ext import message
from rayless.store.data.fields import FieldSchema
from rayless.store.data.messages import UnitView, WaitingFetch

__all__ = [
    "ControllerMetrics",
    "ControllerStats",
    "ExportedSample",
    "KeyListing",
    "PartitionExport",
    "PartitionMetrics",
    "ProductionStatus",
    "Rate",
    "ShardStats",
    "StateStats",
    "UnitStats",
]


def _unit(unit: UnitView) -> dict[str, Any]:
    """A unit as the status documents show it: its fields without the actor handle."""
    out = unit.as_dict()
    del out["handle"]
    return out


@message("store.Rate")
@dataclass(frozen=True)
class Rate:
    """A counter: its ``total`` and its rate ``per_s`` over the last window."""

    total: int
    per_s: float

    def as_dict(self) -> dict[str, Any]:
        """``{"total": n, "per_s": rate}``."""
        return {"total": self.total, "per_s": self.per_s}


@message("store.ShardStats")
@dataclass(frozen=True)
class ShardStats:
    """A unit's shard: its unit id, device, bytes used and capacity (None: none), rows per
    partition and KV keys held."""

    unit_id: str
    device: str
    used_bytes: int
    capacity_bytes: int | None
    rows: dict[str, int]
    kv_keys: int

    def as_dict(self) -> dict[str, Any]:
        """The fields above as a dict."""
        return {
            "unit_id": self.unit_id,
            "device": self.device,
            "used_bytes": self.used_bytes,
            "capacity_bytes": self.capacity_bytes,
            "rows": dict(self.rows),
            "kv_keys": self.kv_keys,
        }


@message("store.UnitStats")
@dataclass(frozen=True)
class UnitStats:
    """What a storage unit reports: the bytes its spare reservations hold (``spare_bytes``),
    its shard's :class:`ShardStats` fields, its process ``incarnation``, rows put and got
    (:class:`Rate`), same-host puts under way (``reservations``), reservations clients leased
    ahead (``spare``) and reserves waiting for room (``reserving``)."""

    spare_bytes: int
    unit_id: str
    device: str
    used_bytes: int
    capacity_bytes: int | None
    rows: dict[str, int]
    kv_keys: int
    incarnation: str
    puts: Rate
    gets: Rate
    reservations: int
    spare: int
    reserving: int

    @classmethod
    def of(
        cls,
        shard: ShardStats,
        *,
        spare_bytes: int,
        incarnation: str,
        puts: Rate,
        gets: Rate,
        reservations: int,
        spare: int,
        reserving: int,
    ) -> UnitStats:
        """The unit's report from its shard's and its own counts."""
        return cls(
            spare_bytes,
            shard.unit_id,
            shard.device,
            shard.used_bytes,
            shard.capacity_bytes,
            shard.rows,
            shard.kv_keys,
            incarnation,
            puts,
            gets,
            reservations,
            spare,
            reserving,
        )

    def as_dict(self) -> dict[str, Any]:
        """The fields above as a dict (the rates as :meth:`Rate.as_dict`)."""
        return {
            "spare_bytes": self.spare_bytes,
            "unit_id": self.unit_id,
            "device": self.device,
            "used_bytes": self.used_bytes,
            "capacity_bytes": self.capacity_bytes,
            "rows": dict(self.rows),
            "kv_keys": self.kv_keys,
            "incarnation": self.incarnation,
            "puts": self.puts.as_dict(),
            "gets": self.gets.as_dict(),
            "reservations": self.reservations,
            "spare": self.spare,
            "reserving": self.reserving,
        }


@message("store.StateStats")
@dataclass(frozen=True)
class StateStats:
    """The controller state's counts: partitions, samples allocated, free indexes, indexes
    pending release, samples staged (puts not committed), column-wise puts not finished, the
    high water of indexes, and the units (without handles)."""

    partitions: int
    allocated: int
    free: int
    pending_release: int
    staged: int
    column_puts: int
    high_water: int
    units: list[UnitView]

    def as_dict(self) -> dict[str, Any]:
        """The fields above as a dict (each unit as a dict without its handle)."""
        return {
            "partitions": self.partitions,
            "allocated": self.allocated,
            "free": self.free,
            "pending_release": self.pending_release,
            "staged": self.staged,
            "column_puts": self.column_puts,
            "high_water": self.high_water,
            "units": [_unit(u) for u in self.units],
        }


@message("store.ControllerStats")
@dataclass(frozen=True)
class ControllerStats:
    """What the controller reports: its state's :class:`StateStats` fields (``allocated``
    and ``staged`` without the samples clients leased ahead), samples allocated and never
    written (``unwritten``), samples leased ahead (``leased``), fetches waiting, whether the
    creator has not completed the unit table yet (``units_starting``) and the ``units()``
    calls waiting for it (``units_waiters``)."""

    partitions: int
    allocated: int
    free: int
    pending_release: int
    staged: int
    column_puts: int
    high_water: int
    units: list[UnitView]
    unwritten: int
    leased: int
    waiting_fetches: int
    units_starting: bool
    units_waiters: int

    def as_dict(self) -> dict[str, Any]:
        """The fields above as a dict (each unit as a dict without its handle)."""
        return {
            "partitions": self.partitions,
            "allocated": self.allocated,
            "free": self.free,
            "pending_release": self.pending_release,
            "staged": self.staged,
            "column_puts": self.column_puts,
            "high_water": self.high_water,
            "units": [_unit(u) for u in self.units],
            "unwritten": self.unwritten,
            "leased": self.leased,
            "waiting_fetches": self.waiting_fetches,
            "units_starting": self.units_starting,
            "units_waiters": self.units_waiters,
        }


@message("store.ProductionStatus")
@dataclass(frozen=True)
class ProductionStatus:
    """A partition's committed ``samples``, those ``lost`` with their unit, the samples
    holding each field (``fields``) and each field's schema."""

    samples: int
    lost: int
    fields: dict[str, int]
    schemas: dict[str, FieldSchema]

    def as_dict(self) -> dict[str, Any]:
        """The fields above as a dict (each schema as :meth:`FieldSchema.to_dict`)."""
        return {
            "samples": self.samples,
            "lost": self.lost,
            "fields": dict(self.fields),
            "schemas": {f: s.to_dict() for f, s in self.schemas.items()},
        }


@message("store.PartitionMetrics")
@dataclass(frozen=True)
class PartitionMetrics:
    """A partition in the controller's metrics: its samples, the samples holding each field,
    and how many each task consumed."""

    samples: int
    fields: dict[str, int]
    consumers: dict[str, int]

    def as_dict(self) -> dict[str, Any]:
        """The fields above as a dict."""
        return {
            "samples": self.samples,
            "fields": dict(self.fields),
            "consumers": dict(self.consumers),
        }


@message("store.ControllerMetrics")
@dataclass(frozen=True)
class ControllerMetrics:
    """The controller's monitoring counters: its store id, samples put and fetched
    (:class:`Rate`), the fetches waiting (:class:`WaitingFetch`), served batches waiting for
    their ack (``leased``), each partition's :class:`PartitionMetrics`, and the units (without
    handles)."""

    store_id: str
    puts: Rate
    fetches: Rate
    waiting: list[WaitingFetch]
    leased: int
    partitions: dict[str, PartitionMetrics]
    units: list[UnitView]

    def as_dict(self) -> dict[str, Any]:
        """The fields above as a dict, each nested message as its own ``as_dict()``."""
        return {
            "store_id": self.store_id,
            "puts": self.puts.as_dict(),
            "fetches": self.fetches.as_dict(),
            "waiting": [w.as_dict() for w in self.waiting],
            "leased": self.leased,
            "partitions": {p: m.as_dict() for p, m in self.partitions.items()},
            "units": [_unit(u) for u in self.units],
        }


@message("store.KeyListing")
@dataclass(frozen=True)
class KeyListing:
    """The KV keys: ``{partition: {key: tags}}``. The tags are the user's (any plain values
    they put), carried as given."""

    keys: dict[str, dict[str, dict[str, Any]]]

    def as_dict(self) -> dict[str, dict[str, dict[str, Any]]]:
        """``{partition: {key: tags}}``."""
        return {p: {k: dict(t) for k, t in keys.items()} for p, keys in self.keys.items()}


@message("store.ExportedSample")
@dataclass(frozen=True)
class ExportedSample:
    """A sample in a checkpoint's export: its global ``index``, KV ``key`` (None: none), its
    ``group`` value and ``custom`` metadata (both the user's, carried as given; a tuple group
    as a list) and the fields it holds (sorted)."""

    index: int
    key: str | None
    group: Any
    custom: dict[str, Any]
    fields: list[str]

    def as_dict(self) -> dict[str, Any]:
        """The fields above as a dict."""
        return {
            "index": self.index,
            "key": self.key,
            "group": self.group,
            "custom": dict(self.custom),
            "fields": list(self.fields),
        }


@message("store.PartitionExport")
@dataclass(frozen=True)
class PartitionExport:
    """Everything a checkpoint needs of a partition except the data: its samples in order
    (:class:`ExportedSample`), the indexes each task consumed (sorted) and its group size
    (None: none fixed)."""

    samples: list[ExportedSample]
    consumed: dict[str, list[int]]
    group_size: int | None

    def as_dict(self) -> dict[str, Any]:
        """The fields above as a dict (each sample as :meth:`ExportedSample.as_dict`)."""
        return {
            "samples": [s.as_dict() for s in self.samples],
            "consumed": {t: list(c) for t, c in self.consumed.items()},
            "group_size": self.group_size,
        }
