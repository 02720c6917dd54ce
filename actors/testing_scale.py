"""Simulated nodes for scale tests: many production node agents per process, actors in-process.

A :class:`SimAgent` is the production :class:`~rayless.actors.control.agent.Agent` (its
registration, heartbeats, spawn/kill/status handlers, restarts and death reports, over its
real sockets) with one part replaced: process spawning. Its :class:`SimSpawner` builds each
actor inside the agent's process, from the spec the agent holds (a ``Bootstrap`` message
answered by the agent's own dispatch table, as a real actor process asks for it), serves the
actor's ``async def`` methods on a real :class:`~rayless.transport.server.Server` of its own,
and reports it through the same table (``Ready``, or ``Failed``). So the head, placement,
routing, supervision and status paths a benchmark exercises are the production ones; only
the processes are missing. Fake pids lie above
Linux's ``pid_max``: a signal sent to one can never reach a real process.

Run ``python -m rayless.actors.testing_scale HEAD --nodes N`` (the token as for an agent:
RAYLESS_TOKEN_FD, RAYLESS_TOKEN or RAYLESS_TOKEN_FILE). It prints ``ready N`` once every
node joined, then reads commands on stdin, one a line, and answers each on stdout:
``freeze NODE_ID`` (the node goes silent as a machine that lost power: no heartbeats, no
replies from its actors, its sockets left open; answers ``frozen NODE_ID``), ``rss``
(answers ``rss BYTES``); EOF or ``exit`` stops every node and exits.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import itertools
import logging
import os
import shutil
import signal
import subprocess
import sys
import tempfile
from collections.abc import Callable
from typing import Any, TypeVar, cast

import zmq

from rayless.actors.api.actor import ClassRef
from rayless.actors.api.binding import public_methods
from rayless.actors.control import agent as agent_module
from rayless.actors.control.agent import ActorProc, Agent
from rayless.actors.control.logs import LogTailer
from rayless.actors.control.process_util import die_with_parent
from rayless.actors.core import context
from rayless.actors.errors import StartError
from rayless.actors.host.process import remote_error
from rayless.actors.launch.procs import START_TIMEOUT, first_line, terminate
from rayless.actors.protocol import wire
from rayless.actors.protocol.messages import Bootstrap, Failed, MethodInfo, ProcState, Ready
from rayless.placement import NodeInfo, discover_node
from rayless.transport import codec
from rayless.transport.errors import ProtocolError
from rayless.transport.peer import Peer
from rayless.transport.protocol import new_token
from rayless.transport.server import Request, Server

log = logging.getLogger("rayless.testing_scale")

FAKE_PID_BASE = 1 << 23  # above the largest pid_max Linux allows (2**22)
MAX_SOCKETS = 65536  # ZeroMQ's default (1023) is far below one socket per simulated actor
_NO_PEER = cast(Peer, None)  # the agent's handlers take the requesting peer; in-process: none
R = TypeVar("R")


def tell(agent: Agent, msg: wire.Request[R]) -> R:
    """``msg`` answered by ``agent``'s own dispatch table, as if an actor process sent it
    (in-process: no socket); the reply checked as ``ask`` checks it.

    Raises:
        ProtocolError: the agent answers no such message, or answered the wrong kind.
        RaylessError: what the handler raised (``ActorNotFoundError``...).
    """
    return wire.check_reply(msg, agent.requests.handle(_NO_PEER, msg))


class Pinger:
    """The actor class the scale benchmark spawns: answers pings, or holds a call."""

    def __init__(self, tag: str = "") -> None:
        self.tag = tag

    async def ping(self, value: Any = None) -> Any:
        """Echo ``value``."""
        return value

    async def hold(self, seconds: float) -> float:
        """Answer after ``seconds`` (a call that is pending when its node goes away)."""
        await asyncio.sleep(seconds)
        return seconds


class SimActor:
    """One simulated actor: its instance, built in the agent's process, behind its own Server."""

    def __init__(self, spawner: SimSpawner, actor_id: str, pid: int) -> None:
        self.spawner = spawner
        self.actor_id = actor_id
        self.pid = pid
        self.server: Server | None = None
        self.instance: Any = None
        self.methods: dict[str, MethodInfo] = {}
        self.frozen: asyncio.Future[None] | None = None

    async def start(self, agent: Agent) -> None:
        """Build the instance from the agent's spec, serve, and tell the agent (as a process
        does through ``Bootstrap`` and ``Ready``); a failure is told as ``Failed`` and exits."""
        try:
            boot = tell(agent, Bootstrap(self.actor_id))
            cls = ClassRef.from_wire(boot.cls).load()
            args, kwargs = codec.decode(boot.init)
            self.methods = public_methods(cls)
            self.instance = cls(*args, **kwargs)
            self.server = Server(
                f"tcp://{agent.node.ip}:0",
                token=agent.token,
                handler=self.dispatch,
                name=f"sim-{self.actor_id}",
                cancellable=True,
            )
            await self.server.start()
        except Exception as exc:
            proc = agent.procs.get(self.actor_id)
            name = proc.name if proc is not None else self.actor_id
            tell(agent, Failed(self.actor_id, remote_error(exc, name)))
            self.spawner.exited(self.pid, 1)
            return
        tell(agent, Ready(self.actor_id, self.server.address, self.pid, self.methods))

    def dispatch(self, req: Request) -> Any:
        """One call, ``("c", method, args, kwargs)`` as callers send it; frozen: never answered.

        Raises:
            ProtocolError: not a call.
            AttributeError: no such public method (the caller gets it as a RemoteError).
        """
        if self.frozen is not None:
            return self.frozen
        body = req.body
        if type(body) is not tuple or len(body) != 4 or body[0] != "c":
            raise ProtocolError(f"malformed call {body!r:.100}")
        _, method, args, kwargs = body
        if not isinstance(method, str) or method not in self.methods:
            raise AttributeError(f"actor {self.actor_id} has no public method {method!r}")
        return getattr(self.instance, method)(*args, **kwargs)

    def freeze(self) -> None:
        """Stop answering (calls stay pending), sockets left open."""
        if self.frozen is None:
            self.frozen = asyncio.get_running_loop().create_future()

    async def aclose(self) -> None:
        """Close its server (its pending calls are cancelled)."""
        if self.server is not None:
            await self.server.aclose()


