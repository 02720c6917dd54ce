"""ControllerState: the controller's bookkeeping, synchronous and free of I/O.

The controller actor wraps one ControllerState. It is a thin owner of collaborators, each of
one concept, that share the :class:`~store.controller.catalog.Catalog` (the partitions and
where each global index lives):

- :class:`~store.controller.units.Units`: registered storage units, numbered by shard, and
  the samples lost with them.
- :class:`~store.controller.allocation.Allocation`: global indexes (unique across partitions,
  freed ones reused smallest first), their shard placement, release after a clear.
- :class:`~store.controller.staging.StagedPuts`: atomic puts not committed yet.
- :class:`~store.controller.readiness.Readiness`: the units' data updates (production
  status), put checks, column-wise puts (:class:`~store.controller.column_puts.ColumnPuts`).
- :class:`~store.controller.consumption.Consumption`: fetches through samplers, consumption
  status per task.
- :class:`~store.controller.clearing.Clearing`: removing samples.
- :class:`~store.controller.kv.KeyValues`: KV keys and per-sample tags (custom metadata).

Because a sample's fields from one put are written to one unit and announced in one
notification, a sample never becomes partly visible; a sample is *ready* for fields F when all
of F are in their ready sets. An atomic allocation (a new put) goes further: none of its
samples is ready until all of them were written (a torn put never shows). A unit loss marks
its samples lost (not ready); only fetches waiting through the loss are told
(:meth:`ControllerState.lost_since`), later ones wait for new data. Every method validates
first and raises a typed :mod:`store.errors` error with the state unchanged.

Clearing is two-phase so that an index is never reused while a unit still holds its old row:
:meth:`ControllerState.clear` hides the samples at once and returns a :class:`ClearPlan`; once
the units deleted the rows, :meth:`ControllerState.release` makes the indexes reusable.

The records (units, partitions, candidate sets, staged puts, clear plans) live in
:mod:`store.controller.records`.
"""

from __future__ import annotations

import uuid
from collections.abc import Hashable, Iterable, Mapping, Sequence
from typing import Any

from rayless.store.controller.allocation import Allocation
from rayless.store.controller.catalog import Catalog
from rayless.store.controller.clearing import Clearing
from rayless.store.controller.column_puts import ColumnPuts
from rayless.store.controller.consumption import Consumption, check_group_n
from rayless.store.controller.kv import KeyValues, check_new_keys
from rayless.store.controller.readiness import Readiness
from rayless.store.controller.records import (
    MODES as MODES,
)
from rayless.store.controller.records import ClearPlan, EnvShards, UnitInfo
from rayless.store.controller.staging import StagedPuts
from rayless.store.controller.units import Units
from rayless.store.data.fields import FieldSchema
from rayless.store.data.messages import FetchMode
from rayless.store.data.meta import BatchMeta
from rayless.store.data.status import KeyListing, PartitionExport, ProductionStatus, StateStats
from rayless.store.data.updates import DataUpdate

__all__ = ["ClearPlan", "ControllerState", "EnvShards", "UnitInfo"]


