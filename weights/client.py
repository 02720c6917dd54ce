"""WeightSync: a trainer publishes versioned state dicts; rollout workers pull them in place.

    ws = await WeightSync.create(cluster, name="policy")   # registry + one relay per node
    await ws.publish(model.state_dict(), version=k)         # trainer
    v = await ws.pull(model, min_version=k, timeout=60)     # rollout worker (any process)
    await ws.latest_version()

``WeightSync.connect(name)`` joins a running sync (inside an actor: the actor's own cluster
session). Paths, chosen per pair (docs/weights.md):

* same host, CPU: the publisher writes each version once into a shared-memory segment
  (``rayless.transport.segments``: double buffered with leases); each subscriber copies straight
  from it into its tensors: one memcpy per subscriber, no socket transfer.
* same host, CUDA (every published tensor on CUDA and ``cuda_ipc``): flattened buckets of
  ``bucket_bytes`` on the publisher's GPU, shared by CUDA IPC; one device-to-device copy per
  subscriber. The segment then carries only the version header and the lease.
* other hosts: one transfer per host, in 64 MiB pieces (two in flight), to that host's relay,
  which serves the host's subscribers by the same-host CPU path.
* ``group=`` (a torch.distributed group between trainer and rollout workers): the buckets are
  broadcast over it (gloo: CPU, NCCL: GPU); a collective, see ``rayless.weights.dist``.

``pull(into=load_weights)`` hands the weights to an inference engine's loader instead of a
module: ``load_weights`` is called once per bucket with an iterator of ``(name, tensor)``
(private copies, drawn lazily: extra memory one tensor beyond what the loader keeps), names
mapped by ``rename=`` and floating tensors converted by ``dtype=`` (vLLM's
``model.load_weights``, SGLang's ``update_weights_from_tensor``, an HF model's
``load_state_dict(strict=False)``). Tied weights travel and arrive once.

Semantics: versions are monotonic (WeightVersionError otherwise); a pull never sees a
half-written version and a slow subscriber skips to the newest; dtypes are converted on the
copy; a name or shape mismatch raises WeightMismatchError naming the tensor before anything
is copied; a dead publisher fails pulls with PublisherLostError.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import os
import time
from collections.abc import Callable, Mapping
from typing import Any

import torch

from rayless.actors import ActorHandle, Cluster, connect
from rayless.actors.api.components import spawn_all
from rayless.actors.api.lifecycle import opener
from rayless.actors.api.timeline import traced, weights_span
from rayless.transport import segments
from rayless.transport.errors import ClosedError, ProtocolError, RaylessError
from rayless.transport.protocol import host_id
from rayless.weights.errors import WeightInputError, WeightSyncError
from rayless.weights.layout import (
    Layout,
    Loader,
    Rename,
    bucket_sizes,
    check,
    feed_into,
    make_layout,
    read_into,
    renamer,
    targets_of,
    tensors_of,
    write_from,
)
from rayless.weights.service import WeightRegistry, WeightRelay, location

__all__ = ["DEFAULT_BUCKET_BYTES", "WeightSync"]

DEFAULT_BUCKET_BYTES = 512 << 20
DIST = "@torch.distributed"  # the registry's location of versions sent over a group
IN_FLIGHT = 2  # chunks on their way to one relay at a time
RELAY_CHUNK = 64 << 20  # a bucket travels to a relay in pieces of this size (a pipeline)


def _starts(sizes: list[int]) -> list[int]:
    return [0, *itertools.accumulate(sizes)][:-1]


class WeightSync:
    """A client of one weight sync (publisher, subscriber, or both). See the module docstring.

    Attributes: ``name``; ``version`` (the last version this client published or pulled,
    -1 before); ``last_pull_s`` / ``last_publish_s`` (seconds the last one took).
    """

    def __init__(
        self,
        registry: ActorHandle[Any],
        name: str,
        info: dict[str, Any],
        *,
        cluster: Cluster | None = None,
        owned: bool = False,
        relays: list[ActorHandle[Any]] | None = None,
        bucket_bytes: int = DEFAULT_BUCKET_BYTES,
        cuda_ipc: bool = True,
        max_slots: int = 3,
    ) -> None:
        self.name = name
        self._registry = registry
        self._cluster = cluster
        self._owned = owned
        self._own_cluster = False
        self._relays = relays or []
        self.location = location(bool(info["per_node"]))
        self.bucket_bytes = bucket_bytes
        self.cuda_ipc = cuda_ipc
        self.max_slots = max_slots
        self.version = -1
        self.last_pull_s = 0.0
        self.last_publish_s = 0.0
        self._pool: segments.SlotPool | None = None
        self._reader = segments.Reader()
        self._cuda: dict[str, tuple[list[torch.Tensor], list[Any]]] = {}  # segment -> buckets
        self._opened: dict[tuple[str, int], tuple[bytes, torch.Tensor]] = {}  # IPC buckets
        self._publishing = asyncio.Lock()
        self._pulling = asyncio.Lock()
        self._closed = False

    # -- lifecycle -----------------------------------------------------------------------

    @classmethod
    @opener
    async def create(
        cls,
        cluster: Cluster,
        name: str = "weights",
        *,
        per_node: bool = False,
        bucket_bytes: int = DEFAULT_BUCKET_BYTES,
        cuda_ipc: bool = True,
        max_slots: int = 3,
    ) -> WeightSync:
        """Spawn the registry (an actor named ``name``) and one relay per node.

        ``per_node`` treats every node as its own host (each node's subscribers read their
        relay's copy: the cross-host path on one machine, for tests and benchmarks). Raises
        ValueError for bad sizes, NameTakenError when ``name`` is taken.
        """
        if bucket_bytes < 1 or max_slots < 2:
            raise ValueError("bucket_bytes must be >= 1 and max_slots >= 2")
        registry = await cluster.spawn(WeightRegistry, name, per_node, name=name, cpus=0)
        alive = [n["node_id"] for n in await cluster.nodes(actors=False) if n.get("alive", True)]
        relays = await spawn_all(
            cluster,
            [cluster.spawn(WeightRelay, per_node, max_slots, node=node, cpus=0) for node in alive],
            kill_on_error=[registry],
        )
        await registry.add_relays(relays)
        info = await registry.info()
        return cls(registry, name, info, cluster=cluster, owned=True, relays=relays,
                   bucket_bytes=bucket_bytes, cuda_ipc=cuda_ipc, max_slots=max_slots)  # fmt: skip

    @classmethod
    @opener
    async def connect(
        cls, name: str = "weights", cluster: Cluster | None = None, **options: Any
    ) -> WeightSync:
        """A client of the running sync ``name`` (options: bucket_bytes, cuda_ipc, max_slots).

        Raises ActorNotFoundError when no such sync runs.
        """
        own = cluster is None
        cluster = cluster or await connect()
        try:
            registry = await cluster.get_actor(name)
            sync = cls(registry, name, await registry.info(), cluster=cluster, **options)
        except BaseException:
            if own:
                await cluster.aclose()
            raise
        sync._own_cluster = own
        return sync

    async def aclose(self) -> None:
        """End this client (idempotent): unlink its segments (a publisher's pulls then fail
        with PublisherLostError); the creator's also kills the registry and the relays. Never
        raises for a cluster that is already gone."""
        if self._closed:
            return
        self._closed = True
        if self._pool is not None:  # this client published: its versions go away
            if not self._owned:
                try:
                    await self._registry.retire(os.getpid())
                except RaylessError:
                    pass
            self._pool.close()
        self._reader.close()
        self._opened.clear()
        self._cuda.clear()
        cluster = self._cluster
        if cluster is not None and self._owned and not cluster.closed:
            for handle in [*self._relays, self._registry]:
                try:
                    await cluster.kill(handle)
                except RaylessError:
                    pass
        if cluster is not None and self._own_cluster:
            await cluster.aclose()

    async def __aenter__(self) -> WeightSync:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    def _check_open(self) -> None:
        if self._closed:
            raise ClosedError(f"this client of weight sync {self.name!r} is closed")

    async def latest_version(self) -> int:
        """The newest version published (-1: none yet). Raises ClosedError once closed."""
        self._check_open()
        return int(await self._registry.latest_version())

    # -- publish -------------------------------------------------------------------------

    @traced("weights", "publish", weights_span)
    async def publish(
        self,
        state: Mapping[str, Any],
        version: int,
        *,
        shard: int = 0,
        num_shards: int = 1,
        group: Any = None,
        src: int | None = None,
    ) -> int:
        """Publish the tensors of ``state`` (a state dict) as ``version``; returns it once
        every host can pull it. Publishes of one client run one at a time.

        ``shard``/``num_shards``: every rank of a sharded trainer publishes its own tensors
        (distinct names) as shard ``shard``; the version is complete, and pulls see it whole,
        once every shard published it.

        With ``group`` (a torch.distributed process group, e.g. ``dist.group.WORLD``) the
        version is broadcast over it from ``src`` (default: this process's global rank)
        instead, and only that group's members get it (each calls ``pull(group=...)``).

        Raises WeightVersionError unless ``version`` is above every version published (and
        every version this shard published), WeightInputError for a bad shard, OSError when
        shared memory is exhausted, ClosedError once closed.
        """
        self._check_open()
        tensors = tensors_of(state)
        async with self._publishing:
            t0 = time.perf_counter()
            feeds = await self._registry.begin(
                version, os.getpid(), host_id(), self.location, shard, num_shards
            )
            layout = make_layout(tensors, self.bucket_bytes)
            if group is not None:
                await self._broadcast(tensors, layout, version, group, src)
                self.version = version
                self.last_publish_s = time.perf_counter() - t0
                return version
            cuda = self.cuda_ipc and bool(tensors) and all(t.is_cuda for t in tensors.values())
            write = self._write_cuda if cuda else self._write_shm
            entry, chunks = await asyncio.to_thread(write, tensors, layout, version)
            entry["shard"] = shard
            await self._registry.announce(self.location, entry)
            if feeds:
                await asyncio.gather(*(self._feed(w, r, entry, chunks) for w, r in feeds))
            self.version = version
            self.last_publish_s = time.perf_counter() - t0
        return version

    async def _broadcast(
        self,
        tensors: dict[str, torch.Tensor],
        layout: Layout,
        version: int,
        group: Any,
        src: int | None,
    ) -> None:
        import torch.distributed as dist

        from rayless.weights import dist as weights_dist

        rank = dist.get_rank() if src is None else src
        await asyncio.to_thread(weights_dist.send, tensors, layout, version, rank, group)
        entry = {"version": version, "kind": "dist", "segment": "", "layout": layout}
        await self._registry.announce(DIST, entry)

    def _slots(self) -> segments.SlotPool:
        if self._pool is None:
            self._pool = segments.SlotPool(self.max_slots)
        return self._pool

    def _write_shm(
        self, tensors: dict[str, torch.Tensor], layout: Layout, version: int
    ) -> tuple[dict[str, Any], list[torch.Tensor]]:
        sizes = bucket_sizes(layout)
        starts = _starts(sizes)
        pool = self._slots()
        seg = pool.begin(sum(sizes))
        try:
            chunks: list[torch.Tensor] = []
            if sum(sizes):
                payload = torch.frombuffer(seg.payload, dtype=torch.uint8)
                chunks = [payload[s : s + n] for s, n in zip(starts, sizes, strict=True)]
                write_from(tensors, layout, [payload] * len(sizes), starts)
        except BaseException:
            pool.abort(seg)
            raise
        pool.commit(seg, version)
        entry = {"version": version, "kind": "shm", "segment": seg.name, "layout": layout,
                 "starts": starts}  # fmt: skip
        return entry, chunks

    def _write_cuda(
        self, tensors: dict[str, torch.Tensor], layout: Layout, version: int
    ) -> tuple[dict[str, Any], list[torch.Tensor]]:
        from rayless.transport._cuda import ipc_fields

        sizes = bucket_sizes(layout)
        device = next(iter(tensors.values())).device
        pool = self._slots()
        seg = pool.begin(0)  # the header only: version and lease; the bytes live on the GPU
        try:
            have = self._cuda.get(seg.name)
            if have is None or [b.numel() for b in have[0]] != sizes or have[0][0].device != device:
                buckets = [torch.empty(n, dtype=torch.uint8, device=device) for n in sizes]
                have = (buckets, [ipc_fields(b) for b in buckets])
                self._cuda[seg.name] = have
            write_from(tensors, layout, have[0])
            torch.cuda.synchronize(device)
        except BaseException:
            pool.abort(seg)
            raise
        pool.commit(seg, version)
        entry = {"version": version, "kind": "cuda", "segment": seg.name, "layout": layout,
                 "buckets": have[1], "starts": _starts(sizes)}  # fmt: skip
        return entry, have[0]

    async def _feed(
        self, where: str, relay: ActorHandle[Any], entry: dict[str, Any], chunks: list[Any]
    ) -> None:
        """One transfer to another host's relay, in RELAY_CHUNK pieces, IN_FLIGHT at a time."""
        version, starts, shard = entry["version"], entry["starts"], entry["shard"]
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
        relayed = await relay.commit(version, entry["layout"], starts, shard)
        await self._registry.announce(where, relayed)

    # -- pull ----------------------------------------------------------------------------

    @traced("weights", "pull", weights_span)
    async def pull(
        self,
        target: Any = None,
        min_version: int = 0,
        timeout: float | None = None,
        *,
        strict: bool = True,
        group: Any = None,
        src: int = 0,
        into: Loader | None = None,
        rename: Rename | None = None,
        dtype: torch.dtype | None = None,
    ) -> int:
        """Load the newest version >= ``min_version`` into ``target`` in place, or hand it to
        the loader ``into``; its number.

        ``target``: a ``torch.nn.Module`` (its parameters and buffers) or a dict of tensors.
        ``strict`` (default): every target tensor must be published and vice versa.
        ``into`` (instead of ``target``): an engine's loader, called in a worker thread once
        per bucket with an iterator of ``(name, tensor)`` (private copies; tied weights once,
        under the first name): names through ``rename`` (a mapping, names not in it unchanged,
        or a callable; None drops the tensor), floating tensors converted to ``dtype``.
        ``group``: receive the broadcasts of global rank ``src`` over that torch.distributed
        group (one per ``publish(group=...)``, in order, until one is >= ``min_version``;
        ``timeout`` does not apply to the collective).

        Raises WeightMismatchError (a name or shape differs; nothing copied),
        WeightTimeoutError (no such version within ``timeout`` s; None waits on),
        PublisherLostError (the publisher died), WeightSyncError (no path to the weights),
        WeightInputError (both or neither of ``target`` and ``into``; ``rename``/``dtype``
        without ``into``), TypeError (not a module or dict, a bad ``rename`` or ``dtype``),
        ClosedError once closed; what the loader raises, as itself.
        """
        self._check_open()
        sink = self._sink(target, strict, into, rename, dtype)
        if group is not None:
            return await self._receive(sink, min_version, group, src)
        deadline = None if timeout is None else time.monotonic() + timeout
        async with self._pulling:
            t0 = time.perf_counter()
            while True:
                left = None if deadline is None else max(0.0, deadline - time.monotonic())
                entry = await self._registry.wait(self.location, min_version, left)
                parts = entry["parts"] if entry["kind"] == "parts" else [entry]
                sink.check([row for part in parts for row in part["layout"]])
                try:
                    await asyncio.to_thread(self._read, entry, sink)
                except segments.Superseded:  # rewritten meanwhile: a newer one is out
                    min_version = max(min_version, int(entry["version"]) + 1)
                    continue
                self.version = int(entry["version"])
                self.last_pull_s = time.perf_counter() - t0
                return self.version

    def _sink(
        self,
        target: Any,
        strict: bool,
        into: Loader | None,
        rename: Rename | None,
        dtype: torch.dtype | None,
    ) -> _Sink:
        if (target is None) == (into is None):
            raise WeightInputError("pull takes a target (module or dict) or into=, one of them")
        if into is None:
            if rename is not None or dtype is not None:
                raise WeightInputError("rename= and dtype= apply to pull(into=...) only")
            return _Targets(targets_of(target), strict)
        if not callable(into):
            raise TypeError(f"into is a callable (an engine's loader), not {type(into)}")
        if dtype is not None and not isinstance(dtype, torch.dtype):
            raise TypeError(f"dtype is a torch.dtype, not {type(dtype)}")
        return _Loader(into, renamer(rename), dtype)

    async def _receive(self, sink: _Sink, min_version: int, group: Any, src: int) -> int:
        from rayless.weights import dist as weights_dist

        async with self._pulling:
            t0 = time.perf_counter()
            while True:
                version, layout, buckets = await asyncio.to_thread(weights_dist.receive, src, group)
                sink.check(layout)  # after the receive: the collective stays in step
                await asyncio.to_thread(sink.copy, layout, buckets, None)
                if version >= min_version:
                    self.version = version
                    self.last_pull_s = time.perf_counter() - t0
                    return version

    def _read(self, entry: dict[str, Any], sink: _Sink) -> None:
        parts = entry["parts"] if entry["kind"] == "parts" else [entry]
        with contextlib.ExitStack() as leases:  # every shard of the version leased at once
            payloads = [leases.enter_context(self._reader.lease(p["segment"], p["version"]))
                        for p in parts]  # fmt: skip
            cuda = False
            for part, payload in zip(parts, payloads, strict=True):
                if part["kind"] == "cuda":
                    sink.copy(part["layout"], self._ipc_buckets(part), None)
                    cuda = True
                elif payload.nbytes:
                    flat = torch.frombuffer(payload, dtype=torch.uint8)
                    sink.copy(part["layout"], [flat] * len(part["starts"]), part["starts"])
            if cuda:
                torch.cuda.synchronize()

    def _ipc_buckets(self, entry: dict[str, Any]) -> list[torch.Tensor]:
        from rayless.transport._cuda import open_ipc

        out = []
        for i, fields in enumerate(entry["buckets"]):
            key = (entry["segment"], i)
            have = self._opened.get(key)
            if have is None or have[0] != fields[5]:
                try:
                    opened = open_ipc(torch.uint8, fields, None)
                except (ProtocolError, RuntimeError) as exc:  # no CUDA, or not this GPU
                    raise WeightSyncError(
                        f"weight sync {self.name!r}: the weights are on the publisher's GPU "
                        f"and this process cannot open them ({exc}); publish CPU tensors or "
                        "create the sync with cuda_ipc=False"
                    ) from None
                have = (fields[5], opened)
                self._opened[key] = have
            out.append(have[1])
        return out


class _Sink:
    """Where a pull's bytes go: ``check`` a layout first, then ``copy`` each part into it."""

    def check(self, layout: Layout) -> None:
        """Raise WeightMismatchError before anything is copied (default: nothing to check)."""

    def copy(self, layout: Layout, buckets: list[torch.Tensor], starts: list[int] | None) -> None:
        raise NotImplementedError


class _Targets(_Sink):
    """A module's or a dict's tensors, filled in place."""

    def __init__(self, targets: dict[str, torch.Tensor], strict: bool) -> None:
        self.targets = targets
        self.strict = strict

    def check(self, layout: Layout) -> None:
        check(layout, self.targets, self.strict)

    def copy(self, layout: Layout, buckets: list[torch.Tensor], starts: list[int] | None) -> None:
        read_into(layout, buckets, self.targets, starts)


class _Loader(_Sink):
    """An engine's loader, called once per bucket (``feed_into``)."""

    def __init__(
        self, loader: Loader, rename: Callable[[str], str | None], dtype: torch.dtype | None
    ) -> None:
        self.loader = loader
        self.rename = rename
        self.dtype = dtype

    def copy(self, layout: Layout, buckets: list[torch.Tensor], starts: list[int] | None) -> None:
        feed_into(layout, buckets, self.loader, self.rename, self.dtype, starts)
