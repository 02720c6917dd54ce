"""The control plane's messages: drivers and actor runtimes ↔ head ↔ node agents ↔ actor
processes.

Every request, reply, one-way message and event of this conversation is a frozen dataclass
registered with the codec (``actors.protocol.wire.message``) under a stable wire name
(``ctl.<Name>``); docs/protocol.md lists them. Status replies (``ListNodes``,
``ActorPage``'s records, ``AgentStatus``, ``DebugEndpoints``) are plain data for people and the CLI.

Who answers what: the head (``actors.control.head``) and a node agent
(``actors.control.agent``) each answer the requests of their handlers marked with
``wire.handles`` (a reply's type is the request's ``Request[R]``); the head hears
:class:`ActorEvent` and :class:`LogLines` one-way from its agents, and pushes
:class:`ActorEvent`, :class:`NodeDied` and :class:`LogLines` to sessions.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Any

from rayless.actors.protocol.wire import Request, message
from rayless.transport.errors import RaylessError

__all__ = [
    "ActorEvent", "ActorPage", "ActorState", "ActorView", "AgentStatus", "Boot", "Bootstrap",
    "ClusterSummary", "DebugEndpoints", "DebugRegister", "EndSession", "EventKind", "Failed",
    "FreePort", "FreePortOn", "GetActor", "GpuView", "Hello", "HelloReply", "KeepSession", "Kill",
    "ListActors", "ListNodes", "LogLines", "LookupActor", "MethodInfo", "NodeDied",
    "NodeHeartbeat", "NodeView",
    "NodeRegistered", "PackageFetch", "PackageRef", "PackageUpload", "ProcState", "Ready",
    "RegisterNode", "Shutdown", "Spawn", "SpawnSpec",
    "StartActor", "Started", "StopActor", "Summarize", "Template",
]  # fmt: skip


class ActorState(str, enum.Enum):
    """An actor's state as the head and the runtimes know it."""

    PENDING = "pending"  # placed, its process starting
    ALIVE = "alive"
    RESTARTING = "restarting"  # its process died and a new one is starting
    DEAD = "dead"  # for good


class ProcState(str, enum.Enum):
    """An actor process's state as its node agent supervises it."""

    STARTING = "starting"
    ALIVE = "alive"
    RESTARTING = "restarting"
    STOPPING = "stopping"  # killed on purpose: not restarted
    DEAD = "dead"


class EventKind(str, enum.Enum):
    """What happened to an actor (:class:`ActorEvent`)."""

    READY = "ready"  # a restarted process serves (at ``address``)
    RESTARTING = "restarting"  # its process died; a new one is starting
    DIED = "died"  # for good


# -- the spawn spec -----------------------------------------------------------------------


class Template(str, enum.Enum):
    """Which of its host's fork templates starts an actor (``Cluster.spawn(template=...)``).

    ``TORCH`` (the default): the template that imports torch and tensordict ahead (its eager
    warm-up), so every fork has them for free; a fork asked for before the warm-up finished
    waits for it. ``LIGHT``: the template that never imports them, so it forks at once; for
    actors whose class does not need torch (the store's controller asks for it).
    A ``LIGHT`` actor that imports torch still works: it pays the import itself (~2 s, and
    torch's memory in its own process). See ``rayless.actors.host.zygote``.
    """

    TORCH = "torch"
    LIGHT = "light"


@message("ctl.MethodInfo")
@dataclass(frozen=True)
class MethodInfo:
    """One remotely callable method of an actor class, as handles carry it.

    ``is_async``: a coroutine function (runs on the actor's loop) or not (a worker thread).
    ``params``: its parameters after ``self``/``cls`` as a parameter list's text, with each
    default shown as ``=`` alone (``"x, y=, /, *args, k=, **kw"``); callers check their
    arguments against it before sending (``actors.api.binding``); None where the signature
    cannot be read (the far side then decides). ``timeout``: the seconds a call may take by
    default (``@endpoint(timeout=...)``), None for none. ``is_generator``: a ``def`` or
    ``async def`` generator (its result streams; Ray's API makes it an ObjectRefGenerator).
    ``group``: the concurrency group it runs in (``@concurrency_group``), None for the
    actor's default one.
    """

    is_async: bool
    params: str | None = None
    timeout: float | None = None
    is_generator: bool = False
    group: str | None = None


