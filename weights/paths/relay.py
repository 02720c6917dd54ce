"""The cross-host path: one transfer per host to that host's relay (``WeightRelay``), in
``RELAY_CHUNK`` pieces, ``IN_FLIGHT`` at a time; the relay writes the version into its own
segment and the host's subscribers read that copy as on the same-host CPU path."""

from __future__ import annotations

import asyncio
from typing import Any

import torch

from rayless.actors import ActorHandle
from rayless.transport.errors import ProtocolError
from rayless.weights.messages import Entry, PathKind
from rayless.weights.paths.base import WeightPath
from rayless.weights.paths.shm import read_segment
from rayless.weights.sinks import Sink

__all__ = ["IN_FLIGHT", "RELAY_CHUNK", "RelayPath", "forward"]

IN_FLIGHT = 2  # chunks on their way to one relay at a time
RELAY_CHUNK = 64 << 20  # a bucket travels to a relay in pieces of this size (a pipeline)


async def forward(
    registry: ActorHandle[Any],
    where: str,
    relay: ActorHandle[Any],
    entry: Entry,
    chunks: list[torch.Tensor],
) -> None:
    """Send the version of ``entry`` (each bucket's bytes in ``chunks``, CPU or CUDA) to
    ``relay``, then announce the relay's copy at its location ``where``.

    Raises ProtocolError when the relay answers its commit with anything but an Entry.
    """
    version, starts, shard = entry.version, entry.starts, entry.shard
    await relay.begin(version, sum(c.numel() for c in chunks), shard)
    gate = asyncio.Semaphore(IN_FLIGHT)

    async def one(start: int, chunk: torch.Tensor) -> None:
        async with gate:
            host_chunk = await asyncio.to_thread(chunk.cpu) if chunk.is_cuda else chunk
            await relay.write(version, start, host_chunk, shard)

    pieces = [
        (start + off, chunk[off : off + RELAY_CHUNK])
        for start, chunk in zip(starts, chunks, strict=True)
        for off in range(0, chunk.numel(), RELAY_CHUNK)
    ]
    await asyncio.gather(*(one(s, c) for s, c in pieces))
    relayed = await relay.commit(entry)
    if not isinstance(relayed, Entry):
        raise ProtocolError(f"a weight relay committed with {type(relayed).__name__}")
    await registry.announce(where, relayed)


class RelayPath(WeightPath):
    """Reads a relay's copy (a segment of this host). Never chosen for a publish: a relay's
    copy is made by :func:`forward` from what another path wrote."""

    kind = PathKind.RELAY

    def read(self, entry: Entry, payload: memoryview, sink: Sink) -> None:
        read_segment(entry, payload, sink)
