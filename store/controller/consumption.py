"""Consumption: fetches through samplers, and what each task consumed (consumption status).

Each fetch's (task, field set) keeps a candidate set (ready and unconsumed positions) that
every update and consume keeps current, so a sequential fetch costs O(batch), whatever the
partition's size. A sampler given as a spec is kept per (partition, task) so seeded random
draws advance; it is forgotten with its partition.
"""

from __future__ import annotations

from collections.abc import Hashable, Iterable, Mapping, Sequence
from typing import Any

import numpy as np

from rayless.store.controller.catalog import Catalog, meta_arrays
from rayless.store.controller.records import (
    _Candidates,
    _check_fields,
    _check_name,
    _Partition,
    _positions_by_partition,
    as_indexes,
)
from rayless.store.controller.samplers import Sampler, capabilities_of, make_sampler
from rayless.store.data.messages import FetchMode
from rayless.store.data.meta import BatchMeta
from rayless.store.errors import StoreError, StoreInputError

__all__ = ["Consumption", "check_group_n"]


def check_group_n(part: _Partition, partition: str, n: int) -> None:
    """Raise StoreInputError if a grouped fetch's ``n`` differs from the partition's
    group size or, while no size is fixed, a group of the partition already holds more than
    ``n`` samples (consumed ones too: such a group could only be fetched split)."""
    if part.group_size is not None and part.group_size != n:
        raise StoreInputError(
            f"the grouped fetch asks for groups of {n}, but partition {partition!r} holds "
            f"groups of {part.group_size}"
        )
    if part.group_size is None:
        for key, count in part.group_count.items():
            if count > n:
                raise StoreInputError(
                    f"the grouped fetch asks for groups of {n}, but group {key!r} of "
                    f"partition {partition!r} holds {count} samples"
                )