@message("ctl.PackageRef")
@dataclass(frozen=True)
class PackageRef:
    """Files a spawn ships to its node (Ray's ``runtime_env`` ``working_dir`` and
    ``py_modules``): a zip the head holds by its sha256 ``digest`` (``size`` bytes).

    ``working_dir``: its extract is the actor's current directory and first import path
    entry; else (a py_module) its extract is on the import path.
    """

    digest: str
    size: int
    working_dir: bool = False


@message("ctl.SpawnSpec")
@dataclass(frozen=True)
class SpawnSpec:
    """What a driver asks of a spawn, passed on by the head to the node agent and, in part
    (:class:`Boot`), to the actor process.

    ``cls`` is ``(module, qualname, cloudpickled class or None)`` (``actors.api.actor.
    ClassRef``); ``init`` the codec frames of ``(args, kwargs)``; ``methods`` the class's
    public methods as the driver sees them; ``imports`` the modules the fork
    template imports before this actor's class module (the class's ``template_imports``).
    """

    cls: tuple[str, str, bytes | None]
    cls_name: str
    init: tuple[bytes, ...]
    owner: str
    name: str | None = None
    node: str | None = None
    gpus: float = 0.0
    cpus: float = 1.0
    gpu_indices: tuple[int, ...] | None = None
    max_restarts: int = 0
    max_concurrency: int | None = None
    concurrency_groups: dict[str, int] = field(default_factory=dict)
    env: dict[str, str] = field(default_factory=dict)
    methods: dict[str, MethodInfo] = field(default_factory=dict)
    cwd: str | None = None
    sys_path: tuple[str, ...] = ()
    timeout: float = 120.0
    wait_for_resources: float = 0.0
    template: Template = Template.TORCH
    imports: tuple[str, ...] = ()
    hooks: bool = True  # setup/teardown are lifecycle hooks (False: plain methods, Ray's)
    executable: tuple[str, ...] = ()  # the command that runs its Python (empty: the node's)
    detached: bool = False  # outlives its owner: ends with the cluster or a kill (Ray's)
    packages: tuple[PackageRef, ...] = ()  # its working_dir and py_modules, fetched by its node


# -- records and events -------------------------------------------------------------------


@message("ctl.ActorEvent")
@dataclass(frozen=True)
class ActorEvent:
    """An actor's process started again (``READY``), died and restarts (``RESTARTING``), or
    died for good (``DIED``): from its agent to the head, and from the head to sessions (then
    with ``name`` and ``node`` filled in)."""

    kind: EventKind
    actor_id: str
    name: str = ""
    node: str | None = None
    pid: int | None = None
    exitcode: int | None = None
    restarts: int = 0
    reason: str = ""
    address: str = ""  # READY: where it serves now
    cause: str = ""  # RESTARTING, DIED: the agent's words for the exit (signal, OOM killer)
    oom: bool = False  # the kernel's OOM killer ended it (``actors.control.death``)
    log_tail: list[str] = field(default_factory=list)  # the last lines of its log
    log: str = ""  # its log file's path on its node


@message("ctl.NodeDied")
@dataclass(frozen=True)
class NodeDied:
    """The head declared a node dead (head → sessions; its actors' DIED events came first)."""

    node_id: str
    reason: str


