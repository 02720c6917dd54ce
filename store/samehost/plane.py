"""The client's same-host data plane: puts and gets straight into and out of a unit's segments.

A unit on this host (same :func:`~rayless.transport.protocol.host_id`, the transport's peer
host check) whose dense columns live in shared memory (:mod:`rayless.store.samehost.columns`) is
written and read without its bytes crossing the socket:

* put: ``reserve`` (control message) → the client copies each dense field's rows into the
  reserved slots (one copy per byte, in a thread) → ``commit`` carrying the other fields
  (nested, strings: the socket path). A failed put releases its reservation.
* get: ``locate`` → the client takes a shared lease on each segment, checks its generation,
  and copies the rows into the result (one copy per byte for runs of slots), or with
  ``zero_copy=True`` returns views of the unit's memory where a field's rows are one run of
  slots on one unit: each view holds its lease until its tensor storage is freed (a
  ``weakref.finalize`` on the buffer under it), and the unit reuses no slot of that segment
  meanwhile (its writes take never-used slots). Everything else falls back to copies.

A new put reserves its rows while the controller allocates its samples (``reserve_ahead``).
CUDA units on this host whose GPU this process sees work the same way with their columns
opened by CUDA IPC and device-to-device copies (:mod:`rayless.store.samehost.plane_cuda`; no views).
Units on other hosts, CUDA units this process cannot open and ``RAYLESS_STORE_LOCAL=0`` keep
the socket path; so do gets that meet lost samples or errors (the socket path raises the
typed errors).

The plane remembers which units run on this host (shared-memory or CUDA IPC columns), keeps
their column segments mapped (at most ``_MAX_OPEN`` unleased ones), takes and releases shared
leases on them (a segment's generation checked), opens CUDA columns from their IPC shares and
builds the column tensors (or zero-copy views that hold a lease of their own) that its puts
and gets copy into and out of.
"""

from __future__ import annotations

import asyncio
import math
import os
import threading
import weakref
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import torch
from tensordict import TensorDict

from rayless.actors import ActorDiedError
from rayless.store.data.messages import LocalInfo, Located, Place, Reservation, Slots, UnitView
from rayless.store.data.meta import BatchMeta
from rayless.store.data.packed import pack_columns
from rayless.store.data.rows import target_device
from rayless.store.data.schema import Column, FieldSchema, assemble, field_key
from rayless.store.errors import StoreError, StoreInputError, UnitLostError
from rayless.store.samehost import shapes
from rayless.store.samehost.columns import forget, tensor_on
from rayless.store.samehost.plane_cuda import open_column, ready_events, run_copies, visible_device
from rayless.store.samehost.results import result as _result
from rayless.store.samehost.slots import gather_rows as _rows
from rayless.store.samehost.slots import run_of as _run
from rayless.store.samehost.slots import scatter_rows as _scatter
from rayless.transport.ext import HEADER, Segment, Superseded, host_id

__all__ = ["LocalPlane"]

_RETRIES = 1000
# Copies of at most this many bytes run on the event loop: handing them to a thread and
# back costs two wake-ups, more than the copy (a 512 KiB memcpy takes ~40 us).
INLINE_COPY_BYTES = 512 << 10


_MAX_OPEN = 32


class _Mapped:
    def __init__(self, seg: Segment, tensor: torch.Tensor | None = None) -> None:
        self.seg = seg  # the column's segment (a CUDA column's: its lease segment)
        self.leases = 0
        self.tensor = tensor  # a CUDA column: the unit's tensor, opened by IPC


def _close_unleased(maps: dict[str, _Mapped], guard: threading.RLock) -> None:
    with guard:
        for name in [k for k, m in maps.items() if m.leases == 0]:
            forget(maps.pop(name).seg)


