"""The records ControllerState keeps (units, samples, partitions, staged puts, clear plans)
and the argument checks its methods share.

- :class:`UnitInfo`: a registered storage unit (wire form: :meth:`UnitInfo.to_dict`).
- :class:`ClearPlan`: the rows units delete after a clear, and the indexes to release then.
- ``_Sample`` / ``_Partition`` / ``_Staging``: one sample, one partition (samples in allocation
  order, ready sets per field, consumed sets per task, schemas, shapes, KV keys, groups) and
  one atomic put that has not committed yet. Private to the ``state_*`` modules.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from rayless.store.data.fields import FieldSchema
from rayless.store.data.meta import NO_CUSTOM, BatchMeta
from rayless.store.data.updates import DataUpdate
from rayless.store.errors import StoreInputError

__all__ = ["MODES", "ClearPlan", "EnvShards", "UnitInfo"]

EnvShards = Mapping[str, int] | Callable[[str], int]
MODES = ("fetch", "peek")


@dataclass
class UnitInfo:
    """A registered storage unit: its id, shard number, node, device and byte capacity."""

    unit_id: str
    shard: int
    node_id: str | None = None
    device: str = "cpu"
    capacity_bytes: int | None = None
    alive: bool = True

    def to_dict(self) -> dict[str, Any]:
        """Plain values for the wire."""
        return dict(vars(self))


@dataclass
class ClearPlan:
    """Rows the units must delete after a clear: ``{shard: {partition: [indexes]}}``.

    Pass ``indexes`` to :meth:`ControllerState.release` once the units have deleted them.
    """

    shards: dict[int, dict[str, list[int]]] = field(default_factory=dict)
    indexes: list[int] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        """Plain values for the wire."""
        return {"shards": {str(k): v for k, v in self.shards.items()}, "indexes": self.indexes}


# The custom metadata of every sample that has none: shared, so never mutated in place (the
# state copies a sample's dict out, and set_custom_meta replaces it).
_NO_CUSTOM: Mapping[str, Any] = NO_CUSTOM


@dataclass(slots=True)
class _Sample:
    shard: int
    generation: int
    group: Hashable
    custom: Mapping[str, Any]
    lost_on: str | None = None
    staged: bool = False  # part of an atomic put that has not committed yet
    key: str | None = None  # its KV key (kv_batch_put), unique in the partition


@dataclass
class _Partition:
    samples: dict[int, _Sample] = field(default_factory=dict)  # in allocation order
    ready: dict[str, set[int]] = field(default_factory=dict)
    schemas: dict[str, FieldSchema] = field(default_factory=dict)
    shapes: dict[str, dict[int, tuple[int, ...]]] = field(default_factory=dict)
    consumed: dict[str, set[int]] = field(default_factory=dict)
    created: int = 0  # serial of the allocation that created the partition
    losses: int = 0  # unit losses that took samples of this partition
    lost_unit: str | None = None  # the unit of the latest such loss
    keys: dict[str, int] = field(default_factory=dict)  # KV key -> index
    group_size: int | None = None  # fixed by a put's group_size or the first grouped fetch
    group_count: dict[Hashable, int] = field(default_factory=dict)  # explicit group -> samples


@dataclass
class _Staging:
    """An atomic put: its samples become ready together once every one of them is written."""

    partition: str
    members: set[int]
    waiting: set[int]
    order: list[int]  # the members in allocation order
    updates: list[DataUpdate] = field(default_factory=list)


def _check_name(value: Any, what: str) -> str:
    if not isinstance(value, str) or not value:
        raise StoreInputError(f"{what} must be a non-empty str, got {value!r}")
    return value


def _check_fields(fields: Any) -> list[str]:
    if isinstance(fields, str) or not isinstance(fields, Iterable):
        raise StoreInputError(f"fields must be a list of names, got {fields!r}")
    names = [_check_name(f, "a field name") for f in fields]
    if not names:
        raise StoreInputError("fields must name at least one field")
    return list(dict.fromkeys(names))


def _positions_by_partition(meta: BatchMeta) -> dict[str, list[int]]:
    ids = meta.partition_ids
    if ids and ids.count(ids[0]) == len(ids):
        return {ids[0]: list(range(len(ids)))}
    groups: dict[str, list[int]] = {}
    for pos, part in enumerate(meta.partition_ids):
        groups.setdefault(part, []).append(pos)
    return groups
