"""The records ControllerState's collaborators keep (units, samples, partitions, staged puts,
clear plans) and the argument checks they share. The underscored ones are private to the
controller package (its collaborators share them), not part of the store's API.

- :class:`UnitInfo`: a registered storage unit (on the wire: :meth:`UnitInfo.view`).
- :class:`ClearPlan`: the rows units delete after a clear, and the indexes to release then.
- ``_IndexTable``: where each global index lives (partition code, position), as columns.
- ``_Partition``: one partition as columns indexed by position in allocation order (global
  index, shard, generation, group, flags; a ready bitmap per field, a consumed bitmap per
  task), sparse custom metadata, KV keys and shapes, and the candidate sets of its fetches.
- ``_Candidates``: the ready and unconsumed positions of one (task, field set), so a
  sequential fetch costs O(batch) whatever the partition's size.
- ``_Staging``: one atomic put that has not committed yet (kept by ``StagedPuts``).
"""

from __future__ import annotations

import heapq
from collections.abc import Callable, Hashable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from rayless.store.data.fields import FieldSchema
from rayless.store.data.messages import FetchMode, UnitView
from rayless.store.data.meta import BatchMeta
from rayless.store.data.updates import DataUpdate
from rayless.store.errors import StoreInputError

__all__ = ["MODES", "ClearPlan", "EnvShards", "UnitInfo"]

EnvShards = Mapping[str, int] | Callable[[str], int]
MODES = tuple(m.value for m in FetchMode)


@dataclass
class UnitInfo:
    """A registered storage unit: its id, shard number, node, device and byte capacity."""

    unit_id: str
    shard: int
    node_id: str | None = None
    device: str = "cpu"
    capacity_bytes: int | None = None
    alive: bool = True

    def view(self, handle: Any = None) -> UnitView:
        """The unit as the controller tells it (with its actor ``handle``)."""
        return UnitView(
            self.unit_id,
            self.shard,
            self.node_id,
            self.device,
            self.capacity_bytes,
            self.alive,
            handle,
        )


@dataclass
class ClearPlan:
    """Rows the units must delete after a clear: ``{shard: {partition: [indexes]}}``.

    Pass ``indexes`` to :meth:`ControllerState.release` once the units have deleted them.
    """

    shards: dict[int, dict[str, list[int]]] = field(default_factory=dict)
    indexes: list[int] = field(default_factory=list)


# Per-sample flag bits of a partition's ``flags`` column.
STAGED = 1  # part of an atomic put that has not committed yet
LOST = 2  # its unit died and it was not rewritten since

_BLOCK_BITS = 8  # a candidate set keeps a heap of blocks of 256 positions
_MIN_CAP = 1024  # columns start at this many positions (a multiple of the block)
_MAX_TRACKERS = 32  # candidate sets kept per partition (the least recently made go first)


def _grown(column: np.ndarray, cap: int, fill: int = 0) -> np.ndarray:
    out = np.full(cap, fill, dtype=column.dtype)
    n = min(len(column), cap)
    out[:n] = column[:n]
    return out


_INT_TYPES = frozenset({int, np.int64, np.int32})


def as_indexes(values: Iterable[Any]) -> np.ndarray:
    """Global indexes as an int64 array. Raises StoreInputError for anything but ints."""
    seq = values if isinstance(values, (list, tuple)) else list(values)
    kinds = set(map(type, seq))  # one C-level pass; the per-item check only for odd types
    if not kinds <= _INT_TYPES and any(
        isinstance(v, bool) or not isinstance(v, (int, np.integer)) for v in seq
    ):
        raise StoreInputError("indexes must be ints")
    try:
        return np.asarray(seq, dtype=np.int64).reshape(-1)
    except OverflowError:
        raise StoreInputError("an index is out of range")


class _IndexTable:
    """Where each global index lives: its partition's code (-1: not allocated) and its
    position in that partition. Columns indexed by global index, grown by doubling."""

    def __init__(self) -> None:
        self.part = np.full(_MIN_CAP, -1, dtype=np.int32)
        self.pos = np.zeros(_MIN_CAP, dtype=np.int64)

    def reserve(self, high: int) -> None:
        """Room for global indexes below ``high``."""
        cap = len(self.part)
        if high <= cap:
            return
        while cap < high:
            cap *= 2
        self.part = _grown(self.part, cap, -1)
        self.pos = _grown(self.pos, cap)

    def lookup(self, code: int, idx: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """``(found, pos)``: which of ``idx`` are allocated in partition ``code``, and their
        positions there (meaningless where not found)."""
        inside = (idx >= 0) & (idx < len(self.part))
        safe = np.where(inside, idx, 0)
        found = inside & (self.part[safe] == code)
        return found, self.pos[safe]

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, _IndexTable):
            return NotImplemented
        return np.array_equal(self.part, other.part) and np.array_equal(self.pos, other.pos)