class LocalPlane:
    """One client's same-host plane: puts into and gets out of local units' columns, and the
    bookkeeping of units (which are local), mapped segments and leases."""

    def __init__(self) -> None:
        self.enabled = os.environ.get("RAYLESS_STORE_LOCAL", "1") != "0"
        self._host = host_id()
        self._local: dict[str, bool] = {}
        self._gpu: dict[str, torch.device] = {}  # CUDA units: their GPU as this process sees it
        self._maps: dict[str, _Mapped] = {}
        self._guard = threading.RLock()  # view finalizers may run inside it (GC)
        weakref.finalize(self, _close_unleased, self._maps, self._guard)
        self._drops: set[asyncio.Future[None]] = set()  # reservations being given back

    # -- put ----------------------------------------------------------------------------

    def reserve_ahead(
        self,
        unit: UnitView,
        partition: str,
        count: int,
        columns: Mapping[str, Column],
        schemas: Mapping[str, FieldSchema],
        timeout: float,
        spare: bool = False,
    ) -> asyncio.Future[Reservation]:
        """Reserve ``count`` rows of the dense ``columns`` on a unit while the controller still
        allocates the put's samples (one round trip less per put); pass the result to
        :meth:`put` as ``reserved``, or to :meth:`drop_later` if the allocation went elsewhere.
        ``spare``: for a lease (store.client.leases): no wait for room, given up when full."""
        dense = {k: schemas[k] for k in self.dense_for(unit, columns)}
        known = self.known(unit)
        call = unit.handle.reserve(partition, count, dense, timeout, known, spare)
        return asyncio.ensure_future(call)

    async def drop(self, handle: Any, reserved: asyncio.Future[Reservation]) -> None:
        """Give back a reservation made ahead that no put will use (errors ignored)."""
        await _drop(handle, reserved)

    def drop_later(self, handle: Any, reserved: asyncio.Future[Reservation]) -> None:
        """Give back a reservation made ahead that the put does not use, in the background
        (errors ignored; a client gone before it runs leaves it to the reservation's expiry)."""
        task = asyncio.ensure_future(_drop(handle, reserved))
        self._drops.add(task)
        task.add_done_callback(self._drops.discard)

    async def put(
        self,
        unit: UnitView,
        partition: str,
        indexes: list[int],
        columns: Mapping[str, Column],
        positions: list[int],
        n: int,
        schemas: Mapping[str, FieldSchema],
        timeout: float,
        reserved: asyncio.Future[Reservation] | None = None,
        put_id: int | None = None,
        generation: int | None = None,
    ) -> None:
        """Write one unit's rows of a put (see the module docstring), into the rows
        ``reserved`` ahead if given (its count must be ``len(indexes)``); ``put_id``: the
        column-wise put it belongs to; ``generation``: a new put's allocation (checked by
        the unit and the controller). Raises like ``write``."""
        handle, gpu = unit.handle, self.gpu_of(unit)
        wire = dict(schemas)
        dense = self.dense_for(unit, columns)
        if not dense:
            sub = pack_columns(columns, positions)
            await handle.write(partition, indexes, sub, wire, timeout, put_id, generation)
            return
        res: Reservation
        if reserved is None:
            want = {k: wire[k] for k in dense}
            res = await handle.reserve(partition, indexes, want, timeout, self.known(unit))
        else:
            res = await reserved
        token = res.token
        try:
            events: list[Any] = []
            if gpu is not None:
                self._map_cuda(res.fields, {k: c.schema for k, c in dense.items()})
                events = ready_events(c.dense for c in dense.values() if c.dense is not None)
            args = (res.fields, dense, positions, events, gpu)
            rows_bytes = sum(_row_bytes(c.dense) for c in dense.values()) * len(positions)
            if gpu is None and rows_bytes <= INLINE_COPY_BYTES:
                copied = self._copy_in(*args)  # cheaper than the hand-off to a thread
            else:
                copied = await asyncio.to_thread(self._copy_in, *args)
            if not copied:  # the column moved or fenced its writers: the socket path
                if not await handle.release(token):
                    raise StoreError("the same-host put's reservation expired before its copy")
                sub = pack_columns(columns, positions)
                await handle.write(partition, indexes, sub, wire, timeout, put_id, generation)
                return
            rest = {k: c for k, c in columns.items() if k not in dense}
            others = pack_columns(rest, positions) if rest else None
            index_list = indexes if reserved else None
            await handle.commit(token, others, wire, timeout, index_list, put_id, generation)
        except BaseException:
            asyncio.ensure_future(_quiet(handle.release(token)))
            raise

    def _copy_in(
        self,
        fields: Mapping[str, Slots],
        dense: Mapping[str, Column],
        positions: list[int],
        events: list[Any],
        gpu: torch.device | None,
    ) -> bool:
        """Copy a put's dense rows into their reserved slots, each segment under a shared
        lease while its header holds the reservation's fence; False: the column moved or
        fenced this reservation's writers (see columns.py), nothing more is copied."""
        copies: list[tuple[torch.Tensor, list[int], torch.Tensor]] = []
        held: list[_Mapped] = []
        try:
            for name, where in fields.items():
                col = dense[name]
                if where.segment is None or col.dense is None:
                    continue  # rows of zero bytes
                m = self._acquire(where.segment, fence=where.fence)
                if m is None:
                    return False
                held.append(m)
                if gpu is not None and m.tensor is None:
                    return False  # not opened (evicted meanwhile): the socket path
                dst = self._view(m, col.schema, where.rows, own=False)
                copies.append((dst, where.slots, col.dense))
            if gpu is None:
                for dst, slots, src in copies:
                    _scatter(dst, slots, _rows(src, positions))
                return True
            devices = {gpu, *(src.device for _, _, src in copies)}

            def copy() -> None:
                for dst, slots, src in copies:
                    _scatter(dst, slots, _rows(src, positions))

            run_copies(events, devices, copy)
            return True
        finally:
            for m in held:
                self._release(m)

    # -- get ----------------------------------------------------------------------------

    async def get(
        self,
        controller: Any,
        table: Sequence[UnitView],
        meta: BatchMeta,
        names: list[str],
        groups: dict[tuple[int, str], list[int]],
        zero_copy: bool = False,
        device: Any = None,
    ) -> TensorDict | None:
        """``meta``'s fields ``names`` read through the units' memory (CPU tensors; a CUDA
        unit's: on its GPU), or None when the socket path must do it (a unit is remote, lost
        samples, any error). ``table``: the store's units (shard order); ``controller``: its
        controller's handle."""
        units = [table[shard] for shard, _ in groups]
        for unit in units:
            if not await self.is_local(unit):
                return None
        gpus = {self.gpu_of(unit) for unit in units}
        if len(gpus) != 1:
            return None  # CPU and CUDA units in one get: the socket path merges them
        gpu = gpus.pop()
        schemas = meta.field_schemas
        dense = [k for k in names if schemas[k].kind == "dense"]
        if not dense:
            return None
        rest = [k for k in names if k not in dense]
        known = meta.sample_shapes
        if any(
            schemas[k].is_nested and (k not in known or any(x is None for x in known[k]))
            for k in rest
        ):
            return None  # shapes unknown here: the socket path rebuilds them
        calls = [controller.lost_positions(meta)]
        for (_, part), positions in groups.items():
            idx = [meta.global_indexes[p] for p in positions]
            unit = units[len(calls) - 1]
            calls.append(unit.handle.locate(part, idx, dense, rest, self.known(unit)))
        results = await asyncio.gather(*calls, return_exceptions=True)
        if isinstance(results[0], BaseException):
            raise results[0]
        if results[0] or any(isinstance(r, BaseException) for r in results[1:]):
            return None
        located: list[Located] = list(results[1:])  # type: ignore[arg-type]
        shaped = shapes.plan(schemas, dense, located, list(groups.values()))
        if shaped is None:
            return None  # a shape the meta does not know: the socket path says why
        schemas = shaped.schemas  # (multi-shape fields: their shapes here; see shapes.py)
        size = meta.size
        view = zero_copy and len(groups) == 1 and gpu is None
        out: dict[str, torch.Tensor] = {}
        for name in shaped.names:  # allocated here: the copies of the units run in parallel
            schema = schemas[name]
            rows = shaped.rows.get(name, size)  # (a piece of a field that mixes shapes: fewer)
            shape = tuple(int(d or 0) for d in schema.shape or ())
            dtype = schema.torch_dtype or torch.float32
            if gpu is not None:  # straight onto the field's device (``place`` then keeps it)
                target = target_device(device, schema.device)
                out[name] = torch.empty((rows, *shape), dtype=dtype, device=target)
            elif not view or name in shaped.rows:
                out[name] = _result((rows, *shape), dtype)
        if gpu is not None:
            for places in shaped.places:
                self._map_cuda(places, schemas)
        events = ready_events(out.values()) if gpu is not None else []
        copies = [
            self._read_group(
                units[g],
                part,
                meta,
                schemas,
                positions,
                dense,
                rest,
                (located[g], shaped.places[g]),
                out,
                view,
                events,
            )
            for g, ((_, part), positions) in enumerate(groups.items())
        ]
        done = await asyncio.gather(*copies)
        if any(r is None for r in done):
            return None
        # Rows located again (their slots were reclaimed: a clear ran meanwhile, and the
        # indexes may hold newer samples now): the meta must still be current (else
        # StaleMetaError); a unit that died meanwhile leaves the socket path to return the
        # live part (PartialResultError), never a bare UnitLostError.
        relocated = any(r[2] for r in done if r is not None)
        if relocated and await controller.lost_positions(meta):
            return None
        parts = [(r[0], r[1]) for r in done if r is not None]
        td = assemble(size, {k: (schemas[k], _unpack(meta, k, size, parts)) for k in rest})
        for name, pieces in shaped.pieces.items():  # fields whose rows mix shapes: nested
            td.set(field_key(name), shapes.nest(size, schemas[name], pieces, out))
        for name in dense:
            if name not in shaped.pieces:
                td.set(field_key(name), out[name])
        return td

    async def _read_group(
        self,
        unit: UnitView,
        part: str,
        meta: BatchMeta,
        schemas: Mapping[str, FieldSchema],
        positions: list[int],
        dense: list[str],
        rest: list[str],
        found: tuple[Located, dict[str, Place]],
        out: dict[str, torch.Tensor],
        view: bool,
        events: list[Any],
    ) -> tuple[list[int], Any, bool] | None:
        """Copy one unit's rows into ``out`` (``schemas``: the meta's, with the shape
        ``locate`` found for a multi-shape field; ``found``: the unit's answer and the places
        the plan copies from); ``(positions, other fields, whether the rows were located
        again)``, None: give up."""
        gpu = self.gpu_of(unit)
        located, places = found
        for attempt in range(_RETRIES):
            args = (places, schemas, positions, meta.size, out, view, events, gpu)
            nbytes = sum(_schema_row_bytes(schemas[k]) for k in places) * len(positions)
            small = gpu is None and nbytes <= INLINE_COPY_BYTES
            if self._copy_out(*args) if small else await asyncio.to_thread(self._copy_out, *args):
                return positions, located.rest, attempt > 0
            idx = [meta.global_indexes[p] for p in positions]
            try:
                if any(w.to is not None for w in places.values()):
                    return None  # (a read mixing shapes located again: the socket path)
                located = await unit.handle.locate(part, idx, dense, rest, self.known(unit))
                again = shapes.plan(schemas, dense, [located], [positions])
                if again is None or again.pieces or again.schemas != schemas:
                    return None  # another shape there now: a stale meta (the socket path)
                places = again.places[0]
                if gpu is not None:
                    self._map_cuda(places, schemas)
            except (ActorDiedError, UnitLostError, StoreInputError):
                return None  # the socket path raises the typed error (StaleMetaError...)
            if attempt > 10:
                await asyncio.sleep(0.001)  # the unit is reclaiming slots: let it finish
        return None

    def _copy_out(
        self,
        fields: Mapping[str, Place],
        schemas: Mapping[str, FieldSchema],
        positions: list[int],
        size: int,
        out: dict[str, torch.Tensor],
        view: bool,
        events: list[Any],
        gpu: torch.device | None,
    ) -> bool:
        """Copy (or view) one unit's dense rows into ``out``; False: locate again."""
        held: dict[str, _Mapped] = {}
        try:
            for name, where in fields.items():
                schema = schemas[name]
                if where.segment is None:
                    continue
                m = self._acquire(where.segment, where.generation)
                if m is None:
                    return False
                held[where.segment] = m
                if gpu is not None and m.tensor is None:
                    return False  # not opened yet: locate again (the share comes then)
            if gpu is not None:  # one device-to-device copy per byte, under the leases
                copies: list[tuple[torch.Tensor, torch.Tensor, list[int], list[int]]] = []
                for name, w in fields.items():
                    src = held[w.segment].tensor if w.segment is not None else None
                    if src is not None:  # ("to": a piece of a field that mixes shapes)
                        to = w.to if w.to is not None else positions
                        copies.append((out[name], src, w.slots, to))
                devices = {gpu, *(dst.device for dst, _, _, _ in copies)}

                def copy() -> None:
                    for dst, src, slots, to in copies:
                        _scatter(dst, to, _rows(src, slots))

                run_copies(events, devices, copy)
                return True
            for name, where in fields.items():
                schema = schemas[name]
                dtype = schema.torch_dtype or torch.float32
                shape = tuple(int(d or 0) for d in schema.shape or ())
                # (``to``: a piece of a field that mixes shapes)
                to = where.to if where.to is not None else positions
                if where.segment is None:
                    if name not in out:
                        out[name] = torch.empty((size, *shape), dtype=dtype)
                    continue
                m = held[where.segment]
                slots = where.slots
                run = _run(slots)
                if view and run is not None and run[1] == 1 and to == list(range(size)):
                    src = self._view(m, schema, where.rows, own=True)
                    out[name] = src.narrow(0, run[0], len(slots))
                    continue
                src = self._view(m, schema, where.rows, own=False)
                dst = out.get(name)
                if dst is None:
                    dst = out[name] = _result((size, *shape), dtype)
                _scatter(dst, to, _rows(src, slots))
            return True
        finally:
            for m in held.values():
                self._release(m)

    # -- units, mappings, leases -----------------------------------------------------------------

    def close(self) -> None:
        """Drop the mappings no view uses (views keep theirs until freed). Idempotent."""
        _close_unleased(self._maps, self._guard)
        self._local.clear()

    async def is_local(self, unit: UnitView) -> bool:
        """Whether ``unit`` runs on this host with shared-memory columns."""
        if not self.enabled or unit.handle is None:
            return False
        key = unit.unit_id
        if key not in self._local:
            try:
                info: LocalInfo = await unit.handle.local_info()
            except ActorDiedError:
                return False
            except Exception:  # not reachable now: the socket path will say why
                return False
            same = info.host == self._host
            gpu = visible_device(info.gpu_uuid) if info.cuda_ipc else None
            if same and gpu is not None:
                self._gpu[key] = gpu
            self._local[key] = same and (info.shm or gpu is not None)
        return self._local[key]

    def gpu_of(self, unit: UnitView) -> torch.device | None:
        """A local CUDA unit's GPU (after :meth:`is_local`), None for a CPU unit."""
        return self._gpu.get(unit.unit_id)

    def dense_for(self, unit: UnitView, columns: Mapping[str, Column]) -> dict[str, Column]:
        """The columns a same-host put writes straight into ``unit``'s columns: dense CPU
        tensors, and for a CUDA unit dense tensors on any device."""
        cuda = self.gpu_of(unit) is not None
        return {
            k: c
            for k, c in columns.items()
            if c.dense is not None and (cuda or c.dense.device.type == "cpu")
        }

    def known(self, unit: UnitView) -> list[str] | None:
        """For a CUDA unit: the columns (lease segments) this client has opened, which the
        unit then sends no IPC share for; None for a CPU unit."""
        if self.gpu_of(unit) is None:
            return None
        with self._guard:
            return [k for k, m in self._maps.items() if m.tensor is not None]

    def _map_cuda(
        self, fields: Mapping[str, Slots | Place], schemas: Mapping[str, FieldSchema]
    ) -> None:
        """Open the CUDA columns whose IPC shares came with ``fields`` (reserve, locate)."""
        for name, where in fields.items():
            ipc, seg_name = where.ipc, where.segment
            if ipc is None or seg_name is None:
                continue
            tensor = open_column(ipc, schemas[name].torch_dtype or torch.float32)
            try:
                seg = Segment.open(seg_name)
            except Superseded:
                continue  # the column moved on: the copy locates again
            with self._guard:
                old = self._maps.get(seg_name)
                if old is not None and old.tensor is not None:
                    forget(seg)
                    continue
                if old is not None and old.leases == 0:
                    forget(old.seg)
                self._maps[seg_name] = _Mapped(seg, tensor)

    def _open(self, name: str) -> _Mapped:
        """The mapping of segment ``name``, opened if needed; call with ``_guard`` held (an
        unleased mapping may be evicted by the next open). Raises Superseded when it is gone."""
        m = self._maps.get(name)
        if m is None:
            full = len(self._maps) >= _MAX_OPEN
            for old in [k for k, v in self._maps.items() if v.leases == 0]:
                if full or (self._maps[old].tensor is None and self._maps[old].seg.unlinked()):
                    forget(self._maps.pop(old).seg)  # an unlinked one: its memory goes back
            m = self._maps[name] = _Mapped(Segment.open(name))
        return m

    def _acquire(
        self, name: str, generation: int | None = None, fence: int | None = None
    ) -> _Mapped | None:
        """A shared lease on segment ``name`` while it holds ``generation`` (a reader's check)
        and ``fence`` (a writer's: see columns.py); None: locate or reserve again.

        Opening and leasing happen under one hold of ``_guard``: a mapping another thread
        evicts or closes is never one this call is about to lock."""
        with self._guard:
            try:
                m = self._open(name)
            except Superseded:
                return None
            if m.leases == 0 and not m.seg.lock(False, False):
                return None  # the unit is reclaiming slots right now
            m.leases += 1
        stale_gen = generation is not None and m.seg.version != generation
        if stale_gen or (fence is not None and m.seg.fence != fence):
            self._release(m)
            return None
        return m

    def _release(self, m: _Mapped) -> None:
        with self._guard:
            m.leases -= 1
            if m.leases == 0 and m.seg.fd >= 0:
                m.seg.unlock()
                if self._maps.get(m.seg.name) is not m:
                    forget(m.seg)  # evicted or closed while a view held it

    def _view(self, m: _Mapped, schema: FieldSchema, rows: int, own: bool) -> torch.Tensor:
        """The column tensor on mapping ``m``; ``own``: its storage holds a lease of its own."""
        dtype = schema.torch_dtype or torch.float32
        shape = tuple(int(d or 0) for d in schema.shape or ())
        if m.tensor is not None:  # a CUDA column (no views with leases of their own)
            return m.tensor
        if not own:
            return tensor_on(m.seg, dtype, shape, rows)
        nbytes = rows * int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
        base = np.frombuffer(m.seg.mapping, dtype=np.uint8, count=nbytes, offset=HEADER)
        with self._guard:
            m.leases += 1  # the view's own lease, released when its storage is freed
        weakref.finalize(base, self._release, m)
        return torch.from_numpy(base).view(dtype).view(rows, *shape)


