"""Dense columns in shared memory: what same-host clients write into and read from directly.

A CPU storage unit keeps each dense column's tensor in one
:class:`~rayless.transport.segments.Segment`
(``/dev/shm/rayless-<pid>-<start>-<serial>-<hex>``: the agent's sweep removes it after kill -9, the
unit unlinks it at exit). Same-host clients map it (:mod:`rayless.store.samehost.plane`): a put's
rows are copied by the client straight into slots the unit reserved for them, a get's rows are
copied straight out of their slots.

Readers never see bytes change under them (the lease design):

* slots are copy-on-write: a write (or a reservation) always takes fresh slots; the slots it
  replaces and those of deleted rows go to ``quarantine``, not back to ``free``;
* a reader copies (or keeps a view) under a shared ``flock`` lease on the segment, after
  checking that the segment header's version still equals the ``generation`` the unit told it;
* quarantined slots become reusable only in :meth:`ShmDense.reclaim`, which takes the
  segment's lease exclusively *without waiting* (so only while no reader holds one), bumps the
  generation in the header and moves them to ``free``. A reader that located rows before a
  reclaim sees the new generation under its lease and locates again. While leases are held,
  writes take never-used slots (the column grows) instead of reusing;
* growing moves the column to a new segment and unlinks the old one: mappings readers hold
  keep the old bytes, which nobody writes again.

Writers are fenced the same way. A same-host client copies a put's rows into its reserved
slots itself, so the unit cannot stop a late copy; it makes one land nowhere visible instead:

* a reservation hands out the column's ``fence`` with its slots; the client copies only under
  a shared lease, after checking that the segment header still holds that fence;
* the slots of a reservation that is dropped (released, expired, its client gone) go to
  ``fenced``, never straight back to ``free``: a writer stalled past the drop may still copy
  into them, and they are visible to nobody;
* ``reclaim`` moves fenced slots to ``free`` only under the exclusive lease (so no writer is
  copying), and bumps the fence in the header first: a writer that wakes later sees another
  fence and copies nothing. Growing and pooling a segment set a fresh fence too (fences, like
  generations, never repeat in a process).
"""

from __future__ import annotations

import math
import os
from collections.abc import Iterable, Sequence

import torch

from rayless.store.data.dense import DenseColumn
from rayless.store.data.schema import FieldSchema
from rayless.transport import segments, shm
from rayless.transport.ext import HEADER, Segment

__all__ = ["POOL_MAX_BYTES", "ShmDense", "drain_pool", "forget", "row_bytes_of", "tensor_on"]


_POOL: list[Segment] = []  # segments of dropped columns, kept for the next column to reuse
POOL_MAX_BYTES = 1 << 30
# at most this share of /dev/shm stays pooled: a pooled segment is freed for the store but not
# for the host (a weight publish, another unit, a column of another size would get ENOSPC)
POOL_MAX_SHARE = 1 / 8
_GENERATION = [0]  # generations are unique per process: a reused segment never repeats one


def _next_generation() -> int:
    _GENERATION[0] += 1
    return _GENERATION[0]


def _segment_for(payload_bytes: int) -> Segment:
    """A segment of at least ``payload_bytes``: the smallest pooled one of at most twice that
    which no reader leases, else a new one of exactly that (when ``/dev/shm`` is full, the
    pool is unlinked first and the creation tried again). A column takes only the rows it
    asked for (its budget); the rest lets it grow in place (:meth:`ShmDense.grow`). So a
    store used with a new partition per step (put, get, ``clear_partition``) reuses the same
    segments step after step, including the room its client's lease grew them by, instead
    of creating, zero-filling and copying into new ones. Raises OSError when shared memory is
    exhausted."""
    fits = [s for s in _POOL if payload_bytes <= s.payload_bytes <= 2 * payload_bytes]
    for seg in sorted(fits, key=lambda s: s.payload_bytes):
        if seg.lock(True, False):
            _POOL.remove(seg)
            seg.unlock()
            return seg
    try:
        return Segment.create(payload_bytes)
    except OSError:
        if not _POOL:
            raise
    drain_pool()
    return Segment.create(payload_bytes)


def _pool_limit() -> int:
    """The bytes the pool may hold: ``POOL_MAX_BYTES``, at most ``POOL_MAX_SHARE`` of /dev/shm."""
    try:
        info = os.statvfs(shm.SHM_DIR)
    except OSError:
        return 0
    return min(POOL_MAX_BYTES, int(info.f_blocks * info.f_frsize * POOL_MAX_SHARE))


def _retire(seg: Segment) -> None:
    """Pool a dropped column's segment (if no reader leases it and room is left), else unlink
    it. Readers that still name it see a new generation once it is reused."""
    held = sum(s.payload_bytes for s in _POOL)
    if held + seg.payload_bytes <= _pool_limit() and seg.lock(True, False):
        seg._set_version(_next_generation())  # stale (name, generation) pairs fail now
        seg._set_fence(_next_generation())  # and so do stalled writers' (name, fence) pairs
        seg.unlock()
        _POOL.append(seg)
        while len(_POOL) > 8:
            forget(_POOL.pop(0), unlink=True)
        return
    forget(seg, unlink=True)


def drain_pool() -> None:
    """Unlink the pooled segments (the unit's exit)."""
    while _POOL:
        forget(_POOL.pop(), unlink=True)


def forget(seg: Segment, unlink: bool = False) -> None:
    """Close ``seg``'s file (dropping its lease) and unlink it if asked, but leave the mapping
    alive: tensors laid over it (:func:`tensor_on`) keep it, and it is unmapped when the last
    of them is freed. (``Segment.close`` unmaps at once: those tensors would then fault.)"""
    seg.payload.release()
    if seg.fd >= 0:
        os.close(seg.fd)
        seg.fd = -1
    if unlink:
        segments._unlink(seg.name)


