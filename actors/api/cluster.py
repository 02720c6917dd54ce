"""The driver's view of a cluster: start an embedded one or join one; spawn, kill, look up.

``async with Cluster.local(nodes=2, gpus_per_node=4) as cluster`` starts a head, one zygote for
this host and ``nodes`` node agents as real processes on loopback with a fresh random token
(fake GPUs unless this machine has enough real ones). ``actors.connect(address, token)`` joins
a running cluster (e.g. one started by ``scripts/launch.py``). Both openers work awaited
(``cluster = await Cluster.local()``, then ``await cluster.aclose()``) or with ``async with``.
Actors spawned by a driver belong to it: they are killed when it closes the cluster or
disappears. A closed Cluster raises ClosedError.
"""

from __future__ import annotations

import asyncio
import os
import selectors
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from typing import Any, TypeVar

from rayless.actors.api import context
from rayless.actors.api.actor import ClassRef, public_methods
from rayless.actors.api.handle import ActorHandle
from rayless.actors.api.lifecycle import Opening
from rayless.actors.api.runtime import Runtime, close_runtimes, get_runtime, materialize
from rayless.transport import codec
from rayless.transport.errors import ClosedError, RaylessError, RemoteError
from rayless.transport.protocol import new_token

START_TIMEOUT = 120.0
A = TypeVar("A")


def _read_line(proc: subprocess.Popen[bytes], what: str, timeout: float) -> str:
    """The first line a starting process prints (its address), or RaylessError."""
    assert proc.stdout is not None  # internal invariant: stdout=PIPE
    with selectors.DefaultSelector() as sel:
        sel.register(proc.stdout, selectors.EVENT_READ)
        line = proc.stdout.readline() if sel.select(timeout) else b""
    text = line.decode().strip()
    if not text:
        raise RaylessError(f"{what} did not start (exit code {proc.poll()}); see its stderr")
    return text


def _real_gpu_count() -> int:
    try:
        from rayless.placement import discover_node

        info = discover_node()
        return 0 if info.fake_gpus else len(info.gpus)
    except Exception:
        return 0


