"""Store: the client of the sharded store, usable from a driver and from inside any actor.

    async with Store.create(cluster, num_units=2, device="cpu") as st:  # controller + units
        meta = await st.put(td, partition="train")
        batch = await st.get_meta(partition="train", fields=["obs"], batch_size=64, task="learner")
        td = await st.get(batch)

``Store.connect(name)`` finds a running store by its controller's name (inside an actor it uses
the actor's own cluster session). Both openers work awaited or with ``async with``.

Lifecycle: ``aclose()`` (idempotent; also on leaving ``async with``) ends this client, and
then every call on it raises ClosedError. The client that *created* the store owns it: its
``aclose()`` also kills the controller and the units (they belong to the creator's session
anyway, and die with it); a connected client's ``aclose()`` only detaches. ``shutdown()`` is
the explicit form: kill the store now, raising StoreError for a client that does not own it.

A put splits the TensorDict per storage unit (one frame per tensor per unit) and writes all
units in parallel; each unit ACKs only after the controller recorded its data. A get reads
only the units holding the meta's samples, in parallel, while the controller checks the
meta, then merges in order and moves the fields to their device.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rayless.actors import ActorHandle, Cluster, connect
from rayless.actors.api.components import spawn_all
from rayless.actors.api.lifecycle import opener
from rayless.store.client_data import PUT_TIMEOUT, DataPlane
from rayless.store.client_status import StatusFace
from rayless.store.controller import StoreController
from rayless.store.errors import (
    StoreError,
    StoreInputError,
)
from rayless.store.kv import KVFace
from rayless.store.local import LocalPlane
from rayless.store.unit import StorageUnit
from rayless.store.unit_local import reservation_ttl as _reservation_ttl
from rayless.transport.errors import ClosedError, RaylessError

if TYPE_CHECKING:
    from rayless.store.checkpoint import Restored

__all__ = ["DEFAULT_NAME", "PUT_TIMEOUT", "Store"]

DEFAULT_NAME = "rayless-store"


class Store(DataPlane, StatusFace, KVFace):
    """A client of one store (controller + storage units). See the module docstring.

    Put and get come from :class:`~rayless.store.client_data.DataPlane`, the status and
    housekeeping methods from :class:`~rayless.store.client_status.StatusFace`, the KV methods
    from :class:`~rayless.store.kv.KVFace`."""

    def __init__(
        self,
        controller: ActorHandle[Any],
        units: list[dict[str, Any]],
        store_id: str,
        cluster: Cluster | None = None,
        owned: bool = False,
    ) -> None:
        self._controller = controller
        self._units = units
        self.store_id = store_id
        self._cluster = cluster
        self._owned = owned
        self._own_cluster = False  # connect() opened the cluster session itself
        self._closed = False
        self._notes: set[asyncio.Future[Any]] = set()  # acks and cancels in flight
        self._plane = LocalPlane()  # the same-host data plane

    @property
    def controller(self) -> ActorHandle[Any]:
        """The controller actor. Raises ClosedError once the client is closed."""
        if self._closed:
            raise ClosedError(f"this client of store {self.store_id!r} is closed")
        return self._controller

    @property
    def units(self) -> list[dict[str, Any]]:
        """The storage units' info (handle, shard, node). Raises ClosedError once closed."""
        if self._closed:
            raise ClosedError(f"this client of store {self.store_id!r} is closed")
        return self._units

    @units.setter
    def units(self, value: list[dict[str, Any]]) -> None:
        self._units = value

    @property
    def owned(self) -> bool:
        """Whether this client created the store (and its ``aclose`` kills it)."""
        return self._owned

    @property
    def closed(self) -> bool:
        """Whether :meth:`aclose` ran."""
        return self._closed

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
    ) -> Store:
        """Spawn a controller (named ``name``) and ``num_units`` units, one per node round-robin
        (or on ``nodes[i]``); wait for their handshakes. Await it, or ``async with`` it (the
        store is killed on exit).

        ``device`` "cuda" spawns units with ``gpus_per_unit`` GPUs each. ``env_nodes`` maps env
        ids to nodes (their samples go to that node's unit); ``env_shards`` maps env ids to
        shard numbers directly. ``unit_max_restarts`` restarts a dead unit (empty: its samples
        stay lost) that registers and is watched again. ``lease_after``: seconds a fetched
        batch waits for its client's ack before it goes back to its task (the client died).
        ``reservation_ttl``: seconds a same-host put's reserved slots wait for its commit
        (default ``RAYLESS_STORE_RESERVATION_TTL`` in the units' environment, else 120).
        Raises ValueError/StoreInputError for bad arguments,
        PlacementError/RemoteError when actors cannot start (nothing is left running).
        """
        if not isinstance(num_units, int) or num_units < 1:
            raise StoreInputError(f"num_units must be a positive int, got {num_units!r}")
        if device not in ("cpu", "cuda"):
            raise StoreInputError(f"device must be 'cpu' or 'cuda', got {device!r}")
        if reservation_ttl is not None:
            _reservation_ttl(reservation_ttl)  # raises StoreInputError before anything starts
        if nodes is None:
            alive = [n["node_id"] for n in await cluster.nodes() if n.get("alive", True)]
            nodes = [alive[i % len(alive)] for i in range(num_units)]
        elif len(nodes) != num_units:
            raise StoreInputError(f"nodes names {len(nodes)} nodes for {num_units} units")
        controller = await cluster.spawn(
            StoreController, None, env_shards, reclaim_after, lease_after, name=name, cpus=0
        )
        gpus = gpus_per_unit if device == "cuda" else 0
        spawned = [
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
            )
            for i, node in enumerate(nodes)
        ]
        handles = await spawn_all(cluster, spawned, kill_on_error=[controller])
        await controller.set_units({f"{name}-unit-{i}": h for i, h in enumerate(handles)})
        store = cls(
            controller, await controller.units(), await controller.store_id(), cluster, True
        )
        if env_nodes is not None:
            await store.set_env_nodes(env_nodes)
        return store

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
        """Kill the controller and the units now (only the store's creator may).

        Raises:
            StoreError: this client did not create the store (or already shut it down).
            ClosedError: this client is closed.
        """
        if not self._owned or self._cluster is None:
            if self._closed:
                raise ClosedError(f"this client of store {self.store_id!r} is closed")
            raise StoreError("only the client that created the store can shut it down")
        self._owned = False
        for unit in self.units:
            if unit.get("handle") is not None:
                await self._cluster.kill(unit["handle"])
        await self._cluster.kill(self.controller)

    async def aclose(self) -> None:
        """End this client (idempotent): the creator's also kills the store; a connected
        client only detaches. Every later call raises ClosedError. Never raises for a cluster
        that is already gone."""
        if self._closed:
            return
        try:
            if self._owned and self._cluster is not None and not self._cluster.closed:
                await self.shutdown()
        except RaylessError:  # the cluster or the actors are already gone
            pass
        finally:
            self._owned = False
            self._closed = True
            self._plane.close()
            if self._own_cluster and self._cluster is not None:
                await self._cluster.aclose()

    async def __aenter__(self) -> Store:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def refresh(self) -> None:
        """Reload the units' info (liveness) from the controller."""
        self.units = await self.controller.units()

    def unit_for_node(self, node_id: str) -> int:
        """The shard number of the (first) unit on ``node_id``. Raises StoreInputError."""
        for unit in self.units:
            if unit["node_id"] == node_id:
                return int(unit["shard"])
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
        :mod:`rayless.store.checkpoint`."""
        from rayless.store.checkpoint import save

        return await save(self, Path(directory), metadata)

    async def load_checkpoint(self, directory: str | Path) -> Restored:
        """Restore a checkpoint into this store (any unit count); returns the new indexes
        per partition (a dict) with the saved ``metadata``. Raises CheckpointNotFoundError
        (also a FileNotFoundError: no checkpoint there), CheckpointError (a
        StoreInputError: bad manifest, missing file, partition exists, no room; nothing
        written); a load failing part-way is undone."""
        from rayless.store.checkpoint import load

        return await load(self, Path(directory))
