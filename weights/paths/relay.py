"""The cross-host path: one transfer per host to that host's relay (``WeightRelay``), in
``RELAY_CHUNK`` pieces, ``IN_FLIGHT`` at a time; the relay writes the version into its own
segment and the host's subscribers read that copy as on the same-host CPU path."""

from __future__ import annotations

import asyncio
from typing import Any

import torch

from rayless.actors import ActorHandle
from rayless.transport.errors import ProtocolError
from rayless.weights.delta import changed_spans
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
    base: int = -1,
) -> None:
    """Send the version of ``entry`` (each bucket's bytes in ``chunks``, CPU or CUDA) to
    ``relay``, then announce the relay's copy at its location ``where``. With ``base`` (the
    version this relay was last sent) and a delta from it in ``entry``, only the changed
    tensors' bytes travel when the relay still holds ``base``.

    Raises ProtocolError when the relay answers its begin or commit with the wrong type.
    """
    version, starts, shard = entry.version, entry.starts, entry.shard
    delta = next((d for d in entry.deltas if d.version == base), None) if base >= 0 else None
    nbytes = sum(c.numel() for c in chunks)
    if delta is None:
        seeded = await relay.begin(version, nbytes, shard)
    else:
        seeded = await relay.begin(version, nbytes, shard, base, entry)
    if not isinstance(seeded, bool):
        raise ProtocolError(f"a weight relay answered begin() with {type(seeded).__name__}")
    gate = asyncio.Semaphore(IN_FLIGHT)

    async def one(start: int, chunk: torch.Tensor) -> None:
        async with gate:
            host_chunk = await asyncio.to_thread(chunk.cpu) if chunk.is_cuda else chunk
            await relay.write(version, start, host_chunk, shard)

    if seeded and delta is not None:
        spans = changed_spans(entry, delta.rows)
    else:
        spans = [(b, 0, c.numel()) for b, c in enumerate(chunks)]
    pieces = [
        (starts[b] + off, chunks[b][off : min(end, off + RELAY_CHUNK)])
        for b, begin, end in spans
        for off in range(begin, end, RELAY_CHUNK)
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
