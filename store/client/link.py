"""StoreLink: one client's link to a store's actors, shared by the Store and its paths.

It holds the controller's handle, the unit table (refreshed from the controller), whether
the client is closed, and the units' start that ``Store.create`` leaves running; it checks a
meta against the table and runs per-unit calls in parallel, reporting a dead unit to the
controller. The :class:`~rayless.store.client.store.Store` owns it (its lifecycle sets
``units``, ``closed``, ``start``); the put and get paths reach the actors through it.
"""

from __future__ import annotations

import asyncio
from typing import Any

import numpy as np

from rayless.actors import ActorDiedError, ActorHandle
from rayless.store.data.messages import UnitView
from rayless.store.data.meta import BatchMeta
from rayless.store.errors import ForeignMetaError, StoreError, StoreInputError, UnitLostError
from rayless.transport.errors import ClosedError

__all__ = ["StoreLink", "shard_groups"]


def shard_groups(meta: BatchMeta) -> dict[tuple[int, str], list[int]]:
    """Positions of ``meta``'s samples by (shard, partition), in first-seen order."""
    parts, shards, n = meta.partition_ids, meta.shards, meta.size
    if n and parts.count(parts[0]) == n:  # one partition (the usual case): by shard, vectorised
        sh = np.asarray(shards)
        uniq, first = np.unique(sh, return_index=True)
        order = uniq[np.argsort(first)].tolist()
        if len(order) == 1:
            return {(order[0], parts[0]): list(range(n))}
        return {(s, parts[0]): np.flatnonzero(sh == s).tolist() for s in order}
    groups: dict[tuple[int, str], list[int]] = {}
    for pos, (shard, part) in enumerate(zip(meta.shards, meta.partition_ids, strict=True)):
        groups.setdefault((shard, part), []).append(pos)
    return groups


class StoreLink:
    """A client's controller handle, unit table, closed flag and units' start (see the
    module docstring). ``handle``: the controller, whether or not the client is closed."""

    def __init__(self, controller: ActorHandle[Any], units: list[UnitView], store_id: str):
        self.handle = controller
        self.units = units
        self.store_id = store_id
        self.closed = False
        # The units' start, which create() leaves running (None once seen done): every
        # operation waits for it first (see Store.ready).
        self.start: asyncio.Future[None] | None = None
        self.start_seen = False  # the start's error reached a caller
        self.stopping = False  # shutdown began: the start must not complete the table

    @property
    def controller(self) -> ActorHandle[Any]:
        """The controller actor. Raises ClosedError once the client is closed."""
        if self.closed:
            raise ClosedError(f"this client of store {self.store_id!r} is closed")
        return self.handle

    @property
    def table(self) -> list[UnitView]:
        """The units in shard order. Raises ClosedError once closed, StoreError while the
        units are still starting, and the start's own error if they failed to start."""
        if self.closed:
            raise ClosedError(f"this client of store {self.store_id!r} is closed")
        start = self.start
        if start is not None:
            if not start.done():
                raise StoreError(
                    f"the units of store {self.store_id!r} are still starting: "
                    "await ready() (or any operation) first"
                )
            self.start_result(start)
        return self.units

    def start_result(self, start: asyncio.Future[None]) -> None:
        """Raise the finished start's error (marking it seen), else forget the start."""
        if start.cancelled():
            self.start_seen = True
            raise StoreError(f"the start of store {self.store_id!r} was cancelled")
        error = start.exception()
        if error is not None:
            self.start_seen = True
            raise error
        if self.stopping:  # it ended early: the unit table was never completed
            raise StoreError(f"store {self.store_id!r} was shut down while its units started")
        if self.start is start:
            self.start = None

    def check_meta(self, meta: Any) -> BatchMeta:
        """``meta`` if it is a BatchMeta of this store naming its shards. Raises
        StoreInputError, ForeignMetaError, and what :attr:`table` raises."""
        if not isinstance(meta, BatchMeta):
            raise StoreInputError(f"expected a BatchMeta, got {type(meta).__name__}")
        if meta.store_id != self.store_id:
            raise ForeignMetaError(f"the meta comes from store {meta.store_id!r}")
        count = len(self.table)
        bad = sorted(s for s in set(meta.shards) if not 0 <= s < count)
        if bad:
            raise StoreInputError(
                f"the meta names shard {bad[0]}, but the store has {count} units "
                "(a forged or corrupted meta)"
            )
        return meta

    async def lost(self, shard: int, exc: BaseException) -> UnitLostError:
        """Report the unit of ``shard`` dead (``exc``) to the controller; the error to raise."""
        unit = self.table[shard]
        try:
            await self.controller.unit_lost(unit.unit_id, str(exc))
        except StoreError:
            pass
        return UnitLostError(unit.unit_id, str(exc))

    async def gather(self, shards: list[int], calls: list[Any]) -> list[Any]:
        """Run per-unit calls in parallel; raise the first error (a dead unit as UnitLostError)."""
        results = await asyncio.gather(*calls, return_exceptions=True)
        first: BaseException | None = None
        for shard, res in zip(shards, results, strict=True):
            if isinstance(res, ActorDiedError):
                res = await self.lost(shard, res)
            if isinstance(res, BaseException) and first is None:
                first = res
        if first is not None:
            raise first
        return list(results)
