"""The controller's bookkeeping of fetches: who waits for what, and leased batches.

A fetch that carries a client ``fetch_id`` is *registered* while it waits and *leased* once
served: its samples are marked consumed at once (so no other fetch of the task gets them),
but they go back to the task when the client cancels (``cancel_fetch``: its ``get_meta``
was cancelled or timed out on its side, e.g. ``asyncio.wait_for(st.get_meta(...), 1)``) or
when no ``ack_fetch`` arrives within ``lease_after`` seconds (the client died between the
reply and the ack). A cancel that arrives before its fetch is remembered, so the fetch never
waits at all. Nothing here does I/O.
"""

from __future__ import annotations

import asyncio
import itertools
import time
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass, field

from rayless.store.errors import StoreInputError

__all__ = ["Fetches", "Lease", "Waiter", "check_timeout"]

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
    partition: str
    fields: list[str]
    batch_size: int | None
    task: str
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

    def wait(
        self,
        fetch_id: str | None,
        partition: str,
        fields: list[str],
        batch_size: int | None,
        task: str,
    ) -> Waiter:
        """Register a fetch (already cancelled if its cancel came first)."""
        waiter = Waiter(next(self._serial), fetch_id, partition, fields, batch_size, task)
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
