"""The node agent: one per node. Starts, supervises and reaps the actor processes of its node.

It registers its node (placement's discovery) with the head and heartbeats to it; starts each
actor through the host's zygote (a fork) or, without one, as a fresh interpreter; hands each
actor its spec; restarts actors that die while they have restarts left; reports deaths with
pid, exit code or signal; tails actors' log files and forwards new lines to the head. When
the head goes away it kills its actors and exits.

Run as ``python -m rayless.actors.control.agent HEAD_ADDRESS [options]`` with RAYLESS_TOKEN
set; prints its address once registered.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import functools
import logging
import os
import shlex
import signal
import sys
import time
from dataclasses import dataclass, field, replace
from typing import Any

from rayless.actors.control import reaper
from rayless.actors.control.death import OomWatch, log_tail
from rayless.actors.control.free_ports import PortPicker
from rayless.actors.control.logs import LogTailer
from rayless.actors.control.node_packages import NodePackages
from rayless.actors.control.process_util import die_with_parent, setup_logging
from rayless.actors.control.spawner import (
    ProcessSpawner,
    Spawner,
    Spawners,
    ZygoteSpawner,
    same_interpreter,
)
from rayless.actors.core import context, gc_policy
from rayless.actors.errors import ActorDiedError, ActorNotFoundError, StartError
from rayless.actors.protocol.messages import (
    ActorEvent,
    AgentStatus,
    Boot,
    Bootstrap,
    EventKind,
    Failed,
    FreePort,
    LogLines,
    NodeHeartbeat,
    ProcState,
    Ready,
    RegisterNode,
    Shutdown,
    SpawnSpec,
    StartActor,
    Started,
    StopActor,
    Template,
)
from rayless.actors.protocol.wire import Handlers, ask, check_reply, handles
from rayless.placement import NodeInfo, discover_node_async
from rayless.transport import loop
from rayless.transport.client import Client
from rayless.transport.codec import refuse_classes_by_value
from rayless.transport.errors import ProtocolError, RaylessError
from rayless.transport.server import Peer, Request, Server
from rayless.transport.shm import reap

log = logging.getLogger("rayless.agent")
# seconds between two sweeps of what dead processes left on this host (``reaper.sweep_host``)
SHM_SWEEP_INTERVAL = reaper.SWEEP_INTERVAL


@dataclass
class ActorProc:
    """One actor process as its agent supervises it."""

    actor_id: str
    name: str
    spec: SpawnSpec
    env: dict[str, str]
    log_path: str
    max_restarts: int
    restarts: int = 0
    pid: int | None = None
    state: ProcState = ProcState.STARTING  # → alive → (restarting →)* stopping/dead
    address: str = ""
    ready: asyncio.Future[Started] | None = None
    stop_reason: str = ""
    exited: asyncio.Event = field(default_factory=asyncio.Event)
    log_start: int = 0  # where the current process's part of the log file begins


class Agent:
    """A node agent. Use ``async with``; ``stopped`` is set when it should exit."""

    def __init__(
        self,
        head_address: str,
        token: str,
        node: NodeInfo,
        *,
        spawner: Spawner,
        light_spawner: Spawner | None = None,
        log_dir: str,
        kill_grace: float = 5.0,
        head_timeout: float = 5.0,
        rank: int | None = None,
    ) -> None:
        self.head_address = head_address
        self.rank = rank
        self.token = token
        self.node = node
        self.ports = PortPicker()  # torch.distributed groups' MASTER_PORTs
        self.spawner = spawner
        # Template.LIGHT actors: the host's light template (none given: the same spawner)
        self.spawners = Spawners(
            {
                Template.TORCH: spawner,
                Template.LIGHT: light_spawner if light_spawner is not None else spawner,
            },
            token,
        )
        self.log_dir = log_dir
        self.kill_grace = kill_grace
        self.head_timeout = head_timeout
        self.procs: dict[str, ActorProc] = {}
        self.by_pid: dict[int, ActorProc] = {}
        self.stopped = asyncio.Event()
        self.failed = False
        self.server = Server(
            f"tcp://{node.ip}:0",
            token=token,
            handler=self._handle,
            name=f"agent-{node.node_id}",
            peer_idle_timeout=30.0,
            allow_pickle=False,  # the control plane never unpickles, whatever the cluster's opt-in
        )
        self.head = Client(
            head_address,
            token=token,
            name=f"agent-{node.node_id}",
            # above the node heartbeat's period: its replies are what we hear of the head,
            # so the session sends no pings of its own while the beats flow
            heartbeat_interval=max(0.1, head_timeout * 2 / 5),
            heartbeat_timeout=head_timeout,
            connect_timeout=head_timeout * 4,
            allow_pickle=False,
        )
        self.tailer = LogTailer(self._send_logs)
        # spawns' working_dir and py_modules, fetched from the head's package store
        self.packages = NodePackages(lambda msg: ask(self.head, msg, timeout=120))
        self.oom = OomWatch()
        self._tasks: set[asyncio.Task[Any]] = set()
        self._closed = False
        self.requests: Handlers[Peer] = Handlers("agent", self)

    async def __aenter__(self) -> Agent:
        os.makedirs(self.log_dir, exist_ok=True)
        await self.server.start()
        await self.spawners.start(self._on_exit)
        await self.head.connect()
        info = self.node.to_dict()
        if self.rank is not None:  # the launch rank, so a rendezvous can name missing ranks
            info["rank"] = self.rank
        reply = await ask(self.head, RegisterNode(info, self.server.address), timeout=30)
        self.head_timeout = reply.node_timeout
        self._spawn_task(self._heartbeat())
        self._spawn_task(self.tailer.run())
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    def _spawn_task(self, coro: Any) -> None:
        task = asyncio.ensure_future(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def aclose(self) -> None:
        """Stop every actor (SIGTERM → grace → SIGKILL), then close. Idempotent."""
        if self._closed:
            return
        self._closed = True
        self.spawners.stopping()  # the templates may end before the actors: no failure
        await self._stop_all("node agent shutting down")
        for task in list(self._tasks):
            task.cancel()
        await self.tailer.flush()
        await self.spawners.aclose()
        self.packages.close()
        await self.head.aclose()
        await self.server.aclose()
        self.stopped.set()

    async def _stop_all(self, reason: str) -> None:
        procs = [
            p for p in self.procs.values() if p.pid is not None and p.state is not ProcState.DEAD
        ]
        pids = [p.pid for p in procs if p.pid is not None]
        await asyncio.gather(*(self._terminate(p, reason) for p in procs))
        # their shared memory now: an actor leaves through os._exit (no exit handlers), and
        # the _after_exit that would reap it is cancelled when the agent closes
        with contextlib.suppress(OSError):
            await asyncio.to_thread(lambda: [reap(pid) for pid in pids])

    async def _heartbeat(self) -> None:
        interval = max(0.05, self.head_timeout / 5)
        lost_since: float | None = None
        next_sweep = time.monotonic() + SHM_SWEEP_INTERVAL
        while True:
            await asyncio.sleep(interval)
            if time.monotonic() > next_sweep:  # what processes killed with SIGKILL left
                next_sweep = time.monotonic() + SHM_SWEEP_INTERVAL
                await asyncio.to_thread(reaper.sweep_host)
            if self.head.ready:
                lost_since = None
                try:  # a request: one message each way per beat, and the reply keeps our session
                    beat = NodeHeartbeat(self.node.node_id)
                    sent = self.head.submit(beat, timeout=self.head_timeout)
                    sent.add_done_callback(functools.partial(_beat_answered, beat))
                except RaylessError:
                    pass
                continue
            now = time.monotonic()
            lost_since = lost_since or now
            if now - lost_since > self.head_timeout:
                log.warning("head lost: stopping this node's actors and exiting")
                self.failed = True
                self._spawn_task(self.aclose())
                return
            left = self.head_timeout - (now - lost_since)
            try:  # the head may be back (a restart): try a fresh session, within the deadline
                await asyncio.wait_for(self.head.connect(), max(0.05, left))
            except (RaylessError, asyncio.TimeoutError):
                pass

    # -- requests ------------------------------------------------------------------------

    def _handle(self, req: Request) -> Any:
        """Answer a request by its message type (the handlers marked ``wire.handles``).

        Raises:
            ProtocolError: an unknown or malformed request.
        """
        return self.requests.handle(req.peer, req.body)

    @handles(StartActor)
    async def op_spawn(self, peer: Peer, msg: StartActor) -> Started:
        """Start an actor and answer once it serves (or failed to start)."""
        actor_id, name, spec = msg.actor_id, msg.name, msg.spec
        if spec.packages:
            spec = await self._with_packages(spec)
        res = dict(msg.env_res)
        gpus = res.pop("CUDA_VISIBLE_DEVICES", None)
        env = {**spec.env, **res}
        if gpus is not None:
            env.update(context.resource_env(gpus, spec.env, os.environ))
        cpus = spec.cpus
        env["RAYLESS_CPUS"] = f"{cpus:g}"
        env.setdefault("OMP_NUM_THREADS", str(max(1, int(cpus))))  # as Ray does
        env.update(
            {
                context.ENV_ADDRESS: self.head_address,
                context.ENV_ACTOR_ID: actor_id,
                context.ENV_ACTOR_NAME: name,
                context.ENV_NODE_ID: self.node.node_id,
                context.ENV_NODE_IP: self.node.ip,
                context.ENV_AGENT_ADDRESS: self.server.address,
                context.ENV_AGENT_PID: str(os.getpid()),
            }
        )
        safe = "".join(c if c.isalnum() or c in "-_." else "_" for c in name)[:80]
        proc = ActorProc(
            actor_id=actor_id,
            name=name,
            spec=spec,
            env=env,
            log_path=os.path.join(self.log_dir, f"{safe}-{actor_id}.log"),
            max_restarts=spec.max_restarts,
        )
        try:
            spawner = await self.spawners.get(spec.template, spec.executable)
        except StartError as exc:
            raise StartError(f"actor {name!r} on node {self.node.node_id}: {exc}") from None
        self.procs[actor_id] = proc
        for module in spec.imports:
            await spawner.preload(module)
        module = spec.cls[0]
        if module not in ("__main__", "__mp_main__"):
            await spawner.preload(module)
        return await self._start(proc)

    async def _with_packages(self, spec: SpawnSpec) -> SpawnSpec:
        """``spec`` run from its packages' extracts on this node: the working_dir's is its
        current directory, and every extract leads its import path."""
        refs = sorted(spec.packages, key=lambda ref: not ref.working_dir)  # working_dir first
        paths = [await self.packages.path(ref) for ref in refs]
        cwd = paths[0] if refs[0].working_dir else spec.cwd
        return replace(spec, cwd=cwd, sys_path=(*paths, *spec.sys_path))

    async def _start(self, proc: ActorProc) -> Started:
        proc.ready = asyncio.get_running_loop().create_future()
        proc.exited = asyncio.Event()
        with contextlib.suppress(OSError):
            proc.log_start = os.path.getsize(proc.log_path)
        spawner = await self.spawners.get(proc.spec.template, proc.spec.executable)
        pid = await spawner.spawn(proc.env, proc.log_path, proc.spec.cwd)
        proc.pid = pid
        self.by_pid[pid] = proc
        self.oom.started(pid)
        self.tailer.watch(proc.actor_id, proc.name, pid, self.node.node_id, proc.log_path)
        if proc.state is ProcState.STOPPING:  # killed while the spawner was forking it
            _signal(pid, signal.SIGKILL)
        return await proc.ready

    @handles(Bootstrap)
    def op_bootstrap(self, peer: Peer, msg: Bootstrap) -> Boot:
        """What a starting actor process needs: its class, init args and limits.

        Raises:
            ActorNotFoundError: this agent starts no such actor.
        """
        proc = self.procs.get(msg.actor_id)
        if proc is None:
            raise ActorNotFoundError(f"unknown actor {msg.actor_id!r}")
        spec = proc.spec
        return Boot(
            spec.cls,
            spec.init,
            spec.max_concurrency,
            spec.sys_path,
            spec.hooks,
            spec.concurrency_groups,
        )

    @handles(Ready)
    def op_ready(self, peer: Peer, msg: Ready) -> None:
        """A started actor serves at ``address``; ``methods``: its class's public methods."""
        proc = self.procs.get(msg.actor_id)
        if proc is None:
            return
        proc.address, proc.state = msg.address, ProcState.ALIVE
        started = Started(msg.address, msg.pid, msg.methods)
        if proc.ready is not None and not proc.ready.done():
            proc.ready.set_result(started)
        if proc.restarts > 0:
            self._event(
                ActorEvent(
                    EventKind.READY,
                    msg.actor_id,
                    pid=msg.pid,
                    restarts=proc.restarts,
                    address=msg.address,
                )
            )

    @handles(Failed)
    def op_failed(self, peer: Peer, msg: Failed) -> None:
        """A starting actor's constructor or ``setup`` raised ``error``."""
        proc = self.procs.get(msg.actor_id)
        if proc is not None and proc.ready is not None and not proc.ready.done():
            proc.stop_reason = f"failed to start: {msg.error}"
            proc.ready.set_exception(msg.error)

    @handles(StopActor)
    async def op_kill(self, peer: Peer, msg: StopActor) -> bool:
        """Stop an actor for good: SIGTERM, a grace period, SIGKILL; answers once it is gone.

        An actor still starting (its spawn timed out at the head) is killed too, at once with
        SIGKILL (it never served: there is nothing to finish gracefully, and the spawn's
        timeout bounds the whole spawn): its process must be gone before the head frees its
        resources.
        """
        proc = self.procs.get(msg.actor_id)
        if proc is None or proc.state is ProcState.DEAD:
            return False
        starting = proc.state is ProcState.STARTING
        await self._terminate(proc, msg.reason, grace=0.0 if starting else self.kill_grace)
        if proc.pid is None and proc.ready is not None:  # still forking: wait for the process
            await asyncio.wait([proc.ready], timeout=self.kill_grace + 5.0)
        if proc.pid is not None and not proc.exited.is_set():
            try:
                await asyncio.wait_for(proc.exited.wait(), self.kill_grace + 5.0)
            except asyncio.TimeoutError:
                log.error("actor %s (pid %s) outlived its kill", proc.name, proc.pid)
        return True

    @handles(AgentStatus)
    def op_status(self, peer: Peer, msg: AgentStatus) -> dict[str, Any]:
        """This node's actors and their processes."""
        return {
            "node": self.node.to_dict(),
            "actors": [
                {
                    "actor_id": p.actor_id,
                    "name": p.name,
                    "pid": p.pid,
                    "state": p.state.value,
                    "restarts": p.restarts,
                    "log": p.log_path,
                }
                for p in self.procs.values()
            ],
        }

    @handles(FreePort)
    def op_free_port(self, peer: Peer, msg: FreePort) -> int:
        """A TCP port free on this node right now, outside the ephemeral range and not handed
        out lately (a torch.distributed group's MASTER_PORT: ``actors.control.free_ports``)."""
        return self.ports.pick()

    @handles(Shutdown)
    def op_shutdown(self, peer: Peer, msg: Shutdown) -> str:
        """Stop every actor and exit (after replying)."""
        asyncio.get_running_loop().call_soon(lambda: self._spawn_task(self.aclose()))
        return "shutting down"

    # -- process lifecycle ---------------------------------------------------------------

    async def _terminate(self, proc: ActorProc, reason: str, grace: float | None = None) -> None:
        """SIGTERM, ``grace`` seconds (default ``kill_grace``; 0: none), SIGKILL."""
        proc.state = ProcState.STOPPING
        proc.stop_reason = reason
        proc.max_restarts = proc.restarts
        pid = proc.pid
        if pid is None:
            return
        grace = self.kill_grace if grace is None else grace
        try:
            if grace <= 0:
                raise asyncio.TimeoutError  # straight to SIGKILL
            os.kill(pid, signal.SIGTERM)
            await asyncio.wait_for(proc.exited.wait(), grace)
        except ProcessLookupError:
            return
        except asyncio.TimeoutError:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                return
            try:
                await asyncio.wait_for(proc.exited.wait(), 5.0)
            except asyncio.TimeoutError:
                log.error("actor %s (pid %d) did not die after SIGKILL", proc.name, pid)

    def _on_exit(self, pid: int, code: int) -> None:
        """The spawner reaped ``pid`` with exit ``code`` (negative: a signal)."""
        proc = self.by_pid.pop(pid, None)
        if proc is None:
            return
        proc.exited.set()
        self._spawn_task(self._after_exit(proc, pid, code))

    async def _after_exit(self, proc: ActorProc, pid: int, code: int) -> None:
        await self.tailer.final(proc.actor_id)
        with contextlib.suppress(OSError):  # its shared memory (a SIGKILL skipped its exit)
            await asyncio.to_thread(reap, pid)
        cause = await asyncio.to_thread(self.oom.cause, pid, code)
        tail = await asyncio.to_thread(log_tail, proc.log_path, proc.log_start)
        starting = proc.ready is not None and not proc.ready.done()
        reason = proc.stop_reason
        exe = proc.spec.executable
        if starting and not reason and exe and not same_interpreter(exe):
            reason = (
                f"its py_executable {shlex.join(exe)!r} exited while "
                "starting it (that Python must be able to import rayless)"
            )
        died = ActorDiedError(
            proc.name,
            pid=pid,
            exitcode=code,
            node=self.node.node_id,
            reason=reason,
            cause=cause.text,
            log_tail=tail,
            log=proc.log_path,
        )
        first_start = starting and proc.restarts == 0  # a failed spawn is not restarted
        can_restart = proc.restarts < proc.max_restarts and not self._closed
        if proc.state is not ProcState.STOPPING and can_restart and not first_start:
            proc.restarts += 1
            proc.state = ProcState.RESTARTING
            self._event(
                ActorEvent(
                    EventKind.RESTARTING,
                    proc.actor_id,
                    pid=pid,
                    exitcode=code,
                    restarts=proc.restarts,
                    reason=f"restarting ({proc.restarts}/{proc.max_restarts})",
                    cause=cause.text,
                    oom=cause.oom,
                    log_tail=tail,
                    log=proc.log_path,
                )
            )
            if starting and proc.ready is not None:
                proc.ready.cancel()  # the previous restart's wait ends here
            try:
                await self._start(proc)
            except BaseException as exc:  # it will exit and come back here
                log.warning("restart of %s failed: %s", proc.name, exc)
            return
        proc.state = ProcState.DEAD
        if starting and proc.ready is not None:
            proc.ready.set_exception(died)
        self._event(
            ActorEvent(
                EventKind.DIED,
                proc.actor_id,
                pid=pid,
                exitcode=code,
                reason=proc.stop_reason,
                restarts=proc.restarts,
                cause=cause.text,
                oom=cause.oom,
                log_tail=tail,
                log=proc.log_path,
            )
        )
        self.tailer.forget(proc.actor_id)
        self.procs.pop(proc.actor_id, None)

    def _event(self, ev: ActorEvent) -> None:
        if self.head.ready:
            try:
                self.head.send_oneway(ev)
            except RaylessError:
                pass

    def _send_logs(self, batch: LogLines) -> None:
        if self.head.ready:
            try:
                self.head.send_oneway(batch)
            except RaylessError:
                pass