@message("ctl.ActorView")
@dataclass(frozen=True)
class ActorView:
    """The head's record of an actor, as it answers lookups, spawns and session resumes."""

    actor_id: str
    name: str
    cls: str
    node_id: str
    gpus: str  # its CUDA_VISIBLE_DEVICES
    gpu_shares: tuple[tuple[int, float], ...]
    cpus: float
    state: ActorState
    address: str
    pid: int | None
    restarts: int
    max_restarts: int
    methods: dict[str, MethodInfo]
    death: ActorEvent | None
    named: bool = False  # its spawn gave the name (else the head made one up)

    def as_dict(self) -> dict[str, Any]:
        """Plain values, for status output (``Cluster.nodes``, ``rayless status``)."""
        death = self.death
        return {
            "actor_id": self.actor_id,
            "name": self.name,
            "cls": self.cls,
            "node_id": self.node_id,
            "gpus": self.gpus,
            "gpu_shares": [list(g) for g in self.gpu_shares],
            "cpus": self.cpus,
            "state": self.state.value,
            "address": self.address,
            "pid": self.pid,
            "restarts": self.restarts,
            "max_restarts": self.max_restarts,
            "methods": {name: info.is_async for name, info in self.methods.items()},
            "death": None if death is None else {"reason": death.reason, "pid": death.pid,
                                                 "exitcode": death.exitcode,
                                                 "cause": death.cause, "oom": death.oom},
        }  # fmt: skip


@message("ctl.LogLines")
@dataclass(frozen=True)
class LogLines:
    """New lines of an actor's output: agent → head → the actor's owner."""

    actor_id: str
    name: str
    pid: int
    node: str
    lines: tuple[str, ...]


# -- sessions (drivers and actor runtimes → head) -----------------------------------------


@message("ctl.HelloReply")
@dataclass(frozen=True)
class HelloReply:
    """The head's answer to :class:`Hello`: its node timeout, the named actors' records."""

    node_timeout: float
    actors: tuple[ActorView, ...] = ()


@message("ctl.Hello")
@dataclass(frozen=True)
class Hello(Request[HelloReply]):
    """A runtime introduces its session; one that resumes names the actors it talks to."""

    reply = HelloReply

    session: str
    actor_ids: tuple[str, ...] = ()


@message("ctl.KeepSession")
@dataclass(frozen=True)
class KeepSession(Request[bool]):
    """A driver's keeper connection holds ``session`` alive (it gets no events). → bool"""

    reply = bool

    session: str


@message("ctl.EndSession")
@dataclass(frozen=True)
class EndSession(Request[int]):
    """The session is over: kill what it owns. → how many actors"""

    reply = int

    session: str


# -- actors (→ head) ----------------------------------------------------------------------


@message("ctl.Spawn")
@dataclass(frozen=True)
class Spawn(Request[ActorView]):
    """Place and start an actor. → :class:`ActorView` once it serves"""

    reply = ActorView

    spec: SpawnSpec


@message("ctl.PackageUpload")
@dataclass(frozen=True)
class PackageUpload(Request[bool]):
    """A part of a package's zip, from ``offset`` (0 starts it over): the head keeps it
    once ``size`` bytes with the sha256 ``digest`` have come. → whether it holds the whole
    package now (at once when it already did: the sender sends no more)"""

    reply = bool

    digest: str
    size: int
    offset: int
    data: bytes


@message("ctl.PackageFetch")
@dataclass(frozen=True)
class PackageFetch(Request[bytes]):
    """Up to ``length`` bytes of a package's zip from ``offset``, for a node that extracts
    it. → the bytes"""

    reply = bytes

    digest: str
    offset: int
    length: int


@message("ctl.GetActor")
@dataclass(frozen=True)
class GetActor(Request[ActorView]):
    """The live actor called ``name``. → :class:`ActorView`"""

    reply = ActorView

    name: str


@message("ctl.LookupActor")
@dataclass(frozen=True)
class LookupActor(Request[ActorView]):
    """An actor's record, in any state. → :class:`ActorView`"""

    reply = ActorView

    actor_id: str


@message("ctl.Kill")
@dataclass(frozen=True)
class Kill(Request[bool]):
    """Kill an actor for good. → False if it was already dead"""

    reply = bool

    actor_id: str


@message("ctl.DebugRegister")
@dataclass(frozen=True)
class DebugRegister(Request[bool]):
    """A process's debug listener (``actors.control.debug``). → True

    ``kind`` ``"actor"``: an actor process's, under ``actor_id``. ``"driver"``: a driver's,
    sent on its session's own connection to the head and kept under that session (whatever
    ``actor_id`` says) until the session ends; an empty ``address`` withdraws it.
    """

    reply = bool

    actor_id: str
    address: str
    pid: int | None
    kind: str = "actor"


