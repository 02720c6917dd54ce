"""Weight sync's messages: what clients, the registry and the relays send each other.

Every value that crosses a process here is a frozen dataclass registered with the codec
(``@message``, the control plane's mechanism: decoded with a check of every field, a malformed
one raising ProtocolError), a plain scalar, or (a relay's) an actor handle, the codec's own
type. :class:`Entry` describes one shard of one version
where one location reads it; its :class:`PathKind` names the transfer path that reads it
(``rayless.weights.paths``). Light: no torch (``rayless status`` decodes ``SyncInfo``).
"""

from __future__ import annotations

import dataclasses
import enum
from dataclasses import dataclass, field
from typing import Any

from rayless.actors.ext import message
from rayless.transport.errors import ProtocolError

__all__ = [
    "Delta",
    "Entry",
    "IpcBucket",
    "Piece",
    "Layout",
    "PathKind",
    "Published",
    "RelayPlace",
    "Row",
    "ShardSpec",
    "SyncInfo",
]

# One tensor's place in the buckets (``rayless.weights.layout``): name, dtype
# (``str(torch.dtype)``), shape, bucket, byte offset, bytes.
Row = tuple[str, str, tuple[int, ...], int, int, int]
Layout = list[Row]


class PathKind(str, enum.Enum):
    """A transfer path: how a version's bytes travel and where a pull reads them."""

    SHM = "shm"  # the publisher's shared-memory segment, same host
    CUDA = "cuda"  # buckets on the publisher's GPU, shared by CUDA IPC, same host
    RELAY = "relay"  # a relay's segment: a copy sent once to another host
    DIST = "dist"  # a broadcast over a torch.distributed group (the registry only records it)


@message("weights.IpcBucket")
@dataclass(frozen=True)
class IpcBucket:
    """A CUDA IPC share of one flat bucket: the fields of ``transport._cuda.ipc_fields``."""

    size: list[int]
    stride: list[int]
    offset: int
    index: int  # the device's index in the publisher
    uuid: str  # the device's UUID
    handle: bytes
    nbytes: int
    byte_offset: int
    rc_handle: bytes
    rc_offset: int
    ev_handle: bytes
    ev_sync: bool
    pid: int  # the publisher's

    @classmethod
    def of(cls, fields: list[Any]) -> IpcBucket:
        """From ``ipc_fields``' list. Raises ProtocolError when it has not 13 fields."""
        if len(fields) != 13:
            raise ProtocolError(f"a CUDA IPC record has 13 fields, not {len(fields)}")
        return cls(*fields)

    def fields(self) -> list[Any]:
        """As ``open_ipc`` takes it."""
        return [getattr(self, f.name) for f in dataclasses.fields(self)]


@message("weights.Delta")
@dataclass(frozen=True)
class Delta:
    """The rows of an entry's layout whose bytes differ from ``version`` (an earlier version
    of the same layout): a subscriber that holds ``version`` copies only those."""

    version: int
    rows: list[int]


@message("weights.ShardSpec")
@dataclass(frozen=True)
class ShardSpec:
    """Rank ``rank``'s slice of a tensor split in ``world`` equal parts along ``dim`` (a
    column- or row-parallel layer, a vocab-parallel embedding, an FSDP shard)."""

    dim: int
    rank: int
    world: int


@message("weights.Piece")
@dataclass(frozen=True)
class Piece:
    """Row ``row`` of an entry's layout is not a whole tensor but the slice ``spec`` of it."""

    row: int
    spec: ShardSpec


@message("weights.Entry")
@dataclass(frozen=True)
class Entry:
    """Shard ``shard`` of ``version``, complete where it is announced.

    ``layout`` places its tensors in buckets; ``segment`` is the shared-memory segment whose
    header carries the version and the readers' lease (its payload holds the bytes at
    ``starts``, one offset per bucket, unless the path keeps them elsewhere); ``ipc`` holds one
    CUDA IPC share per bucket where the bytes stay on the publisher's GPU. ``sums`` holds one
    checksum per layout row (``rayless.weights.checksums``; empty: not computed); ``deltas``
    say which rows changed since each of the publisher's recent versions (a delta publish);
    ``pieces`` mark the rows that are slices of a tensor (a sharded trainer's).
    """

    kind: PathKind
    version: int
    layout: Layout
    shard: int = 0
    segment: str = ""
    starts: list[int] = field(default_factory=list)
    ipc: tuple[IpcBucket, ...] = ()
    sums: list[int] = field(default_factory=list)
    deltas: tuple[Delta, ...] = ()
    pieces: tuple[Piece, ...] = ()


@message("weights.Published")
@dataclass(frozen=True)
class Published:
    """A complete version at one location: one entry per shard, in shard order."""

    version: int
    parts: tuple[Entry, ...]


@message("weights.SyncInfo")
@dataclass(frozen=True)
class SyncInfo:
    """A sync's settings and state: ``per_node``, the newest version, and its relays
    (location → the relay's name)."""

    per_node: bool
    latest: int
    relays: dict[str, str] = field(default_factory=dict)


@message("weights.RelayPlace")
@dataclass(frozen=True)
class RelayPlace:
    """Where a relay serves: its location and its host id."""

    location: str
    host: str
