"""Store: the client of the sharded store, usable from a driver and from inside any actor.

    async with Store.create(cluster, num_units=2, device="cpu") as st:  # controller + units
        meta = await st.put(td, partition="train")
        batch = await st.get_meta(partition="train", fields=["obs"], batch_size=64, task="learner")
        td = await st.get(batch)

``Store.connect(name)`` finds a running store by its controller's name (inside an actor it uses
the actor's own cluster session). Both openers work awaited or with ``async with``.

Start-up: ``create`` returns once the controller serves; the units start in the background
(their fork template may still be importing torch). One gate, :meth:`Store.ready`, stands in
front of every public coroutine method (``_gated``): each waits there first, under its own
``timeout`` when it has a positive one, else ``START_TIMEOUT``, and raises the start's error
if a unit failed to start. ``connect`` meanwhile waits in the controller, whose ``units()``
hands out the unit table only once it is complete (within a deadline).

Lifecycle: ``aclose()`` (idempotent; also on leaving ``async with``) ends this client, and
then every call on it raises ClosedError. The client that *created* the store owns it: its
``aclose()`` also kills the controller and the units (they belong to the creator's session
anyway, and die with it); a connected client's ``aclose()`` only detaches. ``shutdown()`` is
the explicit form: kill the store now, raising StoreError for a client that does not own it.

A put splits the TensorDict per storage unit (one frame per tensor per unit) and writes all
units in parallel (same-host units through :class:`~rayless.store.samehost.plane.LocalPlane`, with
their rows reserved while the controller allocates the samples); each unit ACKs only after the
controller recorded its data. ``get_meta`` asks the controller for a BatchMeta (waiting fetches,
samplers). A get reads only the units holding the meta's samples, in parallel, while the
controller checks the meta, then merges in order and moves the fields to their device. A dead
unit fails a call as UnitLostError (and is reported to the controller). The Store keeps the
lifecycle and delegates: puts to its :class:`~rayless.store.client.put_path.PutPath`, fetches
and reads to its :class:`~rayless.store.client.get_path.GetPath`, unit keys to its
:class:`~rayless.store.client.unit_keys.UnitKeys`; they reach the actors through the client's
:class:`~rayless.store.client.link.StoreLink`.

Clearing samples and partitions, production and consumption status, consumption resets, lost
samples, custom metadata, and the controller's and units' metrics and stats: each is one
controller call (metrics and stats also ask every live unit, in parallel).

The store has two key-value faces. **Partition keys** (TransferQueue 0.1.x's KV interface, same
names and arguments): ``kv_batch_put(keys, partition_id, fields=None, tags=None)`` names
samples of a partition by string keys: a new key allocates a sample (its ``tags`` are the
sample's custom metadata), an existing key gets ``fields`` written onto its sample (a
column-wise put) and its tags replaced. The samples are ordinary samples: ``get_meta`` fetches
them, ``clear`` removes them. ``kv_batch_get(keys, partition_id, select_fields=None)`` reads
them in order, ``kv_list(partition_id=None)`` returns ``{partition: {key: tags}}`` and
``kv_clear(keys, partition_id)`` removes them. A batch mixing new and existing keys is two
puts (new samples, then fields onto the old ones): each is atomic, the pair is not.

**Unit keys** (rayless's own, no partition): ``kv_put(keys, td)`` / ``kv_get`` / ``kv_keys`` /
``kv_delete`` hash each key onto one unit and overwrite in place; nothing of the controller is
involved (these keys are never fetched).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import inspect
import json
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import torch
from tensordict import NonTensorStack, TensorDict, TensorDictBase

from rayless.actors import ActorHandle, Cluster, Template, connect
from rayless.actors.ext import opener, spawn_all, store_span, traced
from rayless.store.client.get_path import GetPath
from rayless.store.client.leases import GIVE_BACK_TIMEOUT, Leases
from rayless.store.client.link import StoreLink
from rayless.store.client.put_path import PutPath
from rayless.store.client.unit_keys import UnitKeys
from rayless.store.controller.actor import StoreController
from rayless.store.controller.fetches import check_timeout
from rayless.store.data.kv_meta import KVBatchMeta
from rayless.store.data.messages import FetchMode, UnitView
from rayless.store.data.meta import BatchMeta
from rayless.store.data.rows import take
from rayless.store.data.schema import split_columns
from rayless.store.data.status import (
    ControllerStats,
    KeyListing,
    PartitionExport,
    ProductionStatus,
    UnitStats,
)
from rayless.store.errors import (
    StoreError,
    StoreInputError,
    StoreTimeoutError,
)
from rayless.store.metrics import collect
from rayless.store.samehost.plane import LocalPlane
from rayless.store.unit.actor import StorageUnit
from rayless.store.unit.actor import reservation_ttl as _reservation_ttl
from rayless.transport.errors import ClosedError, RaylessError

if TYPE_CHECKING:
    from rayless.store.client.checkpoint import Restored

__all__ = ["DEFAULT_NAME", "PUT_TIMEOUT", "START_TIMEOUT", "KVBatchMeta", "Store"]

DEFAULT_NAME = "rayless-store"
T = TypeVar("T")
S = TypeVar("S")


PUT_TIMEOUT = 30.0
START_TIMEOUT = 120.0  # the default bound of a wait for the units' start (a spawn's own)
_STOP_MARGIN = 15.0  # beyond it, for the head's answers to the spawns


def _rows(td: TensorDictBase, positions: list[int]) -> TensorDictBase:
    return take(split_columns(td), positions, int(td.batch_size[0]))


def _retrieve(start: asyncio.Future[None]) -> None:
    """Mark a finished start's error retrieved (``ready`` raises it to the callers)."""
    if not start.cancelled():
        start.exception()


