"""The controller's bookkeeping of fetches: who waits for what, and leased batches.

A fetch that carries a client ``fetch_id`` is *registered* while it waits and *leased* once
served: its samples are marked consumed at once (so no other fetch of the task gets them),
but they go back to the task when the client cancels (``cancel_fetch``: its ``get_meta``
was cancelled or timed out on its side, e.g. ``asyncio.wait_for(st.get_meta(...), 1)``) or
when no ``ack_fetch`` arrives within ``lease_after`` seconds (the client died between the
reply and the ack). A cancel that arrives before its fetch is remembered, so the fetch never
waits at all.

A *shared* batch (``get_meta(share=(key, consumers))``, the streaming loader's step) is
fetched once and handed to every call with its key; it is leased the same way, by part:
each consumer acknowledges the positions it read (``ack_fetch(fetch_id, positions,
consumer)``). The batch is *done* once ``consumers`` distinct consumers acknowledged and every
position was acknowledged by one of them: a consumer that asks again (a restarted rank, a
second pass) counts once, so it never takes another rank's turn (TransferQueue's samplers
cache a step per rank the same way). A done batch stays with its key until ``lease_after``
seconds after it was served, so asking again within that time still returns it; then the key
is forgotten. When a batch is not done by then (a rank died, or never asked), the positions
nobody acknowledged go back to the task and the key is forgotten (a later call with it
fetches a new batch). Delivery is at least once: a consumer slower than the lease may see
its part again in another batch. A *kept* share (``share=(key, consumers, True)``:
TransferQueue's rank-aware sampling, whose group size nobody knows) whose every position was
acknowledged by then stays with its key past the lease, until its partition is cleared or one
of its samples is (their indexes are reused), so a group member however late reads the batch
its peers read. Nothing here does I/O.
"""

from __future__ import annotations

import asyncio
import itertools
import time
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from rayless.store.data.requests import FetchRequest
from rayless.store.errors import StoreInputError

__all__ = ["Fetches", "Lease", "Share", "Shares", "Waiter", "check_timeout"]

REMEMBER = 4096  # cancels of fetches not seen yet, kept at most


def check_timeout(timeout: object) -> None:
    """Raise StoreInputError unless ``timeout`` is None or a number >= 0."""
    if timeout is None:
        return
    if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or timeout < 0:
        raise StoreInputError(f"timeout must be None or a number >= 0, got {timeout!r}")


@dataclass
class Waiter:
    """One fetch waiting in the controller."""

    serial: int
    fetch_id: str | None
    request: FetchRequest
    since: float = field(default_factory=time.monotonic)
    cancelled: bool = False
    event: asyncio.Event | None = None


@dataclass
class Lease:
    """A served batch not acknowledged yet."""

    task: str
    partition: str
    indexes: tuple[int, ...]
    since: float = field(default_factory=time.monotonic)


