"""Readiness: which fields of which samples are written (production status).

Because a sample's fields from one put are written to one unit and announced in one data
update, a sample never becomes partly visible; a sample is *ready* for fields F when all of F
are in their ready sets. An atomic put (see :mod:`store.controller.staging`) becomes ready
only on its last write; a column-wise put (see :mod:`store.controller.column_puts`) only once
every unit it writes to reported. A put onto existing samples is checked first
(:meth:`Readiness.check_put`) and undone if it fails (:meth:`Readiness.drop_fields`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np

from rayless.store.controller.catalog import Catalog, meta_arrays
from rayless.store.controller.column_puts import ColumnPuts
from rayless.store.controller.records import (
    LOST,
    STAGED,
    _check_name,
    _Partition,
    _positions_by_partition,
    as_indexes,
)
from rayless.store.controller.staging import StagedPuts
from rayless.store.controller.units import Units
from rayless.store.data.fields import FieldSchema
from rayless.store.data.meta import BatchMeta
from rayless.store.data.updates import DataUpdate
from rayless.store.errors import SchemaError, StaleMetaError, StoreInputError, UnitLostError

__all__ = ["Readiness"]


class Readiness:
    """Records the units' data updates into a :class:`Catalog`'s ready bitmaps and checks
    and undoes puts (see the module docstring)."""

    def __init__(
        self, catalog: Catalog, units: Units, staging: StagedPuts, column_puts: ColumnPuts
    ) -> None:
        self._catalog = catalog
        self._units = units
        self._staging = staging
        self._column_puts = column_puts

    # -- put checks ------------------------------------------------------------------------

    def check_put(
        self, meta: BatchMeta, schemas: Mapping[str, FieldSchema]
    ) -> dict[str, dict[str, list[int]]]:
        """Raise unless fields ``schemas`` may be written onto ``meta``'s samples.

        ForeignMetaError/StaleMetaError (see :meth:`Catalog.check_meta`), SchemaError (a
        field's schema would change), UnitLostError (a sample's unit is lost). Returns the rows
        the put adds (``{partition: {field: [indexes not holding it yet]}}``): what
        :meth:`drop_fields` removes again if the put fails.
        """
        catalog = self._catalog
        catalog.check_meta(meta)
        for part_id in dict.fromkeys(meta.partition_ids):
            catalog.check_schemas(part_id, schemas)
        for shard in dict.fromkeys(meta.shards):
            if not self._units[shard].alive:
                raise UnitLostError(self._units[shard].unit_id)
        fresh: dict[str, dict[str, list[int]]] = {}
        for part_id, positions in _positions_by_partition(meta).items():
            part = catalog.partitions[part_id]
            idx = meta_arrays(meta, positions)[0]
            at = catalog.where.pos[idx]
            for name in schemas:
                bits = part.ready.get(name)
                new = idx if bits is None else idx[~bits[at]]
                if len(new):
                    fresh.setdefault(part_id, {})[name] = new.tolist()
        return fresh

    def drop_fields(
        self, meta: BatchMeta, fresh: Mapping[str, Mapping[str, Sequence[int]]]
    ) -> dict[int, dict[str, dict[str, list[int]]]]:
        """Undo a failed column-wise put: ``fresh`` (from :meth:`check_put`) is no longer
        ready, and a field no sample holds any more forgets its schema. Returns the rows the
        units delete: ``{shard: {partition: {field: [indexes]}}}``. Raises check_meta's
        errors, StoreInputError.
        """
        catalog = self._catalog
        catalog.check_meta(meta)
        in_meta = set(zip(meta.partition_ids, meta.global_indexes, strict=True))
        for part_id, fields in fresh.items():
            for name, indexes in fields.items():
                _check_name(name, "a field name")
                if any((part_id, i) not in in_meta for i in indexes):
                    raise StoreInputError("fresh rows must be samples of the meta")
        rows: dict[int, dict[str, dict[str, list[int]]]] = {}
        for part_id, fields in fresh.items():
            part = catalog.partitions[part_id]
            for name, indexes in fields.items():
                idx = list(indexes)
                at = catalog.where.pos[as_indexes(idx)]
                part.unset_ready(name, at)
                for i, shard in zip(idx, part.shard[at].tolist(), strict=True):
                    part.shapes.get(name, {}).pop(i, None)
                    rows.setdefault(shard, {}).setdefault(part_id, {}).setdefault(name, [])
                    rows[shard][part_id][name].append(i)
            catalog.drop_empty_schemas(part)
        return rows

    def committed(self, meta: BatchMeta) -> bool:
        """Whether the new put of ``meta`` committed: every one of its samples exists with
        its generation and none is staged any more."""
        catalog = self._catalog
        for part_id, positions in _positions_by_partition(meta).items():
            part = catalog.partitions.get(part_id)
            if part is None:
                return False
            idx, _, gens = meta_arrays(meta, positions)
            found, at = catalog.positions(part, idx)
            safe = np.where(found, at, 0)
            found &= (part.gen[safe] == gens) & (part.flags[safe] & STAGED == 0)
            if not found.all():
                return False
        return bool(meta.global_indexes)

    # -- data updates ----------------------------------------------------------------------

    def apply_update(
        self,
        part: _Partition,
        update: DataUpdate,
        merged: Mapping[str, FieldSchema],
        pos: np.ndarray | None = None,
    ) -> None:
        """Make ``update``'s fields ready at its samples (``pos``: their positions, if known)."""
        idx = update.indexes
        if pos is None:
            pos = self._catalog.where.pos[as_indexes(list(idx))]
        part.schemas.update(merged)
        for name, shapes in update.sample_shapes.items():
            part.shapes.setdefault(name, {}).update(zip(idx, shapes, strict=True))
        part.set_lost(pos, False)
        for name in merged:
            part.set_ready(name, pos)

    def on_data_update(
        self, unit_id: str, update: DataUpdate, settled: list[int] | None = None
    ) -> list[int]:
        """Record a unit's notification that it stored ``update``'s fields for its indexes;
        return the indexes that became ready (for an atomic put: none until its last write,
        then all of its samples but those lost with their unit meanwhile, which stay lost).
        ``settled``: extended with every sample of an atomic put this update completed (the
        ready ones and the lost ones: none of them is unwritten any more).

        Raises UnitLostError (unit marked lost), StoreInputError (unknown unit, samples not in
        the partition or not on this unit's shard), UnknownPartitionError, SchemaError.
        """
        info = self._units.get(unit_id)
        if not info.alive:
            raise UnitLostError(unit_id, "it was marked lost; register it again first")
        if not isinstance(update, DataUpdate):
            raise StoreInputError(f"expected a DataUpdate, got {type(update).__name__}")
        catalog = self._catalog
        part = catalog.part(update.partition)
        idx = list(update.indexes)
        idx_set = set(idx)
        if len(idx_set) != len(idx):
            raise StoreInputError("a data update names an index twice")
        arr = as_indexes(idx)
        found, at = catalog.positions(part, arr)
        found &= part.shard[np.where(found, at, 0)] == info.shard
        if not found.all():
            raise StoreInputError(
                f"samples {arr[~found][:8].tolist()} of {update.partition!r} are not allocated "
                f"on unit {unit_id!r}"
            )
        self._check_generation(part, at, update)
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
            return self._column_puts.on_update(update, self._apply_column_update)
        staged = part.flags[at] & STAGED > 0
        if not staged.any():
            self.apply_update(part, update, merged, at)
            return idx
        gens = part.gen[at]
        serial = int(gens[0])
        staging = self._staging.get(serial)
        if (
            not staged.all()
            or bool((gens != serial).any())
            or staging is None
            or staging.partition != update.partition
            or not idx_set <= staging.members
        ):
            raise StoreInputError("a data update mixes samples of different puts")
        waiting = staging.waiting - idx_set
        if waiting:  # more writes of this put are to come
            staging.waiting = waiting
            staging.updates.append(update)
            return []
        # The put's last write: check all its writes together, then make them ready at once.
        # (Nothing above changed the state: a SchemaError here leaves the put waiting.)
        updates = [*staging.updates, update]
        schemas = dict(part.schemas)
        for upd in updates:
            for name, schema in upd.schemas.items():
                old = schemas.get(name)
                schemas[name] = schema if old is None else old.merged(schema, name)
        self._staging.commit(serial)
        where = catalog.where
        members = np.fromiter(staging.members, dtype=np.int64, count=len(staging.members))
        part.flags[where.pos[members]] &= ~np.uint8(STAGED)
        whole = len(staging.members) == len(staging.order)  # none of it was cleared
        applied = 0
        for k, upd in enumerate(updates):
            upd_idx = as_indexes(upd.indexes)
            pos = where.pos[upd_idx]
            keep = np.ones(len(pos), dtype=bool)
            if not whole:
                keep &= np.isin(upd_idx, members)
            if k < len(updates) - 1:  # written earlier: its unit may have died since
                keep &= part.flags[pos] & LOST == 0
            fields = {n: schemas[n] for n in upd.schemas}
            if keep.all():
                self.apply_update(part, upd, fields, pos)
                applied += len(pos)
                continue
            chosen = np.flatnonzero(keep).tolist()
            sub = DataUpdate(
                upd.partition,
                [upd.indexes[j] for j in chosen],
                dict(upd.schemas),
                {f: [shapes[j] for j in chosen] for f, shapes in upd.sample_shapes.items()},
            )
            self.apply_update(part, sub, fields, pos[keep])
            applied += len(chosen)
        if settled is not None:
            settled.extend(staging.members)
        if whole and applied == len(staging.order):
            return list(staging.order)
        order = as_indexes(staging.order)
        pos = where.pos[order]
        ok = part.flags[pos] & LOST == 0
        if not whole:
            ok &= np.isin(order, members)
        return order[ok].tolist()

    @staticmethod
    def _check_generation(part: _Partition, at: np.ndarray, update: DataUpdate) -> None:
        """Raise StaleMetaError unless the samples at positions ``at`` still belong to the
        allocation ``update.generation`` names (None: no check): a write of samples cleared
        meanwhile must never land on the samples their reused indexes hold now."""
        if update.generation is not None and len(at) and (part.gen[at] != update.generation).any():
            raise StaleMetaError(
                f"samples of {update.partition!r} were cleared during the put (allocation "
                f"{update.generation}); their indexes belong to another put now"
            )

    # -- column-wise puts ------------------------------------------------------------------

    def begin_column_put(
        self, meta: BatchMeta, schemas: Mapping[str, FieldSchema]
    ) -> tuple[int, dict[str, dict[str, list[int]]]]:
        """:meth:`check_put`, then stage the put (see :mod:`store.controller.column_puts`): its
        id (for the units' data updates) and the rows it adds. Raises check_put's errors."""
        fresh = self.check_put(meta, schemas)
        samples = {
            (p, i): g
            for p, i, g in zip(
                meta.partition_ids, meta.global_indexes, meta.generations, strict=True
            )
        }
        return self._column_puts.begin(samples, fresh), fresh

    def _apply_column_update(
        self, update: DataUpdate, generations: Mapping[tuple[str, int], int]
    ) -> list[int]:
        """Apply one held update of a finished column-wise put to the samples that still
        exist with the generation they had when it began; returns their indexes."""
        catalog = self._catalog
        part = catalog.partitions.get(update.partition)
        if part is None:
            return []
        arr = as_indexes(list(update.indexes))
        found, at = catalog.positions(part, arr)
        gens = part.gen[np.where(found, at, 0)].tolist()
        keep = [
            k
            for k, i in enumerate(update.indexes)
            if found[k] and gens[k] == generations.get((update.partition, i))
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
        self.apply_update(part, sub, merged)
        return list(sub.indexes)

    def abort_column_put(self, put_id: int) -> dict[int, dict[str, dict[str, list[int]]]]:
        """Drop a column-wise put that will not finish (its client gave up or died): the rows
        it added that still exist, ``{shard: {partition: {field: [indexes]}}}``, for the units
        to delete. Unknown ids: nothing."""
        put = self._column_puts.end(put_id)
        rows: dict[int, dict[str, dict[str, list[int]]]] = {}
        if put is None:
            return rows
        catalog = self._catalog
        for part_id, fields in put.fresh.items():
            part = catalog.partitions.get(part_id)
            if part is None:
                continue
            for name, indexes in fields.items():
                bits = part.ready.get(name)
                arr = as_indexes(list(indexes))
                found, at = catalog.positions(part, arr)
                safe = np.where(found, at, 0)
                if bits is not None:
                    found &= ~bits[safe]  # gone, or written by a later put
                gens, shards = part.gen[safe].tolist(), part.shard[safe].tolist()
                for k, i in enumerate(indexes):
                    if not found[k] or gens[k] != put.generations.get((part_id, i)):
                        continue
                    rows.setdefault(shards[k], {}).setdefault(part_id, {}).setdefault(name, [])
                    rows[shards[k]][part_id][name].append(i)
        return rows