class _Candidates:
    """The positions of one partition that are ready for a set of fields and not consumed by
    one task: a bitmap plus a min-heap of the 256-position blocks that may hold some.

    Taking the oldest ``k`` examines the blocks they lie in (and blocks emptied since they
    were pushed, each at most once per push), so it costs O(k) amortised whatever the
    partition's size. ``examined`` counts the positions looked at, for tests.
    """

    def __init__(self, bits: np.ndarray) -> None:
        self.bits = bits
        self.count = int(np.count_nonzero(bits))
        blocks = bits.reshape(-1, 1 << _BLOCK_BITS).any(axis=1)
        self.in_heap = blocks.copy()
        self.heap: list[int] = np.flatnonzero(blocks).tolist()  # sorted: a valid heap
        self.examined = 0

    def grow(self, cap: int) -> None:
        """Room for ``cap`` positions."""
        self.bits = _grown(self.bits, cap)
        self.in_heap = _grown(self.in_heap, cap >> _BLOCK_BITS)

    def add(self, pos: np.ndarray) -> None:
        """Make ``pos`` (distinct positions) candidates."""
        new = pos[~self.bits[pos]]
        if not len(new):
            return
        self.bits[new] = True
        self.count += len(new)
        blocks = np.unique(new >> _BLOCK_BITS)
        for b in blocks[~self.in_heap[blocks]].tolist():
            heapq.heappush(self.heap, b)
        self.in_heap[blocks] = True

    def remove(self, pos: np.ndarray) -> None:
        """``pos`` (distinct positions) are no longer candidates (their blocks stay in the
        heap until a take finds them empty)."""
        hit = pos[self.bits[pos]]
        self.bits[hit] = False
        self.count -= len(hit)

    def take(self, k: int) -> np.ndarray:
        """The oldest ``k`` candidates (fewer if there are fewer), left in the set."""
        found: list[np.ndarray] = []
        have = 0
        keep: list[int] = []
        size = 1 << _BLOCK_BITS
        while have < k and self.heap:
            b = heapq.heappop(self.heap)
            seg = np.flatnonzero(self.bits[b * size : (b + 1) * size])
            self.examined += size
            if not len(seg):
                self.in_heap[b] = False
                continue
            keep.append(b)
            found.append(seg[: k - have] + b * size)
            have += len(found[-1])
        for b in keep:
            heapq.heappush(self.heap, b)
        return np.concatenate(found) if found else np.zeros(0, dtype=np.int64)

    def all(self) -> np.ndarray:
        """Every candidate in allocation order (O(candidates' blocks))."""
        return self.take(self.count)