class Consumption:
    """Fetches from a :class:`Catalog`'s partitions and their consumed bitmaps (see the
    module docstring). ``positions_examined``: positions the fetches' candidate sets looked
    at, for tests and monitoring."""

    def __init__(self, catalog: Catalog) -> None:
        self._catalog = catalog
        self._samplers: dict[tuple[str, str, str], Sampler] = {}
        self.positions_examined = 0

    def forget_partition(self, partition: str) -> None:
        """Drop the samplers kept for ``partition`` (it was dropped)."""
        for key in [k for k in self._samplers if k[0] == partition]:
            del self._samplers[key]

    def ready_indexes(
        self, partition: str, fields: Sequence[str], task: str | None = None
    ) -> list[int]:
        """Samples (allocation order) holding all ``fields``; unconsumed by ``task`` if given.
        Raises StoreInputError."""
        names = _check_fields(fields)
        part = self._catalog.partitions.get(partition)
        if part is None:
            return []
        mask = part.mask(names, task)
        if mask is None:
            return []
        return part.index[np.flatnonzero(mask)].tolist()

    def _sampler(self, partition: str, task: str, spec: Any) -> Sampler:
        if spec is None or isinstance(spec, (str, Mapping)):
            key = (partition, task, repr(sorted(dict(make_sampler(spec).spec()).items())))
            if key not in self._samplers:
                self._samplers[key] = make_sampler(spec)
            return self._samplers[key]
        return make_sampler(spec)

    def try_fetch(
        self,
        partition: str,
        fields: Sequence[str],
        batch_size: int | None,
        *,
        task: str = "default",
        sampler: Any = None,
        mode: FetchMode | str = FetchMode.FETCH,
    ) -> BatchMeta | None:
        """A batch of ready samples unconsumed by ``task``, or None if not enough yet; see
        :meth:`store.controller.state.ControllerState.try_fetch`.
        Raises StoreInputError for bad arguments, StoreError for a sampler that picks
        samples that are not candidates.
        """
        _check_name(partition, "partition")
        _check_name(task, "task")
        names = _check_fields(fields)
        mode = FetchMode.of(mode)
        if batch_size is not None and (
            not isinstance(batch_size, int) or isinstance(batch_size, bool) or batch_size <= 0
        ):
            raise StoreInputError(f"batch_size must be a positive int or None, got {batch_size!r}")
        chooser = self._sampler(partition, task, sampler)
        catalog = self._catalog
        part = catalog.partitions.get(partition)
        if part is None:
            return None if batch_size is not None else catalog.empty_meta()
        cand = part.tracker(task, names)
        before = cand.examined
        if batch_size is None:
            pos = cand.all()
        else:
            picked = self._pick(partition, part, cand, chooser, batch_size)
            if picked is None:
                return None
            pos = picked
        self.positions_examined += cand.examined - before
        if mode is FetchMode.FETCH:
            part.consume(task, pos)
        return catalog.meta(partition, part, pos, names)

    def _pick(
        self,
        partition: str,
        part: _Partition,
        cand: _Candidates,
        chooser: Sampler,
        batch_size: int,
    ) -> np.ndarray | None:
        """The positions ``chooser`` picks out of ``cand``, or None if too few."""
        caps = capabilities_of(chooser)
        group_size = caps.group_size or 1
        if caps.group_size is not None:
            check_group_n(part, partition, group_size)
            if part.group_size is None and batch_size % group_size == 0:
                part.group_size = group_size  # later group puts must fit it
        if cand.count < batch_size:
            return None
        if caps.sequential:
            return cand.take(batch_size)
        at = cand.all()
        candidates = part.index[at].tolist()
        where = self._catalog.where

        def group_of(index: int) -> Hashable:
            return part.group_of_pos(int(where.pos[index]), group_size)

        picked = chooser.select(candidates, batch_size, group_of)
        if picked is None:
            return None
        if len(set(picked)) != len(picked) or not set(picked) <= set(candidates):
            raise StoreError(f"sampler {chooser!r} picked samples that are not candidates")
        return where.pos[as_indexes(list(picked))]

    def reset_consumption(
        self, task: str | None, partition: str | None = None, meta: BatchMeta | None = None
    ) -> None:
        """Forget what ``task`` (None: every task) consumed, in ``partition`` or in every
        partition; with ``meta`` only its samples become unconsumed. Raises StoreInputError,
        UnknownPartitionError, the catalog's meta check errors."""
        catalog = self._catalog
        if task is not None:
            _check_name(task, "task")
        if meta is not None:
            catalog.check_meta(meta)
            if partition is not None and set(meta.partition_ids) - {partition}:
                raise StoreInputError(f"the meta's samples are not all in {partition!r}")
            for part_id, positions in _positions_by_partition(meta).items():
                part = catalog.partitions[part_id]
                at = catalog.where.pos[meta_arrays(meta, positions)[0]]
                for t in list(part.consumed) if task is None else [task]:
                    part.unconsume(t, at)
            return
        parts = [catalog.part(partition)] if partition is not None else catalog.partitions.values()
        for part in parts:
            part.forget_task(task)

    def unconsume(self, task: str, partition: str, indexes: Iterable[int]) -> list[int]:
        """Hand ``indexes`` back to ``task`` (unconsumed again); cleared ones are skipped.
        Returns those handed back."""
        catalog = self._catalog
        part = catalog.partitions.get(partition)
        if part is None or task not in part.consumed:
            return []
        idx = as_indexes(list(indexes))
        found, at = catalog.positions(part, idx)
        back = part.unconsume(task, at[found])
        return part.index[back].tolist()

    def mark_consumed(self, task: str, meta: BatchMeta) -> None:
        """Mark ``meta``'s samples consumed by ``task`` (restoring a checkpoint).
        Raises the catalog's meta check errors, StoreInputError."""
        if not isinstance(task, str) or not task:
            raise StoreInputError(f"task must be a non-empty str, got {task!r}")
        catalog = self._catalog
        catalog.check_meta(meta)
        for part_id, positions in _positions_by_partition(meta).items():
            at = catalog.where.pos[meta_arrays(meta, positions)[0]]
            catalog.partitions[part_id].consume(task, np.unique(at))

    def consumers(self) -> dict[str, dict[str, int]]:
        """``{partition: {task: consumed count}}`` for monitoring."""
        return {name: dict(p.consumed_count) for name, p in self._catalog.partitions.items()}
