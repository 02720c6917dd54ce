"""StoreController's clears and background reclaim (a mixin of the actor).

A clear hides samples at once, deletes their rows on the units, then releases the indexes
(:class:`~store.state_clears.StateClears` keeps the two phases). The reaper runs every
``REAP_INTERVAL`` s: it reclaims allocations never written within ``reclaim_after`` s (a client
killed mid-put), aborts column-wise puts that never finished, and hands back the batches of
fetch leases that expired (their caller died before its ack), and the parts of shared batches
that no consumer acknowledged within the lease (a streaming-loader rank died).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Mapping
from typing import TYPE_CHECKING

from rayless.actors import ActorDiedError, ActorHandle
from rayless.store.controller_state import ClearPlan, ControllerState
from rayless.store.errors import StoreError
from rayless.store.fetches import Fetches, Shares
from rayless.store.meta import BatchMeta

__all__ = ["REAP_INTERVAL", "ControllerClears"]

REAP_INTERVAL = 1.0


class ControllerClears:
    """Clears, reclaim of unwritten allocations and expiry of column-wise puts and leases."""

    if TYPE_CHECKING:
        state: ControllerState
        reclaim_after: float
        fetches: Fetches
        handles: dict[str, ActorHandle]
        shares: Shares
        _column_started: dict[int, float]
        _unwritten: dict[int, tuple[str, int, float]]

        def _wake(self, partition: str) -> None: ...
        async def _delete_fields(
            self, rows: Mapping[int, dict[str, dict[str, list[int]]]]
        ) -> None: ...

    async def _apply(self, plan: ClearPlan) -> None:
        units = self.state.units()
        calls = []
        for shard, rows in plan.shards.items():
            info = units[shard]
            handle = self.handles.get(info.unit_id)
            if info.alive and handle is not None:
                calls.append(handle.delete(rows))
        results = await asyncio.gather(*calls, return_exceptions=True)
        for res in results:
            if isinstance(res, BaseException) and not isinstance(res, ActorDiedError):
                raise res
        self.state.release(plan.indexes)

    async def clear(self, meta: BatchMeta) -> None:
        """Remove ``meta``'s samples (hidden at once; rows deleted; indexes then reusable)."""
        await self._cleared(meta, self.state.clear(meta))

    async def _cleared(self, meta: BatchMeta, plan: ClearPlan) -> None:
        for index in plan.indexes:
            self._unwritten.pop(index, None)
        for partition in set(meta.partition_ids):
            self._wake(partition)
        await self._apply(plan)

    async def clear_partition(self, partition: str) -> None:
        """Remove a whole partition. Raises UnknownPartitionError."""
        plan = self.state.clear_partition(partition)
        self.shares.drop_partition(partition)
        for index in plan.indexes:
            self._unwritten.pop(index, None)
        self._wake(partition)
        await self._apply(plan)

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
