"""Store's status and housekeeping face (a mixin of :class:`~rayless.store.client.Store`).

Clearing samples and partitions, production and consumption status, consumption resets, lost
samples, custom metadata, and the controller's and units' metrics and stats: each is one
controller call (metrics and stats also ask every live unit, in parallel).
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from rayless.actors.api.timeline import store_span, traced
from rayless.store.meta import BatchMeta
from rayless.store.metrics import collect

if TYPE_CHECKING:
    from rayless.actors import ActorHandle

__all__ = ["StatusFace"]


class StatusFace:
    """Store's status and housekeeping methods (see the module docstring)."""

    if TYPE_CHECKING:
        store_id: str
        _controller: ActorHandle[Any]

        @property
        def controller(self) -> ActorHandle[Any]: ...

        @property
        def units(self) -> list[dict[str, Any]]: ...

        def _check_meta(self, meta: Any) -> BatchMeta: ...

    @traced("store", "clear", store_span)
    async def clear(self, meta: BatchMeta) -> None:
        """Remove ``meta``'s samples; their indexes are reused. Raises Foreign/StaleMetaError."""
        await self.controller.clear(self._check_meta(meta))

    @traced("store", "clear_partition", store_span)
    async def clear_partition(self, partition: str) -> None:
        """Remove a whole partition. Raises UnknownPartitionError."""
        await self.controller.clear_partition(partition)

    async def partitions(self) -> list[str]:
        """Existing partitions."""
        result: list[str] = await self.controller.partitions()
        return result

    async def production_status(self, partition: str) -> dict[str, Any]:
        """``{"samples": n, "fields": {field: ready}, "schemas": {...}}``."""
        result: dict[str, Any] = await self.controller.production_status(partition)
        return result

    async def consumption_status(self, partition: str, task: str = "default") -> dict[str, int]:
        """``{"samples": n, "consumed": c}`` for ``task``."""
        result: dict[str, int] = await self.controller.consumption_status(partition, task)
        return result

    async def reset_consumption(
        self,
        task: str | None = "default",
        partition: str | None = None,
        *,
        meta: BatchMeta | None = None,
    ) -> None:
        """Make every sample unconsumed again for ``task`` (None: for every task) in
        ``partition`` (None: everywhere), or only ``meta``'s samples (e.g.
        ``PartialResultError.meta``, to fetch them again). Raises StoreInputError,
        UnknownPartitionError."""
        checked = None if meta is None else self._check_meta(meta)
        await self.controller.reset_consumption(task, partition, checked)

    async def lost_samples(self, partition: str) -> BatchMeta:
        """The samples of ``partition`` lost with their unit (not ready; a fetch skips them):
        ``clear`` them, or rewrite their fields once the unit registered again."""
        result: BatchMeta = await self.controller.lost_meta(partition)
        return result

    async def set_custom_meta(self, meta: BatchMeta, custom: Sequence[Mapping[str, Any]]) -> None:
        """Replace the per-sample custom metadata of ``meta``'s samples."""
        await self.controller.set_custom_meta(self._check_meta(meta), [dict(c) for c in custom])

    async def metrics(self) -> dict[str, Any]:
        """The controller's and every unit's counters (see :mod:`rayless.store.metrics`:
        ``render_text``, ``prometheus``)."""
        name = getattr(self._controller, "name", None)
        return await collect(self.controller, self.units, self.store_id, name)

    async def stats(self) -> dict[str, Any]:
        """The controller's counts and each live unit's bytes and rows."""
        out: dict[str, Any] = await self.controller.stats()
        calls = [u["handle"].stats() for u in self.units if u.get("alive")]
        out["unit_stats"] = await asyncio.gather(*calls, return_exceptions=True)
        return out
