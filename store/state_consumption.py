"""ControllerState's consumption status: ready samples, fetches through samplers (a spec's
sampler is kept per partition and task, so seeded draws advance), what each task consumed,
and resetting it.
"""

from __future__ import annotations

from collections.abc import Hashable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from rayless.store.errors import (
    StoreError,
    StoreInputError,
)
from rayless.store.meta import BatchMeta
from rayless.store.samplers import Sampler, make_sampler
from rayless.store.state_metas import StateMetas
from rayless.store.state_records import (
    MODES,
    _check_fields,
    _check_name,
    _Partition,
    _positions_by_partition,
)

__all__ = ["StateConsumption"]


class StateConsumption(StateMetas):
    """Fetches, samplers and consumption marks of :class:`ControllerState`."""

    if TYPE_CHECKING:

        @staticmethod
        def check_group_n(part: _Partition, partition: str, n: int) -> None: ...

    def ready_indexes(
        self, partition: str, fields: Sequence[str], task: str | None = None
    ) -> list[int]:
        """Samples (allocation order) holding all ``fields``; unconsumed by ``task`` if given."""
        names = _check_fields(fields)
        part = self._partitions.get(partition)
        if part is None:
            return []
        sets = [part.ready.get(f) for f in names]
        if any(s is None for s in sets):
            return []
        ready_sets = sorted((s for s in sets if s is not None), key=len)
        consumed = part.consumed.get(task, set()) if task is not None else set()
        first = ready_sets[0]
        return [
            i
            for i in part.samples
            if i in first and i not in consumed and all(i in s for s in ready_sets[1:])
        ]

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
        mode: str = "fetch",
    ) -> BatchMeta | None:
        """A batch of ready samples unconsumed by ``task``, or None if not enough yet.

        ``mode="fetch"`` marks them consumed by ``task``; ``"peek"`` does not. ``batch_size``
        None takes every candidate now (possibly none; never returns None). An unknown
        partition or field only means "not ready yet". ``sampler`` is a Sampler or a spec; a
        spec's sampler is kept per (partition, task) so seeded random draws advance.
        Raises StoreInputError for bad arguments.
        """
        _check_name(partition, "partition")
        _check_name(task, "task")
        names = _check_fields(fields)
        if mode not in MODES:
            raise StoreInputError(f"mode must be one of {MODES}, got {mode!r}")
        if batch_size is not None and (
            not isinstance(batch_size, int) or isinstance(batch_size, bool) or batch_size <= 0
        ):
            raise StoreInputError(f"batch_size must be a positive int or None, got {batch_size!r}")
        chooser = self._sampler(partition, task, sampler)
        candidates = self.ready_indexes(partition, names, task)
        part = self._partitions.get(partition)
        chosen: list[int] = candidates
        if batch_size is not None:
            group_size = getattr(chooser, "n", 1) or 1
            grouped = getattr(chooser, "n", None) is not None
            if grouped and part is not None:
                self.check_group_n(part, partition, group_size)
                if part.group_size is None and batch_size % group_size == 0:
                    part.group_size = group_size  # later group puts must fit it
            if part is None or len(candidates) < batch_size:
                return None
            samples = part.samples

            def group_of(index: int) -> Hashable:
                g = samples[index].group
                if isinstance(g, tuple) and g[:1] == ("#alloc",):
                    return (g[1], g[2] // group_size)
                return g

            picked = chooser.select(candidates, batch_size, group_of)
            if picked is None:
                return None
            if len(set(picked)) != len(picked) or not set(picked) <= set(candidates):
                raise StoreError(f"sampler {chooser!r} picked samples that are not candidates")
            chosen = picked
        if part is None:
            return BatchMeta(self.store_id, (), (), (), (), {})
        if mode == "fetch":
            part.consumed.setdefault(task, set()).update(chosen)
        return self._meta(partition, part, list(chosen), names)

    def reset_consumption(
        self, task: str | None, partition: str | None = None, meta: BatchMeta | None = None
    ) -> None:
        """Forget what ``task`` (None: every task, as TransferQueue) consumed, in
        ``partition`` or in every partition; with ``meta`` only its samples (e.g. the live
        part of a get that lost a unit) become unconsumed."""
        if task is not None:
            _check_name(task, "task")
        if meta is not None:
            self.check_meta(meta)
            if partition is not None and set(meta.partition_ids) - {partition}:
                raise StoreInputError(f"the meta's samples are not all in {partition!r}")
            for part_id, positions in _positions_by_partition(meta).items():
                consumed = self._partitions[part_id].consumed
                sets = list(consumed.values()) if task is None else [consumed.get(task)]
                for done in sets:
                    if done is not None:
                        done.difference_update(meta.global_indexes[p] for p in positions)
            return
        parts = [self._part(partition)] if partition is not None else self._partitions.values()
        for part in parts:
            if task is None:
                part.consumed.clear()
            else:
                part.consumed.pop(task, None)
