"""StoreController's KV face and checkpoint calls (a mixin of the actor): partition keys
(``kv_batch_put``'s samples by string key) and a partition's statuses for checkpoints; the
bookkeeping is :class:`~store.state_extra.StateExtras`'.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from rayless.store.controller_state import ControllerState
from rayless.store.meta import BatchMeta

__all__ = ["ControllerKV"]


class ControllerKV:
    """KV lookups and checkpoint export/restore of the store controller."""

    if TYPE_CHECKING:
        state: ControllerState

    async def kv_lookup(self, partition: str, keys: Sequence[str]) -> list[Any]:
        """``[meta of the existing keys, positions of the missing ones]``."""
        meta, missing = self.state.kv_lookup(partition, list(keys))
        return [meta, missing]

    async def kv_meta(
        self, partition: str, keys: Sequence[str], fields: Sequence[str] | None = None
    ) -> BatchMeta:
        """The meta of existing ``keys`` (see ControllerState.kv_meta)."""
        return self.state.kv_meta(partition, list(keys), None if fields is None else list(fields))

    async def kv_list(self, partition: str | None = None) -> dict[str, Any]:
        """``{partition: {key: tags}}``."""
        return self.state.kv_list(partition)

    async def export_partition(self, partition: str) -> dict[str, Any]:
        """A partition's samples and statuses for a checkpoint (no data)."""
        return self.state.export_partition(partition)

    async def mark_consumed(self, task: str, meta: BatchMeta) -> None:
        """Mark ``meta``'s samples consumed by ``task`` (checkpoint restore)."""
        self.state.mark_consumed(task, meta)
