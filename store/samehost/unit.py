"""The storage unit's side of the same-host data plane (mixed into :class:`StorageUnit`).

A CPU unit keeps its dense columns in shared memory (:mod:`rayless.store.samehost.columns`). A
client on the same host (:mod:`rayless.store.samehost.plane`) then moves only control messages
over the socket:

* put: :meth:`LocalUnit.reserve` checks the dense fields' schemas and the room, grows the
  columns and hands out fresh slots (segment names, slot numbers and the column's writers'
  fence); the client copies the rows into them; :meth:`LocalUnit.commit` writes the other
  fields (sent with it), makes the slots visible and tells the controller (the same ACK as
  ``write``). ``release``, the reservation's expiry (``reservation_ttl`` seconds) or the
  transport telling that the reserving client's connection is gone gives the slots back, as
  *fenced* slots: a writer that copies late lands nowhere visible (see columns.py). A reserve
  still waiting for room when its client goes is cancelled.
* get: :meth:`LocalUnit.locate` returns each dense field's segment, generation and slots (and the
  other fields' data); the client copies the rows out under a lease (see columns.py).
"""

from __future__ import annotations

import asyncio
import os
import time
import uuid
from dataclasses import dataclass
from typing import Any

import torch

from rayless.actors import current_caller
from rayless.store.data.schema import DataUpdate, FieldSchema
from rayless.store.errors import (
    SchemaError,
    StoreError,
    StoreFullError,
    StoreInputError,
    WriteTooLargeError,
)
from rayless.store.samehost.columns import ShmDense, row_bytes_of
from rayless.store.samehost.columns_cuda import CudaDense, cuda_uuid
from rayless.store.unit.shard import ShardStorage, _check_indexes, _check_partition, _Rows
from rayless.transport.protocol import host_id

__all__ = ["RESERVATION_TTL", "LocalUnit", "reservation_ttl", "shm_columns_enabled"]

RESERVATION_TTL = 120.0  # seconds after which an uncommitted reservation is released
ENV_RESERVATION_TTL = "RAYLESS_STORE_RESERVATION_TTL"


def reservation_ttl(value: float | None = None) -> float:
    """Seconds an uncommitted reservation lives: ``value``, else ``RAYLESS_STORE_RESERVATION_TTL``
    from the environment, else :data:`RESERVATION_TTL`. Raises StoreInputError for a value
    that is not a number > 0."""
    raw: object = value if value is not None else os.environ.get(ENV_RESERVATION_TTL)
    if raw is None:
        return RESERVATION_TTL
    try:
        ttl = float(raw)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        ttl = -1.0
    if isinstance(raw, bool) or not ttl > 0 or ttl == float("inf"):
        raise StoreInputError(f"reservation_ttl must be a number of seconds > 0, got {raw!r}")
    return ttl


def shm_columns_enabled() -> bool:
    """Whether CPU units keep dense columns in shared memory (``RAYLESS_STORE_SHM=0``: no)."""
    return os.environ.get("RAYLESS_STORE_SHM", "1") != "0" and os.path.isdir("/dev/shm")


@dataclass
class _Reservation:
    partition: str
    indexes: list[int] | None  # None: reserved by count ahead of the allocation
    columns: dict[str, tuple[ShmDense, torch.Tensor, list[int]]]  # name: (col, data, slots)
    schemas: dict[str, FieldSchema]
    expires: float
    owner: str | None = None  # the reserving client's connection (``current_caller``)