class SimSpawner:
    """The :class:`~rayless.actors.control.spawner.Spawner` of a :class:`SimAgent`: actors
    in-process, fake pids, exits reported through ``on_exit`` as a reaper would."""

    def __init__(self) -> None:
        self.agent: Agent | None = None
        self.actors: dict[int, SimActor] = {}
        self._pids = itertools.count(FAKE_PID_BASE)
        self._on_exit: Callable[[int, int], None] | None = None
        self._tasks: set[asyncio.Task[Any]] = set()

    async def start(self, on_exit: Callable[[int, int], None]) -> None:
        """Remember where exits go."""
        self._on_exit = on_exit

    async def spawn(self, env: dict[str, str], log_path: str, cwd: str | None) -> int:
        """Start an actor (after the agent recorded its pid, as a forked one would)."""
        if self.agent is None:  # internal invariant: set by SimAgent
            raise RuntimeError("SimSpawner has no agent")
        pid = next(self._pids)
        actor = SimActor(self, env[context.ENV_ACTOR_ID], pid)
        self.actors[pid] = actor
        task = asyncio.get_running_loop().create_task(self._start(actor, self.agent))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return pid

    async def _start(self, actor: SimActor, agent: Agent) -> None:
        await asyncio.sleep(0)  # the agent records the pid before the actor reports in
        await actor.start(agent)

    async def preload(self, module: str) -> None:
        """Nothing to preload: no forks."""

    def stopping(self) -> None:
        """Nothing to prepare: no template to lose."""

    async def terminate(self, pid: int, code: int) -> None:
        """Stop an actor as a signal would; its exit is reported with ``code``."""
        actor = self.actors.pop(pid, None)
        if actor is None:
            return
        await actor.aclose()
        self.exited(pid, code)

    def exited(self, pid: int, code: int) -> None:
        """Report an exit to the agent (once per pid)."""
        self.actors.pop(pid, None)
        if self._on_exit is not None:
            self._on_exit(pid, code)

    def freeze(self) -> None:
        """Every actor stops answering."""
        for actor in self.actors.values():
            actor.freeze()

    async def aclose(self) -> None:
        """Stop every actor (SIGKILL's exit code)."""
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(
            *(self.terminate(pid, -signal.SIGKILL) for pid in list(self.actors)),
            return_exceptions=True,
        )


