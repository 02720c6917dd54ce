"""Leases: one client's allocation and same-host reservations for its next put, made ahead.

A put of new samples costs allocate ∥ reserve, then commit + data update. After a put with
default options (no env ids, group ids, custom metadata, keys or group size; a str
partition) the client asks again, in the background, for the same shape: ``allocate(...,
lease=True)`` for the same partition, sample count and field schemas, and *spare*
reservations (:meth:`LocalPlane.reserve_ahead` with ``spare=True``) on the same-host units.
The next put that matches exactly takes that lease, so it learns where to write without a
controller round trip and only its commits (and their data updates) are on its critical
path. A put that does not match goes the usual way, and then leases its own shape instead
(the old lease is given back); of two concurrent puts one takes the lease.

States of a client's one lease slot (:class:`LeaseState`)::

    EMPTY --refill--> HELD --take--> EMPTY (the taker refills: HELD again)
    HELD --lend, settle (this client cleared samples: a new allocation, the same
          reservations)--> HELD
    HELD --give_back (close)--> EMPTY
    EMPTY/HELD --close--> CLOSED (given back; nothing is leased again)

A lease held between puts can go stale: a clear by any client or the reaper's reclaim
removes its samples (their indexes are reused), a unit dies or restarts, a reservation
expires or is given up for room (a full unit drops spare reservations first). The unit and
the controller refuse a write whose samples belong to another allocation now (the data
update carries the allocation's generation: StaleMetaError), so a stale lease never lands on
another put's samples; :class:`~rayless.store.client.store.Store` retries such a put once the
usual way. The controller never lets a lease create a partition, and binds leased
allocations to the client's connection (dropped when it goes); their samples are staged,
never ready, and not counted as the partition's samples. ``RAYLESS_STORE_LEASE=0`` in a
client's environment turns leases off for its clients.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import uuid
import weakref
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from enum import Enum
from typing import TYPE_CHECKING, Any, NamedTuple

from rayless.store.data.fields import FieldSchema
from rayless.store.data.messages import Reservation
from rayless.store.data.meta import BatchMeta
from rayless.store.data.requests import PutOptions
from rayless.store.data.schema import Column
from rayless.transport.errors import ClosedError

if TYPE_CHECKING:
    from rayless.store.client.store import Store

__all__ = ["GIVE_BACK_TIMEOUT", "Lease", "LeaseKey", "LeaseState", "Leases", "lease_key"]

Ahead = dict[int, tuple[int, "asyncio.Future[Reservation]"]]

ENV_LEASE = "RAYLESS_STORE_LEASE"  # "0": this process's clients lease nothing

GIVE_BACK_TIMEOUT = 5.0  # seconds aclose waits for the lease to be given back


class LeaseKey(NamedTuple):
    """What a put must match exactly to take a lease: partition, sample count, schemas."""

    partition: str
    n: int
    schemas: str  # the field schemas' repr, by field name


def lease_key(
    partition: Any, n: int, schemas: Mapping[str, FieldSchema], options: PutOptions
) -> LeaseKey | None:
    """The lease key of a new put, None for one that never leases (options, empty)."""
    if not isinstance(partition, str) or n <= 0 or not schemas or options != PutOptions():
        return None
    return LeaseKey(partition, n, repr(sorted(schemas.items())))


class LeaseState(Enum):
    """The state of a client's lease slot (see the module docstring)."""

    EMPTY = "empty"
    HELD = "held"
    CLOSED = "closed"


@dataclass
class Lease:
    """An allocation made ahead (None once known: the partition was gone) and the spare
    reservations made with it (``{shard: (rows, reservation)}``)."""

    key: LeaseKey
    token: str  # names the allocation to the controller (renewed under the same token)
    allocation: asyncio.Future[BatchMeta | None]
    ahead: Ahead

    async def meta(self) -> BatchMeta | None:
        """The leased allocation, None if it failed (the put then goes the usual way)."""
        try:
            return await self.allocation
        except Exception:
            return None

    def usable(self) -> Ahead:
        """The reservations not known to have failed (a failed one: reserve by index)."""
        return {
            s: (c, f)
            for s, (c, f) in self.ahead.items()
            if not (f.done() and (f.cancelled() or f.exception() is not None))
        }


