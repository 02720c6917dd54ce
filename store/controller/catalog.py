"""Catalog: the controller's partitions and where each global index lives.

It owns the partitions by name (their columns and bitmaps: :class:`_Partition` in
:mod:`store.controller.records`) and the index table (global index -> partition code,
position). Every other collaborator of :class:`~store.controller.state.ControllerState`
reads and updates samples through it: lookups, the checks a meta passes before use, the
metas handed out, and the checkpoint export of a partition.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np

from rayless.store.controller.records import (
    _check_fields,
    _IndexTable,
    _Partition,
    _positions_by_partition,
    as_indexes,
)
from rayless.store.data.fields import FieldSchema
from rayless.store.data.meta import NO_CUSTOM, BatchMeta
from rayless.store.data.status import ExportedSample, PartitionExport
from rayless.store.errors import (
    ForeignMetaError,
    SchemaError,
    StaleMetaError,
    StoreInputError,
    UnknownFieldError,
    UnknownPartitionError,
)

__all__ = ["Catalog", "meta_arrays"]


def meta_arrays(
    meta: BatchMeta, positions: Sequence[int]
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The global indexes, shards and generations of ``meta``'s samples at ``positions``, as
    int64 arrays (``meta.arrays()`` when ``positions`` are all of them). Raises
    StoreInputError for values that are not ints."""
    if len(positions) == meta.size:
        return meta.arrays()
    gidx, shards, gens = meta.global_indexes, meta.shards, meta.generations
    return (
        as_indexes([gidx[p] for p in positions]),
        as_indexes([shards[p] for p in positions]),
        as_indexes([gens[p] for p in positions]),
    )