class SimAgent(Agent):
    """The production node agent whose actors are :class:`SimActor` s in this process."""

    def __init__(
        self,
        head_address: str,
        token: str,
        node: NodeInfo,
        *,
        log_dir: str,
        head_timeout: float = 5.0,
    ) -> None:
        self.sim = SimSpawner()
        super().__init__(
            head_address,
            token,
            node,
            spawner=self.sim,
            log_dir=log_dir,
            kill_grace=1.0,
            head_timeout=head_timeout,
        )
        self.sim.agent = self
        # simulated actors write no log files: nothing to poll
        self.tailer = LogTailer(self._send_logs, interval=3600.0)

    async def _terminate(self, proc: ActorProc, reason: str, grace: float | None = None) -> None:
        """As the agent's SIGTERM → exit, on a simulated actor."""
        proc.state = ProcState.STOPPING
        proc.stop_reason = reason
        proc.max_restarts = proc.restarts
        if proc.pid is not None:
            await self.sim.terminate(proc.pid, -signal.SIGTERM)

    def freeze(self) -> None:
        """Go silent as a machine that lost power: no more node heartbeats (nor transport
        pings to the head), no replies from its actors; sockets are left open."""
        for task in list(self._tasks):
            task.cancel()
        self.head.set_heartbeat(1e9, 2e9)
        self.sim.freeze()


def sim_node(template: NodeInfo, node_id: str) -> NodeInfo:
    """A node record like ``template`` (this host, with its fake GPUs) under its own id."""
    return dataclasses.replace(template, node_id=node_id, cpus=max(template.cpus, 8))


async def start_agents(
    head: str,
    token: str,
    node_ids: list[str],
    *,
    gpus: int,
    head_timeout: float,
    log_dir: str,
    ip: str = "127.0.0.1",
    parallel: int = 24,
) -> list[SimAgent]:
    """Start and register one :class:`SimAgent` per id (``parallel`` joins at a time: the
    head keeps at most ``Limits.max_pending_handshakes // 4`` (256) unauthenticated
    connections of one uid, and every simulation process runs as the same uid).

    Raises:
        RaylessError: an agent could not register (the ones started are closed).
    """
    zmq.Context.instance().set(zmq.MAX_SOCKETS, MAX_SOCKETS)
    template = discover_node(fake_gpus=gpus, node_id="template", ip=ip)
    agents: list[SimAgent] = []
    gate = asyncio.Semaphore(parallel)

    async def one(node_id: str) -> None:
        agent = SimAgent(
            head, token, sim_node(template, node_id), log_dir=log_dir, head_timeout=head_timeout
        )
        async with gate:
            await agent.__aenter__()
        agents.append(agent)

    try:
        await asyncio.gather(*(one(n) for n in node_ids))
    except BaseException:
        await close_agents(agents)
        raise
    return agents


async def close_agents(agents: list[SimAgent]) -> None:
    """Stop every agent (and its actors)."""
    await asyncio.gather(*(a.aclose() for a in agents), return_exceptions=True)