async def serve(args: argparse.Namespace, token: str) -> int:
    """Run an agent until the head shuts the cluster down (0) or goes away (1)."""
    node = await discover_node_async(fake_gpus=args.fake_gpus, node_id=args.node_id, ip=args.ip)
    spawner: Spawner = (
        ZygoteSpawner(args.zygote, token=token) if args.zygote != "none" else ProcessSpawner(token)
    )
    light = args.light_zygote
    if light is None:  # the light template goes with the torch one: ours, or none
        light = "auto" if args.zygote == "auto" else "none"
    light_spawner: Spawner | None = None
    if light != "none":
        light_spawner = ZygoteSpawner(light, token=token, template=Template.LIGHT)
    agent = Agent(
        args.head,
        token,
        node,
        spawner=spawner,
        light_spawner=light_spawner,
        log_dir=args.log_dir,
        head_timeout=args.head_timeout,
        rank=args.rank,
    )
    async with agent:
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
            loop.add_signal_handler(sig, lambda: asyncio.ensure_future(agent.aclose()))
        print(agent.server.address, flush=True)
        await agent.stopped.wait()
    return 1 if agent.failed else 0


def _beat_answered(beat: NodeHeartbeat, fut: asyncio.Future[Any]) -> None:
    """Retrieve a heartbeat's outcome: a lost one is noticed by the session's silence; a
    reply of the wrong kind (a head of another version) is logged."""
    if fut.cancelled() or fut.exception() is not None:
        return
    try:
        check_reply(beat, fut.result())
    except ProtocolError as exc:
        log.warning("the head's answer to a heartbeat: %s", exc)