class Fetches:
    """Waiting fetches, leases of served ones, early cancels."""

    def __init__(self, lease_after: float = 60.0) -> None:
        self.lease_after = lease_after
        self._serial = itertools.count()
        self._waiters: dict[int, Waiter] = {}
        self._by_id: dict[str, Waiter] = {}
        self._leases: dict[str, Lease] = {}
        self._early: OrderedDict[str, None] = OrderedDict()

    def wait(self, fetch_id: str | None, request: FetchRequest) -> Waiter:
        """Register a fetch (already cancelled if its cancel came first)."""
        waiter = Waiter(next(self._serial), fetch_id, request)
        if fetch_id is not None:
            if self._early.pop(fetch_id, 0) is None:
                waiter.cancelled = True
            self._by_id[fetch_id] = waiter
        self._waiters[waiter.serial] = waiter
        return waiter

    def done(self, waiter: Waiter) -> None:
        """The fetch stopped waiting (served or failed)."""
        self._waiters.pop(waiter.serial, None)
        if waiter.fetch_id is not None and self._by_id.get(waiter.fetch_id) is waiter:
            del self._by_id[waiter.fetch_id]

    def waiters(self) -> list[Waiter]:
        """Fetches waiting now, oldest first."""
        return list(self._waiters.values())

    def cancel(self, fetch_id: str) -> Waiter | None:
        """Mark the waiting fetch cancelled and return it; None if it is not waiting (then,
        unless it was served, the cancel is remembered for when it arrives)."""
        waiter = self._by_id.get(fetch_id)
        if waiter is not None:
            waiter.cancelled = True
            return waiter
        if fetch_id not in self._leases:
            self._early[fetch_id] = None
            while len(self._early) > REMEMBER:
                self._early.popitem(last=False)
        return None

    def lease(self, fetch_id: str, task: str, partition: str, indexes: Sequence[int]) -> None:
        """Record a served batch until its ack."""
        if not isinstance(fetch_id, str) or not fetch_id:
            raise StoreInputError(f"fetch_id must be a non-empty str, got {fetch_id!r}")
        self._leases[fetch_id] = Lease(task, partition, tuple(indexes))

    def unlease(self, fetch_id: str) -> Lease | None:
        """Drop and return the lease of ``fetch_id`` (None if there is none)."""
        return self._leases.pop(fetch_id, None)

    def expired(self, now: float | None = None) -> list[Lease]:
        """Drop and return the leases older than ``lease_after``."""
        t = time.monotonic() if now is None else now
        old = [k for k, v in self._leases.items() if t - v.since >= self.lease_after]
        return [self._leases.pop(k) for k in old]

    def leased(self) -> int:
        """How many served batches wait for their ack."""
        return len(self._leases)


ShareKey = tuple[str, str, str]  # (partition, task, the caller's key)


@dataclass
class Share:
    """One batch shared by ``consumers`` fetches with the same key."""

    key: ShareKey
    consumers: int
    future: asyncio.Future[Any]
    served: float | None = None  # when the batch was chosen (its lease starts)
    indexes: tuple[int, ...] = ()
    consumes: bool = True  # a fetch, not a peek: what nobody acked goes back
    keep: bool = False  # stays with its key past the lease once all of it was read
    acked: set[str] = field(default_factory=set)  # the consumers that acknowledged
    delivered: set[int] = field(default_factory=set)  # positions some consumer acknowledged
    given: set[str] = field(default_factory=set)  # fetch ids handed the batch, not acked yet