class SimCluster:
    """A real head process and simulated nodes in ``processes`` processes (blocking API).

    ``start_head()`` then ``start_nodes()`` (separate, so a benchmark can read the head's
    memory in between); ``freeze(node_id)`` makes one node go silent; ``stop()`` stops
    everything (idempotent). ``profile``: a path where the head writes its cProfile stats;
    ``env``: variables for every process (``RAYLESS_UNIX=0``: ZeroMQ over TCP, as between
    hosts, instead of the same-host UNIX path).
    """

    def __init__(
        self,
        nodes: int,
        *,
        gpus: int = 8,
        node_timeout: float = 5.0,
        per_process: int = 250,
        profile: str | None = None,
        prefix: str = "sim",
        env: dict[str, str] | None = None,
    ) -> None:
        if nodes < 1 or gpus < 0 or per_process < 1:
            raise ValueError("nodes and per_process must be >= 1, gpus >= 0")
        self.nodes, self.gpus, self.node_timeout = nodes, gpus, node_timeout
        self.per_process, self.profile, self.prefix = per_process, profile, prefix
        self.env = dict(env or {})  # added to every process's environment
        self.tmpdir = ""  # the agents' log directory (they write nothing there), ours to remove
        self.token = new_token()
        self.address = ""
        self.head: subprocess.Popen[bytes] | None = None
        self.sims: list[tuple[range, subprocess.Popen[bytes]]] = []

    def _popen(self, args: list[str], stdin: bool) -> subprocess.Popen[bytes]:
        fd = context.token_pipe(self.token)
        env = {**context.without_token(os.environ), "RAYLESS_DIE_WITH_PARENT": "1", **self.env}
        env[context.ENV_TOKEN_FD] = str(fd)
        try:
            return subprocess.Popen(
                [sys.executable, *args],
                stdin=subprocess.PIPE if stdin else subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                env=env,
                pass_fds=(fd,),
                start_new_session=True,
            )
        finally:
            os.close(fd)

    def start_head(self, timeout: float = START_TIMEOUT) -> None:
        """Start the head (the production module) and learn its address.

        Raises:
            StartError: it did not start.
        """
        prof = ["-m", "cProfile", "-o", self.profile] if self.profile else []
        args = [*prof, "-m", "rayless.actors.control.head", "tcp://127.0.0.1:0"]
        self.head = self._popen([*args, str(self.node_timeout)], stdin=False)
        self.address = first_line(self.head, "the head", timeout=timeout)

    def start_nodes(self, timeout: float = START_TIMEOUT) -> None:
        """Start every simulated node; returns once all joined the head.

        Raises:
            StartError: a simulation process did not report its nodes ready.
        """
        self.tmpdir = self.tmpdir or tempfile.mkdtemp(prefix="rayless-sim-")
        for first in range(0, self.nodes, self.per_process):
            ids = range(first, min(self.nodes, first + self.per_process))
            args = ["-m", "rayless.actors.testing_scale", self.address, "--nodes", str(len(ids))]
            args += ["--start", str(first), "--prefix", self.prefix, "--gpus", str(self.gpus)]
            args += ["--head-timeout", str(self.node_timeout), "--log-dir", self.tmpdir]
            self.sims.append((ids, self._popen(args, stdin=True)))
        for ids, proc in self.sims:
            line = first_line(proc, f"simulated nodes {ids.start}-{ids.stop - 1}", timeout=timeout)
            if line != f"ready {len(ids)}":
                raise StartError(f"simulated nodes {ids.start}-{ids.stop - 1} said {line!r}")

    def node_id(self, index: int) -> str:
        """The id of simulated node ``index``."""
        return f"{self.prefix}-{index}"

    def _ask(self, proc: subprocess.Popen[bytes], line: str, timeout: float = 30.0) -> str:
        if proc.stdin is None:  # internal invariant: stdin=PIPE
            raise StartError("no stdin pipe")
        proc.stdin.write(line.encode() + b"\n")
        proc.stdin.flush()
        return first_line(proc, "a simulation process", timeout=timeout)

    def freeze(self, node_id: str) -> None:
        """Make one node go silent (as if its machine lost power).

        Raises:
            ValueError: not a node of this cluster.
            StartError: its process did not confirm.
        """
        index = int(node_id.rpartition("-")[2]) if node_id.startswith(self.prefix + "-") else -1
        for ids, proc in self.sims:
            if index in ids:
                answer = self._ask(proc, f"freeze {node_id}")
                if answer != f"frozen {node_id}":
                    raise StartError(f"freeze {node_id}: {answer!r}")
                return
        raise ValueError(f"{node_id!r} is not a simulated node of this cluster")

    def sim_rss(self) -> int:
        """Resident bytes of the simulation processes together."""
        return sum(int(self._ask(p, "rss").split()[1]) for _, p in self.sims)

    def stop(self, grace: float = 30.0) -> None:
        """Stop the head (it shuts the agents down), then the simulation processes."""
        if self.head is not None:
            if self.head.poll() is None:
                self.head.send_signal(signal.SIGTERM)
            terminate([self.head], grace)
            self.head = None
        for _, proc in self.sims:
            if proc.stdin is not None:
                with contextlib.suppress(OSError):
                    proc.stdin.close()
        terminate([p for _, p in self.sims], grace, natural=grace / 2)
        self.sims = []
        if self.tmpdir:
            shutil.rmtree(self.tmpdir, ignore_errors=True)
            self.tmpdir = ""

    def __enter__(self) -> SimCluster:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


