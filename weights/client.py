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

Each path is one module of ``rayless.weights.paths`` behind one interface, chosen from its
registry (``rayless.weights.paths.registry``): the client only lays the tensors out, asks the
registry actor, and announces and reads typed entries (``rayless.weights.messages``).

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
import dataclasses
import inspect
import os
import time
from collections.abc import Callable, Mapping
from typing import Any

import torch

from rayless.actors import ActorHandle, Cluster, connect
from rayless.actors.ext import opener, spawn_all, traced, weights_span
from rayless.transport import segments
from rayless.transport.errors import ClosedError, ProtocolError, RaylessError
from rayless.transport.ext import host_id
from rayless.weights.checksums import sums_of
from rayless.weights.checksums import verify as verify_sums
from rayless.weights.engines import Feed, update_engine
from rayless.weights.errors import (
    WeightChecksumError,
    WeightInputError,
    WeightMismatchError,
    WeightSyncError,
)
from rayless.weights.layout import (
    Layout,
    Loader,
    Rename,
    dtype_of,
    make_layout,
    targets_of,
    tensors_of,
)
from rayless.weights.messages import Entry, Piece, Published, ShardSpec, SyncInfo
from rayless.weights.paths.base import PublishRequest, PullRequest, Slots, WeightPath
from rayless.weights.paths.registry import Paths
from rayless.weights.paths.relay import forward
from rayless.weights.reshard import Spec, resharding, spec_of
from rayless.weights.service import WeightRegistry, WeightRelay, location
from rayless.weights.sinks import Sink, Targets, sink_for

__all__ = ["DEFAULT_BUCKET_BYTES", "WeightSync"]

DEFAULT_BUCKET_BYTES = 512 << 20


def _checked(value: Any, kind: type[Any], what: str) -> Any:
    """``value``, once it is a ``kind``. Raises ProtocolError when it is not."""
    if not isinstance(value, kind):
        raise ProtocolError(f"the weight registry answered {what} with {type(value).__name__}")
    return value


def _check_held(published: Published, targets: dict[str, torch.Tensor]) -> None:
    """Compare every published tensor's checksum with its target's bytes (see
    ``check_weights``). Raises WeightChecksumError, WeightSyncError (no checksums)."""
    for part in published.parts:
        if len(part.sums) != len(part.layout):
            raise WeightSyncError(f"version {part.version} was published without checksums")
        held = []
        for row in part.layout:
            t = targets[row[0]].detach().to("cpu", dtype_of(row[1])).contiguous()
            held.append(t.reshape(-1).view(torch.uint8).numpy().data)
        for row, want, have in zip(part.layout, part.sums, sums_of(held), strict=True):
            if want != have:
                raise WeightChecksumError(row[0], part.version)


def _pieces(layout: Layout, slices: Callable[[str], ShardSpec | None]) -> tuple[Piece, ...]:
    """The rows of ``layout`` that are slices (``slices`` of their names). Raises
    WeightMismatchError for a slice along a dimension the tensor has not."""
    out = []
    for i, row in enumerate(layout):
        spec = slices(row[0])
        if spec is not None:
            if spec.dim >= len(row[2]):
                raise WeightMismatchError(row[0], f"is {len(row[2])}-d: no slice along {spec.dim}")
            out.append(Piece(i, spec))
    return tuple(out)


def _same(a: Any, b: Any) -> bool:
    """Whether ``a`` and ``b`` are one pull target: the same object, or the same bound method
    (``model.load_weights`` is a new object at each access)."""
    if a is b:
        return True
    return (
        inspect.ismethod(a)
        and inspect.ismethod(b)
        and a.__self__ is b.__self__
        and a.__func__ is b.__func__
    )


def _changed_since(part: Entry, since: int | None) -> Entry:
    """``part`` reduced to the rows that changed since version ``since`` (a delta), when the
    publisher described that delta; else ``part``, whole."""
    if since is None:
        return part
    delta = next((d for d in part.deltas if d.version == since), None)
    if delta is None:
        return part
    sums = [part.sums[i] for i in delta.rows] if len(part.sums) == len(part.layout) else []
    index = {old: new for new, old in enumerate(delta.rows)}
    pieces = tuple(Piece(index[p.row], p.spec) for p in part.pieces if p.row in index)
    return dataclasses.replace(
        part, layout=[part.layout[i] for i in delta.rows], sums=sums, pieces=pieces
    )