@message("ctl.DebugEndpoints")
@dataclass(frozen=True)
class DebugEndpoints(Request[list[dict[str, Any]]]):
    """The debug listeners of live actors (and, with ``drivers``, of the drivers whose
    sessions are live: records with ``kind: "driver"``, ``actor_id`` ``driver:SESSION``).
    → list of records with ``debug_address``"""

    reply = list

    drivers: bool = False


# -- the cluster (→ head) -----------------------------------------------------------------


@message("ctl.NodeRegistered")
@dataclass(frozen=True)
class NodeRegistered:
    """The head's answer to :class:`RegisterNode`."""

    node_timeout: float


@message("ctl.RegisterNode")
@dataclass(frozen=True)
class RegisterNode(Request[NodeRegistered]):
    """A node agent joins: its discovery record (``NodeInfo.to_dict``) and address."""

    reply = NodeRegistered

    info: dict[str, Any]
    agent_address: str


@message("ctl.GpuView")
@dataclass(frozen=True)
class GpuView:
    """One GPU of a node as the head sees it: what discovery found, and ``free``, the share
    of it nothing holds (0.0 to 1.0)."""

    index: int
    uuid: str
    name: str
    memory_bytes: int
    pci_bus_id: str
    free: float

    def as_dict(self) -> dict[str, Any]:
        """Plain values (``Cluster.nodes``)."""
        return {
            "index": self.index,
            "uuid": self.uuid,
            "name": self.name,
            "memory_bytes": self.memory_bytes,
            "pci_bus_id": self.pci_bus_id,
            "free": self.free,
        }


@message("ctl.NodeView")
@dataclass(frozen=True)
class NodeView:
    """One node as the head answers for it: where it is, whether it is alive, its resources
    (CPUs counted and used; GPUs, whole ones free), its number of live actors and, when
    asked for (``ListNodes(actors=True)``), their records."""

    node_id: str
    hostname: str | None
    ip: str | None
    rank: int | None
    alive: bool
    cpus: float
    cpus_used: float
    gpus: tuple[GpuView, ...]
    gpus_total: int
    gpus_free: int
    fake_gpus: bool
    num_actors: int
    actors: tuple[ActorView, ...] | None = None

    def as_dict(self) -> dict[str, Any]:
        """Plain values, for ``Cluster.nodes`` (Ray's ``ray.nodes()`` is a list of dicts too)
        and status output; ``"actors"`` only when the view holds them."""
        out: dict[str, Any] = {
            "node_id": self.node_id,
            "hostname": self.hostname,
            "ip": self.ip,
            "rank": self.rank,
            "alive": self.alive,
            "cpus": self.cpus,
            "cpus_used": self.cpus_used,
            "gpus": [g.as_dict() for g in self.gpus],
            "gpus_total": self.gpus_total,
            "gpus_free": self.gpus_free,
            "fake_gpus": self.fake_gpus,
            "num_actors": self.num_actors,
        }
        if self.actors is not None:
            out["actors"] = [a.as_dict() for a in self.actors]
        return out


@message("ctl.ListNodes")
@dataclass(frozen=True)
class ListNodes(Request[list[NodeView]]):
    """Every node with its resources and its number of actors; with ``actors`` also each
    live actor's record (O(actors): a whole-cluster listing). → list of NodeView"""

    reply = list

    actors: bool = True


@message("ctl.ActorPage")
@dataclass(frozen=True)
class ActorPage:
    """One page of the live actors (node by node, by id within a node), and how many live
    actors there are in all."""

    actors: tuple[ActorView, ...]
    total: int
    offset: int


@message("ctl.ListActors")
@dataclass(frozen=True)
class ListActors(Request[ActorPage]):
    """Live actors ``offset`` to ``offset + limit`` (``limit`` None: all of them): costs
    O(nodes + offset + limit), not O(actors). → ActorPage"""

    reply = ActorPage

    limit: int | None = 100
    offset: int = 0