async def _serve(args: argparse.Namespace, token: str) -> int:
    # a simulated node sweeps no shared memory: its actors create none
    agent_module.SHM_SWEEP_INTERVAL = float("inf")
    node_ids = [f"{args.prefix}-{i}" for i in range(args.start, args.start + args.nodes)]
    with contextlib.ExitStack() as stack:
        log_dir = args.log_dir or stack.enter_context(
            tempfile.TemporaryDirectory(prefix="rayless-sim-")
        )
        agents = await start_agents(
            args.head,
            token,
            node_ids,
            gpus=args.gpus,
            head_timeout=args.head_timeout,
            log_dir=log_dir,
        )
        by_id = {a.node.node_id: a for a in agents}
        loop = asyncio.get_running_loop()
        reader = asyncio.StreamReader()
        await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), sys.stdin)
        print(f"ready {len(agents)}", flush=True)
        try:
            while True:
                line = (await reader.readline()).decode().split()
                if not line or line[0] == "exit":
                    break
                if line[0] == "freeze" and len(line) == 2 and line[1] in by_id:
                    by_id[line[1]].freeze()
                    print(f"frozen {line[1]}", flush=True)
                elif line[0] == "rss":
                    import psutil

                    print(f"rss {psutil.Process().memory_info().rss}", flush=True)
                else:
                    print(f"error {' '.join(line)!r}", flush=True)
        finally:
            await close_agents(agents)
    return 0


def main(argv: list[str] | None = None) -> int:
    """Entry point of ``python -m rayless.actors.testing_scale``."""
    parser = argparse.ArgumentParser(prog="python -m rayless.actors.testing_scale")
    parser.add_argument("head")
    parser.add_argument("--nodes", type=int, required=True)
    parser.add_argument("--start", type=int, default=0, help="index of the first node id")
    parser.add_argument("--prefix", default="sim")
    parser.add_argument("--gpus", type=int, default=8)
    parser.add_argument("--head-timeout", type=float, default=5.0)
    parser.add_argument("--log-dir", default=None, help="default: a temporary directory")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s sim %(message)s")
    if os.environ.get("RAYLESS_DIE_WITH_PARENT"):
        die_with_parent()
    token = context.take_token()
    if not token:
        print("RAYLESS_TOKEN_FD, RAYLESS_TOKEN or RAYLESS_TOKEN_FILE must be set", file=sys.stderr)
        return 2
    from rayless.transport import loop

    return loop.run(_serve(args, token))


__all__ = [
    "Pinger",
    "SimActor",
    "SimAgent",
    "SimCluster",
    "SimSpawner",
    "close_agents",
    "start_agents",
]

if __name__ == "__main__":
    sys.exit(main())