class Leases:
    """A :class:`Store`'s lease slot: take, refill, give back, close (see the module
    docstring). Never raises for a lease that failed: its put goes the usual way."""

    def __init__(self, store: Store) -> None:
        self._ref = weakref.ref(store)  # (no cycle: a dropped Store is freed, with its maps)
        self.enabled = os.environ.get(ENV_LEASE, "1") != "0"
        self._lease: Lease | None = None
        self._closed = False
        self._tasks: set[asyncio.Future[Any]] = set()  # give-backs under way
        self.taken = 0  # puts that took a lease (for tests and monitoring)
        self.retried = 0  # leased puts retried the usual way (stale lease)
        self._tokens = 0
        self._prefix = uuid.uuid4().hex[:16]

    @property
    def _store(self) -> Store:
        store = self._ref()
        if store is None:
            raise ClosedError("the store client is gone")
        return store

    @property
    def state(self) -> LeaseState:
        """EMPTY, HELD or CLOSED."""
        if self._closed:
            return LeaseState.CLOSED
        return LeaseState.EMPTY if self._lease is None else LeaseState.HELD

    def take(self, key: LeaseKey | None) -> Lease | None:
        """The held lease if it matches ``key`` (it is this caller's now), else None."""
        lease = self._lease
        if key is None or lease is None or lease.key != key:
            return None
        self._lease = None
        self.taken += 1
        return lease

    async def refill(
        self,
        key: LeaseKey | None,
        columns: Mapping[str, Column],
        wire: dict[str, FieldSchema],
        reserve_ahead: Callable[..., Awaitable[Ahead]],
    ) -> None:
        """Lease the next put of ``key``'s shape (a lease of another shape is given back in the
        background: the slot follows the client's latest shape; one of this shape is kept):
        the allocation is sent now (so it reaches the controller before any later call of
        this client), then the spare reservations (``reserve_ahead(partition, n, columns,
        wire, timeout, spare)``)."""
        if key is None or not self.enabled or self._closed:
            return
        if self._lease is not None:
            if self._lease.key == key:
                return
            self.give_back()
        self._tokens += 1
        token = f"{self._prefix}-{self._tokens}"  # unique per client: clients share connections
        try:
            controller = self._store.controller
            allocation = controller.allocate(key.partition, key.n, wire, PutOptions(), token)
        except Exception:
            return
        lease = Lease(key, token, allocation, {})
        self._lease = lease
        allocation.add_done_callback(_quiet_result)
        with contextlib.suppress(Exception):
            lease.ahead = await reserve_ahead(key.partition, key.n, columns, wire, 0.0, True)
        for _, reserved in lease.ahead.values():
            reserved.add_done_callback(_quiet_result)

    def lend(self) -> Lease | None:
        """For this client's clear: the held lease, out of the slot (no put takes it
        meanwhile). Its token rides on the clear call (``clear(meta, token)``), which renews
        the allocation once the indexes are free: the new one gets them, smallest first, as
        the next put would without a lease. None: nothing held."""
        lease, self._lease = self._lease, None
        return lease

    def settle(
        self, lease: Lease, renewed: BatchMeta | None, cleared: bool
    ) -> asyncio.Future[None] | None:
        """Put back the lease :meth:`lend` took: with its ``renewed`` allocation once the
        clear ``cleared`` (None: the controller held no such lease any more, e.g. its
        partition was cleared; it is given back), else unchanged. Returns the give-back's
        future when it is given back."""
        if cleared:
            done: asyncio.Future[BatchMeta | None] = asyncio.get_running_loop().create_future()
            done.set_result(renewed)
            lease.allocation = done
        if (cleared and renewed is None) or self._closed or self._lease is not None:
            return self._give(lease)
        self._lease = lease
        return None

    def give_back(self) -> Awaitable[None] | None:
        """Give the held lease back (its allocation aborted, its reservations released);
        the returned awaitable is done once it is (None: nothing held)."""
        lease, self._lease = self._lease, None
        if lease is None:
            return None
        return self._give(lease)

    def _give(self, lease: Lease) -> asyncio.Future[None]:
        task = asyncio.ensure_future(self._return(lease))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    async def _return(self, lease: Lease) -> None:
        store = self._ref()
        if store is None:
            return  # (its connection went with it: the controller drops the lease)
        units = store._link.units
        drops = [
            store._plane.drop(units[shard].handle, reserved)
            for shard, (_, reserved) in lease.ahead.items()
            if shard < len(units)
        ]
        meta = await lease.meta()
        calls: list[Awaitable[Any]] = list(drops)
        if meta is not None:
            calls.append(store._link.handle.abort_put(meta))
        await asyncio.gather(*calls, return_exceptions=True)

    async def close(self) -> None:
        """Give the lease back (within ``GIVE_BACK_TIMEOUT``, errors ignored) and lease no
        more. Idempotent."""
        if self._closed:
            return
        self._closed = True
        self.give_back()
        if self._tasks:
            with contextlib.suppress(Exception):
                await asyncio.wait(set(self._tasks), timeout=GIVE_BACK_TIMEOUT)

    def discard(self) -> None:
        """Forget the lease without giving it back (the store is being killed)."""
        self._closed = True
        self._lease = None


def _quiet_result(future: asyncio.Future[Any]) -> None:
    if not future.cancelled():
        future.exception()  # a failed lease is seen by the put that takes it, or by no one