def _feeds(value: Any) -> list[tuple[str, ActorHandle[Any]]]:
    """The registry's answer to ``begin``: (location, relay) pairs. Raises ProtocolError when
    it is anything else."""
    if not isinstance(value, list) or not all(
        isinstance(f, (list, tuple))
        and len(f) == 2
        and isinstance(f[0], str)
        and isinstance(f[1], ActorHandle)
        for f in value
    ):
        raise ProtocolError(f"the weight registry answered begin() with {value!r:.80}")
    return [(str(w), r) for w, r in value]


class WeightSync:
    """A client of one weight sync (publisher, subscriber, or both). See the module docstring.

    Attributes: ``name``; ``version`` (the last version this client published or pulled,
    -1 before); ``last_pull_s`` / ``last_publish_s`` (seconds the last one took).
    """

    def __init__(
        self,
        registry: ActorHandle[Any],
        name: str,
        info: SyncInfo,
        *,
        cluster: Cluster | None = None,
        owned: bool = False,
        relays: list[ActorHandle[Any]] | None = None,
        bucket_bytes: int = DEFAULT_BUCKET_BYTES,
        cuda_ipc: bool = True,
        max_slots: int = 3,
        checksums: bool = False,
    ) -> None:
        self.name = name
        self._registry = registry
        self._cluster = cluster
        self._owned = owned
        self._own_cluster = False
        self._relays = relays or []
        self.location = location(_checked(info, SyncInfo, "info()").per_node)
        self.bucket_bytes = bucket_bytes
        self.cuda_ipc = cuda_ipc
        self.max_slots = max_slots
        self.checksums = checksums
        self.version = -1
        self.last_pull_s = 0.0
        self.last_publish_s = 0.0
        self._slots = Slots(max_slots)
        self._paths = Paths(name, self._slots)
        self._reader = segments.Reader()
        self._publishing = asyncio.Lock()
        self._pulling = asyncio.Lock()
        self._closed = False
        self._held: tuple[Any, int] | None = None  # (target or loader, version it holds)
        self._relayed: dict[tuple[str, int], int] = {}  # (location, shard) -> version sent
        self._feed: Feed | None = None  # the loader of the engine last updated

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
        checksums: bool = False,
    ) -> WeightSync:
        """Spawn the registry (an actor named ``name``) and one relay per node.

        ``per_node`` treats every node as its own host (each node's subscribers read their
        relay's copy: the cross-host path on one machine, for tests and benchmarks).
        ``checksums``: this client's publishes carry a CRC-32 per tensor (what
        ``pull(verify=True)`` and ``check_weights`` check; on the shared-memory paths). Off by
        default: on two cores they cost a third of a sync. Raises ValueError for bad sizes,
        NameTakenError when ``name`` is taken.
        """
        if bucket_bytes < 1 or max_slots < 2:
            raise ValueError("bucket_bytes must be >= 1 and max_slots >= 2")
        registry = await cluster.spawn(WeightRegistry, name, per_node, name=name, cpus=0)
        alive = [n.node_id for n in await cluster.node_views() if n.alive]
        relays = await spawn_all(
            cluster,
            [cluster.spawn(WeightRelay, per_node, max_slots, node=node, cpus=0) for node in alive],
            kill_on_error=[registry],
        )
        await registry.add_relays(relays)
        info = await registry.info()
        return cls(registry, name, info, cluster=cluster, owned=True, relays=relays,
                   bucket_bytes=bucket_bytes, cuda_ipc=cuda_ipc, max_slots=max_slots,
                   checksums=checksums)  # fmt: skip

    @classmethod
    @opener
    async def connect(
        cls, name: str = "weights", cluster: Cluster | None = None, **options: Any
    ) -> WeightSync:
        """A client of the running sync ``name`` (options: bucket_bytes, cuda_ipc, max_slots,
        checksums).

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
        if self._slots.used:  # this client published: its versions go away
            if not self._owned:
                try:
                    await self._registry.retire(os.getpid())
                except RaylessError:
                    pass
            self._slots.close()
        self._reader.close()
        self._paths.close()
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
        delta: bool = False,
        split: Spec | None = None,
    ) -> int:
        """Publish the tensors of ``state`` (a state dict) as ``version``; returns it once
        every host can pull it. Publishes of one client run one at a time.

        ``shard``/``num_shards``: every rank of a sharded trainer publishes its own tensors
        (distinct names) as shard ``shard``; the version is complete, and pulls see it whole,
        once every shard published it.

        With ``group`` (a torch.distributed process group, e.g. ``dist.group.WORLD``) the
        version is broadcast over it from ``src`` (default: this process's global rank)
        instead, and only that group's members get it (each calls ``pull(group=...)``).

        ``delta``: write and send only the tensors whose bytes differ from this client's
        previous version (same names, shapes and dtypes; else everything); a subscriber that
        holds one of the last few versions copies only what changed since it, any other (new,
        restarted, behind) copies the whole version. Over a group everything is sent.

        ``split`` (with ``shard``/``num_shards``: a tensor- or FSDP-parallel trainer): which
        tensors of ``state`` are slices, and which (a ``ShardSpec``, a mapping of names, or a
        function of the name; None: whole). Every rank then publishes the same names, each
        its slices; a pull with ``shard=`` copies its own slice of each from every shard.

        Raises WeightVersionError unless ``version`` is above every version published (and
        every version this shard published), WeightInputError for a bad shard, OSError when
        shared memory is exhausted, ClosedError once closed.
        """
        self._check_open()
        tensors = tensors_of(state)
        slices = spec_of(split)
        if split is not None and group is not None:
            raise WeightInputError("split= does not travel over a group")
        async with self._publishing:
            t0 = time.perf_counter()
            layout = make_layout(tensors, self.bucket_bytes)
            pieces = _pieces(layout, slices)  # a bad split is refused before anything changes
            feeds = await self._registry.begin(
                version, os.getpid(), host_id(), self.location, shard, num_shards
            )
            request = PublishRequest(tensors, layout, version, shard, self.cuda_ipc, group, src,
                                     checksums=self.checksums, delta=delta)  # fmt: skip
            path = self._paths.publisher(request)
            written = await asyncio.to_thread(path.write, request)
            if pieces:
                written.entry = dataclasses.replace(written.entry, pieces=pieces)
            await self._registry.announce(written.where or self.location, written.entry)
            chunks = written.chunks
            if chunks is not None:
                entry = written.entry
                feeds_to = _feeds(feeds)
                # what each relay was sent last; one that fails below gets everything next time
                bases = {w: self._relayed.pop((w, shard), -1) for w, _ in feeds_to}
                await asyncio.gather(
                    *(forward(self._registry, w, r, entry, chunks, bases[w]) for w, r in feeds_to)
                )
                for w, _ in feeds_to:
                    self._relayed[w, shard] = version
            self.version = version
            self.last_publish_s = time.perf_counter() - t0
        return version

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
        verify: bool = False,
        shard: Spec | None = None,
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
        ``verify``: check every tensor's bytes against the checksum published with them
        before copying anything (the shared-memory paths; the publisher's ``checksums``).
        After a delta publish, a pull into the same target (or loader) as this client's last
        pull copies only the tensors that changed since the version that pull got.
        ``shard``: this engine rank's slice of each tensor (a ``ShardSpec(dim, rank, world)``
        for every tensor, a mapping of names, or a function of the name; None: whole), put
        together from whatever slices the publisher's shards published; ``target``'s tensors
        have the slices' shapes; a loader gets them once every shard is copied.

        Raises WeightMismatchError (a name or shape differs; nothing copied),
        WeightChecksumError (``verify``: a tensor's bytes do not match; nothing copied),
        WeightTimeoutError (no such version within ``timeout`` s; None waits on),
        PublisherLostError (the publisher died), WeightSyncError (no path to the weights),
        WeightInputError (both or neither of ``target`` and ``into``; ``rename``/``dtype``
        without ``into``), TypeError (not a module or dict, a bad ``rename`` or ``dtype``),
        ClosedError once closed; what the loader raises, as itself.
        """
        self._check_open()
        plain = sink_for(target, strict, into, rename, dtype)
        sink: Sink = plain if shard is None else resharding(plain, shard, self.bucket_bytes)
        request = PullRequest(group, src)
        receiver = self._paths.receiver(request)
        key = target if into is None else into
        if receiver is not None:
            if verify:
                raise WeightInputError("verify= applies to pulls through the registry")
            self._held = None
            return await self._receive(receiver, sink, min_version, request)
        deadline = None if timeout is None else time.monotonic() + timeout
        async with self._pulling:
            held, self._held = self._held, None  # a copy that fails leaves its target torn
            same = held is not None and _same(held[0], key) and sink.takes_deltas
            since = held[1] if held is not None and same else None
            copying = [False]  # set by _read before its first copy
            t0 = time.perf_counter()
            try:
                while True:
                    left = None if deadline is None else max(0.0, deadline - time.monotonic())
                    published = _checked(
                        await self._registry.wait(self.location, min_version, left),
                        Published,
                        "wait()",
                    )
                    sink.check_parts(published.parts)
                    try:
                        await asyncio.to_thread(self._read, published, sink, since, verify, copying)
                    except segments.Superseded:  # rewritten meanwhile: a newer one is out
                        min_version = max(min_version, published.version + 1)
                        continue
                    break
            except BaseException:
                if not copying[0]:  # nothing copied: the target still holds what it held
                    self._held = held
                raise
            self._held = (key, published.version)
            self.version = published.version
            self.last_pull_s = time.perf_counter() - t0
            return self.version

    async def check_weights(
        self, target: Any, min_version: int = 0, timeout: float | None = None
    ) -> int:
        """Check that ``target`` (a module or a dict of tensors) holds exactly the newest
        version >= ``min_version``, bit for bit in the published dtypes (a target of another
        dtype is converted back first), against the checksums published with it; that
        version. Copies nothing.

        Raises WeightChecksumError naming the first tensor that differs, WeightMismatchError
        (a name or shape differs), WeightSyncError (published without checksums),
        WeightTimeoutError, PublisherLostError, ClosedError once closed.
        """
        self._check_open()
        sink = Targets(targets_of(target), True)
        published = _checked(
            await self._registry.wait(self.location, min_version, timeout), Published, "wait()"
        )
        sink.check_parts(published.parts)
        await asyncio.to_thread(_check_held, published, sink.targets)
        return int(published.version)

    async def update_engine(
        self,
        engine: Any,
        min_version: int = 0,
        timeout: float | None = None,
        *,
        rename: Rename | None = None,
        dtype: torch.dtype | None = None,
        verify: bool = False,
        shard: Spec | None = None,
    ) -> int:
        """Update ``engine`` (an ``UpdatableEngine``: vLLM's protocol, or a ``ModuleEngine``)
        to the newest version >= ``min_version`` through its own protocol: wait for the
        version, then pause its generation, start the update, hand it the weights bucket by
        bucket (``pull(into=...)`` with these options), finish, resume; the version.

        Raises what ``pull`` raises, TypeError when ``engine`` lacks a method of the protocol,
        and what the engine raises, as itself; an engine that failed after its first bucket
        stays paused (its weights are torn: update it again, then resume it).
        """
        self._check_open()
        feed = self._feed if self._feed is not None and self._feed.engine is engine else None
        feed = self._feed = feed or Feed(engine)

        async def wait() -> int:
            published = _checked(
                await self._registry.wait(self.location, min_version, timeout), Published, "wait()"
            )
            return int(published.version)

        return await update_engine(feed, self.pull, wait, timeout=timeout, rename=rename,
                                   dtype=dtype, verify=verify, shard=shard)  # fmt: skip

    async def _receive(
        self, path: WeightPath, sink: Sink, min_version: int, request: PullRequest
    ) -> int:
        async with self._pulling:
            t0 = time.perf_counter()
            while True:
                version = await asyncio.to_thread(path.receive, sink, request)
                if version >= min_version:
                    self.version = version
                    self.last_pull_s = time.perf_counter() - t0
                    return version

    def _read(
        self,
        published: Published,
        sink: Sink,
        since: int | None,
        verify: bool,
        copying: list[bool],
    ) -> None:
        parts = [_changed_since(p, since) for p in published.parts]
        with contextlib.ExitStack() as leases:  # every shard of the version leased at once
            payloads = [leases.enter_context(self._reader.lease(p.segment, p.version))
                        for p in parts]  # fmt: skip
            if verify:  # every shard checked before anything is copied
                for part, payload in zip(parts, payloads, strict=True):
                    verify_sums(part, payload)
            used: list[WeightPath] = []
            copying[0] = True
            for part, payload in zip(parts, payloads, strict=True):
                path = self._paths[part.kind]
                path.read(part, payload, sink)
                if path not in used:
                    used.append(path)
            for path in used:
                path.settle()
        sink.finish()
