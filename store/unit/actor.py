"""StorageUnit: the actor that holds one shard (a :class:`~store.unit.shard.ShardStorage`).

At ``setup`` it registers with the controller (the handshake: id, node, device, capacity).
A ``write`` stores the rows (``index_copy_`` into its columns, never keeping the receive
buffers), tells the controller which samples now hold which fields and returns only after
the controller's ACK, so a sample is never ready before its bytes are stored. If the
controller refuses the notification the rows written for new fields are deleted again.
A write over capacity waits (up to its timeout) for deletes to free room, then raises
StoreFullError; a write larger than the whole capacity raises WriteTooLargeError at once.
On a CUDA unit the columns live on ``cuda:0`` (the GPU the unit was given); a CPU unit keeps
its dense columns in shared memory for same-host clients (:mod:`rayless.store.samehost.unit`).
"""

from __future__ import annotations

import asyncio
import functools
import os
import uuid
from collections.abc import Callable
from typing import Any, TypeVar

import torch

from rayless.actors import Actor, ActorHandle
from rayless.actors.api.context import ENV_NODE_ID
from rayless.store.data.meta import BatchMeta  # noqa: F401  (registers BatchMeta with the codec)
from rayless.store.data.schema import DataUpdate, FieldSchema
from rayless.store.errors import StoreFullError, WriteTooLargeError
from rayless.store.metrics import RateMeter
from rayless.store.samehost.columns import ShmDense, drain_pool
from rayless.store.samehost.columns_cuda import CudaDense
from rayless.store.samehost.unit import LocalUnit, shm_columns_enabled
from rayless.store.samehost.unit import reservation_ttl as _reservation_ttl
from rayless.store.unit.shard import ShardStorage, _Dense

__all__ = ["StorageUnit", "unit_device"]


def unit_device(device: str) -> str:
    """The torch device a unit keeps its columns on: ``"cuda"`` → ``"cuda:0"``."""
    return "cuda:0" if device == "cuda" else device


T = TypeVar("T")


