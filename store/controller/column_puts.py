"""Atomic column-wise puts: fields added to existing samples become ready together.

``put(td, meta=meta)`` adds fields to samples that may live on several units. Each unit writes
its rows and reports them (a data update carrying the put's id); the controller holds those
updates, and only when the last unit of the put has reported does it mark the new fields
ready for all of the put's samples at once. A put that fails is aborted (its staging dropped,
the rows the units wrote deleted), so no fetch ever sees half of it; a put whose client died
is aborted by the controller's reaper after ``reclaim_after`` seconds, and a unit that reports
for an aborted put is told so (it then deletes its rows again).

Fields that samples already held are overwritten in place on each unit as it writes (their
old values are not kept): readers may see the new value of such a field on one unit before
the other. Adding fields is atomic; overwriting them is per unit.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from rayless.store.data.updates import DataUpdate
from rayless.store.errors import StoreInputError

__all__ = ["ColumnPut", "ColumnPuts"]


@dataclass
class ColumnPut:
    """One column-wise put under way."""

    generations: dict[tuple[str, int], int]  # (partition, index) -> the sample's generation
    fresh: dict[str, dict[str, list[int]]]  # rows it adds: {partition: {field: [indexes]}}
    waiting: set[tuple[str, int]]
    updates: list[DataUpdate] = field(default_factory=list)


@dataclass
class ColumnPuts:
    """The column-wise puts a controller stages (see the module docstring)."""

    _puts: dict[int, ColumnPut] = field(default_factory=dict)
    _serial: int = 0

    def __len__(self) -> int:
        return len(self._puts)

    def ids(self) -> list[int]:
        """The ids of the puts under way."""
        return list(self._puts)

    def begin(
        self, samples: Mapping[tuple[str, int], int], fresh: dict[str, dict[str, list[int]]]
    ) -> int:
        """Stage a put onto ``samples`` (``{(partition, index): generation}``) adding ``fresh``
        rows; returns its id for the units' data updates."""
        self._serial += 1
        keys = dict(samples)
        self._puts[self._serial] = ColumnPut(keys, fresh, set(keys))
        return self._serial

    def end(self, put_id: int) -> ColumnPut | None:
        """Drop put ``put_id`` (aborted or expired); its staging, or None if unknown."""
        return self._puts.pop(put_id, None)

    def on_update(
        self,
        update: DataUpdate,
        apply: Callable[[DataUpdate, Mapping[tuple[str, int], int]], list[int]],
    ) -> list[int]:
        """Hold ``update`` (it carries a put id); on the put's last one, ``apply`` each held
        update (with the put's sample generations: it applies the rows of samples that still
        exist as they were) and return the indexes that became ready.

        Raises StoreInputError for an unknown (aborted, expired) put or samples outside it.
        """
        put_id = update.put_id
        put = self._puts.get(put_id) if put_id is not None else None
        if put is None:
            raise StoreInputError(f"the column-wise put {put_id} was aborted or is unknown")
        keys = {(update.partition, i) for i in update.indexes}
        if not keys <= set(put.generations):
            raise StoreInputError("a data update names samples outside its column-wise put")
        put.waiting -= keys
        put.updates.append(update)
        if put.waiting:
            return []
        del self._puts[put_id]  # type: ignore[arg-type]
        ready: list[int] = []
        for upd in put.updates:
            ready += apply(upd, put.generations)
        return ready