@dataclass(eq=False)
class _Partition:
    """One partition as columns indexed by position (allocation order), grown by doubling.

    Per position: the global index (-1: removed), shard, generation (allocation serial),
    group (>= 0: a code of ``group_key``; < 0: ``-1 - offset`` in its allocation, the
    implicit groups of consecutive samples), flags (STAGED, LOST). Per field a ready bitmap,
    per task a consumed bitmap, each with its count. Custom metadata, KV keys and nested
    shapes are sparse (only samples that have them). ``trackers`` hold the candidate sets of
    recent fetches, kept up to date by every change of readiness or consumption.
    """

    code: int
    created: int = 0  # serial of the allocation that created the partition
    n: int = 0  # positions used (removed ones included until a compaction)
    live: int = 0
    lost: int = 0  # samples flagged LOST
    index: np.ndarray = field(default_factory=lambda: np.full(_MIN_CAP, -1, dtype=np.int64))
    shard: np.ndarray = field(default_factory=lambda: np.zeros(_MIN_CAP, dtype=np.int32))
    gen: np.ndarray = field(default_factory=lambda: np.zeros(_MIN_CAP, dtype=np.int64))
    group: np.ndarray = field(default_factory=lambda: np.zeros(_MIN_CAP, dtype=np.int64))
    flags: np.ndarray = field(default_factory=lambda: np.zeros(_MIN_CAP, dtype=np.uint8))
    ready: dict[str, np.ndarray] = field(default_factory=dict)
    ready_count: dict[str, int] = field(default_factory=dict)
    consumed: dict[str, np.ndarray] = field(default_factory=dict)
    consumed_count: dict[str, int] = field(default_factory=dict)
    custom: dict[int, Mapping[str, Any]] = field(default_factory=dict)  # position -> custom
    key_at: dict[int, str] = field(default_factory=dict)  # position -> KV key
    schemas: dict[str, FieldSchema] = field(default_factory=dict)
    shapes: dict[str, dict[int, tuple[int, ...]]] = field(default_factory=dict)  # by index
    losses: int = 0  # unit losses that took samples of this partition
    lost_unit: str | None = None  # the unit of the latest such loss
    keys: dict[str, int] = field(default_factory=dict)  # KV key -> index
    group_size: int | None = None  # fixed by a put's group_size or the first grouped fetch
    group_count: dict[Hashable, int] = field(default_factory=dict)  # explicit group -> samples
    group_code: dict[Hashable, int] = field(default_factory=dict)
    group_key: dict[int, Hashable] = field(default_factory=dict)
    next_group: int = 0
    trackers: dict[tuple[str, frozenset[str]], _Candidates] = field(default_factory=dict)

    @property
    def cap(self) -> int:
        """Positions the columns have room for."""
        return len(self.index)

    def _state(self) -> tuple[Any, ...]:
        n = self.n
        cols = tuple(c[:n].tobytes() for c in (self.index, self.shard, self.gen, self.group))
        bits = (
            {f: (b[:n].tobytes(), self.ready_count[f]) for f, b in self.ready.items()},
            {t: (b[:n].tobytes(), self.consumed_count[t]) for t, b in self.consumed.items()},
        )
        rest = (self.custom, self.key_at, self.schemas, self.shapes, self.keys, self.group_count)
        head = (self.code, self.created, n, self.live, self.lost, self.losses, self.lost_unit)
        return (*head, *cols, self.flags[:n].tobytes(), *bits, *rest, self.group_size)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, _Partition):
            return NotImplemented
        return self._state() == other._state()

    def reserve(self, extra: int) -> None:
        """Room for ``extra`` more positions (doubling)."""
        cap = self.cap
        if self.n + extra <= cap:
            return
        while cap < self.n + extra:
            cap *= 2
        self._resize(cap)

    def _resize(self, cap: int) -> None:
        self.index = _grown(self.index, cap, -1)
        for name in ("shard", "gen", "group", "flags"):
            setattr(self, name, _grown(getattr(self, name), cap))
        for bits in (self.ready, self.consumed):
            for k in bits:
                bits[k] = _grown(bits[k], cap)
        for t in self.trackers.values():
            t.grow(cap)

    def set_lost(self, pos: np.ndarray, lost: bool) -> None:
        """Flag (or unflag) the samples at ``pos`` LOST, keeping the count."""
        was = self.flags[pos] & LOST > 0
        if lost:
            self.flags[pos] |= np.uint8(LOST)
            self.lost += int(np.count_nonzero(~was))
        else:
            self.flags[pos] &= ~np.uint8(LOST)
            self.lost -= int(np.count_nonzero(was))

    def bits(self, table: dict[str, np.ndarray], name: str) -> np.ndarray:
        """The bitmap ``name`` of ``table`` (ready or consumed), made empty if new."""
        out = table.get(name)
        if out is None:
            out = table[name] = np.zeros(self.cap, dtype=bool)
        return out

    def group_of_pos(self, pos: int, size: int) -> Hashable:
        """The group key of the sample at ``pos`` for a grouped sampler of ``size``: its
        explicit group, or (allocation serial, offset // size)."""
        g = int(self.group[pos])
        if g >= 0:
            return self.group_key[g]
        return (int(self.gen[pos]), (-1 - g) // size)

    def group_value(self, pos: int) -> Hashable:
        """The explicit group of the sample at ``pos``, or None (an implicit group)."""
        g = int(self.group[pos])
        return self.group_key[g] if g >= 0 else None

    def code_group(self, g: Hashable) -> int:
        """The code of explicit group ``g`` (made if new), counting one more sample in it."""
        code = self.group_code.get(g)
        if code is None:
            code = self.group_code[g] = self.next_group
            self.group_key[code] = g
            self.next_group += 1
        self.group_count[g] = self.group_count.get(g, 0) + 1
        return code

    def uncount_group(self, pos: int) -> None:
        """One sample fewer in the explicit group of ``pos`` (an empty group is forgotten)."""
        g = int(self.group[pos])
        if g < 0:
            return
        key = self.group_key[g]
        count = self.group_count[key]
        if count <= 1:
            del self.group_count[key], self.group_code[key], self.group_key[g]
        else:
            self.group_count[key] = count - 1

    # -- readiness and consumption (keeping the candidate sets up to date) ---------------

    def set_ready(self, name: str, pos: np.ndarray) -> None:
        """Field ``name`` is written for ``pos``: new candidates where that completes a set."""
        bits = self.bits(self.ready, name)
        new = pos[~bits[pos]]
        bits[new] = True
        self.ready_count[name] = self.ready_count.get(name, 0) + len(new)
        if len(new):
            for (task, names), cand in self.trackers.items():
                if name in names:
                    cand.add(self._qualify(new, task, names))

    def unset_ready(self, name: str, pos: np.ndarray) -> None:
        """Field ``name`` is gone at ``pos`` (lost, dropped, cleared)."""
        bits = self.ready.get(name)
        if bits is None:
            return
        hit = pos[bits[pos]]
        bits[hit] = False
        self.ready_count[name] -= len(hit)
        for (_, names), cand in self.trackers.items():
            if name in names:
                cand.remove(hit)

    def consume(self, task: str, pos: np.ndarray) -> None:
        """``task`` consumed ``pos``: no longer its candidates."""
        bits = self.bits(self.consumed, task)
        new = pos[~bits[pos]]
        bits[new] = True
        self.consumed_count[task] = self.consumed_count.get(task, 0) + len(new)
        for (t, _), cand in self.trackers.items():
            if t == task:
                cand.remove(new)

    def unconsume(self, task: str, pos: np.ndarray) -> np.ndarray:
        """Hand ``pos`` back to ``task``; returns those that were consumed."""
        bits = self.consumed.get(task)
        if bits is None:
            return pos[:0]
        hit = pos[bits[pos]]
        bits[hit] = False
        self.consumed_count[task] -= len(hit)
        for (t, names), cand in self.trackers.items():
            if t == task:
                cand.add(self._qualify(hit, t, names))
        return hit

    def forget_task(self, task: str | None) -> None:
        """Forget what ``task`` (None: every task) consumed."""
        if task is None:
            self.consumed.clear()
            self.consumed_count.clear()
            self.trackers.clear()
            return
        self.consumed.pop(task, None)
        self.consumed_count.pop(task, None)
        for key in [k for k in self.trackers if k[0] == task]:
            del self.trackers[key]

    def _qualify(self, pos: np.ndarray, task: str, names: frozenset[str]) -> np.ndarray:
        """Those of ``pos`` ready for every one of ``names`` and not consumed by ``task``."""
        ok = np.ones(len(pos), dtype=bool)
        for name in names:
            bits = self.ready.get(name)
            if bits is None:
                return pos[:0]
            ok &= bits[pos]
        done = self.consumed.get(task)
        if done is not None:
            ok &= ~done[pos]
        return pos[ok]

    def mask(self, names: Iterable[str], task: str | None) -> np.ndarray | None:
        """Positions ``[:n]`` ready for all ``names`` (and unconsumed by ``task``); None if
        a field has no ready sample."""
        ok = np.ones(self.n, dtype=bool)
        for name in names:
            bits = self.ready.get(name)
            if bits is None:
                return None
            ok &= bits[: self.n]
        done = self.consumed.get(task) if task is not None else None
        if done is not None:
            ok &= ~done[: self.n]
        return ok

    def tracker(self, task: str, names: Sequence[str]) -> _Candidates:
        """The candidate set of (``task``, ``names``), made on first use (one pass)."""
        key = (task, frozenset(names))
        cand = self.trackers.pop(key, None)
        if cand is None:
            mask = self.mask(names, task)
            bits = np.zeros(self.cap, dtype=bool)
            if mask is not None:
                bits[: self.n] = mask
            cand = _Candidates(bits)
            while len(self.trackers) >= _MAX_TRACKERS:
                del self.trackers[next(iter(self.trackers))]
        self.trackers[key] = cand  # most recently used last
        return cand

    def drop(self, pos: np.ndarray) -> None:
        """Clear the columns of removed positions ``pos``."""
        for name in list(self.ready):
            self.unset_ready(name, pos)
        for task, bits in self.consumed.items():
            hit = pos[bits[pos]]
            bits[hit] = False
            self.consumed_count[task] -= len(hit)
        for cand in self.trackers.values():
            cand.remove(pos)
        for p in pos.tolist():
            self.custom.pop(p, None)
        self.set_lost(pos, False)
        self.index[pos] = -1
        self.flags[pos] = 0
        self.live -= len(pos)

    def compact(self, table: _IndexTable) -> None:
        """Renumber the live positions ``0..live-1`` (in order) once removed ones are the
        majority, so the columns grow with the samples held, not with the history."""
        n = self.n
        keep = np.flatnonzero(self.index[:n] >= 0)
        cap = _MIN_CAP
        while cap < 2 * len(keep):
            cap *= 2
        new_of = np.full(n, -1, dtype=np.int64)
        new_of[keep] = np.arange(len(keep))

        def packed(col: np.ndarray, fill: int = 0) -> np.ndarray:
            out = np.full(cap, fill, dtype=col.dtype)
            out[: len(keep)] = col[keep]
            return out

        self.index = packed(self.index, -1)
        self.shard, self.gen = packed(self.shard), packed(self.gen)
        self.group, self.flags = packed(self.group), packed(self.flags)
        for bits in (self.ready, self.consumed):
            for k in bits:
                bits[k] = packed(bits[k])
        self.custom = {int(new_of[p]): c for p, c in self.custom.items()}
        self.key_at = {int(new_of[p]): k for p, k in self.key_at.items()}
        self.n = len(keep)
        table.pos[self.index[: self.n]] = np.arange(self.n)
        self.trackers.clear()  # rebuilt on their next fetch


class FreeIndexes:
    """The global indexes cleared and released for reuse, handed out smallest first.

    Kept as a heap of runs ``(start, length)``: the indexes released together (a cleared
    batch) form one run or a few, so taking or giving back ``n`` indexes costs O(runs touched),
    not O(n log free) as a heap of single indexes did.
    """

    def __init__(self) -> None:
        self._runs: list[tuple[int, int]] = []
        self._count = 0

    def __len__(self) -> int:
        return self._count

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, FreeIndexes):
            return NotImplemented
        return self._count == other._count and sorted(self._runs) == sorted(other._runs)

    __hash__ = None  # type: ignore[assignment]

    def add(self, indexes: np.ndarray) -> None:
        """Make ``indexes`` (distinct, none of them free already) reusable."""
        arr = np.sort(np.asarray(indexes, dtype=np.int64).reshape(-1))
        if not len(arr):
            return
        breaks = np.flatnonzero(np.diff(arr) != 1) + 1
        starts = arr[np.concatenate(([0], breaks))].tolist()
        ends = arr[np.concatenate((breaks - 1, [len(arr) - 1]))].tolist()
        for start, end in zip(starts, ends, strict=True):
            heapq.heappush(self._runs, (start, end - start + 1))
        self._count += len(arr)

    def take(self, n: int) -> np.ndarray:
        """The ``min(n, len(self))`` smallest free indexes, ascending; they are not free any
        more."""
        runs: list[tuple[int, int]] = []
        if n >= self._count:
            runs, self._runs, self._count = sorted(self._runs), [], 0
        else:
            need = n
            while need:
                start, length = heapq.heappop(self._runs)
                if length > need:
                    heapq.heappush(self._runs, (start + need, length - need))
                    length = need
                runs.append((start, length))
                need -= length
            self._count -= n
        if not runs:
            return np.empty(0, dtype=np.int64)
        return np.concatenate([np.arange(s, s + k, dtype=np.int64) for s, k in runs])


@dataclass
class _Staging:
    """An atomic put: its samples become ready together once every one of them is written."""

    partition: str
    members: set[int]
    waiting: set[int]
    order: list[int]  # the members in allocation order
    updates: list[DataUpdate] = field(default_factory=list)


def _check_name(value: Any, what: str) -> str:
    if not isinstance(value, str) or not value:
        raise StoreInputError(f"{what} must be a non-empty str, got {value!r}")
    return value


def _check_fields(fields: Any) -> list[str]:
    if isinstance(fields, str) or not isinstance(fields, Iterable):
        raise StoreInputError(f"fields must be a list of names, got {fields!r}")
    names = [_check_name(f, "a field name") for f in fields]
    if not names:
        raise StoreInputError("fields must name at least one field")
    return list(dict.fromkeys(names))


def _positions_by_partition(meta: BatchMeta) -> dict[str, list[int]]:
    ids = meta.partition_ids
    if ids and ids.count(ids[0]) == len(ids):
        return {ids[0]: list(range(len(ids)))}
    groups: dict[str, list[int]] = {}
    for pos, part in enumerate(meta.partition_ids):
        groups.setdefault(part, []).append(pos)
    return groups