class LocalUnit:
    """Mixin: the same-host methods of a storage unit (needs ``shard``, ``controller``...)."""

    shard: ShardStorage
    unit_id: str
    controller: Any
    reservation_ttl: float
    _reservations: dict[str, _Reservation]  # in order of expiry (one TTL for all)
    _owned: dict[str, set[str]]  # a client connection: its reservations' tokens
    _waiting: dict[str, set[asyncio.Task[Any]]]  # a client connection: its reserves waiting

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
        """Drop the reservations past their expiry (the oldest first: they expire in order)."""
        now = time.monotonic()
        expired = []
        for token, res in self._reservations.items():
            if res.expires >= now:
                break
            expired.append(token)
        for token in expired:
            self._drop_reservation(token)

    def _caller_gone(self, caller: str) -> None:
        """The transport saw client connection ``caller`` go (BYE, dropped, expired): give
        back its reservations and cancel its reserves that still wait for room."""
        for task in self._waiting.pop(caller, set()):
            task.cancel()
        tokens = self._owned.pop(caller, set())
        for token in tokens:
            self._drop_reservation(token)
        if tokens:
            self._notify_freed()  # type: ignore[attr-defined]

    def _take_reservation(self, token: str) -> _Reservation | None:
        """Remove reservation ``token`` from the tables (None: not live)."""
        res = self._reservations.pop(token, None)
        if res is not None and res.owner is not None:
            owned = self._owned.get(res.owner)
            if owned is not None:
                owned.discard(token)
                if not owned:
                    del self._owned[res.owner]
        return res

    def _drop_reservation(self, token: str) -> bool:
        """Give back reservation ``token``'s slots as fenced slots; whether it was live."""
        res = self._take_reservation(token)
        if res is None:
            return False
        for col, _, slots in res.columns.values():
            col.pending -= len(slots)
            col.fenced.extend(slots)  # a late writer may still copy into them: see columns.py
        cols = self.shard._parts.get(res.partition, {})
        for name, (col, _, _) in res.columns.items():
            if not len(col) and cols.get(name) is col:
                del cols[name]
                col.close()
        if res.partition in self.shard._parts and not cols:
            del self.shard._parts[res.partition]
        return True

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
        made: dict[str, ShmDense] = {}
        try:  # growing is what can fail (/dev/shm full): before any slot is handed out
            for name, (old, merged) in plan.items():
                col = old if old is not None else ShmDense(merged, self.shard.device)
                col.schema = merged
                made[name] = col
                if name in growths:
                    col.grow(growths[name])
        except OSError as exc:
            for name, col in made.items():
                if plan[name][0] is None:
                    col.close()
            raise self.shard.shm_full(needed, exc) from None
        out: dict[str, Any] = {}
        taken: dict[str, tuple[ShmDense, torch.Tensor, list[int]]] = {}
        cols = self.shard._parts.setdefault(partition, cols)
        for name, col in made.items():
            cols[name] = col
            slots = col.take_slots(count)
            col.pending += len(slots)
            taken[name] = (col, col.data, slots)
            out[name] = {**self._where(col, known), "fence": col.fence, "slots": slots}
        token = uuid.uuid4().hex
        rows = None if isinstance(idx, int) else idx
        owner = current_caller()
        expires = time.monotonic() + self.reservation_ttl
        self._reservations[token] = _Reservation(
            partition, rows, taken, dict(dense), expires, owner
        )
        if owner is not None:
            self._owned.setdefault(owner, set()).add(token)
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
        caller, task = current_caller(), asyncio.current_task()
        if caller is not None and task is not None:  # cancelled if the caller goes meanwhile
            self._waiting.setdefault(caller, set()).add(task)
        try:
            return await self._until_room(  # type: ignore[attr-defined]
                lambda: self._reserve_now(part, idx, declared, known), timeout
            )
        finally:
            waiting = self._waiting.get(caller) if caller is not None else None
            if waiting is not None:
                waiting.discard(task)
                if not waiting:
                    del self._waiting[caller]  # type: ignore[arg-type]

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

        Raises StoreError for an unknown (expired, released, its client gone) token,
        StoreInputError for indexes that do not fit the reservation, what ``write`` raises
        for ``rest``; on any error the reservation is released and nothing stays written.
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
            if self._reservations.get(token) is not res:  # expired or dropped meanwhile
                written = [n for n in fresh if n not in res.columns]
                if written:
                    self.shard.delete(part, idx, written)
                raise StoreError("the same-host put's reservation expired during its commit")
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
        self._take_reservation(token)
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

    async def release(self, token: str) -> bool:
        """Give back reservation ``token`` (a failed same-host put); whether it was still live
        (False: unknown or expired, and nothing done)."""
        live = self._drop_reservation(token)
        self._notify_freed()  # type: ignore[attr-defined]
        return live

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
