"""Delta publishing: which tensors changed, and what a reused buffer still holds.

A publish with ``delta=True`` compares each tensor's bytes with its bytes in the previous
version (the publisher's newest buffer, which no writer touches) and records the rows that
differ. A buffer the publisher writes again (a segment of its pool, or its GPU buckets) still
holds an older version of the same layout, so only the rows changed since that version are
written. The entry then carries, for each of the last :data:`WINDOW` versions, the rows that
changed since it (:class:`~rayless.weights.messages.Delta`): a subscriber that holds one of them
copies only those rows, any other pulls in full. Comparing bytes (not values) keeps it exact:
``-0.0`` and ``0.0`` differ, a NaN payload is compared bit for bit.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import torch

from rayless.weights.layout import PARALLEL, Layout, executor, row_view
from rayless.weights.messages import Delta, Entry

__all__ = ["MERGE_GAP", "WINDOW", "History", "changed_rows", "changed_spans"]

WINDOW = 8  # versions back that an entry describes deltas from
MERGE_GAP = 1 << 20  # changed tensors closer than this travel as one piece (gap included)


def _bytes(t: torch.Tensor) -> torch.Tensor:
    return t.contiguous().reshape(-1).view(torch.uint8)


def _differ(pair: tuple[torch.Tensor, torch.Tensor]) -> bool:
    """Whether two flat uint8 views hold different bytes: compared as 64-bit (or 32-bit)
    integers where their length and alignment allow, about 7 times faster than byte by byte
    on a CPU, and as exact."""
    a, b = pair
    n = a.numel()
    for dtype, width in ((torch.int64, 8), (torch.int32, 4)):
        if n % width == 0 and a.data_ptr() % width == 0 and b.data_ptr() % width == 0:
            try:
                return not torch.equal(a.view(dtype), b.view(dtype))
            except RuntimeError:  # a view torch refuses (its storage offset): bytes, then
                break
    return not torch.equal(a, b)


def changed_rows(
    tensors: Mapping[str, torch.Tensor],
    layout: Layout,
    buffers: Sequence[torch.Tensor],
    starts: Sequence[int] | None,
) -> set[int]:
    """The rows of ``layout`` whose tensor's bytes differ from those at the row's place in
    ``buffers`` (the previous version of the same layout; bucket ``b`` at ``starts[b]``);
    compared on threads when the tensors are big (CPU)."""
    places: dict[tuple[int, int], int] = {}  # an alias (tied weights) shares its original's
    pairs: list[tuple[torch.Tensor, torch.Tensor]] = []
    for row in layout:
        place = (row[3], row[4])
        if row[5] and place not in places:
            places[place] = len(pairs)
            old = row_view(buffers[row[3]], row, starts[row[3]] if starts else 0)
            pairs.append((_bytes(tensors[row[0]]), _bytes(old)))
    big = sum(a.numel() for a, _ in pairs) >= PARALLEL and all(not a.is_cuda for a, _ in pairs)
    differs = list(executor().map(_differ, pairs)) if big else [_differ(p) for p in pairs]
    return {i for i, row in enumerate(layout) if row[5] and differs[places[row[3], row[4]]]}


class History:
    """A publisher's recent versions of one layout (for one path): the rows that changed from
    each to the next, the version each of its buffers holds, and the newest version's sums."""

    def __init__(self, window: int = WINDOW) -> None:
        self.window = window
        self.layout: Layout | None = None
        self.log: list[tuple[int, set[int]]] = []  # (version, rows changed since the one before)
        self.holds: dict[str, int] = {}  # buffer (segment name) -> the version it holds
        self.sums: list[int] = []

    def newest(self, layout: Layout) -> int | None:
        """The newest version, when it has ``layout`` (else None: a delta has no base)."""
        return self.log[-1][0] if self.log and layout == self.layout else None

    def since(self, version: int | None) -> set[int] | None:
        """The rows changed between ``version`` and the newest (None: not known)."""
        versions = [v for v, _ in self.log]
        if version is None or version not in versions:
            return None
        out: set[int] = set()
        for _, rows in self.log[versions.index(version) + 1 :]:
            out |= rows
        return out

    def to_write(self, key: str, changed: set[int] | None) -> set[int] | None:
        """The rows to write into buffer ``key`` for a version that changed ``changed`` since
        the newest (None: every row)."""
        if changed is None:
            return None
        old = self.since(self.holds.get(key))
        return None if old is None else old | changed

    def record(
        self, layout: Layout, version: int, key: str, changed: set[int] | None, sums: list[int]
    ) -> None:
        """``version`` (``changed`` rows since the newest; None: unknown) now lies in ``key``."""
        if changed is None or layout != self.layout:
            self.log, self.holds = [], {}
        self.layout = layout
        self.log = [*self.log, (version, changed or set())][-self.window :]
        self.holds[key] = version
        self.sums = sums

    def deltas(self) -> tuple[Delta, ...]:
        """For each earlier version in the window: the rows changed since it."""
        return tuple(Delta(v, sorted(self.since(v) or ())) for v, _ in self.log[:-1])


def changed_spans(entry: Entry, rows: list[int]) -> list[tuple[int, int, int]]:
    """The byte spans ``(bucket, start, end)`` that hold ``rows`` of ``entry``'s layout, spans
    less than :data:`MERGE_GAP` apart merged (sending unchanged bytes again is harmless)."""
    places = sorted({(entry.layout[i][3], entry.layout[i][4], entry.layout[i][5]) for i in rows})
    spans: list[tuple[int, int, int]] = []
    for bucket, offset, n in places:
        if not n:
            continue
        if spans and spans[-1][0] == bucket and offset - spans[-1][2] < MERGE_GAP:
            spans[-1] = (bucket, spans[-1][1], max(spans[-1][2], offset + n))
        else:
            spans.append((bucket, offset, offset + n))
    return spans
