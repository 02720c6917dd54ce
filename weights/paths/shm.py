"""The same-host CPU path: the publisher writes each version once into a shared-memory segment
(``rayless.transport.segments``: double buffered, with leases); every subscriber on the host
copies straight out of it into its sink. One memcpy per subscriber, no socket."""

from __future__ import annotations

import itertools

import torch

from rayless.weights.layout import bucket_sizes, write_from
from rayless.weights.messages import Entry, PathKind
from rayless.weights.paths.base import PublishRequest, WeightPath, Written
from rayless.weights.sinks import Sink

__all__ = ["ShmPath", "read_segment", "starts_of"]


def starts_of(sizes: list[int]) -> list[int]:
    """Where each bucket of ``sizes`` starts when the buckets lie back to back."""
    return [0, *itertools.accumulate(sizes)][:-1]


def read_segment(entry: Entry, payload: memoryview, sink: Sink) -> None:
    """Copy ``entry``'s buckets, back to back in ``payload`` at ``entry.starts``, into ``sink``."""
    if payload.nbytes:
        flat = torch.frombuffer(payload, dtype=torch.uint8)
        sink.copy(entry.layout, [flat] * len(entry.starts), entry.starts)


class ShmPath(WeightPath):
    """Publishes into one of the client's segments; reads a segment of this host."""

    kind = PathKind.SHM

    def publishes(self, request: PublishRequest) -> bool:
        return request.group is None  # every tensor on every device: the fallback

    def write(self, request: PublishRequest) -> Written:
        layout = request.layout
        sizes = bucket_sizes(layout)
        starts = starts_of(sizes)
        pool = self.slots.pool()
        seg = pool.begin(sum(sizes))
        try:
            chunks: list[torch.Tensor] = []
            if sum(sizes):
                payload = torch.frombuffer(seg.payload, dtype=torch.uint8)
                chunks = [payload[s : s + n] for s, n in zip(starts, sizes, strict=True)]
                write_from(request.tensors, layout, [payload] * len(sizes), starts)
        except BaseException:
            pool.abort(seg)
            raise
        pool.commit(seg, request.version)
        entry = Entry(PathKind.SHM, request.version, layout, request.shard, seg.name, starts)
        return Written(entry, chunks)

    def read(self, entry: Entry, payload: memoryview, sink: Sink) -> None:
        read_segment(entry, payload, sink)