def _start_bound(timeout: Any) -> float:
    """How long an operation with its own ``timeout`` waits for the units' start: that
    timeout when it is a positive number, else START_TIMEOUT (None waits for data forever,
    0 not at all: neither is about the start; a bad value is the operation's to refuse)."""
    if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or not timeout > 0:
        return START_TIMEOUT
    return float(timeout)


def _after_start(fn: Callable[..., Awaitable[T]]) -> Callable[..., Awaitable[T]]:
    """``fn`` (a Store method) waiting first for the store's units to serve (``ready``),
    under its own keyword-only ``timeout`` if it has one."""
    param = inspect.signature(fn).parameters.get("timeout")
    timed = param is not None and param.kind is inspect.Parameter.KEYWORD_ONLY
    default = param.default if timed and param is not None else None

    @functools.wraps(fn)
    async def call(self: Store, *args: Any, **kwargs: Any) -> T:
        if self._link.start is not None:
            bound = _start_bound(kwargs.get("timeout", default)) if timed else START_TIMEOUT
            await self.ready(bound)
        return await fn(self, *args, **kwargs)

    return call


_UNGATED = frozenset({"ready", "shutdown", "aclose"})


def _gated(cls: type[S]) -> type[S]:
    """The one readiness gate: every public coroutine method of ``cls`` but those in
    ``_UNGATED`` waits for the units' start first (see ``_after_start``)."""
    for name, attr in list(vars(cls).items()):
        if not name.startswith("_") and name not in _UNGATED and inspect.iscoroutinefunction(attr):
            setattr(cls, name, _after_start(attr))
    return cls


def _one_sample(fields: Mapping[str, Any]) -> TensorDict:
    """One sample's values (TransferQueue's ``kv_put`` dict) as a TensorDict of batch size 1:
    tensors get a batch dimension, other values become a one-entry non-tensor list."""
    batch: dict[str, Any] = {}
    for name, value in fields.items():
        if isinstance(value, torch.Tensor):
            if value.is_nested:
                raise StoreInputError(f"field {name!r} is a nested tensor: use kv_batch_put")
            batch[name] = value.unsqueeze(0)
        else:
            batch[name] = NonTensorStack(value)
    return TensorDict(batch, batch_size=[1])


def _settings_text(settings: Mapping[str, Any] | None) -> str:
    """``Store.create``'s ``client_settings`` as JSON text. Raises StoreInputError."""
    try:
        return json.dumps(dict(settings or {}))
    except (TypeError, ValueError) as exc:
        raise StoreInputError(f"client_settings must be JSON values: {exc}") from None


def _kv_keys(keys: Any) -> list[str]:
    """``keys`` as a list of str; a bare str (``"abc"``) is refused, not split into letters."""
    if isinstance(keys, (str, bytes)) or not isinstance(keys, Iterable):
        raise StoreInputError(f"keys must be a list of str, got {keys!r}")
    out = list(keys)
    if any(not isinstance(k, str) or not k for k in out):
        raise StoreInputError("keys must be non-empty str")
    return out