def row_bytes_of(schema: FieldSchema) -> int:
    """Bytes of one row of a dense field."""
    dtype = schema.torch_dtype or torch.float32
    return math.prod(d or 0 for d in schema.shape or ()) * dtype.itemsize


def tensor_on(
    seg: Segment, dtype: torch.dtype, row_shape: Sequence[int], rows: int
) -> torch.Tensor:
    """The ``[rows, *row_shape]`` tensor laid over ``seg``'s payload (shares its memory)."""
    nbytes = rows * math.prod(row_shape) * dtype.itemsize
    if nbytes == 0:
        return torch.empty((rows, *row_shape), dtype=dtype)
    flat = torch.frombuffer(seg.mapping, dtype=torch.uint8, count=nbytes, offset=HEADER)
    return flat.view(dtype).view(rows, *row_shape)


class ShmDense(DenseColumn):
    """A dense column whose tensor lives in a shared-memory segment (see the module docstring)."""

    def __init__(self, schema: FieldSchema, device: torch.device) -> None:
        super().__init__(schema, device)
        self.segment: Segment | None = None
        self.generation = 0
        self.quarantine: list[int] = []
        self.fenced: list[int] = []  # slots of dropped reservations (a late copy may land)
        self.fence = 0  # what a writer must find in the segment header to copy
        self.pending = 0  # slots reserved by same-host puts, not committed yet

    def reclaim(self) -> bool:
        """Move quarantined and fenced slots to ``free`` if no reader or writer holds a lease;
        whether it did."""
        if not self.quarantine and not self.fenced:
            return True
        seg = self.segment
        if seg is not None:
            if not seg.lock(True, False):
                return False
            if self.quarantine:
                self.generation = _next_generation()
                seg._set_version(self.generation)
            if self.fenced:  # stalled writers of these slots find another fence: no copy
                self.fence = _next_generation()
                seg._set_fence(self.fence)
            seg.unlock()
        self.free.extend(self.quarantine)
        self.free.extend(self.fenced)
        self.quarantine.clear()
        self.fenced.clear()
        return True

    def _stamp(self, seg: Segment) -> None:
        """Give a segment the column moves to a fresh generation and fence."""
        self.generation = _next_generation()
        self.fence = _next_generation()
        seg._set_version(self.generation)
        seg._set_fence(self.fence)

    def growth(self, indexes: Sequence[int], budget: int) -> tuple[int, int]:
        """Like the base, but every row takes a fresh slot (copy-on-write)."""
        self.reclaim()
        return self._growth_for(len(indexes), budget)

    def grow(self, capacity: int) -> None:
        """Hold ``capacity`` rows: in place when the segment has room past the current rows
        (a pooled one bigger than asked; the rows stay where they are, and the new slots are
        nobody's yet), else on a new segment (the old one is unlinked; readers' mappings keep
        its bytes). Raises OSError when shared memory is exhausted."""
        row_shape = tuple(self.data.shape[1:])
        seg = self.segment
        if seg is not None and seg.payload_bytes >= capacity * row_bytes_of(self.schema):
            self._stamp(seg)
            self.data = tensor_on(seg, self.data.dtype, row_shape, capacity)
            return
        seg = _segment_for(capacity * row_bytes_of(self.schema))
        self._stamp(seg)
        bigger = tensor_on(seg, self.data.dtype, row_shape, capacity)
        if self.top:
            bigger[: self.top].copy_(self.data[: self.top])
        old, self.segment, self.data = self.segment, seg, bigger
        if old is not None:
            forget(old, unlink=True)

    def take_slots(self, n: int) -> list[int]:
        """``n`` fresh slots (room must have been made by :meth:`growth`/:meth:`grow`), in
        ascending order: freed slots come back as runs, so a put's rows stay one strided
        copy (and a get's one view) after clears."""
        free = self.free
        take = min(n, len(free))
        slots = sorted(free[len(free) - take :]) if take else []
        del free[len(free) - take :]
        if take < n:
            slots.extend(range(self.top, self.top + n - take))
            self.top += n - take
        return slots

    def assign(self, indexes: Sequence[int], slots: Sequence[int]) -> None:
        """Make ``slots`` hold rows ``indexes``; the slots they replace go to quarantine."""
        for i, slot in zip(indexes, slots, strict=True):
            old = self.slot_of.get(i)
            if old is not None:
                self.quarantine.append(old)
            self.slot_of[i] = slot

    def write(self, indexes: Sequence[int], value: torch.Tensor) -> None:
        slots = self.take_slots(len(indexes))
        where = torch.tensor(slots, dtype=torch.int64, device=self.data.device)
        self.data.index_copy_(0, where, value.to(self.data.device))
        self.assign(indexes, slots)

    def delete(self, indexes: Iterable[int]) -> None:
        for i in indexes:
            slot = self.slot_of.pop(i, None)
            if slot is not None:
                self.quarantine.append(slot)

    def __len__(self) -> int:
        return len(self.slot_of) + self.pending

    def close(self) -> None:
        """Pool the segment, or unlink it (readers' mappings stay valid). Slots still
        reserved (a same-host put's lease of its next rows, which verl's partition per step
        never uses) do not keep it out of the pool: pooling takes the exclusive lease and sets
        a new fence, so a writer copying now keeps it from the pool, and one that comes later
        finds another fence and copies nothing."""
        if self.segment is not None:
            _retire(self.segment)
            self.segment = None
