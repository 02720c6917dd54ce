"""StoreController's status and metrics (a mixin of the actor): partitions, production and
consumption status, waiting fetches described (what they wait for), monitoring counters.
"""

from __future__ import annotations

import contextlib
import time
from typing import TYPE_CHECKING, Any

from rayless.store.controller_state import ControllerState
from rayless.store.errors import StoreError
from rayless.store.fetches import Fetches, Waiter
from rayless.store.metrics import RateMeter

__all__ = ["ControllerStatus"]


class ControllerStatus:
    """Status, waiting-fetch descriptions and metrics of the store controller."""

    if TYPE_CHECKING:
        state: ControllerState
        fetches: Fetches
        _puts: RateMeter
        _served: RateMeter
        _unwritten: dict[int, tuple[str, int, float]]
        _waiting: int

    def describe(self, waiter: Waiter) -> dict[str, Any]:
        """What a waiting fetch waits for: partition, fields (missing ones), ready vs asked."""
        exists = waiter.partition in self.state.partitions()
        missing: list[str] = []
        ready = 0
        if exists:
            status = self.state.production_status(waiter.partition)["fields"]
            missing = [f for f in waiter.fields if f not in status]
            with contextlib.suppress(StoreError):
                ready = len(self.state.ready_indexes(waiter.partition, waiter.fields, waiter.task))
        waited = time.monotonic() - waiter.since
        asked = "all" if waiter.batch_size is None else waiter.batch_size
        where = "exists" if exists else "does not exist yet"
        text = (
            f"a fetch waits {waited:.0f}s for partition {waiter.partition!r} ({where}), fields "
            f"{waiter.fields}"
            + (f" (not written yet: {missing})" if missing else "")
            + f", task {waiter.task!r}: {ready} ready of {asked} asked"
        )
        return {
            "partition": waiter.partition,
            "exists": exists,
            "fields": list(waiter.fields),
            "missing_fields": missing,
            "task": waiter.task,
            "ready": ready,
            "asked": waiter.batch_size,
            "waited_s": round(waited, 3),
            "text": text,
        }

    async def waiting(self) -> list[dict[str, Any]]:
        """Every waiting fetch, described (see :meth:`describe`)."""
        return [self.describe(w) for w in self.fetches.waiters()]

    async def partitions(self) -> list[str]:
        """Existing partitions."""
        return self.state.partitions()

    async def production_status(self, partition: str) -> dict[str, Any]:
        """Samples, ready count per field, schemas of ``partition``."""
        return self.state.production_status(partition)

    async def consumption_status(self, partition: str, task: str) -> dict[str, int]:
        """Samples and how many ``task`` consumed in ``partition``."""
        return self.state.consumption_status(partition, task)

    async def metrics(self) -> dict[str, Any]:
        """Counters for monitoring: puts/fetches (total, per second), waiting fetches,
        partitions with their samples and consumers per task, units."""
        consumers = self.state.consumers()
        return {
            "store_id": self.state.store_id,
            "puts": self._puts.snapshot(),
            "fetches": self._served.snapshot(),
            "waiting": await self.waiting(),
            "leased": self.fetches.leased(),
            "partitions": {
                p: {
                    "samples": self.state.production_status(p)["samples"],
                    "consumers": consumers.get(p, {}),
                }
                for p in self.state.partitions()
            },
            "units": [u.to_dict() for u in self.state.units()],
        }

    async def stats(self) -> dict[str, Any]:
        """Monitoring counts (partitions, allocated, free, units, waiting partitions)."""
        return {
            **self.state.stats(),
            "unwritten": len(self._unwritten),
            "waiting_fetches": self._waiting,
        }