@_gated
class Store:
    """A client of one store (controller + storage units). See the module docstring."""

    def __init__(
        self,
        controller: ActorHandle[Any],
        units: list[UnitView],
        store_id: str,
        cluster: Cluster | None = None,
        owned: bool = False,
    ) -> None:
        self.store_id = store_id
        self._cluster = cluster
        self._owned = owned
        self._own_cluster = False  # connect() opened the cluster session itself
        # The controller, the unit table, closed or not, and the units' start that create()
        # leaves running (every operation waits for it first: see _after_start and ready()).
        self._link = StoreLink(controller, units, store_id)
        self._plane = LocalPlane()  # the same-host data plane
        self._spawned: list[ActorHandle[Any]] = []  # the units create() started
        self._leases = Leases(self)  # the next put's allocation and slots, made ahead
        self._puts = PutPath(self._link, self._plane, self._leases)
        self._gets = GetPath(self._link, self._plane)
        self._unit_keys = UnitKeys(self._link)

    @property
    def controller(self) -> ActorHandle[Any]:
        """The controller actor. Raises ClosedError once the client is closed."""
        return self._link.controller

    @property
    def units(self) -> list[dict[str, Any]]:
        """The storage units' info, a dict each (``unit_id``, ``shard``, ``node_id``,
        ``device``, ``capacity_bytes``, ``alive``, ``handle``). Raises ClosedError once closed,
        StoreError while the units are still starting (``await ready()`` first), and the
        start's own error (PlacementError, RemoteError, ...) if they failed to start."""
        return [u.as_dict() for u in self._table]

    @property
    def _table(self) -> list[UnitView]:
        """The units in shard order; raises like :attr:`units`."""
        return self._link.table

    @property
    def owned(self) -> bool:
        """Whether this client created the store (and its ``aclose`` kills it)."""
        return self._owned

    @property
    def cluster(self) -> Cluster | None:
        """The cluster this client is on (a spawned DataLoader worker joins it); None for a
        client made without one."""
        return self._cluster

    @property
    def closed(self) -> bool:
        """Whether :meth:`aclose` ran."""
        return self._link.closed

    # -- lifecycle -----------------------------------------------------------------------

    @classmethod
    @opener
    async def create(
        cls,
        cluster: Cluster,
        num_units: int = 2,
        device: str = "cpu",
        *,
        name: str = DEFAULT_NAME,
        nodes: Sequence[str] | None = None,
        capacity_bytes: int | None = None,
        env_shards: Mapping[str, int] | None = None,
        env_nodes: Mapping[str, str] | None = None,
        gpus_per_unit: float = 1.0,
        reclaim_after: float = 120.0,
        unit_max_restarts: int = 0,
        lease_after: float = 60.0,
        reservation_ttl: float | None = None,
        client_settings: Mapping[str, Any] | None = None,
    ) -> Store:
        """Spawn a controller (named ``name``) and ``num_units`` units, one per node round-robin
        (or on ``nodes[i]``). Await it, or ``async with`` it (the store is killed on exit).

        It returns once the controller serves, with the units' spawns under way (the torch
        fork template they come from may still be warming up): every operation waits for
        their handshakes first (:meth:`ready`), and raises their start's error if they failed.

        ``device`` "cuda" spawns units with ``gpus_per_unit`` GPUs each. ``env_nodes`` maps env
        ids to nodes (their samples go to that node's unit); ``env_shards`` maps env ids to
        shard numbers directly. ``unit_max_restarts`` restarts a dead unit (empty: its samples
        stay lost) that registers and is watched again. ``lease_after``: seconds a fetched
        batch waits for its client's ack before it goes back to its task (the client died).
        ``reservation_ttl``: seconds a same-host put's reserved slots wait for its commit
        (default ``RAYLESS_STORE_RESERVATION_TTL`` in the units' environment, else 120).
        ``client_settings``: JSON values the controller keeps for every client
        (:meth:`client_settings`), set before any client can connect (StoreInputError when
        they are not JSON); their ``config`` entry is what the controller's ``get_config``
        returns (a face's configuration as its users read it: TransferQueue's).
        Raises ValueError/StoreInputError for bad arguments, PlacementError/RemoteError when
        the controller cannot start. A unit that cannot start (PlacementError, RemoteError,
        Timeout, ...) fails the first operation with that error, or ``aclose`` if no operation
        ran; nothing of the store is left running then.
        """
        if not isinstance(num_units, int) or num_units < 1:
            raise StoreInputError(f"num_units must be a positive int, got {num_units!r}")
        if device not in ("cpu", "cuda"):
            raise StoreInputError(f"device must be 'cpu' or 'cuda', got {device!r}")
        if reservation_ttl is not None:
            _reservation_ttl(reservation_ttl)  # raises StoreInputError before anything starts
        settings = _settings_text(client_settings)
        if capacity_bytes is not None and (
            isinstance(capacity_bytes, bool)
            or not isinstance(capacity_bytes, int)
            or capacity_bytes < 0
        ):  # (a unit would refuse it only once started)
            raise StoreInputError(f"capacity_bytes must be an int >= 0, got {capacity_bytes!r}")
        if nodes is None:
            alive = [n.node_id for n in await cluster.node_views() if n.alive]
            nodes = [alive[i % len(alive)] for i in range(num_units)]
        elif len(nodes) != num_units:
            raise StoreInputError(f"nodes names {len(nodes)} nodes for {num_units} units")
        if env_nodes is not None:
            unplaced = sorted(set(env_nodes.values()) - set(nodes))
            if unplaced:  # (would be known only once the units serve)
                raise StoreInputError(f"no storage unit runs on node {unplaced[0]!r}")
        controller = await cluster.spawn(
            StoreController,
            None,
            env_shards,
            reclaim_after,
            lease_after,
            True,  # its unit table is complete only once _start_units set it
            settings,
            name=name,
            cpus=0,
            template=Template.LIGHT,  # the controller never imports torch: no wait for it
        )
        try:
            store = cls(controller, [], await controller.store_id(), cluster, True)
        except BaseException:
            with contextlib.suppress(RaylessError):
                await cluster.kill(controller)
            raise
        gpus = gpus_per_unit if device == "cuda" else 0
        # Units hold tensors: forked from the torch template they share its torch pages and
        # their first put is fast. From the light one each would import torch itself (~240 MB
        # of its own and seconds of CPU at its first put). The torch template may still be
        # warming up (it starts with the cluster): create() does not wait for the units, the
        # first operation does (ready()).
        spawns = [
            cluster.spawn(
                StorageUnit,
                f"{name}-unit-{i}",
                controller,
                device,
                capacity_bytes,
                reservation_ttl,
                name=f"{name}-unit-{i}",
                node=node,
                gpus=gpus,
                cpus=0,
                max_restarts=unit_max_restarts,
                template=Template.TORCH,
            )
            for i, node in enumerate(nodes)
        ]
        start = asyncio.ensure_future(store._start_units(cluster, name, spawns, env_nodes))
        start.add_done_callback(_retrieve)  # its error is raised by ready(), never lost
        store._link.start = start
        return store

    async def _start_units(
        self,
        cluster: Cluster,
        name: str,
        spawns: list[Any],
        env_nodes: Mapping[str, str] | None,
    ) -> None:
        """Create()'s background: the units' spawns and handshakes, then the controller's
        unit table; all or nothing (a failure kills every actor of the store)."""
        controller = self._link.handle
        handles = await spawn_all(cluster, spawns, kill_on_error=[controller])
        self._spawned = handles
        if self._link.stopping:  # shut down while they started: shutdown kills them
            return
        try:
            await controller.set_units({f"{name}-unit-{i}": h for i, h in enumerate(handles)})
            self._link.units = await controller.units()
            if env_nodes is not None:
                shards = {e: self._shard_on(n) for e, n in env_nodes.items()}
                await controller.set_env_shards(shards)
        except BaseException:
            doomed = [*handles, controller]
            await asyncio.gather(*(cluster.kill(h) for h in doomed), return_exceptions=True)
            raise

    async def ready(self, timeout: float | None = START_TIMEOUT) -> None:
        """Wait until the store's units serve. ``Store.create`` returns before they do (the
        torch fork template may still be warming up) and every operation waits here first,
        so calling this is needed only before reading :attr:`units` directly.

        Raises the units' start error (what ``create`` raised before it returned early:
        PlacementError, RemoteError, Timeout, ... every actor of the store is then gone),
        StoreTimeoutError when they do not serve within ``timeout`` s (None: the default
        bound, START_TIMEOUT), ClosedError once closed.
        """
        check_timeout(timeout)
        if self._link.closed:
            raise ClosedError(f"this client of store {self.store_id!r} is closed")
        start = self._link.start
        if start is None:
            return
        if not start.done():
            limit = START_TIMEOUT if timeout is None else timeout
            await asyncio.wait([start], timeout=limit)
            if not start.done():
                raise StoreTimeoutError(
                    f"the units of store {self.store_id!r} did not serve within {limit:g}s"
                )
        self._link.start_result(start)

    @classmethod
    @opener
    async def connect(cls, name: str = DEFAULT_NAME, cluster: Cluster | None = None) -> Store:
        """A client of the running store whose controller is called ``name``. Await it, or
        ``async with`` it (the client detaches on exit).

        Raises ActorNotFoundError when no such actor is alive.
        """
        own = cluster is None
        cluster = cluster or await connect()
        # Inside an actor (or after this process joined a cluster) connect() gives a Cluster
        # on the existing session; closing that one would make the process forget its
        # cluster (the next connect raised ConnectError), so only a session of our own is ours.
        own = own and cluster.owns_session
        try:
            controller = await cluster.get_actor(name)
            units = await controller.units()
            store = cls(controller, units, await controller.store_id(), cluster, False)
        except BaseException:
            if own:
                await cluster.aclose()
            raise
        store._own_cluster = own
        return store

    async def shutdown(self) -> None:
        """Kill the controller and the units now (only the store's creator may); units still
        starting are waited for (their spawns, at most their start's bound) and killed.

        Raises:
            StoreError: this client did not create the store (or already shut it down).
            ClosedError: this client is closed.
            The units' start error (PlacementError, RemoteError, ...) that no operation
            raised yet: a failed start is never silent.
        """
        if not self._owned or self._cluster is None:
            if self._link.closed:
                raise ClosedError(f"this client of store {self.store_id!r} is closed")
            raise StoreError("only the client that created the store can shut it down")
        error = await self._stop(self._cluster)
        if error is not None:
            raise error

    async def _stop(self, cluster: Cluster) -> BaseException | None:
        """Kill the store's actors (after the units' spawns ended); the start's error if no
        caller saw it yet."""
        self._owned = False
        self._link.stopping = True
        start, error = self._link.start, None
        if start is not None:
            # The head starts a spawn even if its caller gives up: wait for the spawns to end
            # (bounded by their own timeout) so that every unit that started is killed here.
            await asyncio.wait([start], timeout=START_TIMEOUT + _STOP_MARGIN)
            if not start.done():
                start.cancel()  # (its units die with the session)
            elif not start.cancelled() and not self._link.start_seen:
                error = start.exception()
                self._link.start_seen = True
        handles = self._spawned or [u.handle for u in self._link.units if u.handle is not None]
        for handle in handles:
            await cluster.kill(handle)
        await cluster.kill(self._link.handle)
        return error

    async def aclose(self) -> None:
        """End this client (idempotent): the creator's also kills the store (waiting for
        units still starting, then killing them); a connected client only detaches. Every
        later call raises ClosedError. Never raises for a cluster that is already gone;
        raises the units' start error if no operation raised it yet (after closing)."""
        if self._link.closed:
            return
        error: BaseException | None = None
        try:
            if self._owned and self._cluster is not None and not self._cluster.closed:
                self._leases.discard()  # the store dies with its lease
                error = await self._stop(self._cluster)
            else:
                await self._leases.close()
        except RaylessError:  # the cluster or the actors are already gone
            pass
        finally:
            self._owned = False
            self._link.closed = True
            self._plane.close()
            if self._own_cluster and self._cluster is not None:
                await self._cluster.aclose()
        if error is not None:
            raise error

    async def __aenter__(self) -> Store:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def refresh(self) -> None:
        """Reload the units' info (liveness) from the controller."""
        self._link.units = await self.controller.units()

    def unit_for_node(self, node_id: str) -> int:
        """The shard number of the (first) unit on ``node_id``. Raises StoreInputError, and
        what :attr:`units` raises while the units start."""
        self._table  # noqa: B018 (raises while they start)
        return self._shard_on(node_id)

    def _shard_on(self, node_id: str) -> int:
        for unit in self._link.units:
            if unit.node_id == node_id:
                return unit.shard
        raise StoreInputError(f"no storage unit runs on node {node_id!r}")

    async def set_env_nodes(self, env_nodes: Mapping[str, str]) -> None:
        """Place env ids on their node's unit (node affinity for ``put(env_ids=...)``)."""
        await self.set_env_shards({e: self.unit_for_node(n) for e, n in env_nodes.items()})

    async def set_env_shards(self, env_shards: Mapping[str, int] | None) -> None:
        """Replace the env id → shard table (e.g. ``EpisodeTable.get_env_to_storage()``)."""
        await self.controller.set_env_shards(None if env_shards is None else dict(env_shards))

    async def save_checkpoint(
        self, directory: str | Path, *, metadata: Mapping[str, Any] | None = None
    ) -> dict[str, Any]:
        """Save every partition (data, keys, groups, tags, production and consumption
        status) and ``metadata`` (a JSON object) to ``directory``; returns the manifest.
        Raises StoreInputError (non-empty directory, metadata not JSON). See
        :mod:`rayless.store.client.checkpoint`."""
        from rayless.store.client.checkpoint import save

        return await save(self, Path(directory), metadata)

    async def load_checkpoint(self, directory: str | Path) -> Restored:
        """Restore a checkpoint into this store (any unit count); returns the new indexes
        per partition (a dict) with the saved ``metadata``. Raises CheckpointNotFoundError
        (also a FileNotFoundError: no checkpoint there), CheckpointError (a
        StoreInputError: bad manifest, missing file, partition exists, no room; nothing
        written); a load failing part-way is undone."""
        from rayless.store.client.checkpoint import load

        return await load(self, Path(directory))

    # -- put and get -----------------------------------------------------------------------

    def _note(self, future: asyncio.Future[Any]) -> None:
        """Keep a one-way note (ack, cancel) alive until sent; its errors do not matter."""
        self._gets.note(future)

    @traced("store", "put", store_span)
    async def put(
        self,
        td: TensorDictBase,
        partition: str | None = None,
        *,
        meta: BatchMeta | None = None,
        env_ids: Sequence[str] | None = None,
        group_ids: Sequence[Any] | None = None,
        custom_meta: Sequence[Mapping[str, Any]] | None = None,
        timeout: float = PUT_TIMEOUT,
        keys: Sequence[str] | None = None,
        group_size: int | None = None,
    ) -> BatchMeta:
        """Put ``td`` (batch_size ``[B]``) as new samples of ``partition``, or its fields onto the
        samples of ``meta`` (column-wise); return the samples' meta with the fields added.

        ``group_ids`` name each sample's group; ``group_size`` fixes the partition's group
        size (else the first grouped fetch does): a put whose groups would outgrow it is
        refused (StoreInputError) before anything is written. ``keys``: KV keys for the new
        samples (see ``kv_batch_put``).

        Waits up to ``timeout`` s for room on full units. Raises SchemaError/StoreInputError/
        ForeignMetaError/StaleMetaError (bad input, unstorable dtypes; nothing changed),
        StoreFullError (no room in time; WriteTooLargeError at once for a write larger than a
        unit's capacity), UnitLostError (a unit is gone). A failed put is undone: new samples
        are cleared (and a partition it created is dropped), fields it added to existing
        samples are deleted again. A new put's samples become ready only once all are written;
        one that failed after that (a unit's reply lost after it committed) returns normally:
        it was stored, consumers may hold it, and what died with the unit is in
        :meth:`lost_samples`.
        """
        return await self._puts.put(
            td,
            partition,
            meta=meta,
            env_ids=env_ids,
            group_ids=group_ids,
            custom_meta=custom_meta,
            timeout=timeout,
            keys=keys,
            group_size=group_size,
        )

    @traced("store", "get_meta", store_span)
    async def get_meta(
        self,
        partition: str,
        fields: Sequence[str],
        batch_size: int | None = None,
        *,
        task: str = "default",
        mode: FetchMode | str = FetchMode.FETCH,
        sampler: Any = None,
        timeout: float | None = None,
        share: tuple[str, int] | tuple[str, int, bool] | None = None,
    ) -> BatchMeta:
        """Ready samples of ``partition`` holding ``fields``, unconsumed by ``task``.

        ``mode="fetch"`` (:attr:`FetchMode.FETCH`) waits up to ``timeout`` (None: forever, 0:
        not at all) for ``batch_size`` of them and marks them consumed by ``task``; ``"peek"``
        (``PEEK``) does not mark.
        ``batch_size`` None takes what is there now. ``sampler``: "sequential" (default),
        "random", ``{"name": "grouped", "n": N}``, ``{"name": "seqlen_balanced", ...}``, a
        Sampler, or a sampler class of your own (or its reference ``"package.module:Class"``,
        with arguments in a dict spec), importable where the controller runs.
        ``share=(key, consumers)``: ``consumers`` calls with ``key`` get one batch (the
        streaming loader's ranks); ``(key, consumers, True)`` keeps it with its key until
        its partition or one of its samples is cleared (a data-parallel group's ranks).
        Raises StoreTimeoutError, StoreInputError (also for a timeout that is not None or a
        number >= 0). Waiting never delays other clients.

        A fetch cancelled here (``asyncio.wait_for(st.get_meta(...), 1)`` timing out, a
        cancelled task, a SyncStore call that timed out) consumes nothing: the controller
        drops it, or hands its batch back if it was already served.
        """
        return await self._gets.get_meta(
            partition,
            fields,
            batch_size,
            task=task,
            mode=mode,
            sampler=sampler,
            timeout=timeout,
            share=share,
        )

    @traced("store", "get", store_span)
    async def get(
        self,
        meta: BatchMeta,
        fields: Sequence[str] | None = None,
        *,
        device: Any = None,
        zero_copy: bool = False,
    ) -> TensorDict:
        """The data of ``meta``'s samples (``fields``: a subset) as one TensorDict.

        From units on this host the bytes are copied once, out of their shared memory;
        ``zero_copy=True`` returns views of it where it can (see
        :mod:`rayless.store.samehost.plane`).

        Same keys, dtypes, shapes, nesting as put; each field on its put-time device where this
        process has it (else the CPU), or on ``device``. Raises ForeignMetaError, StaleMetaError,
        UnknownFieldError, PartialResultError (a UnitLostError naming the unit that held some
        samples; its ``data``/``meta`` are the samples read from live units, ``lost`` the rest).
        """
        return await self._gets.get(meta, fields, device=device, zero_copy=zero_copy)

    # -- status and housekeeping -----------------------------------------------------------

    @traced("store", "clear", store_span)
    async def clear(self, meta: BatchMeta) -> None:
        """Remove ``meta``'s samples; their indexes are reused. Raises Foreign/StaleMetaError.
        A lease this client holds is renewed then (its next put takes the freed indexes)."""
        checked = self._link.check_meta(meta)
        await self._renewing(lambda lease: self.controller.clear(checked, lease))

    async def _renewing(self, clear: Any) -> None:
        """Run ``clear(lease token or None)`` (a controller clear call), renewing the lease
        this client holds on the way (see Leases.lend): the next put then writes into the
        freed indexes, as it would without a lease."""
        lease = self._leases.lend()
        if lease is None:
            await clear(None)
            return
        renewed, cleared = None, False
        try:
            renewed, cleared = await clear(lease.token), True
        finally:
            given = self._leases.settle(lease, renewed, cleared)
        if given is not None and renewed is None:
            # Not renewed: its partition is gone (verl clears each step's partition). Its
            # spare reservations go back to the units before the next put, so the units drop
            # the partition's columns now and that put reuses their segments, instead of
            # creating and faulting in new ones while the old wait for the give-back.
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(asyncio.shield(given), GIVE_BACK_TIMEOUT)

    @traced("store", "clear_partition", store_span)
    async def clear_partition(self, partition: str) -> None:
        """Remove a whole partition (a lease this client holds is renewed). Raises
        UnknownPartitionError."""
        await self._renewing(lambda lease: self.controller.clear_partition(partition, lease))

    async def partitions(self) -> list[str]:
        """Existing partitions."""
        result: list[str] = await self.controller.partitions()
        return result

    async def client_settings(self) -> dict[str, Any]:
        """The ``client_settings`` the store's creator gave ``Store.create`` ({} if none)."""
        settings: dict[str, Any] = json.loads(await self.controller.client_settings())
        return settings

    async def production_status(self, partition: str) -> dict[str, Any]:
        """``{"samples": n, "fields": {field: ready}, "schemas": {...}}``."""
        status: ProductionStatus = await self.controller.production_status(partition)
        return status.as_dict()

    async def consumption_status(self, partition: str, task: str = "default") -> dict[str, int]:
        """``{"samples": n, "consumed": c}`` for ``task``."""
        result: dict[str, int] = await self.controller.consumption_status(partition, task)
        return result

    async def reset_consumption(
        self,
        task: str | None = "default",
        partition: str | None = None,
        *,
        meta: BatchMeta | None = None,
    ) -> None:
        """Make every sample unconsumed again for ``task`` (None: for every task) in
        ``partition`` (None: everywhere), or only ``meta``'s samples (e.g.
        ``PartialResultError.meta``, to fetch them again). Raises StoreInputError,
        UnknownPartitionError."""
        checked = None if meta is None else self._link.check_meta(meta)
        await self.controller.reset_consumption(task, partition, checked)

    async def lost_samples(self, partition: str) -> BatchMeta:
        """The samples of ``partition`` lost with their unit (not ready; a fetch skips them):
        ``clear`` them, or rewrite their fields once the unit registered again."""
        result: BatchMeta = await self.controller.lost_meta(partition)
        return result

    async def set_custom_meta(self, meta: BatchMeta, custom: Sequence[Mapping[str, Any]]) -> None:
        """Replace the per-sample custom metadata of ``meta``'s samples."""
        checked = self._link.check_meta(meta)
        await self.controller.set_custom_meta(checked, [dict(c) for c in custom])

    async def metrics(self) -> dict[str, Any]:
        """The controller's and every unit's counters (see :mod:`rayless.store.metrics`:
        ``render_text``, ``prometheus``)."""
        name = getattr(self._link.handle, "name", None)
        return await collect(self.controller, self._table, self.store_id, name)

    async def stats(self) -> dict[str, Any]:
        """The controller's counts and each live unit's bytes and rows."""
        stats: ControllerStats = await self.controller.stats()
        out = stats.as_dict()
        calls = [u.handle.stats() for u in self._table if u.alive]
        units = await asyncio.gather(*calls, return_exceptions=True)
        out["unit_stats"] = [s.as_dict() if isinstance(s, UnitStats) else s for s in units]
        return out

    # -- KV keys ---------------------------------------------------------------------------

    async def kv_batch_put(
        self,
        keys: Sequence[str],
        partition_id: str,
        fields: TensorDictBase | None = None,
        tags: Sequence[Mapping[str, Any]] | None = None,
    ) -> KVBatchMeta:
        """Write ``fields`` (batch_size ``len(keys)``) and/or ``tags`` under ``keys`` of
        ``partition_id``; returns their KVBatchMeta.

        Raises StoreInputError (neither fields nor tags, lengths that differ, bad keys) and
        every error of ``put``.
        """
        keys = _kv_keys(keys)
        if fields is None and tags is None:
            raise StoreInputError("kv_batch_put needs fields or tags")
        if fields is not None and int(fields.batch_size[0]) != len(keys):
            raise StoreInputError(
                f"{len(keys)} keys for a TensorDict of batch size {fields.batch_size[0]}"
            )
        tag_list = None if tags is None else [dict(t) for t in tags]
        if tag_list is not None and len(tag_list) != len(keys):
            raise StoreInputError(f"{len(keys)} keys for {len(tag_list)} tags")
        old, missing = await self.controller.kv_lookup(partition_id, keys)
        gone = set(missing)
        present = [p for p in range(len(keys)) if p not in gone]
        if missing:
            data = fields if fields is not None else TensorDict({}, batch_size=[len(keys)])
            sub = data if len(missing) == len(keys) else _rows(data, missing)
            await self.put(
                sub,
                partition_id,
                keys=[keys[p] for p in missing],
                custom_meta=None if tag_list is None else [tag_list[p] for p in missing],
            )
        if present:
            if fields is not None and list(fields.keys()):
                sub = fields if len(present) == len(keys) else _rows(fields, present)
                old = await self.put(sub, meta=old)
            if tag_list is not None:
                await self.set_custom_meta(old, [tag_list[p] for p in present])
        meta = await self.controller.kv_meta(partition_id, keys)
        return KVBatchMeta(
            list(keys),
            [dict(c) for c in meta.custom_meta],
            partition_id,
            meta.field_names,
            meta=meta,
        )

    async def kv_batch_get(
        self,
        keys: Sequence[str] | str,
        partition_id: str,
        select_fields: Sequence[str] | str | None = None,
    ) -> TensorDict:
        """The data under ``keys`` of ``partition_id`` (all the fields every key holds, or
        ``select_fields``). Raises UnknownPartitionError, UnknownKeyError, UnknownFieldError."""
        key_list = [keys] if isinstance(keys, str) else _kv_keys(keys)
        wanted = [select_fields] if isinstance(select_fields, str) else select_fields
        meta = await self.controller.kv_meta(
            partition_id, key_list, None if wanted is None else list(wanted)
        )
        result: TensorDict = await self.get(meta)
        return result

    async def kv_list(self, partition_id: str | None = None) -> dict[str, dict[str, Any]]:
        """``{partition: {key: tags}}`` of one partition or of every partition with keys;
        ``{}`` for an unknown partition or one without keys."""
        listing: KeyListing = await self.controller.kv_list(partition_id)
        return listing.as_dict()

    async def kv_keys_of(self, partition_id: str, indexes: Sequence[int]) -> list[str | None]:
        """The KV key of each sample of ``indexes`` (global indexes, as a BatchMeta has them)
        in ``partition_id``; None for a sample without a key or not of that partition.
        Raises StoreInputError."""
        keys: list[str | None] = await self.controller.kv_keys_of(partition_id, list(indexes))
        return keys

    async def kv_lookup(
        self, partition_id: str, keys: Sequence[str]
    ) -> tuple[BatchMeta, list[int]]:
        """The meta of those of ``keys`` that exist (with the fields all of them hold), and
        the positions in ``keys`` of those that do not. Raises StoreInputError."""
        found: tuple[BatchMeta, list[int]] = await self.controller.kv_lookup(
            partition_id, _kv_keys(keys)
        )
        return found

    async def export_partition(self, partition_id: str) -> PartitionExport:
        """Every sample of ``partition_id`` with its key, custom metadata and the fields it
        holds, and the indexes each task consumed (what a checkpoint keeps, without the
        data; O(the partition)). Raises UnknownPartitionError."""
        export: PartitionExport = await self.controller.export_partition(partition_id)
        return export

    async def kv_clear(self, keys: Sequence[str] | str, partition_id: str) -> None:
        """Remove ``keys`` (and their samples) from ``partition_id``; absent keys are ignored."""
        key_list = [keys] if isinstance(keys, str) else _kv_keys(keys)
        meta, _missing = await self.controller.kv_lookup(partition_id, key_list)
        if meta.size:
            await self.clear(meta)

    async def kv_put(
        self,
        keys: Sequence[str] | str | None = None,
        td: TensorDictBase | str | None = None,
        fields: TensorDictBase | Mapping[str, Any] | None = None,
        tag: Mapping[str, Any] | Sequence[Mapping[str, Any]] | None = None,
        *,
        key: str | Sequence[str] | None = None,
        partition_id: str | None = None,
        timeout: float = PUT_TIMEOUT,
    ) -> KVBatchMeta | None:
        """Store ``td``'s rows under string ``keys`` (existing keys are overwritten): the
        units' own KV, no partition.

        TransferQueue's form, ``kv_put(key, partition_id, fields=None, tag=None)`` (one key
        of a partition, positional or by keyword), is :meth:`kv_batch_put` of that one key:
        ``fields`` a TensorDict of batch size 1 or a dict of one sample's values (tensors
        get their batch dimension here), ``tag`` its dict; it returns the KVBatchMeta.

        Raises StoreInputError/SchemaError, StoreFullError, UnitLostError.
        """
        partition = partition_id if partition_id is not None else td
        if isinstance(partition, str) or key is not None or fields is not None or tag is not None:
            return await self._kv_put_one(keys if key is None else key, partition, fields, tag)
        if isinstance(keys, str):
            raise StoreInputError(
                f"keys must be a list of str, got {keys!r} (TransferQueue's form names the "
                "partition: kv_put(key, partition_id, fields=..., tag=...))"
            )
        if td is None:
            raise StoreInputError("kv_put(keys, td) needs a TensorDict of the keys' rows")
        await self._unit_keys.put(_kv_keys(keys), td, timeout)
        return None

    async def _kv_put_one(self, key: Any, partition: Any, fields: Any, tag: Any) -> KVBatchMeta:
        """TransferQueue's ``kv_put(key, partition_id, fields=None, tag=None)``."""
        if not isinstance(partition, str):
            raise StoreInputError(
                "kv_put(key, partition_id, fields=..., tag=...) needs a partition_id (str); "
                "the units' KV is kv_put(keys, td)"
            )
        keys = [key] if isinstance(key, str) else _kv_keys(key)
        if isinstance(fields, Mapping) and not isinstance(fields, TensorDictBase):
            if len(keys) != 1:
                raise StoreInputError("a dict of fields is one sample: give one key")
            fields = _one_sample(fields)
        tags = [tag] if isinstance(tag, Mapping) else tag
        return await self.kv_batch_put(keys, partition, fields, tags)

    async def kv_get(
        self, keys: Sequence[str], fields: Sequence[str] | None = None, *, device: Any = None
    ) -> TensorDict:
        """The rows under ``keys``, in order. Raises UnknownKeyError, UnknownFieldError."""
        return await self._unit_keys.get(_kv_keys(keys), fields, device)

    async def kv_keys(self) -> list[str]:
        """Every unit key, unit by unit (``kv_list`` lists partition keys)."""
        return await self._unit_keys.keys()

    async def kv_delete(self, keys: Sequence[str]) -> int:
        """Delete unit ``keys`` (absent ones ignored); returns how many were deleted."""
        return await self._unit_keys.delete(_kv_keys(keys))
