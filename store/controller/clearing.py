"""Clearing: removing samples, the first phase of the two-phase clear.

:meth:`Clearing.clear` hides samples at once and returns a :class:`ClearPlan` (the rows the
units delete); once they did, :meth:`Allocation.release` makes the indexes reusable, so an
index is never reused while a unit still holds its old row. A partition whose removed
positions are the majority is compacted.
"""

from __future__ import annotations

import numpy as np

from rayless.store.controller.allocation import Allocation
from rayless.store.controller.catalog import Catalog, meta_arrays
from rayless.store.controller.records import STAGED, ClearPlan, _positions_by_partition
from rayless.store.controller.staging import StagedPuts
from rayless.store.data.meta import BatchMeta
from rayless.store.errors import ForeignMetaError, StoreInputError

__all__ = ["Clearing"]


class Clearing:
    """Removes samples from a :class:`Catalog` (see the module docstring)."""

    def __init__(self, catalog: Catalog, staging: StagedPuts, allocation: Allocation) -> None:
        self._catalog = catalog
        self._staging = staging
        self._allocation = allocation

    def clear(self, meta: BatchMeta) -> ClearPlan:
        """Remove ``meta``'s samples (hidden at once); the plan names the rows units delete.
        Samples cleared already are skipped (clearing twice is a no-op).

        Raises StoreInputError (not a BatchMeta, a forged shard), ForeignMetaError; nothing
        is removed then.
        """
        catalog = self._catalog
        if not isinstance(meta, BatchMeta):
            raise StoreInputError(f"expected a BatchMeta, got {type(meta).__name__}")
        if meta.store_id != catalog.store_id:
            raise ForeignMetaError(f"the meta comes from store {meta.store_id!r}")
        live: dict[str, list[int]] = {}
        for part_id, positions in _positions_by_partition(meta).items():
            part = catalog.partitions.get(part_id)
            if part is None:
                continue
            idx, want_shard, want_gen = meta_arrays(meta, positions)
            found, at = catalog.positions(part, idx)
            safe = np.where(found, at, 0)
            found &= part.gen[safe] == want_gen  # else cleared already (maybe reused)
            forged = found & (part.shard[safe] != want_shard)
            if forged.any():
                k = int(np.flatnonzero(forged)[0])
                raise StoreInputError(
                    f"the meta puts sample {int(idx[k])} of {part_id!r} on shard "
                    f"{int(want_shard[k])!r}; it lives on shard {int(part.shard[safe][k])} (a "
                    "forged or corrupted meta)"
                )
            live.setdefault(part_id, []).extend(at[found].tolist())
        plan = ClearPlan()
        for part_id, at_list in live.items():
            self._remove(part_id, np.unique(np.asarray(at_list, dtype=np.int64)), plan)
        return plan

    def clear_all(self, partition: str) -> ClearPlan:
        """Remove every sample of ``partition`` (the partition itself stays: the owner drops
        it). Raises UnknownPartitionError."""
        part = self._catalog.part(partition)
        plan = ClearPlan()
        self._remove(partition, np.flatnonzero(part.index[: part.n] >= 0), plan)
        return plan

    def abandoned(self, meta: BatchMeta) -> list[str]:
        """The partitions that the new put of ``meta`` created and that are empty now."""
        serials = set(meta.generations)
        out = []
        for part_id in dict.fromkeys(meta.partition_ids):
            part = self._catalog.partitions.get(part_id)
            if part is not None and not part.live and part.created in serials:
                out.append(part_id)
        return out

    def _remove(self, partition: str, at: np.ndarray, plan: ClearPlan) -> None:
        """Remove the samples at positions ``at`` (distinct, in allocation order)."""
        catalog = self._catalog
        part = catalog.partitions[partition]
        idx_arr = part.index[at]
        indexes = idx_arr.tolist()
        staged = np.flatnonzero(part.flags[at] & STAGED > 0)
        if len(staged):
            gens = part.gen[at[staged]].tolist()
            self._staging.discard(idx_arr[staged].tolist(), gens)
        if part.key_at:
            for p in at.tolist():
                key = part.key_at.pop(p, None)
                if key is not None:
                    part.keys.pop(key, None)
        grouped = at[part.group[at] >= 0]
        for p in grouped.tolist():
            part.uncount_group(p)
        shards = part.shard[at]
        by_shard = plan.shards
        for shard in np.unique(shards).tolist():
            rows = idx_arr[shards == shard].tolist()
            by_shard.setdefault(shard, {}).setdefault(partition, []).extend(rows)
        self._allocation.retire(indexes)
        plan.indexes.extend(indexes)
        catalog.where.part[part.index[at]] = -1
        for shapes in part.shapes.values():
            for i in indexes:
                shapes.pop(i, None)
        part.drop(at)
        catalog.drop_empty_schemas(part)
        if part.n >= 4096 and 4 * part.live < part.n:
            part.compact(catalog.where)
