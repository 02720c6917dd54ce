"""The actors behind weight sync: one registry per sync, one relay per host.

:class:`WeightRegistry` (named after the sync) knows the newest version, where each host finds
it (a shared-memory segment, or CUDA IPC buckets, and the layout), and the publisher's pid. A
pull long-polls it (``wait``) for a version >= its minimum. Every 0.5 s it checks that the
publisher still runs (through the relay on the publisher's host); when it died, every pending
and later pull fails with PublisherLostError, and its segments are unlinked on that host.

:class:`WeightRelay` (one per node, cpus=0) receives a version once per host from a publisher
on another host, bucket by bucket, writes it into its own segments and serves the host's
subscribers from there. It also answers liveness questions about pids on its host.

What they take and answer is typed (``rayless.weights.messages``): a publisher announces
``Entry`` s, a pull gets a ``Published``, a relay commits the publisher's entry into its own.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import os
import time
from typing import Any

import torch

from rayless.actors import Actor, ActorHandle, endpoint
from rayless.transport import segments
from rayless.transport.errors import ProtocolError
from rayless.transport.ext import host_id, pid_alive
from rayless.weights.delta import changed_spans
from rayless.weights.errors import (
    PublisherLostError,
    WeightInputError,
    WeightSyncError,
    WeightTimeoutError,
    WeightVersionError,
)
from rayless.weights.messages import Entry, PathKind, Published, RelayPlace, SyncInfo

__all__ = ["WeightRegistry", "WeightRelay", "location"]

MONITOR_INTERVAL = 0.5


def location(per_node: bool) -> str:
    """Which copy of the weights this process reads: its host's, or (``per_node``) its node's."""
    if per_node:
        return f"{host_id()}#{os.environ.get('RAYLESS_NODE_ID', 'driver')}"
    return host_id()


@dataclasses.dataclass(frozen=True)
class _Publisher:
    """A shard's publisher: its pid, its host id, and the location it reads from."""

    pid: int
    host: str
    where: str = ""


def _copy_spans(dst: torch.Tensor, src: torch.Tensor, entry: Entry | None, rows: list[int]) -> None:
    """Copy the bytes of ``rows`` of ``entry``'s layout (its buckets at ``entry.starts``)."""
    assert entry is not None
    for bucket, begin, end in changed_spans(entry, rows):
        at = entry.starts[bucket]
        dst[at + begin : at + end].copy_(src[at + begin : at + end])


def _label(relay: ActorHandle[Any]) -> str:
    """How a relay is shown (``rayless status``, the dashboard): its actor's name."""
    return str(getattr(relay, "name", relay))


