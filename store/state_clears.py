"""ControllerState's clears, in two phases so that an index is never reused while a unit still
holds its old row: :meth:`StateClears.clear` hides samples at once and returns a
:class:`~store.state_records.ClearPlan`; once the units deleted the rows,
:meth:`StateClears.release` makes the indexes reusable. A failed put is undone with
:meth:`StateClears.abort`.
"""

from __future__ import annotations

import heapq
from collections.abc import Iterable

from rayless.store.errors import ForeignMetaError, StoreInputError
from rayless.store.meta import BatchMeta
from rayless.store.state_metas import StateMetas
from rayless.store.state_records import (
    ClearPlan,
    _positions_by_partition,
)

__all__ = ["StateClears"]


class StateClears(StateMetas):
    """Clears, aborts and index release of :class:`ControllerState`."""

    def clear(self, meta: BatchMeta) -> ClearPlan:
        """Remove ``meta``'s samples (hidden at once); the plan names the rows units delete.
        Samples cleared already are skipped (clearing twice is a no-op, as in
        TransferQueue). The indexes become reusable only through :meth:`release`.

        Raises StoreInputError (not a BatchMeta, a forged shard), ForeignMetaError; nothing
        is removed then.
        """
        if not isinstance(meta, BatchMeta):
            raise StoreInputError(f"expected a BatchMeta, got {type(meta).__name__}")
        if meta.store_id != self.store_id:
            raise ForeignMetaError(f"the meta comes from store {meta.store_id!r}")
        live: dict[str, list[int]] = {}
        for part_id, positions in _positions_by_partition(meta).items():
            part = self._partitions.get(part_id)
            for p in positions:
                index, shard = meta.global_indexes[p], meta.shards[p]
                sample = part.samples.get(index) if part is not None else None
                if sample is None or sample.generation != meta.generations[p]:
                    continue  # cleared already (its index may be another sample's now)
                if shard != sample.shard:
                    raise StoreInputError(
                        f"the meta puts sample {index} of {part_id!r} on shard {shard!r}; it "
                        f"lives on shard {sample.shard} (a forged or corrupted meta)"
                    )
                live.setdefault(part_id, []).append(index)
        plan = ClearPlan()
        for part_id, indexes in live.items():
            self._remove(part_id, indexes, plan)
        return plan

    def clear_partition(self, partition: str) -> ClearPlan:
        """Remove a whole partition; see :meth:`clear`. Raises UnknownPartitionError."""
        part = self._part(partition)
        plan = ClearPlan()
        self._remove(partition, list(part.samples), plan)
        self._drop_partition(partition)
        return plan

    def _drop_partition(self, partition: str) -> None:
        del self._partitions[partition]
        for key in [k for k in self._samplers if k[0] == partition]:
            del self._samplers[key]

    def abort(self, meta: BatchMeta) -> ClearPlan:
        """Undo a failed put of new samples: :meth:`clear` them, and drop a partition that
        this put created and that is empty now (a failed put leaves no partition behind)."""
        plan = self.clear(meta)
        serials = set(meta.generations)
        for part_id in dict.fromkeys(meta.partition_ids):
            part = self._partitions.get(part_id)
            if part is not None and not part.samples and part.created in serials:
                self._drop_partition(part_id)
        return plan

    def _remove(self, partition: str, indexes: list[int], plan: ClearPlan) -> None:
        part = self._partitions[partition]
        gone = set(indexes)
        for i in indexes:
            sample = part.samples.pop(i)
            if sample.staged:
                staging = self._staging.get(sample.generation)
                if staging is not None:
                    staging.members.discard(i)
                    staging.waiting.discard(i)
                    if not staging.members:
                        del self._staging[sample.generation]
            if sample.key is not None:
                part.keys.pop(sample.key, None)
            count = part.group_count.get(sample.group)
            if count is not None:
                if count <= 1:
                    del part.group_count[sample.group]
                else:
                    part.group_count[sample.group] = count - 1
            plan.shards.setdefault(sample.shard, {}).setdefault(partition, []).append(i)
            del self._owner[i]
            self._pending.add(i)
            plan.indexes.append(i)
        for sets in (part.ready, part.consumed):
            for s in sets.values():
                s -= gone
        for shapes in part.shapes.values():
            for i in indexes:
                shapes.pop(i, None)
        self._drop_empty_schemas(part)

    def release(self, indexes: Iterable[int]) -> None:
        """Make cleared indexes reusable (after the units deleted their rows)."""
        idx = list(indexes)
        unknown = [i for i in idx if i not in self._pending]
        if unknown:
            raise StoreInputError(f"indexes {unknown[:8]} are not waiting for release")
        for i in idx:
            self._pending.discard(i)
            heapq.heappush(self._free, i)
