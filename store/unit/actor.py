"""StorageUnit: the actor that holds one shard (a :class:`~store.unit.shard.ShardStorage`).

At ``setup`` it registers with the controller (the handshake: id, node, device, capacity).
A ``write`` stores the rows (``index_copy_`` into its columns, never keeping the receive
buffers), tells the controller which samples now hold which fields and returns only after
the controller's ACK, so a sample is never ready before its bytes are stored. If the
controller refuses the notification the rows written for new fields are deleted again.
A write over capacity waits (up to its timeout) for deletes to free room, then raises
StoreFullError; a write larger than the whole capacity raises WriteTooLargeError at once.
On a CUDA unit the columns live on ``cuda:0`` (the GPU the unit was given); a CPU unit keeps
its dense columns in shared memory for same-host clients
(:mod:`rayless.store.samehost.columns`). A client on the same host
(:mod:`rayless.store.samehost.plane`) then moves only control messages over the socket:

* put: :meth:`StorageUnit.reserve` checks the dense fields' schemas and the room, grows the
  columns and hands out fresh slots (segment names, slot numbers and the column's writers'
  fence); the client copies the rows into them; :meth:`StorageUnit.commit` writes the other
  fields (sent with it), makes the slots visible and tells the controller (the same ACK as
  ``write``). ``release``, the reservation's expiry (``reservation_ttl`` seconds) or the
  transport telling that the reserving client's connection is gone gives the slots back, as
  *fenced* slots: a writer that copies late lands nowhere visible (see columns.py). A reserve
  still waiting for room when its client goes is cancelled.
* get: :meth:`StorageUnit.locate` returns each dense field's segment, generation and slots (and
  the other fields' data); the client copies the rows out under a lease (see columns.py).
"""

from __future__ import annotations

import asyncio
import functools
import os
import time
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any, TypeVar

from rayless.actors import Actor, ActorHandle, current_caller, endpoint
from rayless.actors.ext import ENV_NODE_ID
from rayless.store.data.fields import FieldSchema
from rayless.store.data.messages import LocalInfo, Located, Place, Reservation, Slots
from rayless.store.data.meta import BatchMeta  # noqa: F401  (registers BatchMeta with the codec)
from rayless.store.data.status import UnitStats
from rayless.store.data.updates import DataUpdate
from rayless.store.errors import (
    SchemaError,
    StaleMetaError,
    StoreError,
    StoreFullError,
    StoreInputError,
    WriteTooLargeError,
)
from rayless.store.metrics import RateMeter
from rayless.transport.ext import host_id

if TYPE_CHECKING:  # (imported when first used: they import torch)
    import torch

    from rayless.store.samehost.columns import ShmDense
    from rayless.store.unit.shard import ShardStorage

__all__ = ["StorageUnit", "unit_device"]


def _schemas(data: Mapping[str, FieldSchema]) -> dict[str, FieldSchema]:
    """The field schemas a client sent, by field. Raises SchemaError for one that is not."""
    out = dict(data)
    for name, schema in out.items():
        if type(schema) is not FieldSchema:
            raise SchemaError(f"not a field schema for {name!r}: {schema!r:.80}")
    return out


def unit_device(device: str) -> str:
    """The torch device a unit keeps its columns on: ``"cuda"`` → ``"cuda:0"``."""
    return "cuda:0" if device == "cuda" else device


T = TypeVar("T")


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


_ttl = reservation_ttl  # StorageUnit's argument of the same name hides it


@dataclass
class _Reservation:
    partition: str
    indexes: list[int] | None  # None: reserved by count ahead of the allocation
    columns: dict[str, tuple[ShmDense, torch.Tensor, list[int]]]  # name: (col, data, slots)
    schemas: dict[str, FieldSchema]
    expires: float
    owner: str | None = None  # the reserving client's connection (``current_caller``)
    spare: bool = False  # a client's lease ahead of its next put: given up for room