def _signal(pid: int, sig: int) -> None:
    try:
        os.kill(pid, sig)
    except ProcessLookupError:
        pass


def main(argv: list[str] | None = None) -> int:
    """Entry point of ``python -m rayless.actors.control.agent``."""
    parser = argparse.ArgumentParser(prog="python -m rayless.actors.control.agent")
    parser.add_argument("head")
    parser.add_argument("--node-id", default=None)
    parser.add_argument("--ip", default=None)
    parser.add_argument("--fake-gpus", type=int, default=None)
    parser.add_argument("--zygote", default="auto", help="socket path, 'auto' or 'none'")
    parser.add_argument(
        "--light-zygote",
        default=None,
        help="the light template's socket path, 'auto' or 'none' (Template.LIGHT actors then "
        "use --zygote's); default: 'auto' with --zygote auto, else 'none'",
    )
    parser.add_argument("--log-dir", default=os.path.join(os.getcwd(), "rayless-logs"))
    parser.add_argument("--head-timeout", type=float, default=5.0)
    parser.add_argument("--rank", type=int, default=None, help="launch rank (rendezvous)")
    args = parser.parse_args(argv)
    setup_logging(f"agent {args.node_id or ''}".strip())
    if os.environ.get("RAYLESS_DIE_WITH_PARENT"):
        die_with_parent()
    # Read once and removed: nothing this agent starts (zygote, actors' children) inherits it.
    token = context.take_token()
    if not token:
        print("RAYLESS_TOKEN_FD, RAYLESS_TOKEN or RAYLESS_TOKEN_FILE must be set", file=sys.stderr)
        return 2
    refuse_classes_by_value()  # it runs no user code: it unpickles nothing
    gc_policy.apply()
    gc_policy.freeze()
    return loop.run(serve(args, token))


if __name__ == "__main__":
    sys.exit(main())