class ControllerState:
    """The store controller's state. See the module docstring for the rules it keeps."""

    check_new_keys = staticmethod(check_new_keys)
    check_group_n = staticmethod(check_group_n)

    def __init__(self, store_id: str | None = None, *, env_shards: EnvShards | None = None):
        self.store_id = store_id or uuid.uuid4().hex
        self.column_puts = ColumnPuts()  # column-wise puts whose units have not all written
        catalog = self._catalog = Catalog(self.store_id)
        units = self._units = Units(catalog)
        staging = self._staging = StagedPuts()
        self._allocation = Allocation(catalog, units, staging, env_shards)
        self._readiness = Readiness(catalog, units, staging, self.column_puts)
        self._consumption = Consumption(catalog)
        self._clearing = Clearing(catalog, staging, self._allocation)
        self._kv = KeyValues(catalog)

    @property
    def positions_examined(self) -> int:
        """Positions examined by fetches' candidate sets, for tests and monitoring."""
        return self._consumption.positions_examined

    # -- status --------------------------------------------------------------------------

    def partitions(self) -> list[str]:
        """Names of existing partitions."""
        return list(self._catalog.partitions)

    def shard_of(self, index: int) -> int:
        """The shard that holds allocated sample ``index``. Raises StoreInputError."""
        return self._catalog.shard_of(index)

    def production_status(self, partition: str) -> ProductionStatus:
        """A partition's samples, those lost with their unit, the ready count per field and
        the schemas; the samples are those of committed puts (not those a put in flight or a
        client's lease allocated). Raises UnknownPartitionError."""
        part = self._catalog.part(partition)
        staged, staged_lost = self._staged_in(partition)
        return ProductionStatus(
            part.live - staged, part.lost - staged_lost, dict(part.ready_count), dict(part.schemas)
        )

    def consumption_status(self, partition: str, task: str) -> dict[str, int]:
        """``{"samples": n, "consumed": c}`` for ``task`` in ``partition``."""
        part = self._catalog.part(partition)
        samples = part.live - self._staged_in(partition)[0]
        return {"samples": samples, "consumed": part.consumed_count.get(task, 0)}

    def staged_count(self, serial: int) -> int:
        """Samples of allocation ``serial`` that exist and are not committed yet."""
        return self._staging.count(serial)

    def _staged_in(self, partition: str) -> tuple[int, int]:
        """Samples of ``partition`` of puts not committed yet, and how many are lost."""
        catalog = self._catalog
        part = catalog.partitions.get(partition)
        return self._staging.in_partition(partition, part, catalog.where)

    def stats(self) -> StateStats:
        """Counts for monitoring: partitions, allocated, free, pending release, staged,
        column-wise puts not finished, high water, units."""
        counts = self._allocation.stats()
        return StateStats(
            len(self._catalog.partitions),
            counts["allocated"],
            counts["free"],
            counts["pending_release"],
            self._staging.total(),
            len(self.column_puts),
            counts["high_water"],
            [u.view() for u in self._units.all()],
        )

    def state_bytes(self) -> int:
        """Bytes held by the partitions' columns and bitmaps (the per-sample state)."""
        return self._catalog.state_bytes()

    # -- meta checks, metas ----------------------------------------------------------------

    def check_meta(self, meta: BatchMeta) -> None:
        """Raise ForeignMetaError/StaleMetaError unless every sample of ``meta`` still exists."""
        self._catalog.check_meta(meta)

    def check_schemas(self, partition: str, schemas: Mapping[str, FieldSchema]) -> None:
        """Raise SchemaError if ``schemas`` cannot be written into ``partition``'s fields."""
        self._catalog.check_schemas(partition, schemas)

    def meta_of(
        self, partition: str, indexes: Sequence[int], fields: Sequence[str] | None = None
    ) -> BatchMeta:
        """A meta for existing samples with the given fields (default: all their ready fields)."""
        return self._catalog.meta_of(partition, indexes, fields)

    def set_custom_meta(self, meta: BatchMeta, custom_meta: Sequence[Mapping[str, Any]]) -> None:
        """Replace the custom metadata of ``meta``'s samples (one plain dict per sample)."""
        self._kv.set_custom_meta(meta, custom_meta)

    # -- units and their loss --------------------------------------------------------------

    def register_unit(
        self,
        unit_id: str,
        *,
        node_id: str | None = None,
        device: str = "cpu",
        capacity_bytes: int | None = None,
    ) -> UnitInfo:
        """Register a storage unit (its handshake) and return its info with its shard number.

        A known id registers again (after a restart): it keeps its shard and comes back alive;
        samples lost with it stay not ready until rewritten.
        """
        return self._units.register(
            unit_id, node_id=node_id, device=device, capacity_bytes=capacity_bytes
        )

    def units(self) -> list[UnitInfo]:
        """Registered units in shard order."""
        return self._units.all()

    def mark_unit_lost(self, unit_id: str, reason: str = "") -> dict[str, list[int]]:
        """Mark a unit dead; its samples become not ready. Returns them, per partition."""
        return self._units.mark_lost(unit_id)

    def loss_count(self, partition: str) -> int:
        """How many unit losses took samples of ``partition`` so far (0 if it does not exist).

        A fetch notes it when it starts waiting; see :meth:`lost_since`.
        """
        return self._units.loss_count(partition)

    def lost_since(self, partition: str, count: int) -> str | None:
        """The unit of the latest loss of ``partition``'s samples if there were more than
        ``count`` losses (a fetch waiting since then may wait for data that never comes), else
        None. Losses before ``count`` do not matter: later fetches wait for new data."""
        return self._units.lost_since(partition, count)

    def lost_meta(self, partition: str) -> BatchMeta:
        """A meta (no fields) of ``partition``'s samples lost with their unit and not rewritten:
        clear them, or rewrite them once the unit registered again. Raises UnknownPartitionError.
        """
        return self._units.lost_meta(partition)

    def check_readable(self, meta: BatchMeta) -> None:
        """Raise unless every field of ``meta`` can be read for every sample.

        UnitLostError (naming the unit) for samples whose unit died, UnknownFieldError for
        fields not written for some sample, plus :meth:`check_meta`'s errors.
        """
        self._units.check_readable(meta)

    def lost_positions(self, meta: BatchMeta) -> dict[int, str]:
        """The positions of ``meta`` whose samples died with their unit, with its id.

        Raises :meth:`check_meta`'s errors, and UnknownFieldError for fields not written for
        some sample that is not lost.
        """
        return self._units.lost_positions(meta)

    # -- allocation and placement ----------------------------------------------------------

    def set_env_shards(self, env_shards: EnvShards | None) -> None:
        """Replace the env id → shard table used when ``allocate`` gets env ids."""
        self._allocation.set_env_shards(env_shards)

    def allocate(
        self,
        partition: str,
        n: int,
        *,
        env_ids: Sequence[str] | None = None,
        group_ids: Sequence[Hashable] | None = None,
        custom_meta: Sequence[Mapping[str, Any]] | None = None,
        schemas: Mapping[str, FieldSchema] | None = None,
        placement: Sequence[int] | None = None,
        atomic: bool = False,
        keys: Sequence[str] | None = None,
        group_size: int | None = None,
    ) -> BatchMeta:
        """Allocate ``n`` new samples in ``partition`` (created if new) and return their meta.

        ``atomic`` (with ``schemas``): the samples become ready together, only once every one
        of them was written (:meth:`on_data_update`), so a put torn by a dead producer never
        shows; until then they count as staged and are cleared like any other sample.

        ``env_ids`` place samples by the env-shard table; ``group_ids`` name each sample's group
        for the grouped sampler (default: consecutive runs of the sampler's ``n`` within this
        allocation); ``schemas`` (the fields about to be put) are checked against the partition
        first and returned in the meta; ``placement`` (live shard numbers, one per sample) place
        samples explicitly when no ``env_ids`` are given (the controller actor uses it to give
        each unit one contiguous block of a put); ``keys`` (KV keys new to the partition) name
        the samples for ``kv_batch_get``; ``group_size`` fixes the partition's group size
        (a group put must fit it: see :func:`store.controller.allocation.check_group_size`).
        Raises StoreInputError/SchemaError/UnitLostError.
        """
        return self._allocation.allocate(
            partition,
            n,
            env_ids=env_ids,
            group_ids=group_ids,
            custom_meta=custom_meta,
            schemas=schemas,
            placement=placement,
            atomic=atomic,
            keys=keys,
            group_size=group_size,
        )

    # -- data updates, put checks, column-wise puts ----------------------------------------

    def check_put(
        self, meta: BatchMeta, schemas: Mapping[str, FieldSchema]
    ) -> dict[str, dict[str, list[int]]]:
        """Raise unless fields ``schemas`` may be written onto ``meta``'s samples.

        ForeignMetaError/StaleMetaError (see :meth:`check_meta`), SchemaError (a field's
        schema would change), UnitLostError (a sample's unit is lost). Returns the rows the
        put adds (``{partition: {field: [indexes not holding it yet]}}``): what
        :meth:`drop_fields` removes again if the put fails.
        """
        return self._readiness.check_put(meta, schemas)

    def drop_fields(
        self, meta: BatchMeta, fresh: Mapping[str, Mapping[str, Sequence[int]]]
    ) -> dict[int, dict[str, dict[str, list[int]]]]:
        """Undo a failed column-wise put: ``fresh`` (from :meth:`check_put`) is no longer
        ready, and a field no sample holds any more forgets its schema. Returns the rows the
        units delete: ``{shard: {partition: {field: [indexes]}}}``. Raises check_meta's errors.
        """
        return self._readiness.drop_fields(meta, fresh)

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
        return self._readiness.on_data_update(unit_id, update, settled)

    def abort_column_put(self, put_id: int) -> dict[int, dict[str, dict[str, list[int]]]]:
        """Drop a column-wise put that will not finish (its client gave up or died): the rows
        it added that still exist, ``{shard: {partition: {field: [indexes]}}}``, for the units
        to delete. Unknown ids: nothing."""
        return self._readiness.abort_column_put(put_id)

    def begin_column_put(
        self, meta: BatchMeta, schemas: Mapping[str, FieldSchema]
    ) -> tuple[int, dict[str, dict[str, list[int]]]]:
        """:meth:`check_put`, then stage the put (see :mod:`store.controller.column_puts`): its id
        (for the units' data updates) and the rows it adds. Raises check_put's errors."""
        return self._readiness.begin_column_put(meta, schemas)

    # -- fetches, samplers, consumption ----------------------------------------------------

    def ready_indexes(
        self, partition: str, fields: Sequence[str], task: str | None = None
    ) -> list[int]:
        """Samples (allocation order) holding all ``fields``; unconsumed by ``task`` if given."""
        return self._consumption.ready_indexes(partition, fields, task)

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
        """A batch of ready samples unconsumed by ``task``, or None if not enough yet.

        ``mode`` FETCH (or ``"fetch"``) marks them consumed by ``task``; PEEK does not.
        ``batch_size`` None takes every candidate now (possibly none; never returns None). An
        unknown partition or field only means "not ready yet". ``sampler`` is a Sampler or a
        spec; a spec's sampler is kept per (partition, task) so seeded random draws advance. A
        sampler declaring itself sequential (its capabilities) gets the oldest candidates from
        the (task, fields) candidate set (O(batch)); other samplers get every candidate.
        Raises StoreInputError for bad arguments, StoreError for a sampler that picks
        samples that are not candidates.
        """
        return self._consumption.try_fetch(
            partition, fields, batch_size, task=task, sampler=sampler, mode=mode
        )

    def reset_consumption(
        self, task: str | None, partition: str | None = None, meta: BatchMeta | None = None
    ) -> None:
        """Forget what ``task`` (None: every task, as TransferQueue) consumed, in
        ``partition`` or in every partition; with ``meta`` only its samples (e.g. the live
        part of a get that lost a unit) become unconsumed."""
        self._consumption.reset_consumption(task, partition, meta)

    def unconsume(self, task: str, partition: str, indexes: Iterable[int]) -> list[int]:
        """Hand ``indexes`` back to ``task`` (unconsumed again); cleared ones are skipped.
        Returns those handed back."""
        return self._consumption.unconsume(task, partition, indexes)

    def mark_consumed(self, task: str, meta: BatchMeta) -> None:
        """Mark ``meta``'s samples consumed by ``task`` (restoring a checkpoint).
        Raises check_meta's errors, StoreInputError."""
        self._consumption.mark_consumed(task, meta)

    def consumers(self) -> dict[str, dict[str, int]]:
        """``{partition: {task: consumed count}}`` for monitoring."""
        return self._consumption.consumers()

    # -- clears, aborts, release -----------------------------------------------------------

    def clear(self, meta: BatchMeta) -> ClearPlan:
        """Remove ``meta``'s samples (hidden at once); the plan names the rows units delete.
        Samples cleared already are skipped (clearing twice is a no-op, as in
        TransferQueue). The indexes become reusable only through :meth:`release`.

        Raises StoreInputError (not a BatchMeta, a forged shard), ForeignMetaError; nothing
        is removed then.
        """
        return self._clearing.clear(meta)

    def clear_partition(self, partition: str) -> ClearPlan:
        """Remove a whole partition; see :meth:`clear`. Raises UnknownPartitionError."""
        plan = self._clearing.clear_all(partition)
        self._drop_partition(partition)
        return plan

    def _drop_partition(self, partition: str) -> None:
        self._catalog.drop(partition)
        self._consumption.forget_partition(partition)

    def committed(self, meta: BatchMeta) -> bool:
        """Whether the new put of ``meta`` committed: every one of its samples exists with
        its generation and none is staged any more (its last write arrived, so its samples
        became ready together; some may have been lost with a unit since)."""
        return self._readiness.committed(meta)

    def abort(self, meta: BatchMeta) -> ClearPlan:
        """Undo a failed put of new samples: :meth:`clear` them, and drop a partition that
        this put created and that is empty now (a failed put leaves no partition behind)."""
        plan = self._clearing.clear(meta)
        for part_id in self._clearing.abandoned(meta):
            self._drop_partition(part_id)
        return plan

    def release(self, indexes: Iterable[int]) -> None:
        """Make cleared indexes reusable (after the units deleted their rows)."""
        self._allocation.release(indexes)

    # -- KV keys, group sizes, checkpoint export -------------------------------------------

    def group_size(self, partition: str) -> int | None:
        """The partition's fixed group size, if any. Raises UnknownPartitionError."""
        return self._catalog.group_size(partition)

    def kv_lookup(self, partition: str, keys: Sequence[str]) -> tuple[BatchMeta, list[int]]:
        """The meta (with the fields every one of them holds) of the keys that exist, and
        the positions in ``keys`` of those that do not. Raises StoreInputError."""
        return self._kv.lookup(partition, keys)

    def kv_meta(
        self, partition: str, keys: Sequence[str], fields: Sequence[str] | None = None
    ) -> BatchMeta:
        """The meta of existing ``keys`` in order (``fields``: default all they hold).
        Raises UnknownPartitionError, UnknownKeyError, UnknownFieldError."""
        return self._kv.meta(partition, keys, fields)

    def kv_keys_of(self, partition: str, indexes: Sequence[int]) -> list[str | None]:
        """The KV key of each of ``indexes`` in ``partition`` (None: no key, or not its
        sample). Raises StoreInputError."""
        return self._kv.keys_of(partition, indexes)

    def kv_list(self, partition: str | None = None) -> KeyListing:
        """``{partition: {key: tags}}`` (one partition, or every one that has keys); an
        unknown partition or one without keys lists as ``{}`` (as in TransferQueue)."""
        return KeyListing(self._kv.listing(partition))

    def export_partition(self, partition: str) -> PartitionExport:
        """Everything a checkpoint needs of ``partition`` except the data: samples in order
        (index, key, group, custom, fields ready), consumed per task, group size.
        Raises UnknownPartitionError."""
        return self._catalog.export_partition(partition)
