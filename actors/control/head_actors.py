"""The head's actor registry: actor records, spawn placement, kills and actor events.

A spawn is placed (``placement.allocation``; with ``wait_for_resources`` it waits for busy
GPUs, woken by each release), started by its node's agent and recorded; the agents' actor
events (``restarting``, ``ready``, ``died``) update the record and are pushed to every session;
a dead actor's resources are released and what it owned is killed. The head
(:class:`~rayless.actors.control.head.Head`) owns one :class:`HeadActors`, hands it the
tables they share (``actors.control.head_state``) and its event fan-out, and answers the
requests of the methods marked here (``wire.handles``).
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from collections.abc import Callable
from dataclasses import replace
from typing import Any

from rayless.actors.control.head_state import ActorRecord, HeadState
from rayless.actors.errors import ActorDiedError, ActorNotFoundError, NameTakenError
from rayless.actors.protocol.messages import (
    ActorEvent,
    ActorState,
    ActorView,
    DebugEndpoints,
    DebugRegister,
    EventKind,
    GetActor,
    Kill,
    LookupActor,
    NodeDied,
    Spawn,
    SpawnSpec,
    StartActor,
    StopActor,
)
from rayless.actors.protocol.wire import ask, handles
from rayless.placement.allocation import Allocation, choose, release
from rayless.placement.errors import PlacementError, ResourcesBusyError
from rayless.transport.client import Client
from rayless.transport.errors import ProtocolError, RaylessError, Timeout
from rayless.transport.peer import Peer

log = logging.getLogger("rayless.head")
DRIVER = "driver"  # the kind (and the name) of a driver's debug listener


class HeadActors:
    """The head's actor operations (``op_spawn``, ``op_kill``, lookups) and actor events."""

    def __init__(
        self,
        state: HeadState,
        *,
        broadcast: Callable[[ActorEvent | NodeDied], None],
        kill_owned: Callable[[str, str], int],
    ) -> None:
        """``state``: the head's tables; ``broadcast``: pushes an event to every session;
        ``kill_owned(session, reason)``: kills what a session (an actor's: its id) owns."""
        self.state = state
        self._broadcast = broadcast
        self._kill_owned = kill_owned
        self.debug_endpoints: dict[str, dict[str, Any]] = {}  # actor id -> its debug listener
        self._freed = asyncio.Event()  # set, then replaced, whenever resources may have freed

    @handles(Spawn)
    async def op_spawn(self, peer: Peer, msg: Spawn) -> ActorView:
        """Place an actor, have its node start it, and return its record once it serves.

        Raises:
            NameTakenError: a live actor has the name asked for.
            PlacementError, ResourcesBusyError: it cannot be placed.
            Timeout: it did not serve within the spec's timeout (its process was killed).
            ActorDiedError, RemoteError: it died or its constructor raised while starting.
        """
        spec = msg.spec
        name = spec.name
        if name is not None and name in self.state.names:
            existing = self.state.actors.get(self.state.names[name])
            if existing is not None and existing.state is not ActorState.DEAD:
                raise NameTakenError(f"an actor named {name!r} already exists")
        alloc = await self._place(spec)
        gone = spec.wait_for_resources and spec.owner not in self.state.sessions
        if gone or (name is not None and name in self.state.names):  # changed while we waited
            release(self.state.nodes, alloc)
            self.resources_changed()
            if gone:
                raise PlacementError("the spawning session ended while it waited for resources")
            raise NameTakenError(f"an actor named {name!r} already exists")
        actor_id = uuid.uuid4().hex[:12]
        record = ActorRecord(
            actor_id=actor_id,
            name=name or f"{spec.cls_name or 'actor'}-{actor_id[:6]}",
            cls=spec.cls_name or "?",
            owner=spec.owner,
            alloc=alloc,
            max_restarts=spec.max_restarts,
            methods=dict(spec.methods),
            named=name is not None,
        )
        self.state.actors[actor_id] = record
        if not spec.detached:  # a detached actor is nobody's: its owner's end leaves it be
            self.state.owned.setdefault(record.owner, set()).add(actor_id)
        self.state.names[record.name] = actor_id  # generated names are unique too
        node = self.state.nodes[alloc.node_id]
        node.actors.add(actor_id)
        agent = self.state.agents.get(alloc.node_id)
        try:
            if agent is None:
                raise PlacementError(f"node {alloc.node_id} has no agent connection")
            env = {"CUDA_VISIBLE_DEVICES": alloc.cuda_visible_devices}
            reply = await ask(
                agent, StartActor(actor_id, record.name, spec, env), timeout=spec.timeout
            )
        except BaseException as exc:
            if isinstance(exc, ActorDiedError):
                exc.actor = record.name
            elif (current := self.state.agents.get(alloc.node_id)) is not None:
                # timed out or cancelled: the process may still start. Its resources are freed
                # only once it is gone, so that nothing else lands on its GPU while it
                # finishes __init__ unknown to us. (No agent: the head dropped it, shutting
                # the cluster down or losing the node, and the node's processes go with it.)
                await asyncio.shield(self._stop_starting(current, record))
            self.mark_dead(record, f"failed to start: {exc}", broadcast=False)
            if isinstance(exc, Timeout):
                raise Timeout(
                    f"actor {record.name} did not start within its spawn timeout of "
                    f"{spec.timeout:g}s; its process was killed"
                ) from None
            raise
        if record.state is ActorState.DEAD:  # it died between starting and answering
            raise ActorDiedError(record.name, node=alloc.node_id, reason="died while starting")
        record.state, record.address, record.pid = ActorState.ALIVE, reply.address, reply.pid
        if reply.methods is not None:  # as the actor process loaded its class
            record.methods = dict(reply.methods)
        return record.public()

    async def _place(self, spec: SpawnSpec) -> Allocation:
        """Choose (and reserve) where a spawn runs; with ``wait_for_resources`` seconds, wait
        for busy GPUs to be freed (woken by each release or node join, never polling).

        Raises:
            PlacementError: infeasible (at once, waiting or not).
            ResourcesBusyError: still busy after the wait (naming the request and the wait).
        """
        gpus, cpus = spec.gpus, spec.cpus
        wait = spec.wait_for_resources
        deadline = time.monotonic() + wait
        while True:
            try:
                return choose(
                    self.state.nodes,
                    gpus,
                    cpus,
                    node=spec.node,
                    gpu_indices=spec.gpu_indices,
                )
            except ResourcesBusyError as exc:
                left = deadline - time.monotonic()
                if wait <= 0:
                    raise
                if left <= 0:
                    raise ResourcesBusyError(
                        f"waited {wait:g}s (wait_for_resources) for gpus={gpus}, cpus={cpus}"
                        f"{'' if spec.node is None else ' on ' + spec.node} "
                        f"and they stayed busy: {exc}"
                    ) from None
                freed = self._freed
                try:
                    await asyncio.wait_for(freed.wait(), left)
                except asyncio.TimeoutError:
                    pass

    def resources_changed(self) -> None:
        """Wake every spawn waiting for resources (they retry their placement)."""
        self._freed.set()
        self._freed = asyncio.Event()

    @handles(GetActor)
    def op_get_actor(self, peer: Peer, msg: GetActor) -> ActorView:
        """The live actor called ``name``.

        Raises:
            ActorNotFoundError: no live actor has that name.
        """
        actor_id = self.state.names.get(msg.name)
        record = self.state.actors.get(actor_id) if actor_id else None
        if record is None or record.state is ActorState.DEAD:
            raise ActorNotFoundError(f"no live actor named {msg.name!r}")
        return record.public()

    @handles(LookupActor)
    def op_actor_info(self, peer: Peer, msg: LookupActor) -> ActorView:
        """The record of an actor (any state).

        Raises:
            ActorNotFoundError: the head never knew that actor.
        """
        record = self.state.actors.get(msg.actor_id)
        if record is None:
            raise ActorNotFoundError(f"unknown actor {msg.actor_id!r}")
        return record.public()

    @handles(DebugRegister)
    def op_debug_register(self, peer: Peer, msg: DebugRegister) -> bool:
        """A process's debug listener (``actors.control.debug``): its address and pid.

        An actor's is kept under its actor id. A driver's (``kind="driver"``) is kept under
        the session of the connection that sends it (never an id the peer names), until that
        session ends or the driver withdraws it (an empty address).

        Raises:
            ProtocolError: a driver's listener sent on a connection without a session, or an
                unknown kind.
        """
        if msg.kind == DRIVER:
            session = self.state.peer_session.get(peer.routing_id)
            if session is None:
                raise ProtocolError("a driver's debug listener is registered by its session")
            if msg.address:
                self.state.driver_debug[session] = {"address": msg.address, "pid": msg.pid}
            elif self.state.driver_debug.get(session, {}).get("pid") == msg.pid:
                del self.state.driver_debug[session]  # withdrawn (by the process that set it)
            return True
        if msg.kind != "actor":
            raise ProtocolError(f"unknown debug listener kind {msg.kind!r:.40}")
        self.debug_endpoints[msg.actor_id] = {"address": msg.address, "pid": msg.pid}
        return True

    @handles(DebugEndpoints)
    def op_debug_endpoints(self, peer: Peer, msg: DebugEndpoints) -> list[dict[str, Any]]:
        """The debug listeners of live or starting actors, with each actor's record (dead
        ones forgotten); with ``msg.drivers`` then those of the drivers of live sessions."""
        found = []
        for actor_id, info in list(self.debug_endpoints.items()):
            record = self.state.actors.get(actor_id)
            if record is None or record.state is ActorState.DEAD:
                del self.debug_endpoints[actor_id]
            elif record.pid in (None, info["pid"]):  # (None: still starting)
                found.append({**record.public().as_dict(), "debug_address": info["address"]})
        if msg.drivers:
            for session, info in list(self.state.driver_debug.items()):
                if session not in self.state.sessions:  # (ended: normally dropped then already)
                    del self.state.driver_debug[session]
                    continue
                found.append(
                    {
                        "actor_id": f"{DRIVER}:{session}",
                        "name": DRIVER,
                        "kind": DRIVER,
                        "node_id": "",
                        "state": ActorState.ALIVE.value,
                        "pid": info["pid"],
                        "debug_address": info["address"],
                    }
                )
        return found

    @handles(Kill)
    async def op_kill(self, peer: Peer, msg: Kill) -> bool:
        """Kill an actor for good (no restart). False if it was already dead."""
        record = self.state.actors.get(msg.actor_id)
        if record is None or record.state is ActorState.DEAD:
            return False
        await self.kill(record, "killed by request")
        return True

    async def _stop_starting(self, agent: Client, record: ActorRecord) -> None:
        try:
            await ask(agent, StopActor(record.actor_id, "its spawn timed out"), timeout=30)
        except RaylessError as exc:
            log.warning("could not stop %s after its spawn failed: %s", record.name, exc)

    async def kill(self, record: ActorRecord, reason: str) -> None:
        """Have ``record``'s agent stop its actor for good, then mark it dead (a failed stop
        is logged: the actor is dead to the head all the same)."""
        agent = self.state.agents.get(record.alloc.node_id)
        record.max_restarts = record.restarts  # no more restarts
        if agent is not None:
            try:
                await ask(agent, StopActor(record.actor_id, reason), timeout=30)
            except RaylessError as exc:
                log.warning("kill of %s failed: %s", record.name, exc)
        if record.state is not ActorState.DEAD:
            self.mark_dead(record, reason)

    @handles(ActorEvent, oneway=True)
    def on_actor_event(self, peer: Peer, ev: ActorEvent) -> None:
        """An agent's event about one of its actors: update the record, tell every session."""
        record = self.state.actors.get(ev.actor_id)
        if record is None:
            return
        ev = replace(ev, name=record.name, node=record.alloc.node_id)
        if ev.kind is EventKind.RESTARTING:
            record.state = ActorState.RESTARTING
            record.restarts = ev.restarts
            record.death = ev
            self._broadcast(ev)
        elif ev.kind is EventKind.READY:
            record.state, record.address, record.pid = ActorState.ALIVE, ev.address, ev.pid
            self._broadcast(ev)
        else:
            self.mark_dead(record, ev)

    def mark_dead(
        self, record: ActorRecord, death: str | ActorEvent, *, broadcast: bool = True
    ) -> None:
        """``death``: the agent's DIED event, or why the head declared the actor dead."""
        if record.state is ActorState.DEAD:
            return
        if isinstance(death, str):
            death = ActorEvent(EventKind.DIED, record.actor_id, reason=death)
        record.state = ActorState.DEAD
        self.state.died.append(record.actor_id)
        record.death = replace(
            death, kind=EventKind.DIED, name=record.name, node=record.alloc.node_id
        )
        release(self.state.nodes, record.alloc)
        self.resources_changed()
        node = self.state.nodes.get(record.alloc.node_id)
        if node is not None:
            node.actors.discard(record.actor_id)
        if self.state.names.get(record.name) == record.actor_id:
            del self.state.names[record.name]
        siblings = self.state.owned.get(record.owner)
        if siblings is not None:
            siblings.discard(record.actor_id)
            if not siblings:
                del self.state.owned[record.owner]
        if broadcast:
            self._broadcast(record.death)
        self._kill_owned(record.actor_id, f"its owner actor {record.name} died")


__all__ = ["HeadActors"]
