"""PutPath: a Store's puts, of new samples and of fields onto existing ones.

A put splits the TensorDict per storage unit (one frame per tensor per unit) and writes all
units in parallel (same-host units through :class:`~rayless.store.samehost.plane.LocalPlane`,
with their rows reserved while the controller allocates the samples, or taken from the lease
of the client's previous put of the same shape: :mod:`rayless.store.client.leases`); each
unit ACKs only after the controller recorded its data. A put of fields onto existing samples
is a column-wise put (see :mod:`rayless.store.controller.column_puts`). A failed put is undone.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Mapping, Sequence
from typing import Any

from tensordict import TensorDictBase

from rayless.store.client.leases import LeaseKey, Leases, lease_key
from rayless.store.client.link import StoreLink, shard_groups
from rayless.store.data.messages import ColumnPut, Reservation
from rayless.store.data.meta import BatchMeta
from rayless.store.data.packed import pack_columns
from rayless.store.data.requests import PutOptions
from rayless.store.data.schema import Column, FieldSchema, split_columns
from rayless.store.errors import StaleMetaError, StoreError, StoreFullError, StoreInputError
from rayless.store.samehost.plane import LocalPlane

__all__ = ["PutPath"]


class PutPath:
    """The put path of one Store client: its link to the actors, its same-host data plane
    and its lease slot (see the module docstring)."""

    def __init__(self, link: StoreLink, plane: LocalPlane, leases: Leases) -> None:
        self._link = link
        self._plane = plane
        self._leases = leases

    async def put(
        self,
        td: TensorDictBase,
        partition: str | None,
        *,
        meta: BatchMeta | None,
        env_ids: Sequence[str] | None,
        group_ids: Sequence[Any] | None,
        custom_meta: Sequence[Mapping[str, Any]] | None,
        timeout: float,
        keys: Sequence[str] | None,
        group_size: int | None,
    ) -> BatchMeta:
        """Put ``td`` as new samples of ``partition``, or its fields onto the samples of
        ``meta``; see :meth:`Store.put` (its arguments, what it returns and raises)."""
        columns = split_columns(td)
        n = int(td.batch_size[0])
        schemas = {name: col.schema for name, col in columns.items()}
        wire = dict(schemas)  # (as sent)
        options = PutOptions.of(env_ids, group_ids, custom_meta, keys, group_size)
        if meta is None:
            if partition is None:
                raise StoreInputError("put needs a partition (or the meta of existing samples)")
            if n == 0:  # nothing to store (every sample filtered out): a no-op
                empty = BatchMeta(self._link.store_id, (), (), (), (), {})
                return self._put_result(empty, columns, schemas)
            key = lease_key(partition, n, wire, options)
            new = (td, partition, columns, n, schemas, wire, options, timeout)
            return await self._put_new(*new, key, retry=True)
        if options.for_new_samples:
            raise StoreInputError("keys/group_ids/group_size apply to new samples only")
        meta = self._link.check_meta(meta)
        if meta.size != n:
            raise StoreInputError(f"the TensorDict holds {n} samples, the meta {meta.size}")
        if n == 0:  # no samples, no fields to write
            return self._put_result(meta, columns, schemas)
        if partition is not None and set(meta.partition_ids) != {partition}:
            raise StoreInputError(f"the meta's samples are not in partition {partition!r}")
        begun: ColumnPut = await self._link.controller.begin_column_put(meta, wire)
        put_id, fresh = begun.put_id, begun.fresh
        shards: list[int] = []
        try:
            none: dict[int, tuple[int, asyncio.Future[Reservation]]] = {}
            args = (meta, td, columns, n, wire, timeout, none, shards, put_id)
            await self._link.gather(shards, await self._put_calls(*args))
        except BaseException:
            with contextlib.suppress(StoreError):
                await self._link.controller.abort_fields(meta, fresh, put_id)
            raise
        return self._put_result(meta, columns, schemas)

    async def _put_new(
        self,
        td: TensorDictBase,
        partition: str,
        columns: Mapping[str, Column],
        n: int,
        schemas: Mapping[str, FieldSchema],
        wire: dict[str, FieldSchema],
        options: PutOptions,
        timeout: float,
        key: LeaseKey | None,
        retry: bool,
    ) -> BatchMeta:
        """A put of new samples: into the lease if one matches ``key``, else allocate ∥
        reserve ahead; then the next put of its shape is leased. One that fails without
        committing because its lease (or its allocation) went stale is put again once the
        usual way (``retry``); one that committed before a failure is acknowledged."""
        lease = self._leases.take(key) if retry else None
        meta: BatchMeta | None = None
        ahead: dict[int, tuple[int, asyncio.Future[Reservation]]] = {}
        if lease is not None:
            meta = await lease.meta()
            ahead = lease.usable()
            if meta is None:  # the partition was gone, or the allocation failed
                for shard, (_, reserved) in ahead.items():
                    self._plane.drop_later(self._link.table[shard].handle, reserved)
                lease, ahead = None, {}
        if meta is None:
            if options.env_ids is None and isinstance(partition, str):
                ahead = await self._reserve_ahead(partition, n, columns, wire, timeout)
            try:
                meta = await self._link.controller.allocate(partition, n, wire, options)
            except BaseException:
                for shard, (_, reserved) in ahead.items():
                    self._plane.drop_later(self._link.table[shard].handle, reserved)
                raise
            assert meta is not None  # (not a lease: the controller always allocates)
        shards: list[int] = []
        try:
            try:
                args = (meta, td, columns, n, wire, timeout, ahead, shards, None)
                calls = await self._put_calls(*args, generation=int(meta.generations[0]))
            finally:
                for shard, (_, reserved) in ahead.items():  # units the allocation left out
                    self._plane.drop_later(self._link.table[shard].handle, reserved)
            await self._link.gather(shards, calls)
        except BaseException as exc:
            if await self._link.controller.abort_put(meta) and isinstance(exc, Exception):
                # It committed before the failure (a reply lost): it is acknowledged,
                # and samples lost with a unit since are in lost_samples().
                return self._put_result(meta, columns, schemas)
            stale = lease is not None and not isinstance(exc, StoreFullError)
            if retry and isinstance(exc, Exception) and (stale or isinstance(exc, StaleMetaError)):
                self._leases.retried += 1
                again = (td, partition, columns, n, schemas, wire, options, timeout)
                return await self._put_new(*again, None, retry=False)
            raise
        # Lease the next put now that this one is done: a spare reserve sent before this
        # put's copies could grow the column under them (the copies then go the socket way).
        await self._leases.refill(key, columns, wire, self._reserve_ahead)
        return self._put_result(meta, columns, schemas)

    @staticmethod
    def _put_result(
        meta: BatchMeta, columns: Mapping[str, Column], schemas: Mapping[str, FieldSchema]
    ) -> BatchMeta:
        shapes = {k: c.sample_shapes or [] for k, c in columns.items() if c.schema.is_nested}
        return meta.with_fields(schemas, shapes)

    async def _put_calls(
        self,
        meta: BatchMeta,
        td: TensorDictBase,
        columns: Mapping[str, Column],
        n: int,
        wire: dict[str, FieldSchema],
        timeout: float,
        ahead: dict[int, tuple[int, asyncio.Future[Reservation]]],
        shards: list[int],
        put_id: int | None,
        generation: int | None = None,
    ) -> list[Any]:
        """One write per unit of a put (appending each unit's shard to ``shards``); uses and
        removes the reservations in ``ahead`` that fit; ``generation``: a new put's
        allocation (the units and the controller refuse its writes once it is stale)."""
        calls: list[Any] = []
        for (shard, part), positions in shard_groups(meta).items():
            gidx = meta.global_indexes
            indexes = list(gidx) if len(positions) == n else [gidx[p] for p in positions]
            unit, args = self._link.table[shard], (indexes, columns, positions, n, wire, timeout)
            shards.append(shard)
            count, reserved = ahead.pop(shard, (-1, None))
            if reserved is not None and count != len(positions):
                self._plane.drop_later(unit.handle, reserved)  # the guess was wrong
                reserved = None
            if await self._plane.is_local(unit):  # same host: straight into its segments
                put = self._plane.put(
                    unit, part, *args, reserved=reserved, put_id=put_id, generation=generation
                )
                calls.append(put)
            else:
                sub = pack_columns(columns, positions)
                calls.append(
                    unit.handle.write(part, indexes, sub, wire, timeout, put_id, generation)
                )
        return calls

    async def _reserve_ahead(
        self,
        partition: str,
        n: int,
        columns: Mapping[str, Column],
        wire: dict[str, FieldSchema],
        timeout: float,
        spare: bool = False,
    ) -> dict[int, tuple[int, asyncio.Future[Reservation]]]:
        """Reserve a new put's dense rows on same-host units while the controller allocates
        its samples: ``{shard: (rows, reservation)}``. The guess is the controller's split
        without env ids (one contiguous block per live unit, in shard order); a wrong guess
        costs a release (see :meth:`put`). ``spare``: a lease's (see LocalPlane)."""
        if not self._plane.enabled or n <= 0:
            return {}
        units = self._link.table
        out: dict[int, tuple[int, asyncio.Future[Reservation]]] = {}
        for k, unit in enumerate(units):
            count = -(-(k + 1) * n // len(units)) - -(-k * n // len(units))
            if count and await self._plane.is_local(unit) and self._plane.dense_for(unit, columns):
                reserved = self._plane.reserve_ahead(
                    unit, partition, count, columns, wire, timeout, spare
                )
                out[unit.shard] = (count, reserved)
        return out
