"""The torch.distributed path: a publish broadcasts its buckets over a group from one rank
(``rayless.weights.dist``); every other member receives them with ``pull(group=...)``. The
registry only records such a version (at :data:`DIST_LOCATION`, a location no client reads)."""

from __future__ import annotations

from rayless.weights import dist as broadcast
from rayless.weights.messages import Entry, PathKind
from rayless.weights.paths.base import PublishRequest, PullRequest, WeightPath, Written
from rayless.weights.sinks import Sink

__all__ = ["DIST_LOCATION", "DistPath"]

DIST_LOCATION = "@torch.distributed"  # the registry's location of versions sent over a group


class DistPath(WeightPath):
    """Broadcasts over, and receives from, the request's torch.distributed group."""

    kind = PathKind.DIST

    def publishes(self, request: PublishRequest) -> bool:
        return request.group is not None

    def write(self, request: PublishRequest) -> Written:
        import torch.distributed as dist

        rank = dist.get_rank() if request.src is None else request.src
        broadcast.send(request.tensors, request.layout, request.version, rank, request.group)
        entry = Entry(PathKind.DIST, request.version, request.layout, request.shard)
        return Written(entry, None, DIST_LOCATION)

    def receives(self, request: PullRequest) -> bool:
        return request.group is not None

    def receive(self, sink: Sink, request: PullRequest) -> int:
        version, layout, buckets = broadcast.receive(request.src, request.group)
        entry = Entry(PathKind.DIST, version, layout)
        sink.check_parts([entry])  # after the receive: the collective stays in step
        sink.copy_part(entry, buckets, None)
        sink.finish()
        return version
