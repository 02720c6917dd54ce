"""The data plane of :class:`~rayless.store.client.Store` (a mixin): put, get_meta, get.

A put splits the TensorDict per storage unit (one frame per tensor per unit) and writes all
units in parallel (same-host units through :class:`~rayless.store.local.LocalPlane`, with their
rows reserved while the controller allocates the samples); each unit ACKs only after the
controller recorded its data. ``get_meta`` asks the controller for a BatchMeta (waiting fetches,
samplers). A get reads only the units holding the meta's samples, in parallel, while the
controller checks the meta, then merges in order and moves the fields to their device. A dead
unit fails a call as UnitLostError (and is reported to the controller).
"""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from tensordict import TensorDict, TensorDictBase

from rayless.actors import ActorDiedError, ActorHandle
from rayless.actors.api.timeline import store_span, traced
from rayless.store.errors import (
    ForeignMetaError,
    StoreError,
    StoreInputError,
    UnitLostError,
    UnknownFieldError,
    UnknownPartitionError,
)
from rayless.store.fetches import check_timeout
from rayless.store.local import LocalPlane
from rayless.store.meta import BatchMeta
from rayless.store.packed import pack_columns
from rayless.store.partial import partial_result
from rayless.store.rows import merge, place
from rayless.store.schema import Column, split_columns

__all__ = ["PUT_TIMEOUT", "DataPlane"]

PUT_TIMEOUT = 30.0


def _sampler_spec(sampler: Any) -> Any:
    if sampler is None or isinstance(sampler, (str, Mapping)):
        return sampler
    spec = getattr(sampler, "spec", None)
    if callable(spec):
        return spec()
    raise StoreInputError(f"not a sampler or sampler spec: {sampler!r}")