@message("ctl.ClusterSummary")
@dataclass(frozen=True)
class ClusterSummary:
    """The whole cluster in a few numbers (every node and live actor counted), with the
    first nodes (status records without actor records), the first live actors, and the
    actors that died for good most recently (newest first)."""

    nodes: int
    nodes_alive: int
    cpus: float
    cpus_used: float
    gpus: int
    gpus_free: int  # whole GPUs with nothing on them
    actors: int
    node_page: tuple[NodeView, ...]
    actor_page: tuple[ActorView, ...]
    died: tuple[ActorView, ...] = ()


@message("ctl.Summarize")
@dataclass(frozen=True)
class Summarize(Request[ClusterSummary]):
    """The cluster's totals and its first ``limit`` nodes and actors (None: all of them):
    O(nodes) arithmetic and O(limit) records at the head, whatever the actor count.
    → ClusterSummary"""

    reply = ClusterSummary

    limit: int | None = 100


@message("ctl.FreePortOn")
@dataclass(frozen=True)
class FreePortOn(Request[int]):
    """A TCP port free now on node ``node_id`` (the head asks its agent). → int"""

    reply = int

    node_id: str


@message("ctl.Shutdown")
@dataclass(frozen=True)
class Shutdown(Request[str]):
    """Stop the cluster (to the head) or the node (to an agent), after replying. → str"""

    reply = str


@message("ctl.NodeHeartbeat")
@dataclass(frozen=True)
class NodeHeartbeat(Request[bool]):
    """Agent → head, every ``node_timeout / 5``: the node is alive. A request, so that its
    reply is the agent's session heartbeat too (no transport pings while beats flow). → True"""

    reply = bool

    node_id: str


# -- node agents (head and actor processes → agent) ---------------------------------------


@message("ctl.Started")
@dataclass(frozen=True)
class Started:
    """An actor process serves at ``address``; ``methods`` as its class loaded there."""

    address: str
    pid: int
    methods: dict[str, MethodInfo] | None


@message("ctl.StartActor")
@dataclass(frozen=True)
class StartActor(Request[Started]):
    """Start an actor process (head → agent). → :class:`Started` once it serves"""

    reply = Started

    actor_id: str
    name: str
    spec: SpawnSpec
    env_res: dict[str, str]  # what its resources set: CUDA_VISIBLE_DEVICES


@message("ctl.StopActor")
@dataclass(frozen=True)
class StopActor(Request[bool]):
    """Stop an actor for good: SIGTERM, grace, SIGKILL (head → agent). → False if gone"""

    reply = bool

    actor_id: str
    reason: str


@message("ctl.FreePort")
@dataclass(frozen=True)
class FreePort(Request[int]):
    """A TCP port free now on the agent's address (head → agent). → int"""

    reply = int


@message("ctl.AgentStatus")
@dataclass(frozen=True)
class AgentStatus(Request[dict[str, Any]]):
    """The node's actors and their processes. → status dict"""

    reply = dict


@message("ctl.Boot")
@dataclass(frozen=True)
class Boot:
    """What an actor process runs: its class, init frames, limits and the driver's path."""

    cls: tuple[str, str, bytes | None]
    init: tuple[bytes, ...]
    max_concurrency: int | None
    sys_path: tuple[str, ...]
    hooks: bool = True  # SpawnSpec.hooks
    concurrency_groups: dict[str, int] = field(default_factory=dict)  # SpawnSpec's


@message("ctl.Bootstrap")
@dataclass(frozen=True)
class Bootstrap(Request[Boot]):
    """A starting actor process asks its agent what to run. → :class:`Boot`"""

    reply = Boot

    actor_id: str


@message("ctl.Ready")
@dataclass(frozen=True)
class Ready(Request[None]):
    """A started actor process serves (actor process → agent). → None"""

    reply = type(None)

    actor_id: str
    address: str
    pid: int
    methods: dict[str, MethodInfo]


@message("ctl.Failed")
@dataclass(frozen=True)
class Failed(Request[None]):
    """A starting actor's constructor or ``setup`` raised ``error``. → None"""

    reply = type(None)

    actor_id: str
    error: RaylessError