class Shares:
    """Shared batches by key, and the fetch ids they were handed to (see the module
    docstring). Every call costs O(1) or O(the batch), never O(shares held)."""

    def __init__(self, lease_after: float = 60.0) -> None:
        self.lease_after = lease_after
        self._by_key: dict[ShareKey, Share] = {}
        self._by_fetch: dict[str, Share] = {}
        self._served: OrderedDict[int, Share] = OrderedDict()  # serve order: oldest first
        # sample index -> the kept shares holding it (one per task that fetched it)
        self._kept: dict[int, list[Share]] = {}

    def get(self, key: ShareKey) -> Share | None:
        """The share of ``key`` (waiting for its batch or served), None if there is none."""
        return self._by_key.get(key)

    def add(
        self, key: ShareKey, consumers: int, future: asyncio.Future[Any], keep: bool = False
    ) -> Share:
        """Record a new share whose batch ``future`` will bring (``keep``: see the module
        docstring)."""
        share = self._by_key[key] = Share(key, consumers, future, keep=keep)
        return share

    def serve(self, share: Share, indexes: Sequence[int], consumes: bool = True) -> None:
        """The batch of ``share`` was chosen (``consumes``: marked consumed, a fetch not a
        peek): its lease starts now."""
        share.served = time.monotonic()
        share.indexes = tuple(indexes)
        share.consumes = consumes
        if self._by_key.get(share.key) is share:
            self._served[id(share)] = share

    def give(self, share: Share, fetch_id: str) -> None:
        """``fetch_id`` was handed the batch of ``share`` (its ack is awaited)."""
        if not isinstance(fetch_id, str) or not fetch_id:
            raise StoreInputError(f"fetch_id must be a non-empty str, got {fetch_id!r}")
        if self._by_key.get(share.key) is share:
            share.given.add(fetch_id)
            self._by_fetch[fetch_id] = share

    def done(self, share: Share) -> bool:
        """Whether every consumer of ``share`` acknowledged and every position was read."""
        return len(share.acked) >= share.consumers and len(share.delivered) >= len(share.indexes)

    def ack(
        self, fetch_id: str, positions: Sequence[int] | None = None, consumer: str | None = None
    ) -> bool:
        """``fetch_id`` read ``positions`` of its shared batch (None: all of it) for
        ``consumer`` (None: the fetch id; one consumer asking again counts once). False if
        ``fetch_id`` holds no share (never did, or its lease expired). Raises StoreInputError
        for positions outside the batch or a consumer that is not a non-empty str."""
        if consumer is not None and (not isinstance(consumer, str) or not consumer):
            raise StoreInputError(f"consumer must be a non-empty str, got {consumer!r}")
        share = self._by_fetch.get(fetch_id)
        if share is None:
            return False
        if positions is None:
            got = set(range(len(share.indexes)))
        else:
            got = set(positions)
            if any(
                not isinstance(p, int) or isinstance(p, bool) or not 0 <= p < len(share.indexes)
                for p in got
            ):
                raise StoreInputError(f"positions {sorted(got)!r} are not in the shared batch")
        del self._by_fetch[fetch_id]
        share.given.discard(fetch_id)
        share.delivered |= got
        share.acked.add(fetch_id if consumer is None else consumer)
        return True

    def cancel(self, fetch_id: str) -> bool:
        """``fetch_id`` will not ack (its caller cancelled): the batch stays with its key, so
        asking again gets it again. False if ``fetch_id`` holds no share."""
        share = self._by_fetch.pop(fetch_id, None)
        if share is None:
            return False
        share.given.discard(fetch_id)
        return True

    def drop(self, share: Share) -> None:
        """Forget ``share`` (done, failed or cleared): its key fetches anew next time."""
        if self._by_key.get(share.key) is share:
            del self._by_key[share.key]
        self._served.pop(id(share), None)
        for index in share.indexes:
            holders = self._kept.get(index)
            if holders is not None and share in holders:
                holders.remove(share)
                if not holders:
                    del self._kept[index]
        for fetch_id in share.given:
            self._by_fetch.pop(fetch_id, None)
        share.given.clear()

    def drop_partition(self, partition: str) -> None:
        """Forget every share of ``partition`` (it was cleared)."""
        for share in [s for k, s in self._by_key.items() if k[0] == partition]:
            self.drop(share)

    def forget(self, indexes: Sequence[int]) -> None:
        """Forget the kept shares holding any of ``indexes`` (those samples were cleared:
        their indexes may be reused). O(len(indexes) x the tasks that fetched them)."""
        for index in indexes:
            for share in self._kept.pop(index, ()):
                self.drop(share)

    def expired(self, now: float | None = None) -> list[tuple[Share, list[int]]]:
        """Drop the shares served ``lease_after`` s ago or more; returns each with the
        indexes of the positions no consumer acknowledged (to hand back; none for a done
        share or a peek). A kept share that was all read stays, and is not returned."""
        t = time.monotonic() if now is None else now
        out = []
        while self._served:
            share = next(iter(self._served.values()))
            if share.served is None or t - share.served < self.lease_after:
                break
            back = [i for p, i in enumerate(share.indexes) if p not in share.delivered]
            if not share.consumes or self.done(share):
                back = []
            if share.keep and not back and self._by_key.get(share.key) is share:
                del self._served[id(share)]  # read: it stays with its key (forget, drop)
                for index in share.indexes:
                    self._kept.setdefault(index, []).append(share)
                continue
            self.drop(share)
            out.append((share, back))
        return out

    def held(self) -> int:
        """How many shared batches are held (waiting, served within their lease, or kept)."""
        return len(self._by_key)
