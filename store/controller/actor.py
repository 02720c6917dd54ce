"""StoreController: the actor around :class:`~store.controller.state.ControllerState`.

Every method is async and runs on the actor's loop, so a ``get_meta`` that waits for data is
just a coroutine parked on its partition's event: other clients' puts, notifications and
``get_meta`` calls run meanwhile (TransferQueue's controller blocks all of them instead).
Each data update (or unit loss, or clear) wakes the waiters of that partition, which re-run
``try_fetch``.

The controller also applies clear plans on the units before releasing the indexes, watches
every unit (a pending ``watch`` call that fails when the unit dies marks its samples lost) and
reclaims allocations that were never written within ``reclaim_after`` seconds (a client
killed mid-put), so their indexes are reused.

A clear hides samples at once, deletes their rows on the units, then releases the indexes
(:meth:`ControllerState.clear` and :meth:`ControllerState.release` keep the two phases). The
reaper runs every ``REAP_INTERVAL`` s: it reclaims allocations never written within
``reclaim_after`` s, aborts column-wise puts that never finished, and hands back the batches
of fetch leases that expired (their caller died before its ack), and the parts of shared
batches that no consumer acknowledged within the lease (a streaming-loader rank died).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import time
from collections.abc import Mapping, Sequence
from typing import Any

from rayless.actors import Actor, ActorDiedError, ActorHandle, current_caller, endpoint
from rayless.store.controller.fetches import Fetches, Share, Shares, Waiter, check_timeout
from rayless.store.controller.leases import LeaseTable
from rayless.store.controller.state import ClearPlan, ControllerState
from rayless.store.data.fields import FieldSchema
from rayless.store.data.messages import ColumnPut, FetchMode, UnitView, WaitingFetch
from rayless.store.data.meta import BatchMeta
from rayless.store.data.requests import FetchRequest, PutOptions
from rayless.store.data.status import (
    ControllerMetrics,
    ControllerStats,
    KeyListing,
    PartitionExport,
    PartitionMetrics,
    ProductionStatus,
)
from rayless.store.data.updates import DataUpdate
from rayless.store.errors import (
    SchemaError,
    StoreError,
    StoreInputError,
    StoreTimeoutError,
    UnitLostError,
)
from rayless.store.metrics import RateMeter

__all__ = ["StoreController"]

log = logging.getLogger("rayless.store")


def _wait_log_interval() -> float:
    try:
        return float(os.environ.get("RAYLESS_STORE_WAIT_LOG_S", 10.0))
    except ValueError:
        return 10.0


def _schemas(data: Mapping[str, FieldSchema] | None) -> dict[str, FieldSchema]:
    """The field schemas a client sent, by field. Raises SchemaError for one that is not."""
    out = dict(data or {})
    for name, schema in out.items():
        if type(schema) is not FieldSchema:
            raise SchemaError(f"not a field schema for {name!r}: {schema!r:.80}")
    return out


REAP_INTERVAL = 1.0
UNITS_TIMEOUT = 120.0  # how long units() waits for a unit table still starting (spawn's own)


class StoreController(Actor):
    """The store's controller: partitions, indexes, statuses, schemas, waiting fetches."""

    def __init__(
        self,
        store_id: str | None = None,
        env_shards: Mapping[str, int] | None = None,
        reclaim_after: float = 120.0,
        lease_after: float = 60.0,
        starting_units: bool = False,
        client_settings: str = "{}",
    ) -> None:
        self.state = ControllerState(store_id, env_shards=env_shards)
        self._client_settings = client_settings
        self.reclaim_after = reclaim_after
        self.fetches = Fetches(lease_after)
        self.wait_log_interval = _wait_log_interval()
        self._puts = RateMeter()
        self._served = RateMeter()
        self._incarnation: dict[str, str | None] = {}
        self._watching: set[str] = set()
        self.shares = Shares(lease_after)
        self.handles: dict[str, ActorHandle] = {}
        self._events: dict[str, asyncio.Event] = {}
        self._column_started: dict[int, float] = {}  # column-wise put id -> its begin time
        self._unwritten: dict[int, tuple[str, int, float]] = {}  # index -> (partition, gen, t)
        self._tasks: set[asyncio.Task[Any]] = set()
        self._waiting = 0  # fetches parked on an event
        # Set once the creator's set_units completed the unit table (at once for a controller
        # whose creator does not start units after it): units() waits for it.
        self._table = asyncio.Event()
        if not starting_units:
            self._table.set()
        self._table_waiters = 0  # units() calls parked on it
        self.leases = LeaseTable()  # clients' allocations ahead of their next puts

    async def setup(self) -> None:
        """Start the reclaimer of never-written allocations."""
        self._spawn(self._reaper())

    async def teardown(self) -> None:
        """Stop the background tasks."""
        for task in list(self._tasks):
            task.cancel()

    def _spawn(self, coro: Any) -> None:
        task = asyncio.ensure_future(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def _wake(self, partition: str) -> None:
        event = self._events.pop(partition, None)
        if event is not None:
            event.set()

    def _wake_all(self) -> None:
        for partition in list(self._events):
            self._wake(partition)

    # -- units ---------------------------------------------------------------------------

    @endpoint
    async def register_unit(
        self,
        unit_id: str,
        node_id: str | None = None,
        device: str = "cpu",
        capacity_bytes: int | None = None,
        incarnation: str | None = None,
    ) -> UnitView:
        """A unit's handshake; returns what the controller knows of it (its shard number...).

        A unit that registers again with a new ``incarnation`` (its process restarted, e.g.
        by ``max_restarts``) holds nothing: its samples are marked lost first (if its death
        was not noticed yet), then it is alive again and watched again.
        """
        known = {u.unit_id: u for u in self.state.units()}.get(unit_id)
        old = self._incarnation.get(unit_id)
        if known is not None and known.alive and old is not None and old != incarnation:
            self.state.mark_unit_lost(unit_id, "it restarted")
            self._wake_all()
        info = self.state.register_unit(
            unit_id, node_id=node_id, device=device, capacity_bytes=capacity_bytes
        )
        self._incarnation[unit_id] = incarnation
        handle = self.handles.get(unit_id)
        if handle is not None and unit_id not in self._watching:
            self._spawn(self._watch(unit_id, handle))
        return info.view(handle)

    @endpoint
    async def set_units(self, handles: dict[str, ActorHandle]) -> None:
        """Record the units' handles (after they registered) and start watching them."""
        known = {u.unit_id for u in self.state.units()}
        missing = [u for u in handles if u not in known]
        if missing:
            raise StoreError(f"units {missing} never registered with the controller")
        for unit_id, handle in handles.items():
            self.handles[unit_id] = handle
            if unit_id not in self._watching:
                self._spawn(self._watch(unit_id, handle))
        self._table.set()

    async def _watch(self, unit_id: str, handle: ActorHandle) -> None:
        """Watch one incarnation of a unit; a death marks it lost (unless a newer incarnation
        registered meanwhile: that registration did), and a restarted unit is watched again
        when it registers."""
        self._watching.add(unit_id)
        incarnation = self._incarnation.get(unit_id)
        try:
            await handle.watch()  # returns when the unit shuts down (killed gracefully)
            reason = "it shut down"
        except ActorDiedError as exc:
            reason = str(exc)
        finally:
            self._watching.discard(unit_id)
        if self._incarnation.get(unit_id) == incarnation:
            await self.unit_lost(unit_id, reason)
        if self._incarnation.get(unit_id) != incarnation and unit_id not in self._watching:
            self._spawn(self._watch(unit_id, handle))  # it registered again while we waited

    @endpoint
    async def units(self, timeout: float = UNITS_TIMEOUT) -> list[UnitView]:
        """Every unit (shard order), with its handle.

        While the store's creator is still starting the units (``Store.create`` returns before
        they serve) the table is not complete: this waits until it is, up to ``timeout`` s.
        Raises StoreTimeoutError past it (the units are still starting), StoreInputError for a
        timeout that is not a number >= 0.
        """
        if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or timeout < 0:
            raise StoreInputError(f"timeout must be a number >= 0, got {timeout!r}")
        if not self._table.is_set():
            self._table_waiters += 1
            try:
                await asyncio.wait_for(self._table.wait(), timeout)
            except asyncio.TimeoutError:
                raise StoreTimeoutError(
                    f"the store's units are still starting after {timeout:g}s"
                ) from None
            finally:
                self._table_waiters -= 1
        return [u.view(self.handles.get(u.unit_id)) for u in self.state.units()]

    @endpoint
    async def unit_lost(self, unit_id: str, reason: str = "") -> None:
        """Mark a unit lost (its samples become not ready); idempotent."""
        info = {u.unit_id: u for u in self.state.units()}.get(unit_id)
        if info is not None and info.alive:
            self.state.mark_unit_lost(unit_id, reason)
            self._wake_all()

    @endpoint
    async def store_id(self) -> str:
        """This store's id (metas carry it)."""
        return self.state.store_id

    @endpoint
    async def client_settings(self) -> str:
        """The values the store's creator left for its clients, as JSON text (``Store.create``'s
        ``client_settings``: a face's configuration, opaque to the store)."""
        return self._client_settings

    @endpoint
    async def get_config(self) -> Any:
        """The ``config`` entry of :meth:`client_settings` (None if there is none): a face's
        configuration as its users read it back (TransferQueue's controller's ``get_config``)."""
        settings = json.loads(self._client_settings)
        return settings.get("config") if isinstance(settings, dict) else None

    @endpoint
    async def set_env_shards(self, env_shards: Mapping[str, int] | None) -> None:
        """Replace the env id → shard table."""
        self.state.set_env_shards(dict(env_shards) if env_shards is not None else None)

    # -- puts ----------------------------------------------------------------------------

    @endpoint
    async def allocate(
        self,
        partition: str,
        n: int,
        schemas: Mapping[str, FieldSchema] | None = None,
        options: PutOptions | None = None,
        lease: str | None = None,
    ) -> BatchMeta | None:
        """Allocate ``n`` samples for a put of fields ``schemas`` with ``options``; see
        ControllerState.allocate. Raises its errors, StoreInputError for options that are not
        PutOptions.

        ``lease``: a client's allocation ahead of its next put (store.client.leases), named by
        the client's token. It never creates a partition (None when ``partition`` does not
        exist), and it is bound to the caller's connection: when that goes, the allocation
        is dropped unless committed.

        Without ``env_ids`` each live unit gets one contiguous block of the batch. The put is
        atomic: its samples become ready together once every unit wrote its part (a put torn
        by a producer's death never shows, and is reclaimed like an unwritten allocation).
        """
        if options is None:
            options = PutOptions()
        if not isinstance(options, PutOptions):
            raise StoreInputError(f"allocate needs PutOptions, got {type(options).__name__}")
        if lease is not None and partition not in self.state.partitions():
            return None
        groups = None if options.group_ids is None else [_hashable(g) for g in options.group_ids]
        shards = None
        if options.env_ids is None and isinstance(n, int) and n > 0:
            alive = [u.shard for u in self.state.units() if u.alive]
            if alive:  # one contiguous block per unit: each unit's rows go as one frame
                m = len(alive)  # unit k gets positions ceil(k n / m) .. ceil((k+1) n / m) - 1
                shards = []
                for k, shard in enumerate(alive):
                    shards += [shard] * ((-(-(k + 1) * n // m)) - (-(-k * n // m)))
        meta = self.state.allocate(
            partition,
            n,
            env_ids=options.env_ids,
            group_ids=groups,
            custom_meta=options.custom_meta,
            schemas=_schemas(schemas),
            placement=shards,
            atomic=True,
            keys=options.keys,
            group_size=options.group_size,
        )
        entry = (partition, meta.generations[0] if n else 0, time.monotonic())
        self._unwritten.update(dict.fromkeys(meta.global_indexes, entry))  # one serial
        caller = current_caller() if lease is not None and n else None
        if caller is not None and isinstance(lease, str):
            self.leases.add(caller, lease, meta)
        return meta

    async def _renew_lease(self, token: str) -> BatchMeta | None:
        """Swap the caller's leased allocation ``token`` (never written: no put took it) for
        a new one of the same shape, under the same token: after the client's own clear
        the new one gets the freed indexes, smallest first, as its next put would without a
        lease. The old samples that are still its own are removed and their indexes released
        at once (no unit holds rows of them). None: no such lease, or its partition is gone.
        Raises like allocate."""
        caller = current_caller()
        meta = None if caller is None else self.leases.pop(caller, token)
        if meta is None or caller is None:
            return None
        if not self.state.committed(meta):
            plan = self.state.clear(meta)
            for index in plan.indexes:
                self._unwritten.pop(index, None)
            self.state.release(plan.indexes)
        schemas = dict(meta.field_schemas)
        return await self.allocate(meta.partition_ids[0], meta.size, schemas, PutOptions(), token)

    async def _renewed(self, lease: str | None) -> BatchMeta | None:
        """:meth:`_renew_lease` after a clear: None when there is no lease or it cannot be
        renewed (the clear succeeded; the client's next put goes the usual way)."""
        if lease is None:
            return None
        try:
            return await self._renew_lease(lease)
        except StoreError:
            return None

    def _caller_gone(self, caller: str) -> None:
        """The transport saw client connection ``caller`` go: drop its leased allocations
        that never committed (the units give back their reservations the same way)."""
        for meta in self.leases.drop_caller(caller):
            self._spawn(self.abort_put(meta))

    async def check_put(
        self, meta: BatchMeta, schemas: Mapping[str, FieldSchema]
    ) -> dict[str, dict[str, list[int]]]:
        """Raise unless fields ``schemas`` may be written onto ``meta``'s samples; returns the
        rows the put adds (pass them to :meth:`abort_fields` if the put fails)."""
        return self.state.check_put(meta, _schemas(schemas))

    @endpoint
    async def begin_column_put(
        self, meta: BatchMeta, schemas: Mapping[str, FieldSchema]
    ) -> ColumnPut:
        """:meth:`check_put`, then stage an atomic column-wise put (store.controller.column_puts):
        its id (pass it to the units' writes) and the rows it adds."""
        put_id, fresh = self.state.begin_column_put(meta, _schemas(schemas))
        self._column_started[put_id] = time.monotonic()
        return ColumnPut(put_id, fresh)

    @endpoint
    async def abort_fields(
        self,
        meta: BatchMeta,
        fresh: Mapping[str, Mapping[str, Sequence[int]]],
        put_id: int | None = None,
    ) -> None:
        """Undo a failed column-wise put: the rows it added are no longer ready and are
        deleted on the units that wrote them (a field no sample holds forgets its schema);
        ``put_id``: its staging is dropped (a unit reporting later is refused)."""
        if put_id is not None:
            self.state.abort_column_put(put_id)
            self._column_started.pop(put_id, None)
        rows = self.state.drop_fields(meta, fresh)
        await self._delete_fields(rows)

    async def _delete_fields(self, rows: Mapping[int, dict[str, dict[str, list[int]]]]) -> None:
        units = self.state.units()
        calls = []
        for shard, plan in rows.items():
            handle = self.handles.get(units[shard].unit_id)
            if units[shard].alive and handle is not None:
                calls.append(handle.delete_fields(plan))
        for res in await asyncio.gather(*calls, return_exceptions=True):
            if isinstance(res, BaseException) and not isinstance(res, ActorDiedError):
                raise res

    @endpoint
    async def on_data_update(self, unit_id: str, update: DataUpdate) -> None:
        """A unit stored new data: record it (the ACK is this call's return) and wake fetches.
        Raises StoreInputError for an update that is not a DataUpdate, and what
        ControllerState.on_data_update raises."""
        if type(update) is not DataUpdate:
            raise StoreInputError(f"expected a DataUpdate, got {type(update).__name__}")
        upd = update
        settled: list[int] = []
        ready = self.state.on_data_update(unit_id, upd, settled)
        if (settled or ready) and upd.generation is not None:
            self.leases.forget(upd.generation)  # committed: ordinary samples now
        unwritten = self._unwritten
        for index in settled or ready:  # a completed put's lost samples are not unwritten
            unwritten.pop(index, None)
        if upd.put_id is not None and upd.put_id not in self.state.column_puts.ids():
            self._column_started.pop(upd.put_id, None)  # the column-wise put is complete
            if ready:
                self._puts.add(len(ready))
                self._wake_all()  # its samples may span partitions
        elif ready:
            self._puts.add(len(ready))
            self._wake(upd.partition)

    @endpoint
    async def abort_put(self, meta: BatchMeta) -> bool:
        """Undo a failed put of new samples: clear them wherever they were written, and drop
        the partition if the put created it and it is empty now. A put that committed
        before its client saw the failure (a unit's reply lost after its data update was
        ACKed) is kept instead: its samples are ready, and consumers may hold them. Returns
        True when it committed (nothing undone). Also gives back a client's leased
        allocation (store.client.leases)."""
        for serial in set(meta.generations):
            self.leases.forget(serial)
        if self.state.committed(meta):
            return True
        with contextlib.suppress(StoreError):
            plan = self.state.abort(meta)
            await self._cleared(meta, plan)
        return False

    # -- gets ----------------------------------------------------------------------------

    @endpoint
    async def get_meta(
        self,
        request: FetchRequest,
        fetch_id: str | None = None,
        share: Sequence[Any] | None = None,
    ) -> BatchMeta:
        """A batch of ready samples (see ControllerState.try_fetch), waiting up to the
        request's ``timeout``.

        ``timeout`` None waits as long as it takes, 0 does not wait. Raises StoreTimeoutError
        when the batch is not ready in time, UnitLostError (naming the unit) when a unit that
        held samples of ``partition`` dies while this fetch waits (they may never come back),
        StoreInputError for bad arguments. Samples lost before the fetch began are simply not
        ready: it serves and waits for the other samples. Waiting blocks nothing else.

        ``fetch_id`` (the client's): :meth:`cancel_fetch` drops the waiting fetch, or hands
        its batch back if it was served; a served batch is leased until :meth:`ack_fetch`
        and handed back if no ack comes within ``lease_after`` s (the caller died).
        ``share`` ``(key, consumers)``: the first call with ``key`` fetches the batch, every
        call with it gets the same batch (the streaming loader's ranks) for ``lease_after``
        s; it is done once ``consumers`` distinct consumers acknowledged it
        (``ack_fetch(fetch_id, positions, consumer)``: the positions each read) and every
        position was read; if it is not done by then, the positions nobody acknowledged go
        back to the task (a consumer died). Then the key is forgotten. A call without
        ``fetch_id`` counts as an ack of the whole batch when it is answered.
        ``(key, consumers, True)`` keeps a batch that was all read with its key past the
        lease, until its partition or one of its samples is cleared (TransferQueue's
        rank-aware sampling: see ``fetches``).
        """
        if not isinstance(request, FetchRequest):
            raise StoreInputError(f"get_meta needs a FetchRequest, got {type(request).__name__}")
        check_timeout(request.timeout)
        if share is not None:
            return await self._shared_fetch(request, share, fetch_id)
        waiter = self.fetches.wait(fetch_id, request)
        try:
            meta = await self._fetch(request, waiter)
        finally:
            self.fetches.done(waiter)
        if request.mode is FetchMode.FETCH and meta.size:
            self._served.add(meta.size)
            if fetch_id is not None:
                self.fetches.lease(fetch_id, request.task, request.partition, meta.global_indexes)
        return meta

    async def _fetch(self, request: FetchRequest, waiter: Waiter) -> BatchMeta:
        partition, fields, batch_size, task = (
            request.partition,
            request.fields,
            request.batch_size,
            request.task,
        )
        timeout = request.timeout
        loop = asyncio.get_running_loop()
        deadline = None if timeout is None else loop.time() + timeout
        losses = self.state.loss_count(partition) if isinstance(partition, str) else 0
        next_log = loop.time() + self.wait_log_interval
        while True:
            if waiter.cancelled:
                raise StoreTimeoutError(f"the fetch {waiter.fetch_id} was cancelled by its caller")
            meta = self.state.try_fetch(
                partition, fields, batch_size, task=task, sampler=request.sampler, mode=request.mode
            )
            if meta is not None:
                return meta
            left = None if deadline is None else deadline - loop.time()
            lost = self.state.lost_since(partition, losses)
            if lost is not None and (left is None or left > 0):
                # samples of this partition died with their unit while we waited: the batch
                # may have needed them, and waiting could last forever
                raise UnitLostError(
                    lost, f"it held samples of partition {partition!r}; the batch cannot complete"
                )
            if left is not None and left <= 0:
                raise StoreTimeoutError(
                    f"{batch_size} ready samples of {list(fields)} in partition {partition!r} "
                    f"for task {task!r} did not arrive within {timeout or 0}s"
                )
            if loop.time() >= next_log:
                log.warning("store %s: %s", self.state.store_id, self._describe(waiter).text)
                next_log = loop.time() + self.wait_log_interval
            event = self._events.setdefault(partition, asyncio.Event())
            waiter.event = event
            self._waiting += 1
            step = max(0.0, next_log - loop.time())
            wait = step if left is None else min(left, step)
            try:
                with contextlib.suppress(asyncio.TimeoutError):
                    await asyncio.wait_for(event.wait(), wait)
            finally:
                self._waiting -= 1

    async def _shared_fetch(
        self, request: FetchRequest, share: Sequence[Any], fetch_id: str | None
    ) -> BatchMeta:
        if (
            len(share) not in (2, 3)
            or not isinstance(share[0], str)
            or not isinstance(share[1], int)
            or isinstance(share[1], bool)
            or share[1] < 1
            or (len(share) == 3 and not isinstance(share[2], bool))
        ):
            raise StoreInputError(
                f"share must be (key: str, consumers: int >= 1[, keep: bool]), got {share!r}"
            )
        keep = len(share) == 3 and share[2]
        if fetch_id is not None and (not isinstance(fetch_id, str) or not fetch_id):
            raise StoreInputError(f"fetch_id must be a non-empty str, got {fetch_id!r}")
        key = (request.partition, request.task, share[0])
        fetching = request.mode is FetchMode.FETCH
        entry = self.shares.get(key)
        if entry is None:
            waiter = self.fetches.wait(None, request)

            async def run() -> BatchMeta:
                try:
                    got = await self._fetch(request, waiter)
                finally:
                    self.fetches.done(waiter)
                if fetching:
                    self._served.add(got.size)
                return got

            future = asyncio.ensure_future(run())
            entry = self.shares.add(key, share[1], future, keep)

            def finished(f: asyncio.Future[Any], entry: Share = entry) -> None:
                if f.cancelled() or f.exception() is not None:
                    self.shares.drop(entry)  # the next call with the key fetches again
                else:
                    self.shares.serve(entry, f.result().global_indexes, fetching)

            future.add_done_callback(finished)
        meta: BatchMeta = await asyncio.shield(entry.future)
        given = fetch_id if fetch_id is not None else f"#unacked-{id(entry)}"
        self.shares.give(entry, given)
        if fetch_id is None:
            self.shares.ack(given)
        return meta

    @endpoint
    async def cancel_fetch(self, fetch_id: str) -> int:
        """Drop the fetch ``fetch_id`` (its caller cancelled it or left): a waiting one stops
        waiting and consumes nothing; a served one hands its samples back to its task.
        Returns how many samples were handed back. Idempotent. A shared fetch's batch stays
        with its key (asking again gets it); it goes back when its lease expires."""
        if self.shares.cancel(fetch_id):
            return 0
        waiter = self.fetches.cancel(fetch_id)
        if waiter is not None:
            if waiter.event is not None:
                waiter.event.set()
            return 0
        lease = self.fetches.unlease(fetch_id)
        if lease is None:
            return 0
        back = self.state.unconsume(lease.task, lease.partition, lease.indexes)
        self._wake(lease.partition)
        return len(back)

    @endpoint
    async def ack_fetch(
        self,
        fetch_id: str,
        positions: Sequence[int] | None = None,
        consumer: str | None = None,
    ) -> None:
        """The caller received the batch of ``fetch_id``: it stays consumed. For a shared
        batch, ``positions`` are those the caller read (None: all) and ``consumer`` names
        the reader (a rank: one that asks again counts once; None: the fetch id). Raises
        StoreInputError for positions outside the batch or a bad consumer."""
        got = None if positions is None else list(positions)
        if not self.shares.ack(fetch_id, got, consumer):
            self.fetches.unlease(fetch_id)

    @endpoint
    async def check_readable(self, meta: BatchMeta) -> None:
        """Raise unless every field of ``meta`` is readable (UnitLostError names the unit)."""
        self.state.check_readable(meta)

    @endpoint
    async def lost_positions(self, meta: BatchMeta) -> dict[int, str]:
        """``{position: unit id}`` of ``meta``'s samples lost with their unit; raises like
        check_readable for everything else (stale/foreign meta, unwritten fields)."""
        return self.state.lost_positions(meta)

    @endpoint
    async def lost_meta(self, partition: str) -> BatchMeta:
        """A meta of ``partition``'s samples lost with their unit (see ControllerState)."""
        return self.state.lost_meta(partition)

    @endpoint
    async def meta_of(
        self, partition: str, indexes: Sequence[int], fields: Sequence[str] | None = None
    ) -> BatchMeta:
        """A meta for existing samples (default: their ready fields)."""
        return self.state.meta_of(partition, indexes, fields)

    @endpoint
    async def set_custom_meta(self, meta: BatchMeta, custom: Sequence[Mapping[str, Any]]) -> None:
        """Replace the custom metadata of ``meta``'s samples."""
        self.state.set_custom_meta(meta, custom)

    @endpoint
    async def reset_consumption(
        self, task: str | None, partition: str | None = None, meta: BatchMeta | None = None
    ) -> None:
        """Forget what ``task`` (None: every task) consumed (in ``partition`` or everywhere,
        or only ``meta``'s samples); wakes waiters."""
        self.state.reset_consumption(task, partition, meta)
        if meta is not None:
            for part in set(meta.partition_ids):
                self._wake(part)
        elif partition is None:
            self._wake_all()
        else:
            self._wake(partition)

    # -- clears, reclaim and expiry --------------------------------------------------------

    async def _apply(self, plan: ClearPlan) -> None:
        units = self.state.units()
        calls = []
        for shard, rows in plan.shards.items():
            info = units[shard]
            handle = self.handles.get(info.unit_id)
            if info.alive and handle is not None:
                calls.append(handle.delete(rows))
        self.shares.forget(plan.indexes)  # a kept share of cleared samples is stale now
        results = await asyncio.gather(*calls, return_exceptions=True)
        for res in results:
            if isinstance(res, BaseException) and not isinstance(res, ActorDiedError):
                raise res
        self.state.release(plan.indexes)

    @endpoint
    async def clear(self, meta: BatchMeta, lease: str | None = None) -> BatchMeta | None:
        """Remove ``meta``'s samples (hidden at once; rows deleted; indexes then reusable);
        ``lease``: the token of the caller's leased allocation, renewed once the indexes are
        free (:meth:`_renew_lease`; the new one is returned, else None)."""
        await self._cleared(meta, self.state.clear(meta))
        return await self._renewed(lease)

    async def _cleared(self, meta: BatchMeta, plan: ClearPlan) -> None:
        for index in plan.indexes:
            self._unwritten.pop(index, None)
        for partition in set(meta.partition_ids):
            self._wake(partition)
        await self._apply(plan)

    @endpoint
    async def clear_partition(self, partition: str, lease: str | None = None) -> BatchMeta | None:
        """Remove a whole partition; ``lease`` as for :meth:`clear`. Raises
        UnknownPartitionError."""
        plan = self.state.clear_partition(partition)
        self.shares.drop_partition(partition)
        for index in plan.indexes:
            self._unwritten.pop(index, None)
        self._wake(partition)
        await self._apply(plan)
        return await self._renewed(lease)

    async def _reaper(self) -> None:
        while True:
            await asyncio.sleep(min(REAP_INTERVAL, self.reclaim_after))
            await self.reclaim()
            await self._expire_column_puts()
            for lease in self.fetches.expired():
                self.state.unconsume(lease.task, lease.partition, lease.indexes)
                self._wake(lease.partition)
            for share, back in self.shares.expired():
                partition, task, _ = share.key
                if back:
                    self.state.unconsume(task, partition, back)
                self._wake(partition)

    @endpoint
    async def reclaim(self, older_than: float | None = None) -> int:
        """Clear samples allocated more than ``older_than`` s ago (default ``reclaim_after``)
        and never written (a client died mid-put); returns how many."""
        limit = self.reclaim_after if older_than is None else older_than
        now = time.monotonic()
        stale: dict[str, list[tuple[int, int]]] = {}
        for index, (partition, gen, t) in list(self._unwritten.items()):
            if now - t >= limit:
                stale.setdefault(partition, []).append((index, gen))
        count = 0
        for partition, items in stale.items():
            try:
                meta = self.state.meta_of(partition, [i for i, _ in items])
            except StoreError:
                for i, _ in items:
                    self._unwritten.pop(i, None)
                continue
            with contextlib.suppress(StoreError):
                await self.clear(meta)
                count += len(items)
        return count

    async def _expire_column_puts(self, older_than: float | None = None) -> int:
        """Abort column-wise puts begun more than ``reclaim_after`` s ago and not finished (a
        client died mid-put): their rows are deleted on the units. Returns how many."""
        limit = self.reclaim_after if older_than is None else older_than
        now = time.monotonic()
        stale = [p for p, t in self._column_started.items() if now - t >= limit]
        for put_id in stale:
            del self._column_started[put_id]
            with contextlib.suppress(StoreError, ActorDiedError):
                await self._delete_fields(self.state.abort_column_put(put_id))
        return len(stale)

    # -- status and metrics ----------------------------------------------------------------

    def _describe(self, waiter: Waiter) -> WaitingFetch:
        """What a waiting fetch waits for: partition, fields (missing ones), ready vs asked."""
        request = waiter.request
        exists = request.partition in self.state.partitions()
        missing: list[str] = []
        ready = 0
        if exists:
            status = self.state.production_status(request.partition).fields
            missing = [f for f in request.fields if f not in status]
            with contextlib.suppress(StoreError):
                ready = len(
                    self.state.ready_indexes(request.partition, request.fields, request.task)
                )
        waited = time.monotonic() - waiter.since
        asked = "all" if request.batch_size is None else request.batch_size
        where = "exists" if exists else "does not exist yet"
        text = (
            f"a fetch waits {waited:.0f}s for partition {request.partition!r} ({where}), fields "
            f"{list(request.fields)}"
            + (f" (not written yet: {missing})" if missing else "")
            + f", task {request.task!r}: {ready} ready of {asked} asked"
        )
        return WaitingFetch(
            request.partition,
            exists,
            list(request.fields),
            missing,
            request.task,
            ready,
            request.batch_size,
            round(waited, 3),
            text,
        )

    @endpoint
    async def waiting(self) -> list[WaitingFetch]:
        """Every waiting fetch, described (see :meth:`_describe`)."""
        return [self._describe(w) for w in self.fetches.waiters()]

    @endpoint
    async def partitions(self) -> list[str]:
        """Existing partitions."""
        return self.state.partitions()

    @endpoint
    async def production_status(self, partition: str) -> ProductionStatus:
        """Samples, ready count per field, schemas of ``partition``."""
        return self.state.production_status(partition)

    @endpoint
    async def consumption_status(self, partition: str, task: str) -> dict[str, int]:
        """Samples and how many ``task`` consumed in ``partition``."""
        return self.state.consumption_status(partition, task)

    @endpoint
    async def metrics(self) -> ControllerMetrics:
        """Counters for monitoring: puts/fetches (total, per second), waiting fetches,
        partitions with their samples, fields produced and consumers per task, units."""
        consumers = self.state.consumers()
        production = {p: self.state.production_status(p) for p in self.state.partitions()}
        return ControllerMetrics(
            self.state.store_id,
            self._puts.snapshot(),
            self._served.snapshot(),
            await self.waiting(),
            self.fetches.leased(),
            {
                p: PartitionMetrics(status.samples, status.fields, consumers.get(p, {}))
                for p, status in production.items()
            },
            [u.view() for u in self.state.units()],
        )

    @endpoint
    async def stats(self) -> ControllerStats:
        """Monitoring counts (partitions, allocated, free, units, waiting partitions;
        ``units_starting``: the creator has not completed the unit table yet, and
        ``units_waiters``: the units() calls waiting for it); the samples clients leased
        ahead (store.client.leases) are ``leased``, not allocated, staged or unwritten."""
        out = self.state.stats()
        leased = sum(self.state.staged_count(serial) for serial in self.leases.serials())
        return ControllerStats(  # the samples clients leased ahead are counted apart
            out.partitions,
            out.allocated - leased,
            out.free,
            out.pending_release,
            out.staged - leased,
            out.column_puts,
            out.high_water,
            out.units,
            unwritten=len(self._unwritten) - leased,
            leased=leased,
            waiting_fetches=self._waiting,
            units_starting=not self._table.is_set(),
            units_waiters=self._table_waiters,
        )

    # -- KV keys and checkpoints -----------------------------------------------------------

    @endpoint
    async def kv_lookup(self, partition: str, keys: Sequence[str]) -> tuple[BatchMeta, list[int]]:
        """The meta of the existing keys and the positions of the missing ones."""
        return self.state.kv_lookup(partition, list(keys))

    @endpoint
    async def kv_meta(
        self, partition: str, keys: Sequence[str], fields: Sequence[str] | None = None
    ) -> BatchMeta:
        """The meta of existing ``keys`` (see ControllerState.kv_meta)."""
        return self.state.kv_meta(partition, list(keys), None if fields is None else list(fields))

    @endpoint
    async def kv_keys_of(self, partition: str, indexes: Sequence[int]) -> list[str | None]:
        """The KV key of each of ``indexes`` (see ControllerState.kv_keys_of)."""
        return self.state.kv_keys_of(partition, list(indexes))

    @endpoint
    async def kv_list(self, partition: str | None = None) -> KeyListing:
        """``{partition: {key: tags}}``."""
        return self.state.kv_list(partition)

    @endpoint
    async def export_partition(self, partition: str) -> PartitionExport:
        """A partition's samples and statuses for a checkpoint (no data)."""
        return self.state.export_partition(partition)

    @endpoint
    async def mark_consumed(self, task: str, meta: BatchMeta) -> None:
        """Mark ``meta``'s samples consumed by ``task`` (checkpoint restore)."""
        self.state.mark_consumed(task, meta)


def _hashable(value: Any) -> Any:
    if isinstance(value, list):
        return tuple(_hashable(v) for v in value)
    return value
