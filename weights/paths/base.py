"""The interface of a weight-sync transfer path, and what a client lends its paths.

A path publishes a version (``write``: the tensors → an :class:`~rayless.weights.messages.Entry`
that the client announces) and reads one (``read``: an entry → a sink), or, for a path that
delivers without the registry (a collective), receives one (``receive``). A client holds one
instance of every registered path (``rayless.weights.paths.registry``); it asks each, in the
registry's order, whether it ``publishes`` a request, and reads every entry with the path its
``kind`` names.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

import torch

from rayless.transport import segments
from rayless.weights.errors import WeightSyncError
from rayless.weights.layout import Layout
from rayless.weights.messages import Entry, PathKind
from rayless.weights.sinks import Sink

__all__ = ["PublishRequest", "PullRequest", "Slots", "WeightPath", "Written"]


@dataclass
class PublishRequest:
    """One publish: its tensors (placed by ``layout``), version and shard, the client's
    ``cuda_ipc`` setting, a torch.distributed ``group`` (with ``src``) or None, whether to
    compute checksums, and whether to write only what changed (``delta``)."""

    tensors: dict[str, torch.Tensor]
    layout: Layout
    version: int
    shard: int = 0
    cuda_ipc: bool = True
    group: Any = None
    src: int | None = None
    checksums: bool = False
    delta: bool = False


@dataclass
class PullRequest:
    """How a pull asked to receive: a torch.distributed ``group`` and its ``src`` rank, or
    None (through the registry)."""

    group: Any = None
    src: int = 0


@dataclass
class Written:
    """A version a path wrote: the ``entry`` to announce, at ``where`` (None: the publisher's
    location), and each bucket's bytes for the relays of other hosts (``chunks``; None: the
    version does not travel to relays)."""

    entry: Entry
    chunks: list[torch.Tensor] | None
    where: str | None = None


class Slots:
    """A client's shared-memory segments (``segments.SlotPool``, made on first use): the
    version headers and leases of every path that publishes through the registry."""

    def __init__(self, max_slots: int) -> None:
        self.max_slots = max_slots
        self._pool: segments.SlotPool | None = None

    @property
    def used(self) -> bool:
        """Whether this client wrote any segment (it published)."""
        return self._pool is not None

    def pool(self) -> segments.SlotPool:
        """The pool, made on first use."""
        if self._pool is None:
            self._pool = segments.SlotPool(self.max_slots)
        return self._pool

    def close(self) -> None:
        """Unlink every segment (pulls of these versions then fail)."""
        if self._pool is not None:
            self._pool.close()


class WeightPath:
    """One way a version travels from a publisher to its subscribers.

    ``sync`` names the weight sync (for errors); ``slots`` are the client's segments. Every
    method that copies blocks (the client runs it in a thread). The defaults refuse: a path
    overrides what it does.
    """

    kind: ClassVar[PathKind]

    def __init__(self, sync: str, slots: Slots) -> None:
        self.sync = sync
        self.slots = slots

    def publishes(self, request: PublishRequest) -> bool:
        """Whether this path carries ``request`` (the first registered path that does, does)."""
        return False

    def write(self, request: PublishRequest) -> Written:
        """Publish ``request``'s tensors; the entry to announce. Raises WeightSyncError when
        this path does not publish, OSError when shared memory is exhausted."""
        raise WeightSyncError(f"the {self.kind.value} path does not publish")

    def read(self, entry: Entry, payload: memoryview, sink: Sink) -> None:
        """Copy ``entry``'s tensors into ``sink``; ``payload`` is its segment's payload, leased
        by the caller. Raises WeightSyncError when this process cannot read this path."""
        raise WeightSyncError(
            f"weight sync {self.sync!r}: version {entry.version} travelled by the "
            f"{self.kind.value} path, which is not read through the registry"
        )

    def settle(self) -> None:
        """Wait for the copies ``read`` started (once per pull, after every shard's read)."""

    def receives(self, request: PullRequest) -> bool:
        """Whether this path delivers ``request``'s versions itself, without the registry."""
        return False

    def receive(self, sink: Sink, request: PullRequest) -> int:
        """Receive one version into ``sink`` (checked first); its number. Raises
        WeightSyncError when this path does not receive."""
        raise WeightSyncError(f"the {self.kind.value} path does not receive")

    def close(self) -> None:
        """Drop what this path holds for its client (mappings, device buffers)."""
