"""ControllerState's production status: which fields are ready for which samples.

Units notify every write (:meth:`StateProduction.on_data_update`); an atomic put's samples
become ready together on its last write, a column-wise put's field (see
:mod:`store.column_puts`) once all its units wrote. A failed column-wise put is undone
(:meth:`StateProduction.drop_fields`, :meth:`StateProduction.abort_column_put`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from rayless.store.errors import (
    SchemaError,
    StoreInputError,
    UnitLostError,
)
from rayless.store.meta import BatchMeta
from rayless.store.schema import DataUpdate, FieldSchema
from rayless.store.state_metas import StateMetas
from rayless.store.state_records import (
    _check_name,
    _positions_by_partition,
)

__all__ = ["StateProduction"]


class StateProduction(StateMetas):
    """Data updates, put checks and column-wise puts of :class:`ControllerState`."""

    def check_put(
        self, meta: BatchMeta, schemas: Mapping[str, FieldSchema]
    ) -> dict[str, dict[str, list[int]]]:
        """Raise unless fields ``schemas`` may be written onto ``meta``'s samples.

        ForeignMetaError/StaleMetaError (see :meth:`check_meta`), SchemaError (a field's
        schema would change), UnitLostError (a sample's unit is lost). Returns the rows the
        put adds (``{partition: {field: [indexes not holding it yet]}}``): what
        :meth:`drop_fields` removes again if the put fails.
        """
        self.check_meta(meta)
        for part_id in dict.fromkeys(meta.partition_ids):
            self.check_schemas(part_id, schemas)
        for shard in dict.fromkeys(meta.shards):
            if not self._units[shard].alive:
                raise UnitLostError(self._units[shard].unit_id)
        fresh: dict[str, dict[str, list[int]]] = {}
        for part_id, positions in _positions_by_partition(meta).items():
            part = self._partitions[part_id]
            for name in schemas:
                ready = part.ready.get(name, set())
                new = [meta.global_indexes[p] for p in positions]
                new = [i for i in new if i not in ready]
                if new:
                    fresh.setdefault(part_id, {})[name] = new
        return fresh

    def drop_fields(
        self, meta: BatchMeta, fresh: Mapping[str, Mapping[str, Sequence[int]]]
    ) -> dict[int, dict[str, dict[str, list[int]]]]:
        """Undo a failed column-wise put: ``fresh`` (from :meth:`check_put`) is no longer
        ready, and a field no sample holds any more forgets its schema. Returns the rows the
        units delete: ``{shard: {partition: {field: [indexes]}}}``. Raises check_meta's errors.
        """
        self.check_meta(meta)
        in_meta = set(zip(meta.partition_ids, meta.global_indexes, strict=True))
        for part_id, fields in fresh.items():
            for name, indexes in fields.items():
                _check_name(name, "a field name")
                if any((part_id, i) not in in_meta for i in indexes):
                    raise StoreInputError("fresh rows must be samples of the meta")
        rows: dict[int, dict[str, dict[str, list[int]]]] = {}
        for part_id, fields in fresh.items():
            part = self._partitions[part_id]
            for name, indexes in fields.items():
                idx = list(indexes)
                part.ready.get(name, set()).difference_update(idx)
                for i in idx:
                    part.shapes.get(name, {}).pop(i, None)
                    shard = part.samples[i].shard
                    rows.setdefault(shard, {}).setdefault(part_id, {}).setdefault(name, [])
                    rows[shard][part_id][name].append(i)
            self._drop_empty_schemas(part)
        return rows

    def on_data_update(self, unit_id: str, update: DataUpdate) -> list[int]:
        """Record a unit's notification that it stored ``update``'s fields for its indexes;
        return the indexes that became ready (for an atomic put: none until its last write,
        then all of its samples).

        Raises UnitLostError (unit marked lost), StoreInputError (unknown unit, samples not in
        the partition or not on this unit's shard), UnknownPartitionError, SchemaError.
        """
        info = self._unit(unit_id)
        if not info.alive:
            raise UnitLostError(unit_id, "it was marked lost; register it again first")
        if not isinstance(update, DataUpdate):
            raise StoreInputError(f"expected a DataUpdate, got {type(update).__name__}")
        part = self._part(update.partition)
        idx = list(update.indexes)
        if len(set(idx)) != len(idx):
            raise StoreInputError("a data update names an index twice")
        wrong = [i for i in idx if i not in part.samples or part.samples[i].shard != info.shard]
        if wrong:
            raise StoreInputError(
                f"samples {wrong[:8]} of {update.partition!r} are not allocated on unit {unit_id!r}"
            )
        merged: dict[str, FieldSchema] = {}
        for name, schema in update.schemas.items():
            if not isinstance(schema, FieldSchema):
                raise SchemaError(f"schema of field {name!r} is not a FieldSchema")
            old = part.schemas.get(name)
            merged[name] = schema if old is None else old.merged(schema, name)
        for name, shapes in update.sample_shapes.items():
            if name not in merged or len(shapes) != len(idx):
                raise StoreInputError(f"sample_shapes of field {name!r} do not fit the update")
        if not idx:
            return []
        if update.put_id is not None:  # a column-wise put: ready once all its units wrote
            return self.column_puts.on_update(update, self._apply_column_update)
        serials = {part.samples[i].generation for i in idx if part.samples[i].staged}
        if not serials:
            self._apply_update(part, update, merged)
            return idx
        staging = self._staging.get(next(iter(serials)))
        if (
            len(serials) != 1
            or staging is None
            or staging.partition != update.partition
            or not set(idx) <= staging.members
        ):
            raise StoreInputError("a data update mixes samples of different puts")
        if staging.waiting - set(idx):  # more writes of this put are to come
            staging.waiting -= set(idx)
            staging.updates.append(update)
            return []
        # The put's last write: check all its writes together, then make them ready at once.
        updates = [*staging.updates, update]
        schemas = dict(part.schemas)
        for upd in updates:
            for name, schema in upd.schemas.items():
                old = schemas.get(name)
                schemas[name] = schema if old is None else old.merged(schema, name)
        del self._staging[next(iter(serials))]
        for upd in updates:
            keep = [k for k, i in enumerate(upd.indexes) if i in staging.members]
            sub = DataUpdate(
                upd.partition,
                [upd.indexes[k] for k in keep],
                dict(upd.schemas),
                {f: [shapes[k] for k in keep] for f, shapes in upd.sample_shapes.items()},
            )
            self._apply_update(part, sub, {n: schemas[n] for n in upd.schemas})
        for i in staging.members:
            part.samples[i].staged = False
        return [i for i in staging.order if i in part.samples]

    def _apply_column_update(
        self, update: DataUpdate, generations: Mapping[tuple[str, int], int]
    ) -> list[int]:
        """Apply one held update of a finished column-wise put to the samples that still
        exist with the generation they had when it began; returns their indexes."""
        part = self._partitions.get(update.partition)
        if part is None:
            return []
        keep = [
            k
            for k, i in enumerate(update.indexes)
            if i in part.samples
            and part.samples[i].generation == generations.get((update.partition, i))
        ]
        sub = DataUpdate(
            update.partition,
            [update.indexes[k] for k in keep],
            dict(update.schemas),
            {f: [shapes[k] for k in keep] for f, shapes in update.sample_shapes.items()},
        )
        merged: dict[str, FieldSchema] = {}
        for name, schema in sub.schemas.items():
            old = part.schemas.get(name)
            try:
                merged[name] = schema if old is None else old.merged(schema, name)
            except SchemaError:  # another put changed the field meanwhile: not ready
                sub.sample_shapes.pop(name, None)
        sub.schemas = {k: v for k, v in sub.schemas.items() if k in merged}
        self._apply_update(part, sub, merged)
        return list(sub.indexes)

    def abort_column_put(self, put_id: int) -> dict[int, dict[str, dict[str, list[int]]]]:
        """Drop a column-wise put that will not finish (its client gave up or died): the rows
        it added that still exist, ``{shard: {partition: {field: [indexes]}}}``, for the units
        to delete. Unknown ids: nothing."""
        put = self.column_puts.end(put_id)
        rows: dict[int, dict[str, dict[str, list[int]]]] = {}
        if put is None:
            return rows
        for part_id, fields in put.fresh.items():
            part = self._partitions.get(part_id)
            if part is None:
                continue
            for name, indexes in fields.items():
                ready = part.ready.get(name, set())
                for i in indexes:
                    sample = part.samples.get(i)
                    if sample is None or i in ready:
                        continue  # gone, or written by a later put
                    if sample.generation != put.generations.get((part_id, i)):
                        continue
                    rows.setdefault(sample.shard, {}).setdefault(part_id, {}).setdefault(name, [])
                    rows[sample.shard][part_id][name].append(i)
        return rows

    def begin_column_put(
        self, meta: BatchMeta, schemas: Mapping[str, FieldSchema]
    ) -> tuple[int, dict[str, dict[str, list[int]]]]:
        """:meth:`check_put`, then stage the put (see :mod:`store.column_puts`): its id (for
        the units' data updates) and the rows it adds. Raises check_put's errors."""
        fresh = self.check_put(meta, schemas)
        samples = {
            (p, i): g
            for p, i, g in zip(
                meta.partition_ids, meta.global_indexes, meta.generations, strict=True
            )
        }
        return self.column_puts.begin(samples, fresh), fresh