@dataclass
class LocalProcesses:
    """The processes of an embedded cluster on this host (blocking; loop-independent)."""

    nodes: int = 1
    gpus_per_node: int = 0
    node_timeout: float = 5.0
    zygote: bool = True
    log_dir: str | None = None
    zygote_preload: str = "eager"
    token: str = field(default_factory=new_token)
    address: str = ""
    head: subprocess.Popen[bytes] | None = None
    zygote_proc: subprocess.Popen[bytes] | None = None
    agents: list[subprocess.Popen[bytes]] = field(default_factory=list)
    tmpdir: str = ""

    def _popen(self, *args: str, **extra: str) -> subprocess.Popen[bytes]:
        env = {**os.environ, context.ENV_TOKEN: self.token, "RAYLESS_DIE_WITH_PARENT": "1", **extra}
        return subprocess.Popen(
            [sys.executable, *args],
            stdout=subprocess.PIPE,
            stdin=subprocess.DEVNULL,
            env=env,
            start_new_session=True,
        )

    def start(self) -> None:
        """Start the head, the zygote and the agents; wait until every agent joined.

        Raises:
            ValueError: bad sizes.
            RaylessError: a process did not start.
        """
        if self.nodes < 1 or self.gpus_per_node < 0:
            raise ValueError("nodes must be >= 1 and gpus_per_node >= 0")
        self.tmpdir = tempfile.mkdtemp(prefix="rayless-local-")
        log_dir = self.log_dir or os.path.join(self.tmpdir, "logs")
        try:
            self.head = self._popen(
                "-m", "rayless.actors.control.head", "tcp://127.0.0.1:0", str(self.node_timeout)
            )
            zygote_path = "none"
            if self.zygote:
                zygote_path = os.path.join(self.tmpdir, "zygote.sock")
                self.zygote_proc = self._popen(
                    "-m",
                    "rayless.actors.control.zygote",
                    zygote_path,
                    RAYLESS_ZYGOTE_PRELOAD=self.zygote_preload,
                )
            self.address = _read_line(self.head, "the head", START_TIMEOUT)
            if self.zygote_proc is not None:
                _read_line(self.zygote_proc, "the zygote", START_TIMEOUT)
            real = _real_gpu_count() if self.gpus_per_node else 0
            use_real = self.gpus_per_node > 0 and real >= self.nodes * self.gpus_per_node
            for i in range(self.nodes):
                args = [
                    "-m",
                    "rayless.actors.control.agent",
                    self.address,
                    "--node-id",
                    f"node-{i}",
                    "--ip",
                    "127.0.0.1",
                    "--zygote",
                    zygote_path,
                    "--log-dir",
                    log_dir,
                    "--head-timeout",
                    str(self.node_timeout),
                ]
                extra: dict[str, str] = {}
                if use_real:
                    first = i * self.gpus_per_node
                    visible = range(first, first + self.gpus_per_node)
                    extra["CUDA_VISIBLE_DEVICES"] = ",".join(map(str, visible))
                else:
                    args += ["--fake-gpus", str(self.gpus_per_node)]
                self.agents.append(self._popen(*args, **extra))
            for i, agent in enumerate(self.agents):
                _read_line(agent, f"node agent {i}", START_TIMEOUT)
        except BaseException:
            self.stop()
            raise

    @property
    def pids(self) -> list[int]:
        """Pids of the head, the zygote and the agents."""
        procs = [self.head, self.zygote_proc, *self.agents]
        return [p.pid for p in procs if p is not None]

    def stop(self, grace: float = 10.0) -> None:
        """Shut the cluster down: SIGTERM to the head (it stops the agents, which stop their
        actors), wait, then SIGTERM → grace → SIGKILL what is left; the zygote goes last, so
        agents never see it vanish under them. Idempotent.
        """
        others = [p for p in [self.head, *self.agents] if p is not None]
        zygote = [self.zygote_proc] if self.zygote_proc is not None else []
        if self.head is not None and self.head.poll() is None:
            self.head.send_signal(signal.SIGTERM)  # a no-op race if a shutdown is under way
        deadline = time.monotonic() + grace / 2
        for proc in others:
            try:
                proc.wait(max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                pass
        for group in (others, zygote):
            for proc in group:
                if proc.poll() is None:
                    proc.send_signal(signal.SIGTERM)
            for proc in group:
                try:
                    proc.wait(grace)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait()
                if proc.stdout is not None:
                    proc.stdout.close()
        self.head, self.zygote_proc, self.agents = None, None, []
        if self.tmpdir:
            shutil.rmtree(self.tmpdir, ignore_errors=True)
            self.tmpdir = ""


class Cluster:
    """A driver's handle on a cluster. Use ``Cluster.local(...)`` or ``actors.connect(...)``."""

    def __init__(
        self,
        info: context.ClusterInfo,
        local: LocalProcesses | None = None,
        *,
        owns_session: bool = True,
    ) -> None:
        self.info = info
        self._local = local
        self._owns_session = owns_session
        self._closed = False

    @property
    def address(self) -> str:
        """The head's address."""
        return self.info.address

    @property
    def token(self) -> str:
        """The cluster token (a secret: hand it to trusted processes only)."""
        return self.info.token

    @classmethod
    def local(
        cls,
        nodes: int = 1,
        gpus_per_node: int = 0,
        *,
        node_timeout: float = 5.0,
        zygote: bool = True,
        log_dir: str | None = None,
        zygote_preload: str = "eager",
    ) -> Opening[Cluster]:
        """An embedded cluster of real processes on loopback: ``async with`` it, or await it
        and ``aclose()`` the Cluster when done.

        ``zygote_preload="lazy"`` keeps the idle cluster small: the fork template imports
        torch on the first spawn instead of at start (see ``actors.zygote``).

        Raises:
            ValueError: a bad ``zygote_preload``.
        """
        if zygote_preload not in ("eager", "lazy"):
            raise ValueError(f"zygote_preload must be 'eager' or 'lazy', got {zygote_preload!r}")
        procs = LocalProcesses(nodes, gpus_per_node, node_timeout, zygote, log_dir, zygote_preload)
        return Opening(lambda: _start_local(procs))

    @classmethod
    def local_sync(cls, *args: Any, **kwargs: Any) -> Any:
        """The synchronous facade over :meth:`local` (see ``actors.sync``)."""
        from rayless.actors.api.sync import SyncCluster

        return SyncCluster.local(*args, **kwargs)

    async def _runtime(self) -> Runtime:
        if self._closed:
            raise ClosedError("this cluster handle is closed")
        return await get_runtime()

    async def spawn(
        self,
        cls: type[A],
        *args: Any,
        name: str | None = None,
        node: str | None = None,
        gpus: float = 0,
        cpus: float = 1,
        max_restarts: int = 0,
        max_concurrency: int | None = None,
        env: dict[str, str] | None = None,
        gpu_indices: tuple[int, ...] | None = None,
        timeout: float = 120.0,
        **kwargs: Any,
    ) -> ActorHandle[A]:
        """Start an actor of ``cls(*args, **kwargs)`` in its own process; return its handle.

        Raises:
            ClosedError: this cluster handle is closed.
            TypeError: ``cls`` is not an importable class, or an argument cannot be encoded.
            ValueError: malformed resource amounts.
            PlacementError: no node can hold the request (at once, never a hang).
            RemoteError: the constructor or ``setup`` raised.
        """
        ref = ClassRef.of(cls)
        if max_restarts < 0 or (max_concurrency is not None and max_concurrency < 1):
            raise ValueError("max_restarts must be >= 0 and max_concurrency >= 1")
        init = codec.encode((args, kwargs), root="init")
        spec = {
            "cls": ref.to_wire(),
            "cls_name": cls.__qualname__,
            "init": [bytes(f) for f in init],
            "name": name,
            "node": node,
            "gpus": gpus,
            "cpus": cpus,
            "gpu_indices": list(gpu_indices) if gpu_indices is not None else None,
            "max_restarts": max_restarts,
            "max_concurrency": max_concurrency,
            "env": dict(env or {}),
            "owner": self.info.session,
            "methods": public_methods(cls),
            "cwd": os.getcwd(),
            "sys_path": [p for p in sys.path if p],
            "timeout": timeout,
        }
        runtime = await self._runtime()
        try:
            record = await runtime.head_request(("spawn", spec), timeout=timeout + 10)
        except RemoteError as exc:  # the constructor or setup raised
            raise materialize(exc) from None
        return ActorHandle.from_record(record)  # its methods, as the actor process reported

    async def spawn_group(self, cls: type, n: int, *args: Any, **kwargs: Any) -> list[ActorHandle]:
        """Spawn ``n`` actors of ``cls`` as one group (see ``actors.group.spawn_group``).

        With ``torch_distributed=True`` each member gets MASTER_ADDR, MASTER_PORT, RANK,
        WORLD_SIZE, LOCAL_RANK and LOCAL_WORLD_SIZE so it can ``init_process_group``.
        """
        from rayless.actors.api.group import spawn_group

        return await spawn_group(self, cls, n, *args, **kwargs)

    async def spawn_component(
        self, cls: type, plan: Any, component: str, *args: Any, **kwargs: Any
    ) -> list[ActorHandle]:
        """Spawn a planned component's workers on exactly their slots, in worker-id order.

        ``plan`` is a ``placement.ResourcePoolPlanner`` (or its packed slots); see
        ``actors.components``.
        """
        from rayless.actors.api.components import spawn_component

        return await spawn_component(self, cls, plan, component, *args, **kwargs)

    async def kill(self, handle: ActorHandle[Any]) -> bool:
        """Kill the actor for good (no restart); False if it was already dead."""
        runtime = await self._runtime()
        return bool(await runtime.head_request(("kill", handle.actor_id)))

    async def get_actor(self, name: str) -> ActorHandle[Any]:
        """The live actor called ``name``.

        Raises:
            RaylessError: no live actor has that name.
        """
        runtime = await self._runtime()
        return ActorHandle.from_record(await runtime.head_request(("get_actor", name)))

    async def nodes(self) -> list[dict[str, Any]]:
        """Every node: its resources (GPUs free/used), actors, restarts."""
        runtime = await self._runtime()
        result: list[dict[str, Any]] = await runtime.head_request(("nodes",))
        return result

    async def shutdown(self) -> None:
        """Stop the whole cluster (head, agents, actors)."""
        runtime = await self._runtime()
        try:
            await runtime.head_request(("shutdown",), timeout=30)
        except RaylessError:
            pass

    @property
    def closed(self) -> bool:
        """Whether :meth:`aclose` ran (every later verb raises ClosedError)."""
        return self._closed

    async def aclose(self) -> None:
        """End this driver's session (its actors are killed); stop a local cluster.
        Idempotent."""
        if self._closed:
            return
        try:
            if self._local is not None:
                await self.shutdown()
            elif self._owns_session:
                runtime = await get_runtime()
                await runtime.head_request(("end_session", self.info.session), timeout=30)
        except RaylessError:
            pass
        finally:
            self._closed = True
            if self._owns_session:
                await close_runtimes()
            if self._local is not None:
                await asyncio.to_thread(self._local.stop)
            if context._current is self.info:
                context.set_current(None)

    async def __aenter__(self) -> Cluster:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()


async def _start_local(procs: LocalProcesses) -> Cluster:
    """Start the processes of an embedded cluster and return a Cluster that owns them."""
    await asyncio.to_thread(procs.start)
    info = context.ClusterInfo(procs.address, procs.token)
    context.set_current(info)
    cluster = Cluster(info, procs)
    try:
        await get_runtime()
    except BaseException:
        await cluster.aclose()
        raise
    return cluster


def connect(address: str | None = None, *, token: str | None = None) -> Opening[Cluster]:
    """Join a running cluster (defaults from RAYLESS_ADDRESS / RAYLESS_TOKEN[_FILE]):
    ``cluster = await actors.connect(...)`` or ``async with actors.connect(...) as cluster``.

    Without arguments inside an actor, or in a process that already joined, it gives a
    Cluster on this process's own session (closing it then kills nothing).

    Raises:
        RaylessError: no address/token given or in the environment.
        AuthError: the token is wrong.
    """
    return Opening(lambda: _connect(address, token))


async def _connect(address: str | None, token: str | None) -> Cluster:
    if address is None and token is None:
        try:  # inside an actor (or after an earlier connect): join as this process's session
            return Cluster(context.current(), owns_session=False)
        except RaylessError:
            pass
    env = context.from_env()
    address = address or (env.address if env else None)
    token = token or (env.token if env else None)
    if not address or not token:
        raise RaylessError(
            f"connect() needs an address and a token (or {context.ENV_ADDRESS} and "
            f"{context.ENV_TOKEN} in the environment)"
        )
    info = context.ClusterInfo(address, token)
    context.set_current(info)
    await get_runtime()
    return Cluster(info)