class WeightRegistry(Actor):
    """Versions, their locations per host, and the publisher's liveness. See the module doc."""

    def __init__(self, name: str, per_node: bool) -> None:
        self.name = name
        self.per_node = per_node
        self.latest = -1
        self.entries: dict[str, Published] = {}  # location -> newest version there
        self.relays: dict[str, ActorHandle[Any]] = {}  # location -> its relay
        self.relay_hosts: dict[str, str] = {}  # location -> host id
        self.publishers: dict[int, _Publisher] = {}  # shard -> its publisher
        self.num_shards = 1
        self.begun: dict[
            int, tuple[int, int, str]
        ] = {}  # shard -> newest begun: version, pid, host
        self.done: dict[int, int] = {}  # shard -> the newest version it completed
        self.partial: dict[tuple[str, int], dict[int, Entry]] = {}  # shards so far
        self.lost: str | None = None
        self.changed = asyncio.Condition()
        self._monitor: asyncio.Task[None] | None = None

    async def setup(self) -> None:
        self._monitor = asyncio.ensure_future(self._watch())

    async def teardown(self) -> None:
        if self._monitor is not None:
            self._monitor.cancel()

    @endpoint
    async def add_relays(self, relays: list[ActorHandle[Any]]) -> None:
        """Register relays (one per location is kept).

        Raises ProtocolError when a relay does not answer with its place.
        """
        for relay in relays:
            place = await relay.where()
            if not isinstance(place, RelayPlace):
                raise ProtocolError(f"a weight relay answered where() with {place!r:.60}")
            if place.location not in self.relays:
                self.relays[place.location] = relay
                self.relay_hosts[place.location] = place.host

    @endpoint
    def info(self) -> SyncInfo:
        """The sync's settings, newest version and relays (location → relay's name)."""
        relays = {where: _label(relay) for where, relay in self.relays.items()}
        return SyncInfo(self.per_node, self.latest, relays)

    @endpoint
    async def begin(
        self, version: int, pid: int, host: str, where: str, shard: int = 0, num_shards: int = 1
    ) -> list[tuple[str, ActorHandle[Any]]]:
        """Start publishing shard ``shard`` of ``num_shards`` of ``version`` from ``pid``: the
        locations of other hosts to feed, each with its relay (handles travel as the codec's
        own type). A version is complete once every shard announced it.

        Raises WeightVersionError unless ``version`` is above every complete version, every
        version this shard completed, and a version this shard began whose publisher still
        runs (a version begun by a publisher that died, or by the same pid, may be published
        again); WeightInputError for a bad shard.
        """
        if not isinstance(version, int) or isinstance(version, bool) or version <= self.latest:
            raise WeightVersionError(
                f"version {version!r} is not above the newest published version {self.latest}"
            )
        if not (isinstance(num_shards, int) and num_shards >= 1 and 0 <= shard < num_shards):
            raise WeightInputError(f"bad shard {shard!r} of {num_shards!r}")
        if version <= self.done.get(shard, -1):
            raise WeightVersionError(
                f"shard {shard} already published version {self.done[shard]} (not below it)"
            )
        began, by, on = self.begun.get(shard, (-1, 0, ""))
        if version <= began and by != pid and await self._alive(_Publisher(by, on)):
            raise WeightVersionError(
                f"shard {shard} began version {began} (publisher pid {by}, still running) and "
                f"has not completed it: publish a version above {began}"
            )
        if num_shards != self.num_shards:
            self.num_shards = num_shards
            self.publishers = {k: v for k, v in self.publishers.items() if k < num_shards}
        self.begun[shard] = (version, pid, host)
        old = self.publishers.get(shard)
        if old is None or old.pid != pid or self.lost:
            self.publishers[shard] = _Publisher(pid, host, where)
            self.lost = None
        return [(w, r) for w, r in self.relays.items() if w != where]

    @endpoint
    async def announce(self, where: str, entry: Entry) -> None:
        """Shard ``entry.shard`` of ``entry.version`` is complete at ``where``; with every
        shard there, so is the version.

        Raises ProtocolError when ``entry`` is not an Entry.
        """
        if not isinstance(entry, Entry):
            raise ProtocolError(f"announce takes a weights.Entry, not {type(entry).__name__}")
        version, shard = entry.version, entry.shard
        self.done[shard] = max(self.done.get(shard, -1), version)
        parts: tuple[Entry, ...] = (entry,)
        if self.num_shards > 1:
            got = self.partial.setdefault((where, version), {})
            got[shard] = entry
            if len(got) < self.num_shards:
                return
            for key in [k for k in self.partial if k[0] == where and k[1] <= version]:
                del self.partial[key]
            parts = tuple(got[i] for i in range(self.num_shards))
        old = self.entries.get(where)
        if old is None or old.version < version:
            self.entries[where] = Published(version, parts)
        self.latest = max(self.latest, version)
        async with self.changed:
            self.changed.notify_all()

    @endpoint
    async def retire(self, pid: int) -> None:
        """The publisher ``pid`` closed its client: pulls fail until a new publish."""
        if any(p.pid == pid for p in self.publishers.values()) and not self.lost:
            self.lost = (
                f"the publisher of {self.name!r} (pid {pid}) closed its client, and its "
                "versions with it (a publisher keeps its client open while its weights are "
                "pulled)"
            )
            self.entries.clear()
            async with self.changed:
                self.changed.notify_all()

    @endpoint
    def latest_version(self) -> int:
        """The newest version published anywhere (-1: none yet)."""
        return self.latest

    @endpoint
    async def wait(self, where: str, min_version: int, timeout: float | None) -> Published:
        """The newest version at ``where`` once it is >= ``min_version``.

        Raises PublisherLostError (the publisher died), WeightTimeoutError (not in time),
        WeightSyncError (no relay serves ``where``).
        """
        deadline = None if timeout is None else time.monotonic() + timeout
        async with self.changed:
            while True:
                if self.lost:
                    raise PublisherLostError(self.lost)
                published = self.entries.get(where)
                if published is not None and published.version >= min_version:
                    return published
                sources = {p.where for p in self.publishers.values()}
                if sources and where not in self.relays and where not in sources:
                    raise WeightSyncError(f"weight sync {self.name!r}: no relay at {where}")
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    raise WeightTimeoutError(
                        f"no version >= {min_version} of {self.name!r} within {timeout} s "
                        f"(newest: {self.latest})"
                    )
                with contextlib.suppress(asyncio.TimeoutError):
                    await asyncio.wait_for(self.changed.wait(), left)

    async def _alive(self, pub: _Publisher) -> bool:
        if pub.host == host_id():
            return pid_alive(pub.pid)
        for where, host in self.relay_hosts.items():
            if host == pub.host:
                try:
                    return bool(await self.relays[where].alive(pub.pid))
                except Exception:
                    return True  # the relay is gone: cannot tell
        return True

    async def _watch(self) -> None:
        while True:
            await asyncio.sleep(MONITOR_INTERVAL)
            if self.lost:
                continue
            dead = [p for p in list(self.publishers.values()) if not await self._alive(p)]
            if not dead:
                continue
            pub = dead[0]
            self.lost = f"the publisher of {self.name!r} (pid {pub.pid}) died"
            self.entries.clear()
            async with self.changed:
                self.changed.notify_all()
            for where, relay in self.relays.items():
                with contextlib.suppress(Exception):
                    await relay.drop(pub.pid if self.relay_hosts[where] == pub.host else 0)
            if pub.host == host_id():
                await asyncio.to_thread(segments.reap, pub.pid)


