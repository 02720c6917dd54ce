"""ControllerState's KV keys, group sizes and consumption marks (a mixin, to keep
``controller_state`` readable).

- **KV keys** (``kv_batch_put``): a partition maps string keys to its samples; a key is unique
  in its partition and is forgotten when its sample is cleared.
- **Group size**: a partition's group size is fixed by the first put that names one
  (``group_size=``) or by the first grouped fetch (its ``n``). From then on a put whose
  groups would hold more samples than that, a put naming another size and a grouped fetch
  with another ``n`` are refused with StoreInputError (before: a grouped fetch failed later).
- **Consumption marks**: :meth:`StateExtras.unconsume` hands samples back to a task (a fetch
  whose caller left), :meth:`StateExtras.mark_consumed` restores a checkpoint's status.
"""

from __future__ import annotations

from collections.abc import Hashable, Iterable, Sequence
from typing import TYPE_CHECKING, Any

from rayless.store.errors import StoreInputError, UnknownKeyError
from rayless.store.meta import BatchMeta

if TYPE_CHECKING:
    from rayless.store.state_records import _Partition

__all__ = ["StateExtras", "check_group_size"]


def check_group_size(
    part: _Partition | None,
    n: int,
    group_ids: Sequence[Hashable] | None,
    group_size: int | None,
) -> int | None:
    """Raise StoreInputError unless a put of ``n`` samples with ``group_ids`` fits the
    partition's group size (or the ``group_size`` it names); returns the size to fix (None:
    nothing to fix). Without group ids a put with ``group_size`` must be whole groups."""
    if group_size is not None and (
        not isinstance(group_size, int) or isinstance(group_size, bool) or group_size <= 0
    ):
        raise StoreInputError(f"group_size must be a positive int, got {group_size!r}")
    fixed = part.group_size if part is not None else None
    if group_size is not None and fixed is not None and group_size != fixed:
        raise StoreInputError(
            f"the put's group_size is {group_size}, but the partition's groups hold {fixed} "
            "samples (fixed by an earlier put or grouped fetch)"
        )
    size = fixed if fixed is not None else group_size
    if size is None:
        return None
    if group_ids is None:
        if group_size is not None and n % size:
            raise StoreInputError(
                f"a put of {n} samples without group_ids is not whole groups of {size}"
            )
        return size
    counts: dict[Hashable, int] = {}
    for g in group_ids:
        counts[g] = counts.get(g, 0) + 1
    for g, k in counts.items():
        have = part.group_count.get(g, 0) if part is not None else 0
        if have + k > size:
            raise StoreInputError(
                f"group {g!r} would hold {have + k} samples, but the partition's group size "
                f"is {size}: the put is refused"
            )
    return size


