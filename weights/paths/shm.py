"""The same-host CPU path: the publisher writes each version once into a shared-memory segment
(``rayless.transport.segments``: double buffered, with leases); every subscriber on the host
copies straight out of it into its sink. One memcpy per subscriber, no socket."""

from __future__ import annotations

import itertools

import torch

from rayless.weights.checksums import sums_in
from rayless.weights.delta import History, changed_rows
from rayless.weights.layout import Layout, bucket_sizes, write_from
from rayless.weights.messages import Entry, PathKind
from rayless.weights.paths.base import PublishRequest, Slots, WeightPath, Written
from rayless.weights.sinks import Sink

__all__ = ["ShmPath", "read_segment", "starts_of"]


def starts_of(sizes: list[int]) -> list[int]:
    """Where each bucket of ``sizes`` starts when the buckets lie back to back."""
    return [0, *itertools.accumulate(sizes)][:-1]


def read_segment(entry: Entry, payload: memoryview, sink: Sink) -> None:
    """Copy ``entry``'s buckets, back to back in ``payload`` at ``entry.starts``, into ``sink``."""
    if payload.nbytes:
        flat = torch.frombuffer(payload, dtype=torch.uint8)
        sink.copy_part(entry, [flat] * len(entry.starts), entry.starts)


class ShmPath(WeightPath):
    """Publishes into one of the client's segments; reads a segment of this host."""

    kind = PathKind.SHM

    def __init__(self, sync: str, slots: Slots) -> None:
        super().__init__(sync, slots)
        self.history = History()

    def publishes(self, request: PublishRequest) -> bool:
        return request.group is None  # every tensor on every device: the fallback

    def write(self, request: PublishRequest) -> Written:
        layout = request.layout
        sizes = bucket_sizes(layout)
        starts = starts_of(sizes)
        pool = self.slots.pool()
        history = self.history
        changed = None
        prev, base = pool.newest, history.newest(layout)
        if (
            request.delta
            and prev is not None
            and sum(sizes) > 0
            and base is not None
            and history.holds.get(prev.name) == base == prev.version
        ):
            old = torch.frombuffer(prev.payload, dtype=torch.uint8)
            changed = changed_rows(request.tensors, layout, [old] * len(sizes), starts)
        seg = pool.begin(sum(sizes))
        try:
            chunks: list[torch.Tensor] = []
            sums: list[int] = []
            if sum(sizes):
                payload = torch.frombuffer(seg.payload, dtype=torch.uint8)
                chunks = [payload[s : s + n] for s, n in zip(starts, sizes, strict=True)]
                rows = history.to_write(seg.name, changed)
                todo = layout if rows is None else [layout[i] for i in sorted(rows)]
                write_from(request.tensors, todo, [payload] * len(sizes), starts)
            if request.checksums:
                sums = self._sums(layout, seg.payload, starts, changed)
        except BaseException:
            history.holds.pop(seg.name, None)  # its bytes are torn
            pool.abort(seg)
            raise
        pool.commit(seg, request.version)
        history.record(layout, request.version, seg.name, changed, sums)
        entry = Entry(PathKind.SHM, request.version, layout, request.shard, seg.name, starts,
                      sums=sums, deltas=history.deltas() if request.delta else ())  # fmt: skip
        return Written(entry, chunks)

    def _sums(
        self, layout: Layout, payload: memoryview, starts: list[int], changed: set[int] | None
    ) -> list[int]:
        """Every row's sum: computed for the rows that changed, the others' kept."""
        old = self.history.sums
        if changed is None or len(old) != len(layout):
            return sums_in(layout, payload, starts)
        rows = sorted(changed)
        fresh = dict(zip(rows, sums_in([layout[i] for i in rows], payload, starts), strict=True))
        return [fresh.get(i, old[i]) for i in range(len(layout))]

    def read(self, entry: Entry, payload: memoryview, sink: Sink) -> None:
        read_segment(entry, payload, sink)
