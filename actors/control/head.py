"""The head: one per cluster. Registry of nodes, actors and names; placement; failure fan-out.

Calls never pass through the head: it answers spawn/kill/lookup requests, holds a client to
every node agent, declares nodes dead when their heartbeats stop, and pushes actor events
(``ready``, ``restarting``, ``died``) to every connected process, which fail their pending
calls at once. Actors belong to the session (driver or actor) that spawned them and are
killed when that session ends or vanishes.

Run as ``python -m rayless.actors.control.head ADDRESS`` with the token in RAYLESS_TOKEN; prints
its address.

This module holds the head's lifecycle, request dispatch, sessions, nodes (joins, heartbeats,
deaths) and event fan-out; the actor registry (spawns, kills, lookups, actor events) is a
:class:`~rayless.actors.control.head_actors.HeadActors` the head owns, and the tables both use
are one :class:`~rayless.actors.control.head_state.HeadState`. The head answers exactly the
messages of the methods of the two marked with ``wire.handles``.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import os
import signal
import sys
import time
from typing import Any

from rayless.actors.control.head_actors import HeadActors
from rayless.actors.control.head_packages import HeadPackages
from rayless.actors.control.head_state import ActorRecord, HeadState
from rayless.actors.core import context, gc_policy, published
from rayless.actors.protocol.messages import (
    ActorEvent,
    ActorPage,
    ActorState,
    ClusterSummary,
    EndSession,
    FreePort,
    FreePortOn,
    GpuView,
    Hello,
    HelloReply,
    KeepSession,
    ListActors,
    ListNodes,
    LogLines,
    NodeDied,
    NodeHeartbeat,
    NodeRegistered,
    NodeView,
    RegisterNode,
    Shutdown,
    Summarize,
)
from rayless.actors.protocol.wire import Handlers, ask, handles
from rayless.placement.allocation import NodeState
from rayless.placement.errors import PlacementError
from rayless.transport import loop
from rayless.transport.client import Client
from rayless.transport.codec import refuse_classes_by_value
from rayless.transport.errors import ProtocolError, RaylessError
from rayless.transport.server import Peer, Request, Server
from rayless.transport.zmq_context import zmq_context

log = logging.getLogger("rayless.head")
DEAD = ActorState.DEAD
# The head's pings on its connection to each agent: the agent's server forgets ZeroMQ peers
# silent for 30 s; a node's death is learnt from its missing heartbeats, not from these.
AGENT_PING_INTERVAL = 10.0


class Head:
    """The head's server, sessions, nodes and request dispatch. Use ``async with``."""

    def __init__(
        self,
        token: str,
        address: str = "tcp://127.0.0.1:0",
        *,
        node_timeout: float = 5.0,
        owner_grace: float | None = None,
    ) -> None:
        self.token = token
        self.node_timeout = node_timeout
        self.owner_grace = node_timeout if owner_grace is None else owner_grace
        self.state = HeadState()
        self.registry = HeadActors(
            self.state, broadcast=self._broadcast, kill_owned=self._kill_owned
        )
        self.packages = HeadPackages()  # the zips of spawns' working_dir and py_modules
        self._keepers: set[bytes] = set()  # connections that only hold a session alive
        self._orphan_timers: dict[str, asyncio.TimerHandle] = {}
        self._tasks: set[asyncio.Task[Any]] = set()
        self.stopped = asyncio.Event()
        self.server = Server(
            address,
            token=token,
            handler=self._handle,
            on_oneway=self._oneway,
            on_peer_gone=self._peer_gone,
            name="head",
            peer_idle_timeout=max(2.0, node_timeout),
            allow_pickle=False,  # the control plane never unpickles, whatever the cluster's opt-in
        )
        self._sweeper: asyncio.Task[None] | None = None
        self.requests: Handlers[Peer] = Handlers("head", self, self.registry, self.packages)
        self.oneways: Handlers[Peer] = Handlers("head", self, self.registry, oneway=True)

    async def __aenter__(self) -> Head:
        await self.server.start()
        self._sweeper = asyncio.ensure_future(self._sweep())
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    @property
    def address(self) -> str:
        """Where the head listens."""
        return self.server.address

    async def aclose(self) -> None:
        """Tell every agent to shut down, then close. Idempotent."""
        if self._sweeper is not None:
            self._sweeper.cancel()
            self._sweeper = None
        agents, self.state.agents = self.state.agents, {}
        await asyncio.gather(
            *(self._stop_agent(c) for c in agents.values()), return_exceptions=True
        )
        for task in list(self._tasks):
            task.cancel()
        await self.server.aclose()
        self.packages.close()
        self.stopped.set()

    async def _stop_agent(self, client: Client) -> None:
        try:
            await ask(client, Shutdown(), timeout=10)
        except RaylessError:
            pass
        await client.aclose()

    def _spawn_task(self, coro: Any) -> None:
        task = asyncio.ensure_future(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    # -- dispatch --------------------------------------------------------------------------

    def _handle(self, req: Request) -> Any:
        """Answer a request by its message type (the handlers marked ``wire.handles``).

        Raises:
            ProtocolError: an unknown or malformed request.
        """
        return self.requests.handle(req.peer, req.body)

    def _oneway(self, peer: Peer, body: object) -> None:
        self.oneways.oneway(peer, body)

    # -- sessions ------------------------------------------------------------------------

    @handles(Hello)
    def op_hello(self, peer: Peer, msg: Hello) -> HelloReply:
        """A driver or actor runtime introduces its session (the owner of what it spawns).

        A runtime that resumes its session after the head forgot its connection names the
        actors it talks to (``actor_ids``): the reply carries their records (``actors``), so
        that it learns of the events it missed meanwhile.

        Raises:
            ProtocolError: an empty session id.
        """
        if not msg.session:
            raise ProtocolError("hello needs a session id")
        self._join(peer, msg.session)
        records = (self.state.actors.get(a) for a in msg.actor_ids)
        return HelloReply(self.node_timeout, tuple(r.public() for r in records if r is not None))

    @handles(KeepSession)
    def op_keep_session(self, peer: Peer, msg: KeepSession) -> bool:
        """A driver's keeper connection (``actors.api.keeper``): it holds ``session`` alive
        while it is heard, and gets no events or logs.

        Raises:
            ProtocolError: an empty session id.
        """
        if not msg.session:
            raise ProtocolError("keep_session needs a session id")
        self._join(peer, msg.session)
        self._keepers.add(peer.routing_id)
        return True

    def _join(self, peer: Peer, session: str) -> None:
        old = self.state.peer_session.get(peer.routing_id)
        if old is not None and old != session:  # a connection belongs to one session
            raise ProtocolError("this connection already belongs to another session")
        self.state.sessions.setdefault(session, set()).add(peer.routing_id)
        self.state.peer_session[peer.routing_id] = session
        timer = self._orphan_timers.pop(session, None)
        if timer is not None:
            timer.cancel()

    @handles(EndSession)
    async def op_end_session(self, peer: Peer, msg: EndSession) -> int:
        """The session is over: kill every actor it owns; returns how many, once they are dead."""
        self.state.driver_debug.pop(msg.session, None)
        owned = self._owned_by(msg.session)
        await asyncio.gather(
            *(self.registry.kill(a, "its owner ended the session") for a in owned),
            return_exceptions=True,
        )
        return len(owned)

    def _peer_gone(self, peer: Peer) -> None:
        self.packages.peer_gone(peer.routing_id)
        session = self.state.peer_session.pop(peer.routing_id, None)
        self._keepers.discard(peer.routing_id)
        if session is None:
            return
        peers = self.state.sessions.get(session)
        if peers is not None:
            peers.discard(peer.routing_id)
            if not peers:
                del self.state.sessions[session]
                self.state.driver_debug.pop(session, None)
                owner = self.state.actors.get(session)
                if owner is not None and owner.state is not DEAD:
                    # an actor's session: what it owns dies with it (``HeadActors.mark_dead``),
                    # never because its loop, held by a long method, went silent
                    return
                loop = asyncio.get_running_loop()
                self._orphan_timers[session] = loop.call_later(
                    self.owner_grace, self._kill_owned, session, "its owner disconnected"
                )

    def _kill_owned(self, session: str, reason: str) -> int:
        self._orphan_timers.pop(session, None)
        owned = self._owned_by(session)
        for record in owned:
            self._spawn_task(self.registry.kill(record, reason))
        # what those actors owned goes too (their sessions are their actor ids)
        return len(owned)

    def _owned_by(self, session: str) -> list[ActorRecord]:
        """The live actors ``session`` owns (from the owner index: no scan of every actor)."""
        records = (self.state.actors.get(a) for a in self.state.owned.get(session, ()))
        return [r for r in records if r is not None and r.state is not DEAD]

    # -- nodes ---------------------------------------------------------------------------

    @handles(RegisterNode)
    async def op_register_node(self, peer: Peer, msg: RegisterNode) -> NodeRegistered:
        """A node agent joins (or re-joins) the cluster."""
        agent_address = msg.agent_address
        node = NodeState.create(msg.info, agent_address, time.monotonic())
        old = self.state.agents.pop(node.node_id, None)
        if old is not None:
            await old.aclose()
        client = Client(  # the node's liveness is its heartbeats: pings only keep the session
            agent_address,
            token=self.token,
            name=f"head->{node.node_id}",
            heartbeat_interval=AGENT_PING_INTERVAL,
            heartbeat_timeout=3 * AGENT_PING_INTERVAL,
        )
        await client.connect()
        self.state.nodes[node.node_id] = node
        self.state.agents[node.node_id] = client
        self.registry.resources_changed()
        log.info("node %s joined (%d GPUs)", node.node_id, len(node.gpu_indices))
        return NodeRegistered(self.node_timeout)

    @handles(ListNodes)
    def op_nodes(self, peer: Peer, msg: ListNodes) -> list[NodeView]:
        """Every node with its resources and number of actors; with ``msg.actors`` their
        records too."""
        return [self._node_view(node, msg.actors) for node in self.state.nodes.values()]

    def _node_view(self, node: NodeState, with_actors: bool) -> NodeView:
        info = node.info
        rank = info.get("rank")
        actors = None
        if with_actors:
            records = self.state.actors
            actors = tuple(records[a].public() for a in sorted(node.actors) if a in records)
        return NodeView(
            node_id=node.node_id,
            hostname=None if info.get("hostname") is None else str(info["hostname"]),
            ip=None if info.get("ip") is None else str(info["ip"]),
            rank=None if rank is None else int(rank),
            alive=node.alive,
            cpus=float(node.cpus),
            cpus_used=round(node.cpus_used, 6),
            gpus=tuple(
                GpuView(
                    index=int(g["index"]),
                    uuid=str(g.get("uuid", "")),
                    name=str(g.get("name", "")),
                    memory_bytes=int(g.get("memory_bytes", 0)),
                    pci_bus_id=str(g.get("pci_bus_id", "")),
                    free=round(node.gpu_free.get(int(g["index"]), 0.0), 6),
                )
                for g in info.get("gpus", [])
            ),
            gpus_total=len(node.gpu_indices),
            gpus_free=node.whole_gpus_free(),
            fake_gpus=bool(info.get("fake_gpus", False)),
            num_actors=len(node.actors),
            actors=actors,
        )

    @handles(Summarize)
    def op_summarize(self, peer: Peer, msg: Summarize) -> ClusterSummary:
        """The cluster's totals and its first nodes and actors (O(nodes + limit)).

        Raises:
            ProtocolError: a limit that is not an int >= 0 or None.
        """
        if not (msg.limit is None or _count(msg.limit)):
            raise ProtocolError(f"limit must be an int >= 0 or None, got {msg.limit!r}")
        nodes = self.state.nodes.values()
        page = [self._node_view(node, False) for node in itertools.islice(nodes, msg.limit)]
        actors = self.op_list_actors(peer, ListActors(limit=msg.limit))
        records = self.state.actors
        died = (records[a].public() for a in reversed(self.state.died) if a in records)
        return ClusterSummary(
            nodes=len(self.state.nodes),
            nodes_alive=sum(1 for n in nodes if n.alive),
            cpus=sum(n.cpus for n in nodes),
            cpus_used=round(sum(n.cpus_used for n in nodes), 6),
            gpus=sum(len(n.gpu_indices) for n in nodes),
            gpus_free=sum(n.whole_gpus_free() for n in nodes),
            actors=actors.total,
            node_page=tuple(page),
            actor_page=actors.actors,
            died=tuple(itertools.islice(died, msg.limit)),
        )

    def _by_name(self, actor_id: str) -> tuple[str, str]:
        record = self.state.actors.get(actor_id)
        return ("" if record is None else record.name, actor_id)

    @handles(ListActors)
    def op_list_actors(self, peer: Peer, msg: ListActors) -> ActorPage:
        """A page of the live actors, node by node, by name within a node (O(nodes + offset +
        limit), plus sorting each node's actors).

        Raises:
            ProtocolError: an offset or limit that is not an int >= 0 (limit: or None).
        """
        if not _count(msg.offset) or not (msg.limit is None or _count(msg.limit)):
            raise ProtocolError(
                f"offset and limit must be ints >= 0, got {msg.offset!r}, {msg.limit!r}"
            )
        total = sum(len(node.actors) for node in self.state.nodes.values())
        end = None if msg.limit is None else msg.offset + msg.limit
        ids = itertools.islice(
            itertools.chain.from_iterable(
                sorted(n.actors, key=self._by_name) for n in self.state.nodes.values()
            ),
            msg.offset,
            end,
        )
        views = tuple(self.state.actors[a].public() for a in ids if a in self.state.actors)
        return ActorPage(views, total, msg.offset)

    @handles(FreePortOn)
    async def op_free_port(self, peer: Peer, msg: FreePortOn) -> int:
        """A TCP port free right now on ``node_id`` (asked of its agent).

        Raises:
            PlacementError: no such live node.
        """
        node_id = msg.node_id
        agent = self.state.agents.get(node_id)
        node = self.state.nodes.get(node_id)
        if agent is None or node is None or not node.alive:
            raise PlacementError(f"node {node_id!r} is not alive in this cluster")
        return await ask(agent, FreePort(), timeout=10)

    @handles(NodeHeartbeat)
    def op_node_heartbeat(self, peer: Peer, msg: NodeHeartbeat) -> bool:
        """A node agent is alive (answered: the reply is its session's heartbeat too)."""
        node = self.state.nodes.get(msg.node_id)
        if node is not None and node.alive:
            node.last_heartbeat = time.monotonic()
        return True

    @handles(Shutdown)
    def op_shutdown(self, peer: Peer, msg: Shutdown) -> str:
        """Shut the whole cluster down (after replying)."""
        asyncio.get_running_loop().call_soon(lambda: self._spawn_task(self.aclose()))
        return "shutting down"

    async def _sweep(self) -> None:
        interval = max(0.05, self.node_timeout / 10)
        while True:
            await asyncio.sleep(interval)
            now = time.monotonic()
            for node in list(self.state.nodes.values()):
                if node.alive and now - node.last_heartbeat > self.node_timeout:
                    self._node_died(node, f"no heartbeat for {now - node.last_heartbeat:.1f}s")

    def _node_died(self, node: NodeState, reason: str) -> None:
        log.warning("node %s declared dead: %s", node.node_id, reason)
        node.alive = False
        client = self.state.agents.pop(node.node_id, None)
        if client is not None:
            self._spawn_task(client.aclose())
        for actor_id in list(node.actors):
            record = self.state.actors.get(actor_id)
            if record is not None and record.state is not DEAD:
                self.registry.mark_dead(record, f"node {node.node_id} died ({reason})")
        self._broadcast(NodeDied(node.node_id, reason))

    # -- events --------------------------------------------------------------------------

    def _broadcast(self, ev: ActorEvent | NodeDied) -> None:
        # the sessions' connections (not every peer: the agents' are most of them)
        for rid in list(self.state.peer_session):
            if rid not in self._keepers:
                self.server.send_oneway(rid, ev)

    @handles(LogLines, oneway=True)
    def on_log_lines(self, peer: Peer, batch: LogLines) -> None:
        """An agent's batch of an actor's log lines: to the connections of its owner's
        session."""
        record = self.state.actors.get(batch.actor_id)
        if record is None:
            return
        for rid in self.state.sessions.get(record.owner, ()):
            if rid not in self._keepers:
                self.server.send_oneway(rid, batch)


def raise_socket_limits() -> None:
    """Room for a connection to every node agent: the head holds one ZeroMQ socket per remote
    agent (``transport.zmq_context``: ZeroMQ's default of 1,023 sockets would keep a
    1,100-node cluster from joining). Call before the first socket exists."""
    zmq_context()


async def serve(address: str, token: str, node_timeout: float) -> None:
    """Run a head until SIGTERM/SIGINT/SIGHUP or a shutdown request."""
    async with Head(token, address, node_timeout=node_timeout) as head:
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
            loop.add_signal_handler(sig, head.stopped.set)
        print(head.address, flush=True)
        await head.stopped.wait()


def main() -> None:
    """Entry point of ``python -m rayless.actors.control.head ADDRESS [NODE_TIMEOUT]``."""
    from rayless.actors.control.process_util import die_with_parent, setup_logging

    setup_logging("head")
    if os.environ.get("RAYLESS_DIE_WITH_PARENT"):
        die_with_parent()
    token = context.take_token()  # read once (a pipe, RAYLESS_TOKEN_FD); no child inherits it
    if len(sys.argv) not in (2, 3) or not token:
        sys.exit(
            "usage: RAYLESS_TOKEN_FILE=... python -m rayless.actors.control.head ADDRESS "
            "[NODE_TIMEOUT]"
        )
    timeout = float(sys.argv[2]) if len(sys.argv) == 3 else 5.0
    refuse_classes_by_value()  # it runs no user code: it unpickles nothing
    raise_socket_limits()
    gc_policy.apply()
    gc_policy.freeze()
    try:
        loop.run(serve(sys.argv[1], token, timeout))
    finally:  # an embedded cluster's entry, if its driver died without removing it
        published.unpublish(str(published.runtime_dir() / f"cluster-{os.getpid()}.json"))


def _count(value: object) -> bool:
    """An int >= 0 (not a bool)."""
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


if __name__ == "__main__":
    main()
