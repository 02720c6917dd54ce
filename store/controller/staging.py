"""StagedPuts: the atomic puts that have not committed yet.

An atomic allocation (a new put with schemas) stages its samples: none of them is ready
until all of them were written, so a put torn by a dead producer never shows. Allocation
stages a put (:meth:`StagedPuts.stage`), readiness commits it on its last write
(:meth:`StagedPuts.commit`), clearing drops cleared samples from it (:meth:`StagedPuts.discard`).
"""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np

from rayless.store.controller.records import LOST, _IndexTable, _Partition, _Staging

__all__ = ["StagedPuts"]


class StagedPuts:
    """Uncommitted atomic puts by allocation serial."""

    def __init__(self) -> None:
        self._puts: dict[int, _Staging] = {}  # allocation serial -> uncommitted put

    def __len__(self) -> int:
        return len(self._puts)

    def __iter__(self) -> Iterator[_Staging]:
        return iter(self._puts.values())

    def stage(self, serial: int, partition: str, indexes: list[int]) -> None:
        """Stage allocation ``serial``'s samples ``indexes`` (allocation order)."""
        self._puts[serial] = _Staging(partition, set(indexes), set(indexes), indexes)

    def get(self, serial: int) -> _Staging | None:
        """The uncommitted put of allocation ``serial``, if any."""
        return self._puts.get(serial)

    def commit(self, serial: int) -> None:
        """Forget allocation ``serial``'s put: its last write arrived."""
        del self._puts[serial]

    def discard(self, indexes: list[int], serials: list[int]) -> None:
        """Drop cleared samples ``indexes`` from the puts of their allocations ``serials`` (a
        put goes when none of its samples is left)."""
        for i, gen in zip(indexes, serials, strict=True):
            staging = self._puts.get(gen)
            if staging is not None:
                staging.members.discard(i)
                staging.waiting.discard(i)
                if not staging.members:
                    del self._puts[gen]

    def count(self, serial: int) -> int:
        """Samples of allocation ``serial`` that exist and are not committed yet."""
        staging = self._puts.get(serial)
        return 0 if staging is None else len(staging.members)

    def total(self) -> int:
        """Samples of every uncommitted put."""
        return sum(len(st.members) for st in self._puts.values())

    def in_partition(
        self, partition: str, part: _Partition | None, where: _IndexTable
    ) -> tuple[int, int]:
        """Samples of ``partition`` (``part``: its record, if it exists) allocated by puts that
        have not committed yet, and how many of them are lost with their unit. Costs the
        uncommitted puts' samples, not the partition's size."""
        staged = lost = 0
        for st in self._puts.values():
            if st.partition != partition or not st.members:
                continue
            staged += len(st.members)
            if part is not None and part.lost:
                members = np.fromiter(st.members, dtype=np.int64, count=len(st.members))
                lost += int(np.count_nonzero(part.flags[where.pos[members]] & LOST))
        return staged, lost
