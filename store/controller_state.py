"""ControllerState: the controller's bookkeeping, synchronous and free of I/O.

The controller actor wraps one ControllerState. It owns:

- **Units**: registered storage units (handshake data), numbered by shard in registration
  order. A unit that registers again under its id (a restart) keeps its shard.
- **Indexes**: global indexes, unique across partitions. Freed indexes are reused, smallest
  first, so shard columns stay compact over long runs.
- **Partitions**: per partition the samples in allocation order, the ready set of every field
  (production status), the consumed set of every task (consumption status), field schemas,
  per-sample shapes of nested fields and per-sample custom metadata.

Shard rule: a sample's row lives on exactly one unit, chosen when its index is allocated and
recorded with the sample. By default it is ``alive[index % len(alive)]`` (``alive`` = the shard
numbers of live units, ascending): with every unit alive that is ``index % n_units``, which
spreads any allocation pattern evenly and needs no capacity plan. When the caller gives env
ids, the env-shard table (a ``Mapping[str, int]`` or a callable, e.g. the placement episode
table) decides instead, so one env's samples stay on the unit near its workers.

Because a sample's fields from one put are written to one unit and announced in one
notification, a sample never becomes partly visible; a sample is *ready* for fields F when all
of F are in their ready sets. An atomic allocation (a new put) goes further: none of its
samples is ready until all of them were written (a torn put never shows). A unit loss marks
its samples lost (not ready); only fetches waiting through the loss are told
(:meth:`ControllerState.lost_since`), later ones wait for new data. Every method validates
first and raises a typed :mod:`store.errors` error with the state unchanged.

Clearing is two-phase so that an index is never reused while a unit still holds its old row:
:meth:`ControllerState.clear` hides the samples at once and returns a :class:`ClearPlan`; once
the units deleted the rows, :meth:`ControllerState.release` makes the indexes reusable.

The class is composed of mixins, one concept each: :mod:`store.state_units` (units, loss),
:mod:`store.state_alloc` (allocation), :mod:`store.state_production` (data updates, staged and
column-wise puts), :mod:`store.state_consumption` (fetches, samplers), :mod:`store.state_clears`
(clears, release), :mod:`store.state_extra` (KV keys, group sizes, consumption marks), on the
shared lookups and metas of :mod:`store.state_metas`; the records live in
:mod:`store.state_records`. This module keeps the state itself and its status, and re-exports
the public names.
"""

from __future__ import annotations

import uuid
from typing import Any

from rayless.store.column_puts import ColumnPuts
from rayless.store.errors import StoreInputError
from rayless.store.samplers import Sampler
from rayless.store.state_alloc import StateAllocation
from rayless.store.state_clears import StateClears
from rayless.store.state_consumption import StateConsumption
from rayless.store.state_extra import StateExtras
from rayless.store.state_production import StateProduction
from rayless.store.state_records import (
    MODES as MODES,
)
from rayless.store.state_records import (
    ClearPlan,
    EnvShards,
    UnitInfo,
    _Partition,
    _Staging,
)
from rayless.store.state_units import StateUnits

__all__ = ["ClearPlan", "ControllerState", "EnvShards", "UnitInfo"]


class ControllerState(
    StateUnits, StateAllocation, StateProduction, StateConsumption, StateClears, StateExtras
):
    """The store controller's state. See the module docstring for the rules it keeps."""

    def __init__(self, store_id: str | None = None, *, env_shards: EnvShards | None = None):
        self.store_id = store_id or uuid.uuid4().hex
        self._env_shards = env_shards
        self._units: list[UnitInfo] = []
        self._unit_by_id: dict[str, UnitInfo] = {}
        self._partitions: dict[str, _Partition] = {}
        self._owner: dict[int, str] = {}  # allocated index -> partition
        self._free: list[int] = []  # heap of reusable indexes
        self._pending: set[int] = set()  # cleared, waiting for release
        self._next_index = 0
        self._serial = 0
        self._samplers: dict[tuple[str, str, str], Sampler] = {}
        self._staging: dict[int, _Staging] = {}  # allocation serial -> uncommitted put
        self.column_puts = ColumnPuts()  # column-wise puts whose units have not all written

    # -- status --------------------------------------------------------------------------

    def partitions(self) -> list[str]:
        """Names of existing partitions."""
        return list(self._partitions)

    def shard_of(self, index: int) -> int:
        """The shard that holds allocated sample ``index``. Raises StoreInputError."""
        partition = self._owner.get(index)
        if partition is None:
            raise StoreInputError(f"index {index} is not allocated")
        return self._partitions[partition].samples[index].shard

    def production_status(self, partition: str) -> dict[str, Any]:
        """``{"samples": n, "lost": lost with their unit, "fields": {field: ready count},
        "schemas": {...}}`` of a partition."""
        part = self._part(partition)
        return {
            "samples": len(part.samples),
            "lost": sum(1 for s in part.samples.values() if s.lost_on is not None),
            "fields": {f: len(r) for f, r in part.ready.items()},
            "schemas": {f: s.to_dict() for f, s in part.schemas.items()},
        }

    def consumption_status(self, partition: str, task: str) -> dict[str, int]:
        """``{"samples": n, "consumed": c}`` for ``task`` in ``partition``."""
        part = self._part(partition)
        return {"samples": len(part.samples), "consumed": len(part.consumed.get(task, ()))}

    def stats(self) -> dict[str, Any]:
        """Counts for monitoring: partitions, allocated, free, pending release, units."""
        return {
            "partitions": len(self._partitions),
            "allocated": len(self._owner),
            "free": len(self._free),
            "pending_release": len(self._pending),
            "staged": sum(len(st.members) for st in self._staging.values()),
            "column_puts": len(self.column_puts),  # column-wise puts not finished yet
            "high_water": self._next_index,
            "units": [u.to_dict() for u in self._units],
        }