class Catalog:
    """The partitions of one store (``partitions``: by name) and the index table
    (``where``); see the module docstring."""

    def __init__(self, store_id: str) -> None:
        self.store_id = store_id
        self.partitions: dict[str, _Partition] = {}
        self.where = _IndexTable()  # global index -> (partition code, position)
        self._by_code: dict[int, str] = {}  # partition code -> name
        self._codes = 0

    # -- partitions ------------------------------------------------------------------------

    def create(self, partition: str, serial: int) -> _Partition:
        """A new empty partition ``partition``, created by allocation ``serial``."""
        self._codes += 1
        part = self.partitions[partition] = _Partition(self._codes, created=serial)
        self._by_code[part.code] = partition
        return part

    def drop(self, partition: str) -> None:
        """Forget partition ``partition`` (its samples were removed)."""
        part = self.partitions.pop(partition)
        del self._by_code[part.code]

    def part(self, partition: str) -> _Partition:
        """The partition ``partition``. Raises UnknownPartitionError."""
        part = self.partitions.get(partition)
        if part is None:
            raise UnknownPartitionError(f"partition {partition!r} does not exist")
        return part

    def group_size(self, partition: str) -> int | None:
        """The partition's fixed group size, if any. Raises UnknownPartitionError."""
        return self.part(partition).group_size

    # -- lookups ---------------------------------------------------------------------------

    def shard_of(self, index: int) -> int:
        """The shard that holds allocated sample ``index``. Raises StoreInputError."""
        idx = as_indexes([index])
        inside = 0 <= index < len(self.where.part)
        code = int(self.where.part[idx[0]]) if inside else -1
        if code < 0:
            raise StoreInputError(f"index {index} is not allocated")
        part = self.partitions[self._by_code[code]]
        return int(part.shard[self.where.pos[index]])

    def positions(self, part: _Partition, idx: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """``(found, pos)`` of global indexes ``idx`` in ``part``."""
        return self.where.lookup(part.code, idx)

    def existing(self, part: _Partition, indexes: Sequence[int], what: str) -> np.ndarray:
        """Positions of ``indexes`` (all in ``part``). Raises StoreInputError naming ``what``."""
        idx = as_indexes(indexes)
        found, pos = self.positions(part, idx)
        if not found.all():
            raise StoreInputError(f"samples {idx[~found][:8].tolist()} {what}")
        return pos

    def state_bytes(self) -> int:
        """Bytes held by the partitions' columns and bitmaps (the per-sample state)."""
        total = self.where.part.nbytes + self.where.pos.nbytes
        for part in self.partitions.values():
            cols = (part.index, part.shard, part.gen, part.group, part.flags)
            total += sum(c.nbytes for c in cols)
            total += sum(b.nbytes for b in (*part.ready.values(), *part.consumed.values()))
            total += sum(t.bits.nbytes + t.in_heap.nbytes for t in part.trackers.values())
        return total

    # -- meta checks -----------------------------------------------------------------------

    def check_meta(self, meta: BatchMeta) -> None:
        """Raise ForeignMetaError/StaleMetaError unless every sample of ``meta`` still exists."""
        if not isinstance(meta, BatchMeta):
            raise StoreInputError(f"expected a BatchMeta, got {type(meta).__name__}")
        if meta.store_id != self.store_id:
            raise ForeignMetaError(f"the meta comes from store {meta.store_id!r}")
        for part_id, positions in _positions_by_partition(meta).items():
            part = self.partitions.get(part_id)
            idx, shards, gens = meta_arrays(meta, positions)
            if part is None:
                raise StaleMetaError(
                    f"sample {int(idx[0])} of partition {part_id!r} was cleared since the meta "
                    "was made"
                )
            found, pos = self.positions(part, idx)
            found &= part.gen[np.where(found, pos, 0)] == gens
            if not found.all():
                index = int(idx[~found][0])
                raise StaleMetaError(
                    f"sample {index} of partition {part_id!r} was cleared since the meta was made"
                )
            have = part.shard[pos]
            if not np.array_equal(have, shards):
                k = int(np.flatnonzero(have != shards)[0])
                raise StoreInputError(
                    f"the meta puts sample {int(idx[k])} of {part_id!r} on shard "
                    f"{int(shards[k])!r}; it lives on shard {int(have[k])} (a forged or "
                    "corrupted meta)"
                )

    def check_schemas(self, partition: str, schemas: Mapping[str, FieldSchema]) -> None:
        """Raise SchemaError if ``schemas`` cannot be written into ``partition``'s fields."""
        part = self.partitions.get(partition)
        for name, schema in schemas.items():
            if not isinstance(schema, FieldSchema):
                raise SchemaError(f"schema of field {name!r} is not a FieldSchema")
            if part is not None and name in part.schemas:
                part.schemas[name].merged(schema, name)

    @staticmethod
    def drop_empty_schemas(part: _Partition) -> None:
        """Forget the schema of every field no sample of ``part`` holds any more (it may come
        back as anything)."""
        for name in [f for f, k in part.ready_count.items() if not k]:
            del part.ready[name], part.ready_count[name]
            part.schemas.pop(name, None)
            part.shapes.pop(name, None)

    # -- metas -----------------------------------------------------------------------------

    @staticmethod
    def ready_for_all(part: _Partition, pos: np.ndarray) -> list[str]:
        """The fields every one of ``pos`` holds."""
        return [f for f, bits in part.ready.items() if bits[pos].all()]

    def empty_meta(self) -> BatchMeta:
        """A meta of no samples."""
        return BatchMeta(self.store_id, (), (), (), (), {})

    def meta_of(
        self, partition: str, indexes: Sequence[int], fields: Sequence[str] | None = None
    ) -> BatchMeta:
        """A meta for existing samples with the given fields (default: all their ready fields).
        Raises UnknownPartitionError, StoreInputError, UnknownFieldError."""
        part = self.part(partition)
        pos = self.existing(part, list(indexes), f"are not in partition {partition!r}")
        if len(np.unique(pos)) != len(pos):
            raise StoreInputError("indexes must be distinct")
        if fields is None:
            names = self.ready_for_all(part, pos)
        else:
            names = _check_fields(fields)
            unknown = [f for f in names if f not in part.schemas]
            if unknown:
                raise UnknownFieldError(f"fields {unknown} are not in partition {partition!r}")
        return self.meta(partition, part, pos, names)

    def meta(
        self, partition: str, part: _Partition, pos: np.ndarray, names: list[str]
    ) -> BatchMeta:
        """The meta of ``part``'s samples at positions ``pos`` with fields ``names``."""
        idx = part.index[pos].tolist()
        shapes = {
            f: tuple(part.shapes.get(f, {}).get(i) for i in idx)
            for f in names
            if f in part.schemas and part.schemas[f].is_nested
        }
        if part.custom:
            got = [part.custom.get(p) for p in pos.tolist()]
            custom = tuple(dict(c) if c else NO_CUSTOM for c in got)
        else:
            custom = (NO_CUSTOM,) * len(idx)
        return BatchMeta(
            self.store_id,
            tuple(idx),
            (partition,) * len(idx),
            tuple(part.shard[pos].tolist()),
            tuple(part.gen[pos].tolist()),
            {f: part.schemas[f] for f in names if f in part.schemas},
            custom,
            shapes,
        )

    # -- checkpoint export -----------------------------------------------------------------

    def export_partition(self, partition: str) -> PartitionExport:
        """Everything a checkpoint needs of ``partition`` except the data: samples in order
        (index, key, group, custom, fields ready), consumed per task, group size.
        Raises UnknownPartitionError."""
        part = self.part(partition)
        n = part.n
        keep = np.flatnonzero((part.index[:n] >= 0) & (part.flags[:n] == 0))
        ready = {f: bits[keep].tolist() for f, bits in part.ready.items()}
        samples = []
        for k, (p, i) in enumerate(zip(keep.tolist(), part.index[keep].tolist(), strict=True)):
            group = part.group_value(p)
            samples.append(
                ExportedSample(
                    i,
                    part.key_at.get(p),
                    list(group) if isinstance(group, tuple) else group,
                    dict(part.custom.get(p, NO_CUSTOM)),
                    sorted(f for f, r in ready.items() if r[k]),
                )
            )
        consumed = {t: part.index[keep[bits[keep]]].tolist() for t, bits in part.consumed.items()}
        return PartitionExport(
            samples, {t: sorted(c) for t, c in consumed.items()}, part.group_size
        )
