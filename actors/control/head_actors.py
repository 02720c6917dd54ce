"""The head's actor registry: actor records, spawn placement, kills and actor events.

A spawn is placed (``placement.allocation``; with ``wait_for_resources`` it waits for busy
GPUs, woken by each release), started by its node's agent and recorded; the agents' actor
events (``restarting``, ``ready``, ``died``) update the record and are pushed to every session;
a dead actor's resources are released and what it owned is killed. Part of
:class:`~rayless.actors.control.head.Head` (a mixin; the head holds the state it declares).
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from rayless.actors.errors import ActorDiedError, ActorNotFoundError, NameTakenError
from rayless.placement.allocation import Allocation, NodeState, choose, release
from rayless.placement.errors import PlacementError, ResourcesBusyError
from rayless.transport.client import Client
from rayless.transport.errors import ProtocolError, RaylessError, Timeout
from rayless.transport.peer import Peer

log = logging.getLogger("rayless.head")


@dataclass
class ActorRecord:
    """An actor as the head knows it."""

    actor_id: str
    name: str
    cls: str
    owner: str
    alloc: Allocation
    max_restarts: int
    methods: dict[str, bool]
    state: str = "pending"
    address: str = ""
    pid: int | None = None
    restarts: int = 0
    death: dict[str, Any] | None = None
    env: dict[str, str] = field(default_factory=dict)

    def public(self) -> dict[str, Any]:
        """Plain values for lookups, handles and status."""
        return {
            "actor_id": self.actor_id,
            "name": self.name,
            "cls": self.cls,
            "node_id": self.alloc.node_id,
            "gpus": self.alloc.cuda_visible_devices,
            "gpu_shares": [list(g) for g in self.alloc.gpus],
            "cpus": self.alloc.cpus,
            "state": self.state,
            "address": self.address,
            "pid": self.pid,
            "restarts": self.restarts,
            "max_restarts": self.max_restarts,
            "methods": self.methods,
            "death": self.death,
        }


class HeadActors:
    """The head's actor operations (``op_spawn``, ``op_kill``, lookups) and actor events."""

    # the head's state that the actor registry uses (set by ``Head.__init__``)
    nodes: dict[str, NodeState]
    agents: dict[str, Client]
    actors: dict[str, ActorRecord]
    owned: dict[str, set[str]]
    names: dict[str, str]
    sessions: dict[str, set[bytes]]
    debug_endpoints: dict[str, dict[str, Any]]
    _freed: asyncio.Event

    if TYPE_CHECKING:  # the head's sessions and event fan-out (``actors.control.head``)

        def _kill_owned(self, session: str, reason: str) -> int: ...

        def _broadcast(self, ev: dict[str, Any]) -> None: ...

    async def op_spawn(self, peer: Peer, spec: dict[str, Any]) -> dict[str, Any]:
        """Place an actor, have its node start it, and return its record once it serves."""
        name = spec.get("name")
        if name is not None and name in self.names:
            existing = self.actors.get(self.names[name])
            if existing is not None and existing.state != "dead":
                raise NameTakenError(f"an actor named {name!r} already exists")
        alloc = await self._place(spec)
        gone = spec.get("wait_for_resources") and str(spec.get("owner", "")) not in self.sessions
        if gone or (name is not None and name in self.names):  # changed while we waited
            release(self.nodes, alloc)
            self._resources_changed()
            if gone:
                raise PlacementError("the spawning session ended while it waited for resources")
            raise NameTakenError(f"an actor named {name!r} already exists")
        actor_id = uuid.uuid4().hex[:12]
        record = ActorRecord(
            actor_id=actor_id,
            name=name or f"{spec.get('cls_name', 'actor')}-{actor_id[:6]}",
            cls=str(spec.get("cls_name", "?")),
            owner=str(spec.get("owner", "")),
            alloc=alloc,
            max_restarts=int(spec.get("max_restarts", 0)),
            methods=dict(spec.get("methods", {})),
        )
        self.actors[actor_id] = record
        self.owned.setdefault(record.owner, set()).add(actor_id)
        self.names[record.name] = actor_id  # generated names are unique too
        node = self.nodes[alloc.node_id]
        node.actors.add(actor_id)
        agent = self.agents.get(alloc.node_id)
        try:
            if agent is None:
                raise PlacementError(f"node {alloc.node_id} has no agent connection")
            env = {"CUDA_VISIBLE_DEVICES": alloc.cuda_visible_devices}
            reply = await agent.request(
                ("spawn", actor_id, {**spec, "name": record.name, "env_res": env}),
                timeout=spec.get("timeout", 120),
            )
        except BaseException as exc:
            if isinstance(exc, ActorDiedError):
                exc.actor = record.name
            elif agent is not None:  # timed out or cancelled: the process may still start
                # Its resources are freed only once it is gone, so that nothing else lands on
                # its GPU while it finishes __init__ unknown to us.
                await asyncio.shield(self._stop_starting(agent, record))
            self._mark_dead(record, {"reason": f"failed to start: {exc}"}, broadcast=False)
            if isinstance(exc, Timeout):
                raise Timeout(
                    f"actor {record.name} did not start within its spawn timeout of "
                    f"{spec.get('timeout', 120)}s; its process was killed"
                ) from None
            raise
        if record.state == "dead":  # it died between starting and answering
            raise ActorDiedError(record.name, node=alloc.node_id, reason="died while starting")
        record.state, record.address, record.pid = "alive", reply["address"], reply["pid"]
        if isinstance(reply.get("methods"), dict):  # as the actor process loaded its class
            record.methods = {str(k): bool(v) for k, v in reply["methods"].items()}
        return record.public()

    async def _place(self, spec: dict[str, Any]) -> Allocation:
        """Choose (and reserve) where a spawn runs; with ``wait_for_resources`` seconds, wait
        for busy GPUs to be freed (woken by each release or node join, never polling).

        Raises:
            PlacementError: infeasible (at once, waiting or not).
            ResourcesBusyError: still busy after the wait (naming the request and the wait).
        """
        gpu_indices = spec.get("gpu_indices")
        gpus, cpus = spec.get("gpus", 0), spec.get("cpus", 1)
        wait = float(spec.get("wait_for_resources") or 0.0)
        deadline = time.monotonic() + wait
        while True:
            try:
                return choose(
                    self.nodes,
                    gpus,
                    cpus,
                    node=spec.get("node"),
                    gpu_indices=tuple(gpu_indices) if gpu_indices is not None else None,
                )
            except ResourcesBusyError as exc:
                left = deadline - time.monotonic()
                if wait <= 0:
                    raise
                if left <= 0:
                    raise ResourcesBusyError(
                        f"waited {wait:g}s (wait_for_resources) for gpus={gpus}, cpus={cpus}"
                        f"{'' if spec.get('node') is None else ' on ' + str(spec['node'])} "
                        f"and they stayed busy: {exc}"
                    ) from None
                freed = self._freed
                try:
                    await asyncio.wait_for(freed.wait(), left)
                except asyncio.TimeoutError:
                    pass

    def _resources_changed(self) -> None:
        """Wake every spawn waiting for resources (they retry their placement)."""
        self._freed.set()
        self._freed = asyncio.Event()

    def op_get_actor(self, peer: Peer, name: str) -> dict[str, Any]:
        """The live actor called ``name``."""
        actor_id = self.names.get(name)
        record = self.actors.get(actor_id) if actor_id else None
        if record is None or record.state == "dead":
            raise ActorNotFoundError(f"no live actor named {name!r}")
        return record.public()

    def op_actor_info(self, peer: Peer, actor_id: str) -> dict[str, Any]:
        """The record of an actor (any state)."""
        record = self.actors.get(actor_id)
        if record is None:
            raise ActorNotFoundError(f"unknown actor {actor_id!r}")
        return record.public()

    def op_debug_register(self, peer: Peer, actor_id: str, info: dict[str, Any]) -> bool:
        """An actor process's debug listener (``actors.control.debug``): its address and pid."""
        if not isinstance(info, dict) or not isinstance(info.get("address"), str):
            raise ProtocolError("malformed debug registration")
        self.debug_endpoints[str(actor_id)] = {"address": info["address"], "pid": info.get("pid")}
        return True

    def op_debug_endpoints(self, peer: Peer) -> list[dict[str, Any]]:
        """The debug listeners of live or starting actors, with each actor's record (dead
        ones forgotten)."""
        found = []
        for actor_id, info in list(self.debug_endpoints.items()):
            record = self.actors.get(actor_id)
            if record is None or record.state == "dead":
                del self.debug_endpoints[actor_id]
            elif record.pid in (None, info["pid"]):  # (None: still starting)
                found.append({**record.public(), "debug_address": info["address"]})
        return found

    async def op_kill(self, peer: Peer, actor_id: str) -> bool:
        """Kill an actor for good (no restart). False if it was already dead."""
        record = self.actors.get(actor_id)
        if record is None or record.state == "dead":
            return False
        await self._kill(record, "killed by request")
        return True

    async def _stop_starting(self, agent: Client, record: ActorRecord) -> None:
        try:
            await agent.request(("kill", record.actor_id, "its spawn timed out"), timeout=30)
        except RaylessError as exc:
            log.warning("could not stop %s after its spawn failed: %s", record.name, exc)

    async def _kill(self, record: ActorRecord, reason: str) -> None:
        agent = self.agents.get(record.alloc.node_id)
        record.max_restarts = record.restarts  # no more restarts
        if agent is not None:
            try:
                await agent.request(("kill", record.actor_id, reason), timeout=30)
            except RaylessError as exc:
                log.warning("kill of %s failed: %s", record.name, exc)
        if record.state != "dead":
            self._mark_dead(record, {"reason": reason})

    def _on_actor_event(self, ev: dict[str, Any]) -> None:
        record = self.actors.get(str(ev.get("actor_id")))
        if record is None:
            return
        kind = ev.get("ev")
        if kind == "restarting":
            record.state = "restarting"
            record.restarts = int(ev.get("restarts", record.restarts + 1))
            record.death = ev
            self._broadcast({**ev, "name": record.name})
        elif kind == "ready":
            record.state, record.address, record.pid = "alive", ev["address"], ev.get("pid")
            self._broadcast({**ev, "name": record.name})
        elif kind == "died":
            self._mark_dead(record, ev)

    def _mark_dead(
        self, record: ActorRecord, info: dict[str, Any], *, broadcast: bool = True
    ) -> None:
        if record.state == "dead":
            return
        record.state = "dead"
        record.death = {**info, "node": record.alloc.node_id, "name": record.name}
        release(self.nodes, record.alloc)
        self._resources_changed()
        node = self.nodes.get(record.alloc.node_id)
        if node is not None:
            node.actors.discard(record.actor_id)
        if self.names.get(record.name) == record.actor_id:
            del self.names[record.name]
        siblings = self.owned.get(record.owner)
        if siblings is not None:
            siblings.discard(record.actor_id)
            if not siblings:
                del self.owned[record.owner]
        if broadcast:
            self._broadcast({"ev": "died", "actor_id": record.actor_id, **record.death})
        self._kill_owned(record.actor_id, f"its owner actor {record.name} died")


__all__ = ["ActorRecord", "HeadActors"]