class WeightRelay(Actor):
    """A host's copy of the weights, fed once per version by a publisher on another host."""

    def __init__(self, per_node: bool, max_slots: int = 3) -> None:
        self.location = location(per_node)
        self.max_slots = max_slots
        self.pools: dict[int, segments.SlotPool] = {}  # shard -> its segments
        self.pending: dict[tuple[int, int], segments.Segment] = {}  # (version, shard) -> segment
        self.payloads: dict[tuple[int, int], torch.Tensor] = {}
        self.holds: dict[str, int] = {}  # segment -> the version whose bytes it holds

    @endpoint
    def where(self) -> RelayPlace:
        """This relay's location and host id."""
        return RelayPlace(self.location, host_id())

    @endpoint
    def alive(self, pid: int) -> bool:
        """Whether process ``pid`` runs on this host."""
        return pid_alive(pid)

    @endpoint
    def drop(self, dead_pid: int) -> list[str]:
        """Forget every version (the publisher died); unlink ``dead_pid``'s segments here."""
        self._abort()
        for pool in self.pools.values():
            pool.close()
        self.pools.clear()
        self.holds.clear()
        return segments.reap(dead_pid) if dead_pid else []

    def _abort(self, shard: int | None = None) -> None:
        for key in [k for k in self.pending if shard is None or k[1] == shard]:
            self.pools[key[1]].abort(self.pending.pop(key))
            self.payloads.pop(key, None)

    @endpoint
    async def begin(
        self, version: int, nbytes: int, shard: int = 0, base: int = -1, entry: Entry | None = None
    ) -> bool:
        """Lease a segment of ``nbytes`` for ``version`` (waits for slow readers). With
        ``base`` (a delta), first bring it to the newest copy here when that holds ``base`` in
        ``nbytes``: only the tensors that ``entry`` (the publisher's, with its deltas) says
        changed since the version the segment still holds, else every byte. Whether it did
        (else the publisher sends every byte).

        Raises ProtocolError when ``entry`` is neither None nor an Entry.
        """
        if entry is not None and not isinstance(entry, Entry):
            raise ProtocolError(f"begin takes a weights.Entry, not {type(entry).__name__}")
        self._abort(shard)  # an unfinished earlier version (its publisher gave up) is dropped
        pool = self.pools.setdefault(shard, segments.SlotPool(self.max_slots))
        newest = pool.newest
        seg = await asyncio.to_thread(pool.begin, nbytes)
        held = self.holds.pop(seg.name, None)  # torn until committed
        payload = torch.frombuffer(seg.payload, dtype=torch.uint8) if nbytes else torch.empty(0)
        self.pending[version, shard] = seg
        self.payloads[version, shard] = payload
        seeded = (
            base >= 0
            and newest is not None
            and newest.version == base
            and newest.payload_bytes == nbytes
        )
        if seeded and nbytes and newest is not None:
            old = torch.frombuffer(newest.payload, dtype=torch.uint8)
            delta = None
            if entry is not None and held is not None:
                delta = next((d for d in entry.deltas if d.version == held), None)
            if delta is None:
                await asyncio.to_thread(payload.copy_, old)
            else:
                await asyncio.to_thread(_copy_spans, payload, old, entry, delta.rows)
        return seeded

    @endpoint
    async def write(self, version: int, offset: int, chunk: torch.Tensor, shard: int = 0) -> None:
        """Copy one bucket (flat uint8) to ``offset`` of the pending version."""
        payload = self.payloads.get((version, shard))
        if payload is None:
            raise WeightSyncError(f"relay at {self.location}: version {version} was not begun")
        n = chunk.numel()
        await asyncio.to_thread(payload[offset : offset + n].copy_, chunk.view(torch.uint8))

    @endpoint
    def commit(self, entry: Entry) -> Entry:
        """Make the pending version of ``entry`` (the publisher's: its version, shard, layout
        and bucket starts) readable here; the relay's entry to announce.

        Raises WeightSyncError when that version was not begun, ProtocolError when ``entry``
        is not an Entry.
        """
        if not isinstance(entry, Entry):
            raise ProtocolError(f"commit takes a weights.Entry, not {type(entry).__name__}")
        version, shard = entry.version, entry.shard
        seg = self.pending.pop((version, shard), None)
        self.payloads.pop((version, shard), None)
        if seg is None:
            raise WeightSyncError(f"relay at {self.location}: version {version} was not begun")
        self.pools[shard].commit(seg, version)
        self.holds[seg.name] = version
        return Entry(PathKind.RELAY, version, entry.layout, shard, seg.name, list(entry.starts),
                     sums=list(entry.sums), deltas=entry.deltas)  # fmt: skip

    async def teardown(self) -> None:
        self._abort()
        for pool in self.pools.values():
            pool.close()
