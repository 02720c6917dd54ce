"""The storage unit's side of the same-host data plane (mixed into :class:`StorageUnit`).

A CPU unit keeps its dense columns in shared memory (:mod:`rayless.store.columns`). A client on
the same host (:mod:`rayless.store.local`) then moves only control messages over the socket:

* put: :meth:`LocalUnit.reserve` checks the dense fields' schemas and the room, grows the
  columns and hands out fresh slots (segment names and slot numbers); the client copies the
  rows into them; :meth:`LocalUnit.commit` writes the other fields (sent with it), makes the
  slots visible and tells the controller (the same ACK as ``write``). ``release`` (or the
  reservation's expiry, for a client killed mid-put) gives the slots back.
* get: :meth:`LocalUnit.locate` returns each dense field's segment, generation and slots (and the
  other fields' data); the client copies the rows out under a lease (see columns.py).
"""

from __future__ import annotations

import asyncio
import os
import time
import uuid
from dataclasses import dataclass, field
from typing import Any

import torch

from rayless.store.columns import ShmDense, row_bytes_of
from rayless.store.columns_cuda import CudaDense, cuda_uuid
from rayless.store.errors import (
    SchemaError,
    StoreError,
    StoreFullError,
    StoreInputError,
    WriteTooLargeError,
)
from rayless.store.schema import DataUpdate, FieldSchema
from rayless.store.shard import ShardStorage, _check_indexes, _check_partition, _Rows
from rayless.transport.protocol import host_id

__all__ = ["RESERVATION_TTL", "LocalUnit", "shm_columns_enabled"]

RESERVATION_TTL = 120.0  # seconds after which an uncommitted reservation is released


def shm_columns_enabled() -> bool:
    """Whether CPU units keep dense columns in shared memory (``RAYLESS_STORE_SHM=0``: no)."""
    return os.environ.get("RAYLESS_STORE_SHM", "1") != "0" and os.path.isdir("/dev/shm")


@dataclass
class _Reservation:
    partition: str
    indexes: list[int] | None  # None: reserved by count ahead of the allocation
    columns: dict[str, tuple[ShmDense, torch.Tensor, list[int]]]  # name: (col, data, slots)
    schemas: dict[str, FieldSchema]
    expires: float = field(default_factory=lambda: time.monotonic() + RESERVATION_TTL)