class StorageUnit(Actor):
    """One storage unit: a shard of every partition and of the KV face, and the unit's side of
    the same-host data plane (reserve, commit, locate)."""

    # its columns are torch tensors: a template on demand imports them once, not every unit
    template_imports = ("torch", "tensordict")

    def __init__(
        self,
        unit_id: str,
        controller: ActorHandle,
        device: str = "cpu",
        capacity_bytes: int | None = None,
        reservation_ttl: float | None = None,
    ) -> None:
        self.unit_id = unit_id
        self.reservation_ttl = _ttl(reservation_ttl)
        self.controller = controller
        self.device = unit_device(device)
        if not isinstance(unit_id, str) or not unit_id:
            raise StoreInputError(f"unit_id must be a non-empty str, got {unit_id!r}")
        if capacity_bytes is not None and (
            not isinstance(capacity_bytes, int) or capacity_bytes < 0
        ):
            raise StoreInputError(f"capacity_bytes must be an int >= 0, got {capacity_bytes!r}")
        self.capacity_bytes = capacity_bytes
        self._shard: ShardStorage | None = None
        self._making: asyncio.Future[ShardStorage] | None = None  # _loaded's, under way
        if self.device != "cpu":  # a CUDA unit needs torch at once (its device, in setup)
            self._shard = self._new_shard()
        self._reservations: dict[str, _Reservation] = {}  # in order of expiry (one TTL for all)
        self._owned: dict[str, set[str]] = {}  # a client connection: its reservations' tokens
        self._waiting: dict[str, set[asyncio.Task[Any]]] = {}  # a connection: reserves waiting
        self._freed = asyncio.Event()
        self._stop = asyncio.Event()
        self.incarnation = uuid.uuid4().hex  # this process: a restart registers a new one
        self._puts = RateMeter()
        self._gets = RateMeter()

    def _new_shard(self) -> ShardStorage:
        from rayless.store.data.dense import DenseColumn
        from rayless.store.samehost.columns import ShmDense
        from rayless.store.samehost.columns_cuda import CudaDense
        from rayless.store.unit.shard import ShardStorage

        dense: type[DenseColumn] = DenseColumn
        if shm_columns_enabled():  # same-host clients write and read the columns directly
            dense = CudaDense if self.device.startswith("cuda") else ShmDense
        return ShardStorage(self.unit_id, self.device, self.capacity_bytes, dense_type=dense)

    @property
    def shard(self) -> ShardStorage:
        """The unit's data (made here if :meth:`_loaded` did not make it yet)."""
        if self._shard is None:
            self._shard = self._new_shard()
        return self._shard

    async def _loaded(self) -> None:
        """Make the shard on first use, in a thread: a CPU unit imports torch only when a
        request needs its columns (a write, a reserve, a read, stats, ...), not to start and
        register, and its loop keeps serving while torch loads (seconds)."""
        if self._shard is not None:
            return
        if self._making is None:
            self._making = asyncio.get_running_loop().run_in_executor(None, self._new_shard)
        making = self._making
        try:
            shard = await asyncio.shield(making)
        except Exception:
            if self._making is making:  # the next request tries again
                self._making = None
            raise
        if self._shard is None:
            self._shard = shard

    async def setup(self) -> None:
        """Register with the controller (the handshake)."""
        if self.device.startswith("cuda"):
            import torch

            torch.cuda.set_device(torch.device(self.device))
        await self.controller.register_unit(
            self.unit_id,
            node_id=os.environ.get(ENV_NODE_ID),
            device=self.device,
            capacity_bytes=self.capacity_bytes,
            incarnation=self.incarnation,
        )

    async def teardown(self) -> None:
        """Ends the controller's ``watch`` call cleanly; unlinks the shared-memory columns."""
        self._stop.set()
        if self._shard is not None:  # (nothing to unlink, and no torch to import, otherwise)
            from rayless.store.samehost.columns import drain_pool

            self._shard.close()
            drain_pool()

    def _sync_device(self) -> None:
        if self.shard.device.type == "cuda":
            import torch

            torch.cuda.synchronize(self.shard.device)

    @endpoint
    async def write(
        self,
        partition: str,
        indexes: list[int],
        td: Any,
        schemas: dict[str, FieldSchema],
        timeout: float = 0.0,
        put_id: int | None = None,
        generation: int | None = None,
    ) -> None:
        """Store ``td`` (fields ``schemas``) as samples ``indexes`` of ``partition``; return
        after the controller's ACK.
        ``put_id``: the column-wise put this write belongs to (store.controller.column_puts);
        ``generation``: the allocation of a new put's samples (see :meth:`_check_new_rows`).

        Raises SchemaError/StoreInputError (bad data), StoreFullError (still no room after
        ``timeout`` seconds of waiting for deletes), StaleMetaError (the samples were cleared
        and their indexes hold another put's rows), the controller's refusal (rows rolled back).
        """
        await self._loaded()
        declared = _schemas(schemas)
        fresh = [n for n in declared if not self.shard.has_any(partition, indexes, n)]
        new = generation is not None
        update = await self._write_when_room(partition, indexes, td, declared, timeout, new)
        update.put_id = put_id
        update.generation = generation
        del td  # the receive buffers are no longer referenced
        if self.shard.device.type == "cuda":
            await asyncio.to_thread(self._sync_device)  # IPC sources may be reused after ACK
        try:
            await self.controller.on_data_update(self.unit_id, update)
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
        new: bool = False,
    ) -> DataUpdate:
        """Write ``td`` once there is room; ``new``: a new put's samples, refused
        (StaleMetaError) where they hold rows already (see :meth:`_check_new_rows`)."""

        def attempt() -> DataUpdate:
            if new:
                self._check_new_rows(partition, indexes, declared)
            return self.shard.write(partition, indexes, td, schemas=declared)

        return await self._until_room(attempt, timeout)

    def _check_new_rows(self, partition: str, indexes: list[int], fields: Any) -> None:
        """Raise StaleMetaError if samples ``indexes`` of a new put already hold a row of
        ``fields`` here: the put's samples were cleared and their reused indexes belong to a
        newer put, whose rows must not be overwritten (the controller refuses the stale
        put's data update too)."""
        if any(self.shard.has_any(partition, indexes, n) for n in fields):
            raise StaleMetaError(
                f"samples of {partition!r} were cleared during the put; their indexes hold "
                "another put's rows now"
            )

    async def _until_room(
        self, attempt: Callable[[], T], timeout: float, preempt: bool = True
    ) -> T:
        """``attempt()``, retried after every delete while it raises StoreFullError, until
        ``timeout`` seconds have passed (then the StoreFullError is raised). ``preempt``: a
        full unit, or a schema that conflicts with a column, first gives up the spare
        reservations clients leased ahead (their puts then reserve again), so a lease never
        takes room or fixes a dtype another write needs."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + max(0.0, timeout)
        while True:
            freed = self._freed
            try:
                return attempt()
            except SchemaError:
                if preempt and self._drop_spares():
                    continue  # a column held only by spare slots keeps no dtype
                raise
            except WriteTooLargeError:
                raise  # can never fit: waiting would only delay the error
            except StoreFullError:
                if preempt and self._drop_spares():
                    continue
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

    @endpoint
    async def read(
        self, partition: str, indexes: list[int], fields: list[str] | None = None
    ) -> Any:
        """Samples ``indexes`` of ``partition`` as a TensorDict on this unit's device.

        Raises UnknownPartitionError, UnknownFieldError, StoreInputError.
        """
        await self._loaded()
        td = self.shard.read(partition, indexes, fields)
        if self.shard.device.type == "cuda":
            await asyncio.to_thread(self._sync_device)
        self._gets.add(len(indexes))
        return td

    @endpoint
    async def delete(self, plan: dict[str, list[int]]) -> int:
        """Delete rows ``{partition: [indexes]}`` (absent ones ignored); returns bytes freed."""
        await self._loaded()
        freed = 0
        for partition, indexes in plan.items():
            freed += self.shard.delete(partition, indexes)
        self._notify_freed()
        return freed

    @endpoint
    async def delete_fields(self, plan: dict[str, dict[str, list[int]]]) -> int:
        """Delete fields of rows ``{partition: {field: [indexes]}}`` (a failed column-wise
        put's); absent ones ignored. Returns bytes freed."""
        await self._loaded()
        freed = 0
        for partition, fields in plan.items():
            for name, indexes in fields.items():
                freed += self.shard.delete(partition, indexes, [name])
        self._notify_freed()
        return freed

    @endpoint
    async def drop_partition(self, partition: str) -> int:
        """Delete a whole partition; returns bytes freed."""
        await self._loaded()
        freed = self.shard.drop_partition(partition)
        self._notify_freed()
        return freed

    @endpoint
    async def kv_put(
        self, keys: list[str], td: Any, timeout: float = 0.0
    ) -> dict[str, FieldSchema]:
        """Store ``td``'s rows under ``keys``; returns the written fields' schemas.

        Waits up to ``timeout`` for room like :meth:`write`; raises like ShardStorage.kv_put.
        """
        await self._loaded()
        schemas = await self._until_room(functools.partial(self.shard.kv_put, keys, td), timeout)
        del td
        if self.shard.device.type == "cuda":
            await asyncio.to_thread(self._sync_device)
        return dict(schemas)

    @endpoint
    async def kv_get(self, keys: list[str], fields: list[str] | None = None) -> Any:
        """The rows under ``keys``. Raises UnknownKeyError, UnknownFieldError."""
        await self._loaded()
        td = self.shard.kv_get(keys, fields)
        if self.shard.device.type == "cuda":
            await asyncio.to_thread(self._sync_device)
        return td

    @endpoint
    async def kv_list(self) -> list[str]:
        """Keys held here, in insertion order."""
        await self._loaded()
        return self.shard.kv_list()

    @endpoint
    async def kv_delete(self, keys: list[str]) -> int:
        """Delete ``keys`` (absent ones ignored); returns how many were deleted."""
        await self._loaded()
        n = self.shard.kv_delete(keys)
        self._notify_freed()
        return n

    @endpoint
    async def stats(self) -> UnitStats:
        """Bytes used, capacity, rows per partition, KV keys, puts/gets (rows: total and per
        second over the last 10 s)."""
        await self._loaded()
        spare = sum(1 for r in self._reservations.values() if r.spare)
        return UnitStats.of(
            self.shard.stats(),
            spare_bytes=self._spare_bytes(),
            incarnation=self.incarnation,
            puts=self._puts.snapshot(),
            gets=self._gets.snapshot(),
            reservations=len(self._reservations) - spare,  # same-host puts under way
            spare=spare,  # reservations clients leased ahead of their next puts
            reserving=sum(len(t) for t in self._waiting.values()),  # reserves waiting for room
        )

    @endpoint
    async def watch(self) -> None:
        """Return only when this unit shuts down: the controller's death watch on it."""
        await self._stop.wait()

    # -- same-host reserve, commit, locate ----------------------------------------------------

    @endpoint
    async def local_info(self) -> LocalInfo:
        """This unit's host and how same-host clients reach its dense columns."""
        shm = shm_columns_enabled()  # (as _new_shard chooses: no torch needed to tell)
        cuda = shm and self.device.startswith("cuda")
        gpu_uuid = None
        if cuda:
            from rayless.store.samehost.columns_cuda import cuda_uuid

            gpu_uuid = cuda_uuid(self.shard.device)
        return LocalInfo(host_id(), shm and not cuda, cuda, gpu_uuid)

    def _share(self, col: ShmDense, known: list[str] | None) -> list[Any] | None:
        """The IPC share a same-host client opens for a CUDA column whose lease segment is
        not in ``known`` (None: a CPU column, or one the client has opened)."""
        from rayless.store.samehost.columns_cuda import CudaDense

        seg = col.segment
        wants_share = known is not None and seg is not None and seg.name not in known
        if isinstance(col, CudaDense) and wants_share:  # known None: a CPU-only client
            return col.export()
        return None

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
            self._notify_freed()

    def _spare_bytes(self) -> int:
        """Bytes that giving up the spare reservations would free (the columns that hold
        nothing else): what a writer that needs room may count as free."""
        rows: dict[int, tuple[Any, int]] = {}
        for res in self._reservations.values():
            if res.spare:
                for col, _, slots in res.columns.values():
                    rows[id(col)] = (col, rows.get(id(col), (col, 0))[1] + len(slots))
        total = 0
        for col, spare in rows.values():
            if len(col) == spare:  # (slots of a column that holds more free no bytes)
                total += int(col.nbytes)
        return total

    def _drop_spares(self) -> bool:
        """Give back every spare (leased-ahead) reservation; whether there was one."""
        spares = [t for t, r in self._reservations.items() if r.spare]
        for token in spares:
            self._drop_reservation(token)
        return bool(spares)

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
        for name, (col, _, _) in res.columns.items():
            self.shard.drop_part(res.partition, name, col)  # (if it holds nothing now)
        return True

    def _reserve_now(
        self,
        partition: str,
        idx: list[int] | int,
        dense: dict[str, FieldSchema],
        known: list[str] | None = None,
        spare: bool = False,
    ) -> Reservation:
        from rayless.store.samehost.columns import ShmDense, row_bytes_of
        from rayless.store.unit.columns import _Parts, dense_part, part_schema, with_part

        count = idx if isinstance(idx, int) else len(idx)
        cols = self.shard._parts.get(partition, {})
        plan: dict[str, tuple[ShmDense | None, FieldSchema]] = {}
        fields: dict[str, FieldSchema] = {}  # the fields' merged schemas
        own = 0
        for name, schema in dense.items():
            if schema.kind != "dense" or schema.is_multi_shape:
                raise SchemaError(f"field {name!r} is not dense")
            field = cols.get(name)
            if field is not None and not isinstance(field, (ShmDense, _Parts)):
                raise SchemaError(f"field {name!r} is not a dense column on this unit")
            fields[name] = schema if field is None else field.schema.merged(schema, name)
            old = dense_part(field, schema.shape or ())  # the part of this shape
            assert old is None or isinstance(old, ShmDense)
            plan[name] = (old, part_schema(fields[name], schema.shape or ()))
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
        if spare and needed and budget is not None and 2 * needed > budget:
            # a spare grows columns only while the unit keeps as much room free as it takes
            raise StoreFullError(self.unit_id, needed, budget, cap or 0)
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
        out: dict[str, Slots] = {}
        taken: dict[str, tuple[ShmDense, torch.Tensor, list[int]]] = {}
        cols = self.shard._parts.setdefault(partition, cols)
        for name, col in made.items():
            cols[name] = with_part(cols.get(name), col, fields[name])
            slots = col.take_slots(count)
            col.pending += len(slots)
            taken[name] = (col, col.data, slots)
            seg = None if col.segment is None else col.segment.name
            out[name] = Slots(seg, col.capacity, col.fence, slots, self._share(col, known))
        token = uuid.uuid4().hex
        rows = None if isinstance(idx, int) else idx
        owner = current_caller()
        expires = time.monotonic() + self.reservation_ttl
        self._reservations[token] = _Reservation(
            partition, rows, taken, dict(dense), expires, owner, spare
        )
        if owner is not None:
            self._owned.setdefault(owner, set()).add(token)
        return Reservation(token, out)

    @endpoint
    async def reserve(
        self,
        partition: str,
        indexes: list[int] | int,
        dense: dict[str, FieldSchema],
        timeout: float = 0.0,
        known: list[str] | None = None,
        spare: bool = False,
    ) -> Reservation:
        """Slots for the dense fields ``dense`` (their schemas) of samples ``indexes``: the
        reservation's token and each field's slots in its column. ``indexes`` may be a
        count: slots reserved while the controller still allocates the samples (their indexes
        then come with ``commit``). ``known``: the CUDA columns (lease segment names) the
        client has opened; the others come with their IPC share (``Slots.ipc``). ``spare``: a
        client's reservation ahead of its next put (store.client.leases): it never waits for
        room nor takes another spare's, grows columns only while the unit keeps as much room
        free as it takes (StoreFullError), and a write that finds the unit full takes its
        slots (the put then reserves again).

        Waits up to ``timeout`` for room like ``write``. Raises SchemaError, StoreInputError,
        StoreFullError, WriteTooLargeError (nothing changed but the columns' growth).
        """
        await self._loaded()
        from rayless.store.unit.shard import _check_indexes, _check_partition

        self._expire()
        part = _check_partition(partition)
        idx: list[int] | int
        if isinstance(indexes, int) and not isinstance(indexes, bool):
            if indexes < 0:
                raise StoreInputError(f"a reservation of {indexes} rows")
            idx = indexes
        else:
            idx = _check_indexes(indexes)
        declared = _schemas(dense)
        caller, task = current_caller(), asyncio.current_task()
        if caller is not None and task is not None:  # cancelled if the caller goes meanwhile
            self._waiting.setdefault(caller, set()).add(task)
        try:
            return await self._until_room(
                lambda: self._reserve_now(part, idx, declared, known, spare),
                0.0 if spare else timeout,
                preempt=not spare,
            )
        finally:
            waiting = self._waiting.get(caller) if caller is not None else None
            if waiting is not None:
                waiting.discard(task)
                if not waiting:
                    del self._waiting[caller]  # type: ignore[arg-type]

    @endpoint
    async def commit(
        self,
        token: str,
        rest: Any,
        schemas: dict[str, FieldSchema],
        timeout: float = 0.0,
        indexes: list[int] | None = None,
        put_id: int | None = None,
        generation: int | None = None,
    ) -> None:
        """Finish reservation ``token``: write the other fields ``rest`` (a TensorDict or None),
        make the reserved slots hold their rows, return after the controller's ACK.
        ``indexes``: the samples of a reservation made by count (one per reserved row);
        ``put_id``: the column-wise put it belongs to; ``generation``: as for ``write``
        (StaleMetaError, nothing written, when the samples hold another put's rows).

        Raises StoreError for an unknown (expired, released, its client gone) token,
        StoreInputError for indexes that do not fit the reservation, what ``write`` raises
        for ``rest``; on any error the reservation is released and nothing stays written.
        """
        await self._loaded()
        import torch

        from rayless.store.unit.shard import _check_indexes

        res = self._reservations.get(token)
        if res is None:
            raise StoreError("the same-host put's reservation expired or is unknown")
        res.spare = False  # its put is committing: no longer room to give up
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
        fresh = [n for n in schemas if not self.shard.has_any(part, idx, n)]
        if generation is not None and len(fresh) != len(schemas):
            self._drop_reservation(token)
            self._check_new_rows(part, idx, schemas)  # raises StaleMetaError
        try:
            reported: dict[str, FieldSchema] = {}
            shapes: dict[str, list[tuple[int, ...]]] = {}
            if rest is not None:
                declared = {k: v for k, v in _schemas(schemas).items() if k not in res.columns}
                new = generation is not None
                update = await self._write_when_room(part, idx, rest, declared, timeout, new)
                reported.update(update.schemas)
                shapes.update(update.sample_shapes)
            del rest
            taken = generation is not None and any(  # another put's rows came meanwhile
                self.shard.has_any(part, idx, n) for n in res.columns
            )
            if taken or self._reservations.get(token) is not res:  # or expired, dropped
                written = [n for n in fresh if n not in res.columns]
                if written:
                    self.shard.delete(part, idx, written)
                if taken:
                    self._check_new_rows(part, idx, res.columns)  # raises StaleMetaError
                raise StoreError("the same-host put's reservation expired during its commit")
        except BaseException:
            self._drop_reservation(token)
            raise
        from rayless.store.unit.columns import _Parts, dense_part, with_part

        cols = self.shard._parts.get(part, {})
        gone = [
            n
            for n, (col, _, _) in res.columns.items()
            if (n in cols and dense_part(cols[n], _Parts.shape_of(col)) is not col)
            or (col.segment is None and col.capacity)
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
            cols[name] = with_part(cols.get(name), col)
            self.shard.moved(cols, name, col, idx)  # rows of another shape it replaces
            reported[name] = res.schemas[name]
        if self.shard.device.type == "cuda":
            await asyncio.to_thread(self._sync_device)
        try:
            await self.controller.on_data_update(
                self.unit_id,
                DataUpdate(part, idx, reported, shapes, put_id, generation),
            )
        except BaseException:
            if fresh:
                self.shard.delete(part, idx, fresh)
                self._notify_freed()
            raise
        self._puts.add(len(idx))

    @endpoint
    async def release(self, token: str) -> bool:
        """Give back reservation ``token`` (a failed same-host put); whether it was still live
        (False: unknown or expired, and nothing done)."""
        live = self._drop_reservation(token)
        self._notify_freed()
        return live

    @endpoint
    async def locate(
        self,
        partition: str,
        indexes: list[int],
        dense: list[str],
        rest: list[str],
        known: list[str] | None = None,
    ) -> Located:
        """Where the dense fields ``dense`` of samples ``indexes`` are (one place per column
        part holding some: a multi-shape field's rows may sit in several, each place with the
        positions ``at`` of its rows in ``indexes``), and the rows of the other fields
        ``rest``; ``known`` as for ``reserve``. Raises like ``read``."""
        await self._loaded()
        import torch

        from rayless.store.samehost.columns import ShmDense
        from rayless.store.unit.columns import _Parts
        from rayless.store.unit.shard import _check_indexes, _check_partition, _Rows

        part = _check_partition(partition)
        idx = _check_indexes(indexes)
        cols = self.shard._parts.get(part)
        if cols is None:
            self.shard.read(part, idx, dense or rest)  # raises UnknownPartitionError
        fields: dict[str, list[Place]] = {}
        for name in dense:
            col = (cols or {}).get(name)
            if not isinstance(col, (ShmDense, _Parts)):
                self.shard.read(part, idx, [name])  # raises the typed error
                raise SchemaError(f"field {name!r} is not a shared-memory column here")
            if isinstance(col, ShmDense):  # one shape (the usual case)
                missing = [i for i in idx if i not in col.slot_of]
                if missing:
                    self.shard.read(part, idx, [name])  # raises UnknownFieldError
                fields[name] = [self._place(col, known, [col.slot_of[i] for i in idx])]
                continue
            if any(i not in col for i in idx):
                self.shard.read(part, idx, [name])  # raises UnknownFieldError
            groups = col.groups(idx)
            places = []
            for one, at in groups:  # one per per-sample shape (a multi-shape field's parts)
                assert isinstance(one, ShmDense)
                slots = [one.slot_of[idx[k]] for k in at]
                places.append(self._place(one, known, slots, list(at)))
            # one shape: as ever (the client copies into one dense tensor); several: each
            # part's rows with their positions in ``indexes`` (the client copies each into a
            # piece of that shape and nests them: store/samehost/shapes.py)
            if len(places) == 1:
                places = [replace(places[0], at=None)]
            fields[name] = places
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
        self._gets.add(len(idx))
        return Located(fields, packed)

    def _place(
        self, col: ShmDense, known: list[str] | None, slots: list[int], at: list[int] | None = None
    ) -> Place:
        """Where rows ``slots`` of column ``col`` are for a same-host client (``at``: their
        positions in the located indexes, for a field whose rows sit in several parts)."""
        from rayless.store.unit.columns import _Parts

        seg = None if col.segment is None else col.segment.name
        shape = list(_Parts.shape_of(col))
        share = self._share(col, known)
        return Place(seg, col.capacity, col.generation, slots, shape, share, at)
