"""ControllerState's metas: the lookups every part of the state shares (partition, unit), the
validation of a client's :class:`~store.meta.BatchMeta` (:meth:`StateMetas.check_meta`), metas
of existing samples, custom metadata, and how a data update is applied to a partition.

The base of the other ``state_*`` mixins; :class:`~store.controller_state.ControllerState`
composes them.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from rayless.store.column_puts import ColumnPuts
from rayless.store.errors import (
    ForeignMetaError,
    SchemaError,
    StaleMetaError,
    StoreInputError,
    UnknownFieldError,
    UnknownPartitionError,
)
from rayless.store.meta import NO_CUSTOM, BatchMeta
from rayless.store.samplers import Sampler
from rayless.store.schema import DataUpdate, FieldSchema, check_plain
from rayless.store.state_records import (
    _NO_CUSTOM,
    EnvShards,
    UnitInfo,
    _check_fields,
    _Partition,
    _Staging,
)

__all__ = ["StateMetas"]


class StateMetas:
    """Lookups, meta checks and metas of :class:`ControllerState` (the mixins' base)."""

    # The state ControllerState.__init__ sets up (declared here for the mixins' type checks).
    store_id: str
    _env_shards: EnvShards | None
    _units: list[UnitInfo]
    _unit_by_id: dict[str, UnitInfo]
    _partitions: dict[str, _Partition]
    _owner: dict[int, str]
    _free: list[int]
    _pending: set[int]
    _next_index: int
    _serial: int
    _samplers: dict[tuple[str, str, str], Sampler]
    _staging: dict[int, _Staging]
    column_puts: ColumnPuts

    def _part(self, partition: str) -> _Partition:
        part = self._partitions.get(partition)
        if part is None:
            raise UnknownPartitionError(f"partition {partition!r} does not exist")
        return part

    def _unit(self, unit_id: str) -> UnitInfo:
        info = self._unit_by_id.get(unit_id)
        if info is None:
            raise StoreInputError(f"unknown storage unit {unit_id!r}")
        return info

    def check_meta(self, meta: BatchMeta) -> None:
        """Raise ForeignMetaError/StaleMetaError unless every sample of ``meta`` still exists."""
        if not isinstance(meta, BatchMeta):
            raise StoreInputError(f"expected a BatchMeta, got {type(meta).__name__}")
        if meta.store_id != self.store_id:
            raise ForeignMetaError(f"the meta comes from store {meta.store_id!r}")
        ids = meta.partition_ids
        if ids and ids.count(ids[0]) == len(ids) and ids[0] in self._partitions:
            samples = self._partitions[ids[0]].samples  # one partition: the quick pass
            for index, gen, shard in zip(
                meta.global_indexes, meta.generations, meta.shards, strict=True
            ):
                sample = samples.get(index)
                if sample is None or sample.generation != gen or sample.shard != shard:
                    break
            else:
                return
        for part_id, index, gen, shard in zip(
            meta.partition_ids, meta.global_indexes, meta.generations, meta.shards, strict=True
        ):
            part = self._partitions.get(part_id)
            sample = part.samples.get(index) if part is not None else None
            if sample is None or sample.generation != gen:
                raise StaleMetaError(
                    f"sample {index} of partition {part_id!r} was cleared since the meta was made"
                )
            if shard != sample.shard:
                raise StoreInputError(
                    f"the meta puts sample {index} of {part_id!r} on shard {shard!r}; it lives "
                    f"on shard {sample.shard} (a forged or corrupted meta)"
                )

    def check_schemas(self, partition: str, schemas: Mapping[str, FieldSchema]) -> None:
        """Raise SchemaError if ``schemas`` cannot be written into ``partition``'s fields."""
        part = self._partitions.get(partition)
        for name, schema in schemas.items():
            if not isinstance(schema, FieldSchema):
                raise SchemaError(f"schema of field {name!r} is not a FieldSchema")
            if part is not None and name in part.schemas:
                part.schemas[name].merged(schema, name)

    def meta_of(
        self, partition: str, indexes: Sequence[int], fields: Sequence[str] | None = None
    ) -> BatchMeta:
        """A meta for existing samples with the given fields (default: all their ready fields)."""
        part = self._part(partition)
        idx = list(indexes)
        missing = [i for i in idx if i not in part.samples]
        if missing:
            raise StoreInputError(f"samples {missing[:8]} are not in partition {partition!r}")
        if len(set(idx)) != len(idx):
            raise StoreInputError("indexes must be distinct")
        if fields is None:
            names = [f for f, r in part.ready.items() if all(i in r for i in idx)]
        else:
            names = _check_fields(fields)
            unknown = [f for f in names if f not in part.schemas]
            if unknown:
                raise UnknownFieldError(f"fields {unknown} are not in partition {partition!r}")
        return self._meta(partition, part, idx, names)

    def _meta(
        self, partition: str, part: _Partition, idx: list[int], names: list[str]
    ) -> BatchMeta:
        samples = [part.samples[i] for i in idx]
        shapes = {
            f: tuple(part.shapes.get(f, {}).get(i) for i in idx)
            for f in names
            if f in part.schemas and part.schemas[f].is_nested
        }
        return BatchMeta(
            self.store_id,
            tuple(idx),
            (partition,) * len(idx),
            tuple(s.shard for s in samples),
            tuple(s.generation for s in samples),
            {f: part.schemas[f] for f in names if f in part.schemas},
            tuple(dict(s.custom) if s.custom else NO_CUSTOM for s in samples),
            shapes,
        )

    @staticmethod
    def _check_custom(
        custom: Sequence[Mapping[str, Any]] | None, n: int
    ) -> list[Mapping[str, Any]]:
        if custom is None:
            return [_NO_CUSTOM] * n  # shared and read-only: samples copy it out
        if len(custom) != n:
            raise StoreInputError(f"custom_meta has {len(custom)} entries for {n} samples")
        out: list[Mapping[str, Any]] = []
        for i, item in enumerate(custom):
            if not isinstance(item, Mapping):
                raise StoreInputError(f"custom_meta[{i}] is not a dict")
            check_plain(dict(item), f"custom_meta[{i}]")
            out.append(dict(item))
        return out

    def set_custom_meta(self, meta: BatchMeta, custom_meta: Sequence[Mapping[str, Any]]) -> None:
        """Replace the custom metadata of ``meta``'s samples (one plain dict per sample)."""
        self.check_meta(meta)
        custom = self._check_custom(custom_meta, meta.size)
        for part_id, index, item in zip(
            meta.partition_ids, meta.global_indexes, custom, strict=True
        ):
            self._partitions[part_id].samples[index].custom = item

    @staticmethod
    def _apply_update(
        part: _Partition, update: DataUpdate, merged: Mapping[str, FieldSchema]
    ) -> None:
        idx = list(update.indexes)
        part.schemas.update(merged)
        for name in merged:
            part.ready.setdefault(name, set()).update(idx)
        for name, shapes in update.sample_shapes.items():
            part.shapes.setdefault(name, {}).update(zip(idx, shapes, strict=True))
        for i in idx:
            part.samples[i].lost_on = None

    def _drop_empty_schemas(self, part: _Partition) -> None:
        # A field no sample holds any more forgets its schema (it may come back as anything).
        for name in [f for f, r in part.ready.items() if not r]:
            del part.ready[name]
            part.schemas.pop(name, None)
            part.shapes.pop(name, None)