def _unpack(meta: BatchMeta, name: str, size: int, parts: list[tuple[list[int], Any]]) -> list[Any]:
    """Field ``name``'s rows in batch order from the units' packed answers (see ``locate``)."""
    rows: list[Any] = [None] * size
    nested = meta.field_schemas[name].is_nested
    for positions, packed in parts:
        value = packed[name]
        if nested and positions:
            shapes = [tuple(meta.sample_shapes[name][p] or ()) for p in positions]
            pieces = value.split([math.prod(s) for s in shapes])
            if all(len(s) == 1 for s in shapes):
                value = list(pieces)  # 1-D rows: the pieces are the rows
            else:
                value = [piece.view(s) for piece, s in zip(pieces, shapes, strict=True)]
        for p, row in zip(positions, value, strict=True):
            rows[p] = row
    return rows


def _row_bytes(t: torch.Tensor | None) -> int:
    """Bytes of one row of column tensor ``t`` (0 for None or no rows)."""
    if t is None or t.dim() == 0 or t.shape[0] == 0:
        return 0
    return int(t[0].numel()) * t.element_size()


def _schema_row_bytes(schema: FieldSchema) -> int:
    """Bytes of one row of a dense field of ``schema``."""
    dtype = schema.torch_dtype or torch.float32
    return math.prod(int(d or 0) for d in schema.shape or ()) * dtype.itemsize


async def _drop(handle: Any, reserved: asyncio.Future[Reservation]) -> None:
    try:
        res = await reserved
    except BaseException:
        return
    await _quiet(handle.release(res.token))


async def _quiet(call: Any) -> None:
    try:
        await call
    except BaseException:
        pass