class LocalUnit:
    """Mixin: the same-host methods of a storage unit (needs ``shard``, ``controller``...)."""

    shard: ShardStorage
    unit_id: str
    controller: Any
    _reservations: dict[str, _Reservation]

    async def local_info(self) -> dict[str, Any]:
        """``{"host": host id, "shm": whether dense columns live in shared memory, "cuda_ipc":
        whether they live in GPU memory exported by CUDA IPC, "gpu_uuid": that GPU's UUID}``."""
        cuda = self.shard.dense_type is CudaDense
        return {
            "host": host_id(),
            "shm": self.shard.dense_type is ShmDense,
            "cuda_ipc": cuda,
            "gpu_uuid": cuda_uuid(self.shard.device) if cuda else None,
        }

    def _where(self, col: ShmDense, known: list[str] | None) -> dict[str, Any]:
        """A column's place for a same-host client: segment, rows (and for a CUDA column
        whose lease segment is not in ``known``, the IPC share the client opens)."""
        seg = col.segment
        out: dict[str, Any] = {"segment": None if seg is None else seg.name, "rows": col.capacity}
        wants_share = known is not None and seg is not None and seg.name not in known
        if isinstance(col, CudaDense) and wants_share:  # known None: a CPU-only client
            out["ipc"] = col.export()["ipc"]
        return out

    def _expire(self) -> None:
        now = time.monotonic()
        for token in [t for t, r in self._reservations.items() if r.expires < now]:
            self._drop_reservation(token)

    def _drop_reservation(self, token: str) -> None:
        res = self._reservations.pop(token, None)
        if res is None:
            return
        for col, _, slots in res.columns.values():
            col.pending -= len(slots)
            col.quarantine.extend(slots)  # a late writer may still touch them: not free yet
        cols = self.shard._parts.get(res.partition, {})
        for name, (col, _, _) in res.columns.items():
            if not len(col) and cols.get(name) is col:
                del cols[name]
                col.close()
        if res.partition in self.shard._parts and not cols:
            del self.shard._parts[res.partition]

    def _reserve_now(
        self,
        partition: str,
        idx: list[int] | int,
        dense: dict[str, FieldSchema],
        known: list[str] | None = None,
    ) -> dict[str, Any]:
        count = idx if isinstance(idx, int) else len(idx)
        cols = self.shard._parts.get(partition, {})
        plan: dict[str, tuple[ShmDense | None, FieldSchema]] = {}
        own = 0
        for name, schema in dense.items():
            if schema.kind != "dense":
                raise SchemaError(f"field {name!r} is not dense")
            old = cols.get(name)
            if old is not None and not isinstance(old, ShmDense):
                raise SchemaError(f"field {name!r} is not a dense column on this unit")
            merged = schema if old is None else old.schema.merged(schema, name)
            plan[name] = (old, merged)
            own += count * row_bytes_of(schema)
        cap = self.shard.capacity_bytes
        if cap is not None and own > cap:
            raise WriteTooLargeError(self.unit_id, own, self.shard.free_bytes or 0, cap)
        budget = self.shard.free_bytes
        limit = budget if budget is not None else 2**62
        needed = 0
        growths: dict[str, int] = {}
        for name, (old, merged) in plan.items():
            probe = old if old is not None else ShmDense(merged, self.shard.device)
            size, cost = probe.growth(range(count), max(0, limit - needed))
            needed += cost
            if size == -1 or (budget is not None and needed > budget):
                raise StoreFullError(self.unit_id, needed, budget or 0, cap or 0)
            if cost:
                growths[name] = size
        out: dict[str, Any] = {}
        taken: dict[str, tuple[ShmDense, torch.Tensor, list[int]]] = {}
        cols = self.shard._parts.setdefault(partition, cols)
        for name, (old, merged) in plan.items():
            col = old if old is not None else ShmDense(merged, self.shard.device)
            cols[name] = col
            col.schema = merged
            if name in growths:
                col.grow(growths[name])
            slots = col.take_slots(count)
            col.pending += len(slots)
            taken[name] = (col, col.data, slots)
            out[name] = {**self._where(col, known), "slots": slots}
        token = uuid.uuid4().hex
        rows = None if isinstance(idx, int) else idx
        self._reservations[token] = _Reservation(partition, rows, taken, dict(dense))
        return {"token": token, "fields": out}

    async def reserve(
        self,
        partition: str,
        indexes: list[int] | int,
        dense: dict[str, dict[str, Any]],
        timeout: float = 0.0,
        known: list[str] | None = None,
    ) -> dict[str, Any]:
        """Slots for the dense fields ``dense`` (wire schemas) of samples ``indexes``:
        ``{"token", "fields": {name: {"segment", "rows", "slots"}}}``. ``indexes`` may be a
        count: slots reserved while the controller still allocates the samples (their indexes
        then come with ``commit``). ``known``: the CUDA columns (lease segment names) the
        client has opened; the others come with their IPC share (``"ipc"``).

        Waits up to ``timeout`` for room like ``write``. Raises SchemaError, StoreInputError,
        StoreFullError, WriteTooLargeError (nothing changed but the columns' growth).
        """
        self._expire()
        part = _check_partition(partition)
        idx: list[int] | int
        if isinstance(indexes, int) and not isinstance(indexes, bool):
            if indexes < 0:
                raise StoreInputError(f"a reservation of {indexes} rows")
            idx = indexes
        else:
            idx = _check_indexes(indexes)
        declared = {k: FieldSchema.from_dict(v) for k, v in dense.items()}
        return await self._until_room(  # type: ignore[attr-defined]
            lambda: self._reserve_now(part, idx, declared, known), timeout
        )

    async def commit(
        self,
        token: str,
        rest: Any,
        schemas: dict[str, dict[str, Any]],
        timeout: float = 0.0,
        indexes: list[int] | None = None,
        put_id: int | None = None,
    ) -> None:
        """Finish reservation ``token``: write the other fields ``rest`` (a TensorDict or None),
        make the reserved slots hold their rows, return after the controller's ACK.
        ``indexes``: the samples of a reservation made by count (one per reserved row);
        ``put_id``: the column-wise put it belongs to.

        Raises StoreError for an unknown (expired) token, StoreInputError for indexes that do
        not fit the reservation, what ``write`` raises for ``rest``; on any error the
        reservation is released and nothing stays written.
        """
        res = self._reservations.get(token)
        if res is None:
            raise StoreError("the same-host put's reservation expired or is unknown")
        if res.indexes is None:
            try:
                idx = _check_indexes(indexes if indexes is not None else ())
                rows = {len(slots) for _, _, slots in res.columns.values()}
                if rows and rows != {len(idx)}:
                    raise StoreInputError(
                        f"{len(idx)} indexes for a reservation of {rows.pop()} rows"
                    )
            except StoreInputError:
                self._drop_reservation(token)
                raise
            res.indexes = idx
        elif indexes is not None and list(indexes) != res.indexes:
            self._drop_reservation(token)
            raise StoreInputError("the commit's indexes differ from the reservation's")
        part, idx = res.partition, res.indexes
        fresh = [n for n in schemas if not any(self.shard.has(part, i, n) for i in idx)]
        try:
            reported: dict[str, FieldSchema] = {}
            shapes: dict[str, list[tuple[int, ...]]] = {}
            if rest is not None:
                declared = {k: FieldSchema.from_dict(v) for k, v in schemas.items()}
                declared = {k: v for k, v in declared.items() if k not in res.columns}
                update = await self._write_when_room(  # type: ignore[attr-defined]
                    part, idx, rest, declared, timeout
                )
                reported.update(update.schemas)
                shapes.update(update.sample_shapes)
            del rest
        except BaseException:
            self._drop_reservation(token)
            raise
        cols = self.shard._parts.get(part, {})
        gone = [
            n
            for n, (col, _, _) in res.columns.items()
            if cols.get(n, col) is not col or (col.segment is None and col.capacity)
        ]
        if gone:  # the partition was dropped (and maybe recreated) during the put
            self._drop_reservation(token)
            raise StoreError(f"partition {part!r} was cleared during the put (fields {gone})")
        self._reservations.pop(token, None)
        cols = self.shard._parts.setdefault(part, {})
        for name, (col, data, slots) in res.columns.items():
            col.pending -= len(slots)
            if data is not col.data:  # the column grew meanwhile: bring the rows along
                where = torch.tensor(slots, dtype=torch.int64, device=col.data.device)
                col.data.index_copy_(0, where, data.index_select(0, where))
            col.assign(idx, slots)
            cols.setdefault(name, col)
            reported[name] = res.schemas[name]
        if self.shard.device.type == "cuda":
            await asyncio.to_thread(self._sync_device)  # type: ignore[attr-defined]
        try:
            await self.controller.on_data_update(
                self.unit_id, DataUpdate(part, idx, reported, shapes, put_id).to_dict()
            )
        except BaseException:
            if fresh:
                self.shard.delete(part, idx, fresh)
                self._notify_freed()  # type: ignore[attr-defined]
            raise
        self._puts.add(len(idx))  # type: ignore[attr-defined]

    async def release(self, token: str) -> None:
        """Give back reservation ``token`` (a failed same-host put); unknown tokens are ignored."""
        self._drop_reservation(token)
        self._notify_freed()  # type: ignore[attr-defined]

    async def locate(
        self,
        partition: str,
        indexes: list[int],
        dense: list[str],
        rest: list[str],
        known: list[str] | None = None,
    ) -> dict[str, Any]:
        """Where the dense fields ``dense`` of samples ``indexes`` are (``{"fields": {name:
        {"segment", "generation", "rows", "slots"}}, "rest": {name: the rows of the other
        fields ``rest``: one flat tensor of a ragged field, a list of a plain one}}``);
        ``known`` as for ``reserve``. Raises like ``read``."""
        part = _check_partition(partition)
        idx = _check_indexes(indexes)
        cols = self.shard._parts.get(part)
        if cols is None:
            self.shard.read(part, idx, dense or rest)  # raises UnknownPartitionError
        fields: dict[str, Any] = {}
        for name in dense:
            col = (cols or {}).get(name)
            if not isinstance(col, ShmDense):
                self.shard.read(part, idx, [name])  # raises the typed error
                raise SchemaError(f"field {name!r} is not a shared-memory column here")
            missing = [i for i in idx if i not in col.slot_of]
            if missing:
                self.shard.read(part, idx, [name])  # raises UnknownFieldError
            fields[name] = {
                **self._where(col, known),
                "generation": col.generation,
                "slots": [col.slot_of[i] for i in idx],
            }
        packed: dict[str, Any] = {}
        for name in rest:  # one flat tensor (or one list of values) per field
            col = (cols or {}).get(name)
            if not isinstance(col, _Rows) or any(i not in col for i in idx):
                self.shard.read(part, idx, [name])  # raises the typed error
                raise SchemaError(f"field {name!r} is not a ragged or plain column here")
            values = [col.rows[i] for i in idx]
            if col.schema.is_non_tensor or not values:
                packed[name] = values
            else:
                flat = (
                    values if all(r.dim() == 1 for r in values) else [r.reshape(-1) for r in values]
                )
                packed[name] = torch.cat(flat)
        self._gets.add(len(idx))  # type: ignore[attr-defined]
        return {"fields": fields, "rest": packed}