class StorageUnit(LocalUnit, Actor):
    """One storage unit: a shard of every partition and of the KV face (same-host methods:
    :class:`~rayless.store.samehost.unit.LocalUnit`)."""

    def __init__(
        self,
        unit_id: str,
        controller: ActorHandle,
        device: str = "cpu",
        capacity_bytes: int | None = None,
        reservation_ttl: float | None = None,
    ) -> None:
        self.unit_id = unit_id
        self.reservation_ttl = _reservation_ttl(reservation_ttl)
        self.controller = controller
        self.device = unit_device(device)
        dense: type[_Dense] = _Dense
        if shm_columns_enabled():  # same-host clients write and read the columns directly
            dense = CudaDense if self.device.startswith("cuda") else ShmDense
        self.shard = ShardStorage(unit_id, self.device, capacity_bytes, dense_type=dense)
        self._reservations = {}
        self._owned = {}
        self._waiting = {}
        self._freed = asyncio.Event()
        self._stop = asyncio.Event()
        self.incarnation = uuid.uuid4().hex  # this process: a restart registers a new one
        self._puts = RateMeter()
        self._gets = RateMeter()

    async def setup(self) -> None:
        """Register with the controller (the handshake)."""
        if self.device.startswith("cuda"):
            torch.cuda.set_device(torch.device(self.device))
        await self.controller.register_unit(
            self.unit_id,
            node_id=os.environ.get(ENV_NODE_ID),
            device=self.device,
            capacity_bytes=self.shard.capacity_bytes,
            incarnation=self.incarnation,
        )

    async def teardown(self) -> None:
        """Ends the controller's ``watch`` call cleanly; unlinks the shared-memory columns."""
        self._stop.set()
        self.shard.close()
        drain_pool()

    def _sync_device(self) -> None:
        if self.shard.device.type == "cuda":
            torch.cuda.synchronize(self.shard.device)

    async def write(
        self,
        partition: str,
        indexes: list[int],
        td: Any,
        schemas: dict[str, dict[str, Any]],
        timeout: float = 0.0,
        put_id: int | None = None,
    ) -> None:
        """Store ``td`` as samples ``indexes`` of ``partition``; return after the controller's ACK.
        ``put_id``: the column-wise put this write belongs to (store.controller.column_puts).

        Raises SchemaError/StoreInputError (bad data), StoreFullError (still no room after
        ``timeout`` seconds of waiting for deletes), the controller's refusal (rows rolled back).
        """
        declared = {k: FieldSchema.from_dict(v) for k, v in schemas.items()}
        fresh = [n for n in declared if not any(self.shard.has(partition, i, n) for i in indexes)]
        update = await self._write_when_room(partition, indexes, td, declared, timeout)
        update.put_id = put_id
        del td  # the receive buffers are no longer referenced
        if self.shard.device.type == "cuda":
            await asyncio.to_thread(self._sync_device)  # IPC sources may be reused after ACK
        try:
            await self.controller.on_data_update(self.unit_id, update.to_dict())
        except BaseException:
            if fresh:
                self.shard.delete(partition, indexes, fresh)
                self._notify_freed()
            raise
        self._puts.add(len(indexes))

    async def _write_when_room(
        self,
        partition: str,
        indexes: list[int],
        td: Any,
        declared: dict[str, FieldSchema],
        timeout: float,
    ) -> DataUpdate:
        return await self._until_room(
            lambda: self.shard.write(partition, indexes, td, schemas=declared), timeout
        )

    async def _until_room(self, attempt: Callable[[], T], timeout: float) -> T:
        """``attempt()``, retried after every delete while it raises StoreFullError, until
        ``timeout`` seconds have passed (then the StoreFullError is raised)."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + max(0.0, timeout)
        while True:
            freed = self._freed
            try:
                return attempt()
            except WriteTooLargeError:
                raise  # can never fit: waiting would only delay the error
            except StoreFullError:
                left = deadline - loop.time()
                if left <= 0:
                    raise
                try:
                    await asyncio.wait_for(freed.wait(), left)
                except asyncio.TimeoutError:
                    pass

    def _notify_freed(self) -> None:
        old, self._freed = self._freed, asyncio.Event()
        old.set()

    async def read(
        self, partition: str, indexes: list[int], fields: list[str] | None = None
    ) -> Any:
        """Samples ``indexes`` of ``partition`` as a TensorDict on this unit's device.

        Raises UnknownPartitionError, UnknownFieldError, StoreInputError.
        """
        td = self.shard.read(partition, indexes, fields)
        if self.shard.device.type == "cuda":
            await asyncio.to_thread(self._sync_device)
        self._gets.add(len(indexes))
        return td

    async def delete(self, plan: dict[str, list[int]]) -> int:
        """Delete rows ``{partition: [indexes]}`` (absent ones ignored); returns bytes freed."""
        freed = 0
        for partition, indexes in plan.items():
            freed += self.shard.delete(partition, indexes)
        self._notify_freed()
        return freed

    async def delete_fields(self, plan: dict[str, dict[str, list[int]]]) -> int:
        """Delete fields of rows ``{partition: {field: [indexes]}}`` (a failed column-wise
        put's); absent ones ignored. Returns bytes freed."""
        freed = 0
        for partition, fields in plan.items():
            for name, indexes in fields.items():
                freed += self.shard.delete(partition, indexes, [name])
        self._notify_freed()
        return freed

    async def drop_partition(self, partition: str) -> int:
        """Delete a whole partition; returns bytes freed."""
        freed = self.shard.drop_partition(partition)
        self._notify_freed()
        return freed

    async def kv_put(self, keys: list[str], td: Any, timeout: float = 0.0) -> dict[str, Any]:
        """Store ``td``'s rows under ``keys``; returns the written fields' schemas (as dicts).

        Waits up to ``timeout`` for room like :meth:`write`; raises like ShardStorage.kv_put.
        """
        schemas = await self._until_room(functools.partial(self.shard.kv_put, keys, td), timeout)
        del td
        if self.shard.device.type == "cuda":
            await asyncio.to_thread(self._sync_device)
        return {k: v.to_dict() for k, v in schemas.items()}

    async def kv_get(self, keys: list[str], fields: list[str] | None = None) -> Any:
        """The rows under ``keys``. Raises UnknownKeyError, UnknownFieldError."""
        td = self.shard.kv_get(keys, fields)
        if self.shard.device.type == "cuda":
            await asyncio.to_thread(self._sync_device)
        return td

    async def kv_list(self) -> list[str]:
        """Keys held here, in insertion order."""
        return self.shard.kv_list()

    async def kv_delete(self, keys: list[str]) -> int:
        """Delete ``keys`` (absent ones ignored); returns how many were deleted."""
        n = self.shard.kv_delete(keys)
        self._notify_freed()
        return n

    async def stats(self) -> dict[str, Any]:
        """Bytes used, capacity, rows per partition, KV keys, puts/gets (rows: total and per
        second over the last 10 s)."""
        return {
            **self.shard.stats(),
            "unit_id": self.unit_id,
            "incarnation": self.incarnation,
            "puts": self._puts.snapshot(),
            "gets": self._gets.snapshot(),
            "reservations": len(self._reservations),  # same-host puts under way
            "reserving": sum(len(t) for t in self._waiting.values()),  # reserves waiting for room
        }

    async def watch(self) -> None:
        """Return only when this unit shuts down: the controller's death watch on it."""
        await self._stop.wait()