class StateExtras:
    """KV keys, group-size checks and consumption marks of :class:`ControllerState`."""

    if TYPE_CHECKING:
        _partitions: dict[str, _Partition]
        store_id: str

        def _part(self, partition: str) -> _Partition: ...
        def check_meta(self, meta: BatchMeta) -> None: ...
        def _meta(
            self, partition: str, part: _Partition, idx: list[int], names: list[str]
        ) -> BatchMeta: ...

    @staticmethod
    def check_new_keys(part: _Partition | None, keys: Sequence[str] | None, n: int) -> None:
        """Raise StoreInputError unless ``keys`` are ``n`` distinct non-empty str new to
        the partition."""
        if keys is None:
            return
        if len(keys) != n:
            raise StoreInputError(f"keys has {len(keys)} entries for {n} samples")
        if any(not isinstance(k, str) or not k for k in keys) or len(set(keys)) != n:
            raise StoreInputError("keys must be distinct non-empty str")
        taken = [k for k in keys if part is not None and k in part.keys]
        if taken:
            raise StoreInputError(f"keys {taken[:8]} already name samples of the partition")

    @staticmethod
    def check_group_n(part: _Partition, partition: str, n: int) -> None:
        """Raise StoreInputError if a grouped fetch's ``n`` differs from the partition's
        group size."""
        if part.group_size is not None and part.group_size != n:
            raise StoreInputError(
                f"the grouped fetch asks for groups of {n}, but partition {partition!r} holds "
                f"groups of {part.group_size}"
            )

    def group_size(self, partition: str) -> int | None:
        """The partition's fixed group size, if any. Raises UnknownPartitionError."""
        return self._part(partition).group_size

    def kv_lookup(self, partition: str, keys: Sequence[str]) -> tuple[BatchMeta, list[int]]:
        """The meta (with the fields every one of them holds) of the keys that exist, and
        the positions in ``keys`` of those that do not. Raises StoreInputError."""
        if isinstance(keys, str) or any(not isinstance(k, str) or not k for k in keys):
            raise StoreInputError("keys must be a list of non-empty str")
        if len(set(keys)) != len(keys):
            raise StoreInputError("keys must be distinct")
        part = self._partitions.get(partition)
        table = part.keys if part is not None else {}
        found = [table[k] for k in keys if k in table]
        missing = [pos for pos, k in enumerate(keys) if k not in table]
        if part is None:
            return BatchMeta(self.store_id, (), (), (), (), {}), missing
        names = [f for f, r in part.ready.items() if all(i in r for i in found)] if found else []
        return self._meta(partition, part, found, names), missing

    def kv_meta(
        self, partition: str, keys: Sequence[str], fields: Sequence[str] | None = None
    ) -> BatchMeta:
        """The meta of existing ``keys`` in order (``fields``: default all they hold).
        Raises UnknownPartitionError, UnknownKeyError, UnknownFieldError."""
        part = self._part(partition)
        meta, missing = self.kv_lookup(partition, keys)
        if missing:
            absent = [keys[p] for p in missing]
            raise UnknownKeyError(f"keys {absent[:8]} are not in partition {partition!r}")
        if fields is None:
            return meta
        idx = list(meta.global_indexes)
        names = list(dict.fromkeys(fields))
        for f in names:
            ready = part.ready.get(f, set())
            if any(i not in ready for i in idx):
                from rayless.store.errors import UnknownFieldError

                raise UnknownFieldError(f"field {f!r} is not written for every key")
        return self._meta(partition, part, idx, names)

    def kv_list(self, partition: str | None = None) -> dict[str, dict[str, dict[str, Any]]]:
        """``{partition: {key: tags}}`` (one partition, or every one that has keys); an
        unknown partition or one without keys lists as ``{}`` (as in TransferQueue)."""
        if partition is not None:
            part = self._partitions.get(partition)
            if part is None or not part.keys:
                return {}
            return {partition: {k: dict(part.samples[i].custom) for k, i in part.keys.items()}}
        return {
            name: {k: dict(p.samples[i].custom) for k, i in p.keys.items()}
            for name, p in self._partitions.items()
            if p.keys
        }

    def unconsume(self, task: str, partition: str, indexes: Iterable[int]) -> list[int]:
        """Hand ``indexes`` back to ``task`` (unconsumed again); cleared ones are skipped.
        Returns those handed back."""
        part = self._partitions.get(partition)
        if part is None:
            return []
        consumed = part.consumed.get(task)
        if consumed is None:
            return []
        back = [i for i in indexes if i in consumed]
        consumed.difference_update(back)
        return back

    def mark_consumed(self, task: str, meta: BatchMeta) -> None:
        """Mark ``meta``'s samples consumed by ``task`` (restoring a checkpoint).
        Raises check_meta's errors, StoreInputError."""
        if not isinstance(task, str) or not task:
            raise StoreInputError(f"task must be a non-empty str, got {task!r}")
        self.check_meta(meta)
        for part_id, index in zip(meta.partition_ids, meta.global_indexes, strict=True):
            self._partitions[part_id].consumed.setdefault(task, set()).add(index)

    def consumers(self) -> dict[str, dict[str, int]]:
        """``{partition: {task: consumed count}}`` for monitoring."""
        return {
            name: {task: len(done) for task, done in p.consumed.items()}
            for name, p in self._partitions.items()
        }

    def export_partition(self, partition: str) -> dict[str, Any]:
        """Everything a checkpoint needs of ``partition`` except the data: samples in order
        (index, key, group, custom, fields ready), consumed per task, group size.
        Raises UnknownPartitionError."""
        part = self._part(partition)
        ready = {f: r for f, r in part.ready.items()}
        samples = []
        for i, s in part.samples.items():
            if s.staged or s.lost_on is not None:
                continue  # not readable: an unfinished put or a lost sample
            group = None if isinstance(s.group, tuple) and s.group[:1] == ("#alloc",) else s.group
            samples.append(
                {
                    "index": i,
                    "key": s.key,
                    "group": list(group) if isinstance(group, tuple) else group,
                    "custom": dict(s.custom),
                    "fields": sorted(f for f, r in ready.items() if i in r),
                }
            )
        kept = {s["index"] for s in samples}
        return {
            "samples": samples,
            "consumed": {t: sorted(i for i in c if i in kept) for t, c in part.consumed.items()},
            "group_size": part.group_size,
        }