class DataPlane:
    """Store's put and get and their per-unit calls (see the module docstring)."""

    if TYPE_CHECKING:
        store_id: str
        _controller: ActorHandle[Any]

        @property
        def controller(self) -> ActorHandle[Any]: ...

        @property
        def units(self) -> list[dict[str, Any]]: ...

        _notes: set[asyncio.Future[Any]]
        _plane: LocalPlane

    def _check_meta(self, meta: Any) -> BatchMeta:
        if not isinstance(meta, BatchMeta):
            raise StoreInputError(f"expected a BatchMeta, got {type(meta).__name__}")
        if meta.store_id != self.store_id:
            raise ForeignMetaError(f"the meta comes from store {meta.store_id!r}")
        count = len(self.units)
        bad = sorted(s for s in set(meta.shards) if not 0 <= s < count)
        if bad:
            raise StoreInputError(
                f"the meta names shard {bad[0]}, but the store has {len(self.units)} units "
                "(a forged or corrupted meta)"
            )
        return meta

    async def _lost(self, shard: int, exc: BaseException) -> UnitLostError:
        unit = self.units[shard]
        try:
            await self.controller.unit_lost(unit["unit_id"], str(exc))
        except StoreError:
            pass
        return UnitLostError(unit["unit_id"], str(exc))

    async def _gather(self, shards: list[int], calls: list[Any]) -> list[Any]:
        """Run per-unit calls in parallel; raise the first error (a dead unit as UnitLostError)."""
        results = await asyncio.gather(*calls, return_exceptions=True)
        first: BaseException | None = None
        for shard, res in zip(shards, results, strict=True):
            if isinstance(res, ActorDiedError):
                res = await self._lost(shard, res)
            if isinstance(res, BaseException) and first is None:
                first = res
        if first is not None:
            raise first
        return list(results)

    # -- data plane ----------------------------------------------------------------------

    @traced("store", "put", store_span)
    async def put(
        self,
        td: TensorDictBase,
        partition: str | None = None,
        *,
        meta: BatchMeta | None = None,
        env_ids: Sequence[str] | None = None,
        group_ids: Sequence[Any] | None = None,
        custom_meta: Sequence[Mapping[str, Any]] | None = None,
        timeout: float = PUT_TIMEOUT,
        keys: Sequence[str] | None = None,
        group_size: int | None = None,
    ) -> BatchMeta:
        """Put ``td`` (batch_size ``[B]``) as new samples of ``partition``, or its fields onto the
        samples of ``meta`` (column-wise); return the samples' meta with the fields added.

        ``group_ids`` name each sample's group; ``group_size`` fixes the partition's group
        size (else the first grouped fetch does): a put whose groups would outgrow it is
        refused (StoreInputError) before anything is written. ``keys``: KV keys for the new
        samples (see ``kv_batch_put``).

        Waits up to ``timeout`` s for room on full units. Raises SchemaError/StoreInputError/
        ForeignMetaError/StaleMetaError (bad input, unstorable dtypes; nothing changed),
        StoreFullError (no room in time; WriteTooLargeError at once for a write larger than a
        unit's capacity), UnitLostError (a unit is gone). A failed put is undone: new samples
        are cleared (and a partition it created is dropped), fields it added to existing
        samples are deleted again. A new put's samples become ready only once all are written.
        """
        columns = split_columns(td)
        n = int(td.batch_size[0])
        schemas = {name: col.schema for name, col in columns.items()}
        wire = {name: s.to_dict() for name, s in schemas.items()}
        new = meta is None
        fresh: dict[str, Any] = {}
        put_id: int | None = None
        ahead: dict[int, tuple[int, asyncio.Future[dict[str, Any]]]] = {}
        if meta is None:
            if partition is None:
                raise StoreInputError("put needs a partition (or the meta of existing samples)")
            if env_ids is None and isinstance(partition, str):
                ahead = await self._reserve_ahead(partition, n, columns, wire, timeout)
            try:
                meta = await self.controller.allocate(
                    partition,
                    n,
                    wire,
                    None if env_ids is None else list(env_ids),
                    None if group_ids is None else list(group_ids),
                    None if custom_meta is None else [dict(c) for c in custom_meta],
                    None if keys is None else list(keys),
                    group_size,
                )
            except BaseException:
                for shard, (_, reserved) in ahead.items():
                    self._plane.drop_later(self.units[shard]["handle"], reserved)
                raise
        else:
            if keys is not None or group_size is not None or group_ids is not None:
                raise StoreInputError("keys/group_ids/group_size apply to new samples only")
            meta = self._check_meta(meta)
            if meta.size != n:
                raise StoreInputError(f"the TensorDict holds {n} samples, the meta {meta.size}")
            if partition is not None and set(meta.partition_ids) != {partition}:
                raise StoreInputError(f"the meta's samples are not in partition {partition!r}")
            begun = await self.controller.begin_column_put(meta, wire)
            put_id, fresh = int(begun["put_id"]), begun["fresh"]
        shards: list[int] = []
        try:
            try:
                args = (meta, td, columns, n, wire, timeout, ahead, shards, put_id)
                calls = await self._put_calls(*args)
            finally:
                for shard, (_, reserved) in ahead.items():  # units the allocation left out
                    self._plane.drop_later(self.units[shard]["handle"], reserved)
            await self._gather(shards, calls)
        except BaseException:
            if new:
                await self.controller.abort_put(meta)
            elif put_id is not None:
                with contextlib.suppress(StoreError):
                    await self.controller.abort_fields(meta, fresh, put_id)
            raise
        shapes = {k: c.sample_shapes or [] for k, c in columns.items() if c.schema.is_nested}
        return meta.with_fields(schemas, shapes)

    async def _put_calls(
        self,
        meta: BatchMeta,
        td: TensorDictBase,
        columns: Mapping[str, Column],
        n: int,
        wire: dict[str, dict[str, Any]],
        timeout: float,
        ahead: dict[int, tuple[int, asyncio.Future[dict[str, Any]]]],
        shards: list[int],
        put_id: int | None,
    ) -> list[Any]:
        """One write per unit of a put (appending each unit's shard to ``shards``); uses and
        removes the reservations in ``ahead`` that fit."""
        calls: list[Any] = []
        for (shard, part), positions in _groups(meta).items():
            indexes = [meta.global_indexes[p] for p in positions]
            unit, args = self.units[shard], (indexes, columns, positions, n, wire, timeout)
            shards.append(shard)
            count, reserved = ahead.pop(shard, (-1, None))
            if reserved is not None and count != len(positions):
                self._plane.drop_later(unit["handle"], reserved)  # the guess was wrong
                reserved = None
            if await self._plane.is_local(unit):  # same host: straight into its segments
                put = self._plane.put(unit, part, *args, reserved=reserved, put_id=put_id)
                calls.append(put)
            else:
                sub = pack_columns(columns, positions)
                calls.append(unit["handle"].write(part, indexes, sub, wire, timeout, put_id))
        return calls

    async def _reserve_ahead(
        self,
        partition: str,
        n: int,
        columns: Mapping[str, Column],
        wire: dict[str, dict[str, Any]],
        timeout: float,
    ) -> dict[int, tuple[int, asyncio.Future[dict[str, Any]]]]:
        """Reserve a new put's dense rows on same-host units while the controller allocates
        its samples: ``{shard: (rows, reservation)}``. The guess is the controller's split
        without env ids (one contiguous block per live unit, in shard order); a wrong guess
        costs a release (see :meth:`put`)."""
        if not self._plane.enabled or n <= 0:
            return {}
        units = self.units
        out: dict[int, tuple[int, asyncio.Future[dict[str, Any]]]] = {}
        for k, unit in enumerate(units):
            count = -(-(k + 1) * n // len(units)) - -(-k * n // len(units))
            if count and await self._plane.is_local(unit) and self._plane.dense_for(unit, columns):
                reserved = self._plane.reserve_ahead(unit, partition, count, columns, wire, timeout)
                out[int(unit["shard"])] = (count, reserved)
        return out

    @traced("store", "get_meta", store_span)
    async def get_meta(
        self,
        partition: str,
        fields: Sequence[str],
        batch_size: int | None = None,
        *,
        task: str = "default",
        mode: str = "fetch",
        sampler: Any = None,
        timeout: float | None = None,
        share: tuple[str, int] | None = None,
    ) -> BatchMeta:
        """Ready samples of ``partition`` holding ``fields``, unconsumed by ``task``.

        ``mode="fetch"`` waits up to ``timeout`` (None: forever, 0: not at all) for
        ``batch_size`` of them and marks them consumed by ``task``; ``"peek"`` does not mark.
        ``batch_size`` None takes what is there now. ``sampler``: "sequential" (default),
        "random", ``{"name": "grouped", "n": N}``, ``{"name": "seqlen_balanced", ...}`` or a
        Sampler. ``share=(key, consumers)``: ``consumers`` calls with ``key`` get one batch
        (the streaming loader's ranks). Raises StoreTimeoutError, StoreInputError (also for
        a timeout that is not None or a number >= 0). Waiting never delays other clients.

        A fetch cancelled here (``asyncio.wait_for(st.get_meta(...), 1)`` timing out, a
        cancelled task, a SyncStore call that timed out) consumes nothing: the controller
        drops it, or hands its batch back if it was already served.
        """
        check_timeout(timeout)
        if share is not None:
            return await self.controller.get_meta(
                partition,
                list(fields),
                batch_size,
                task,
                mode,
                _sampler_spec(sampler),
                timeout,
                None,
                list(share),
            )
        fetch_id = uuid.uuid4().hex
        try:
            meta: BatchMeta = await self.controller.get_meta(
                partition,
                list(fields),
                batch_size,
                task,
                mode,
                _sampler_spec(sampler),
                timeout,
                fetch_id,
            )
        except asyncio.CancelledError:
            self._note(self._controller.cancel_fetch(fetch_id))
            raise
        if mode == "fetch":
            self._note(self._controller.ack_fetch(fetch_id))
        return meta

    def _note(self, future: asyncio.Future[Any]) -> None:
        """Keep a one-way note (ack, cancel) alive until sent; its errors do not matter."""
        self._notes.add(future)

        def done(f: asyncio.Future[Any]) -> None:
            self._notes.discard(f)
            if not f.cancelled():
                f.exception()

        future.add_done_callback(done)

    @traced("store", "get", store_span)
    async def get(
        self,
        meta: BatchMeta,
        fields: Sequence[str] | None = None,
        *,
        device: Any = None,
        zero_copy: bool = False,
    ) -> TensorDict:
        """The data of ``meta``'s samples (``fields``: a subset) as one TensorDict.

        From units on this host the bytes are copied once, out of their shared memory;
        ``zero_copy=True`` returns views of it where it can (see :mod:`rayless.store.local`).

        Same keys, dtypes, shapes, nesting as put; each field on its put-time device where this
        process has it (else the CPU), or on ``device``. Raises ForeignMetaError, StaleMetaError,
        UnknownFieldError, PartialResultError (a UnitLostError naming the unit that held some
        samples; its ``data``/``meta`` are the samples read from live units, ``lost`` the rest).
        """
        meta = self._check_meta(meta)
        if fields is not None:
            meta = meta.select_fields(fields)
        names = meta.field_names
        if meta.size == 0 or not names:
            await self.controller.check_readable(meta)
            return TensorDict({}, batch_size=[meta.size])
        groups = _groups(meta)
        local = await self._plane.get(self, meta, names, groups, zero_copy, device)
        if local is not None:
            return place(local, meta.field_schemas, device)
        calls = [self.controller.lost_positions(meta)]
        for (shard, part), positions in groups.items():
            indexes = [meta.global_indexes[p] for p in positions]
            calls.append(self.units[shard]["handle"].read(part, indexes, names))
        results = await asyncio.gather(*calls, return_exceptions=True)
        if isinstance(results[0], BaseException):
            raise results[0]
        if any(isinstance(r, (UnknownFieldError, UnknownPartitionError)) for r in results[1:]):
            await self.controller.check_readable(meta)  # cleared meanwhile: StaleMetaError
        lost = {int(pos): str(unit) for pos, unit in results[0]}
        dead = [isinstance(r, (ActorDiedError, UnitLostError)) for r in results[1:]]
        if lost or any(dead):
            await partial_result(self, meta, groups, results[1:], lost, device)
        results = await self._gather(
            [shard for shard, _ in groups], [_done(r) for r in results[1:]]
        )
        parts = [(pos, td) for pos, td in zip(groups.values(), results, strict=True)]
        return place(merge(meta.size, meta.field_schemas, parts), meta.field_schemas, device)


async def _done(value: Any) -> Any:
    if isinstance(value, BaseException):
        raise value
    return value


def _groups(meta: BatchMeta) -> dict[tuple[int, str], list[int]]:
    groups: dict[tuple[int, str], list[int]] = {}
    for pos, (shard, part) in enumerate(zip(meta.shards, meta.partition_ids, strict=True)):
        groups.setdefault((shard, part), []).append(pos)
    return groups
