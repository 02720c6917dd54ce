"""The driver's view of a cluster: start an embedded one or join one; spawn, kill, look up.

``async with Cluster.local(nodes=2, gpus_per_node=4) as cluster`` starts a head, one zygote for
this host and ``nodes`` node agents as real processes on loopback with a fresh random token
(fake GPUs unless this machine has enough real ones) and publishes it in this user's
runtime directory (``actors.core.published``) until it closes. A driver closes on SIGTERM
and SIGHUP as on Ctrl-C, then exits with the signal's status (``actors.api.signals``).
``actors.connect(address, token)`` joins a running cluster (e.g. one started by
``scripts/launch.py``); without arguments it uses the environment ``rayless launch`` gives a
driver, else the one published local cluster. Both openers work awaited
(``cluster = await Cluster.local()``, then ``await cluster.aclose()``) or with ``async with``.
Actors spawned by a driver belong to it: they are killed when it closes the cluster or
disappears. A closed Cluster raises ClosedError.
"""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import Any, TypeVar

from rayless.actors.api import signals
from rayless.actors.api.actor import ClassRef, class_name
from rayless.actors.api.binding import check_groups, public_methods
from rayless.actors.api.calls import call_encode_error
from rayless.actors.api.components import spawn_component
from rayless.actors.api.group import spawn_group
from rayless.actors.api.handle import ActorHandle, check_method_names
from rayless.actors.api.interpreter import code_paths, parse_executable
from rayless.actors.api.lifecycle import Opening
from rayless.actors.api.packages import Package, upload
from rayless.actors.api.remote_errors import materialize
from rayless.actors.api.runtime import Runtime, close_runtimes, get_runtime
from rayless.actors.api.sync import DEFAULT_TIMEOUT, SyncCluster
from rayless.actors.core import context, published, timeline
from rayless.actors.core.preload import PRELOAD_MODES, preload_mode
from rayless.actors.errors import ConnectError
from rayless.actors.launch import templates
from rayless.actors.launch.local import LocalProcesses
from rayless.actors.protocol.messages import (
    ActorPage,
    ClusterSummary,
    EndSession,
    GetActor,
    Kill,
    ListActors,
    ListNodes,
    NodeView,
    PackageRef,
    Shutdown,
    Spawn,
    SpawnSpec,
    Summarize,
    Template,
)
from rayless.transport import codec
from rayless.transport.errors import ClosedError, RaylessError, RemoteError
from rayless.transport.protocol import pickle_allowed

A = TypeVar("A")
# what a spawn may take past its timeout: the head's own reply (it stops a process that did
# not start in time with SIGKILL, at once, and answers)
_HEAD_MARGIN = 5.0


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
        self._uploaded: set[str] = set()  # digests of the packages the head holds
        self._published: str | None = None  # this embedded cluster's entry in the runtime dir

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
        zygote_preload: str | None = None,
    ) -> Opening[Cluster]:
        """An embedded cluster of real processes on loopback: ``async with`` it, or await it
        and ``aclose()`` the Cluster when done.

        Entering it raises StartError when a process of the cluster does not start.

        It returns once the head and the agents are up; the fork template imports torch in
        the background meanwhile, and a spawn asked for before that finished waits for it
        (within its ``timeout``). ``zygote_preload="lazy"`` keeps the idle cluster small: the
        fork template imports torch on the first spawn instead; ``"demand"`` imports it only
        when an actor's module does (see ``rayless.actors.host.zygote``). None: the
        ``RAYLESS_ZYGOTE_PRELOAD`` environment variable's mode, ``"eager"`` when unset, or
        the process's shared templates where it shares them (``actors.launch.templates``: the
        pytest plugin does); a mode given here always gets templates of the cluster's own.

        Raises:
            ValueError: a bad ``zygote_preload`` (or ``RAYLESS_ZYGOTE_PRELOAD``).
        """
        pool = templates.pool() if zygote_preload is None else None  # shared ones are eager
        if zygote_preload is None:
            zygote_preload = preload_mode()
        elif zygote_preload not in PRELOAD_MODES:
            modes = ", ".join(map(repr, PRELOAD_MODES))
            raise ValueError(f"zygote_preload must be one of {modes}, got {zygote_preload!r}")
        signals.install()  # SIGTERM/SIGHUP close it as Ctrl-C does (in the main thread)
        procs = LocalProcesses(nodes, gpus_per_node, node_timeout, zygote, log_dir, zygote_preload)
        procs.template_pool = pool
        return Opening(lambda: _start_local(procs))

    @classmethod
    def local_sync(cls, *args: Any, **kwargs: Any) -> SyncCluster:
        """The synchronous facade over :meth:`local` (see ``actors.api.sync``)."""
        return SyncCluster.open(lambda: cls.local(*args, **kwargs), DEFAULT_TIMEOUT)

    @classmethod
    def connect_sync(cls, address: str | None = None, *, token: str | None = None) -> SyncCluster:
        """The synchronous facade over :func:`connect` (same arguments and errors)."""
        return SyncCluster.open(lambda: connect(address, token=token), 60)

    async def _runtime(self) -> Runtime:
        if self._closed:
            raise ClosedError("this cluster handle is closed")
        return await get_runtime()

    @timeline.traced("spawn", "spawn", lambda a, kw, r: _spawn_span(a, kw, r))
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
        concurrency_groups: Mapping[str, int] | None = None,
        env: dict[str, str] | None = None,
        gpu_indices: tuple[int, ...] | None = None,
        timeout: float = 120.0,
        wait_for_resources: float = 0.0,
        template: Template = Template.TORCH,
        hooks: bool = True,
        executable: str | Sequence[str] | None = None,
        detached: bool = False,
        packages: Sequence[Package | PackageRef] = (),
        check_names: bool = True,
        **kwargs: Any,
    ) -> ActorHandle[A]:
        """Start an actor of ``cls(*args, **kwargs)`` in its own process; return its handle.

        ``timeout`` bounds the start (process, constructor, ``setup``), after
        ``wait_for_resources`` if any: an actor not serving by then is killed at once.
        ``template`` picks the host's fork template (:class:`~rayless.actors.Template`):
        ``TORCH``, the default, has torch imported ahead; ``LIGHT`` forks at once without it.
        ``hooks=False`` makes the class's ``setup`` and ``teardown`` plain remote methods
        (rayless.ray's classes: Ray has no lifecycle hooks) instead of running them at spawn
        and at a clean stop. ``concurrency_groups`` (``{"io": 2, ...}``, Ray's): the calls of
        a method marked ``@concurrency_group("io")`` run at most 2 at once (a ``def`` method's
        in threads of the group's own), beside the other groups' and the default group's
        (``max_concurrency``), so a call waiting in one group never blocks another's.
        ``executable`` (Ray's ``py_executable``): the command that runs the actor's Python,
        an interpreter's path or a command such as ``"uv run --extra vllm"``; the actor then
        starts as a fresh process of it (unless it is the node's own interpreter), which
        must be able to import rayless (``actors.api.interpreter``). ``detached`` (Ray's
        ``lifetime="detached"``): the actor outlives this session (and, spawned by an actor,
        that actor); it ends when it is killed or the cluster shuts down. ``packages``
        (Ray's ``working_dir`` and ``py_modules``, packed by ``actors.api.packages``): files
        its node fetches and extracts before it starts (uploaded to the head once).
        ``check_names=False`` lets the class have methods named as the handle's own
        attributes (``name``, ``address``...), reached by ``actors.ext.method_of`` only
        (rayless.ray's classes: a Ray handle reaches every method by name).

        Raises:
            ClosedError: this cluster handle is closed.
            TypeError: ``cls`` is not an importable class, a method of it has a name of the
                handle's own (``address``, ``name``, ...), or an argument cannot be encoded
                (named as ``argument 0 ['a']``).
            ValueError: malformed resource amounts, an empty name or ``executable``,
                ``template`` is not a
                Template (nor one's value), or a malformed concurrency group or a method in
                one that ``concurrency_groups`` does not define.
            PlacementError: no node can hold the request (at once, never a hang).
            ResourcesBusyError: a PlacementError: the GPUs are taken now (at once), or still
                after ``wait_for_resources`` seconds (Ray's pending actors: the head waits for
                other actors to free them; infeasible requests still fail at once).
            RemoteError: the constructor or ``setup`` raised.
            Timeout: the actor did not start within ``timeout`` seconds (its process is gone).
            StartError: ``executable``'s command is not found on the node.
            PackageError: a package is too big, or the head's package store is full.
            ActorDiedError: the actor's process exited while starting (``executable``
                cannot import rayless, say: its log's tail says why).
        """
        argv = parse_executable(executable)
        ref = ClassRef.of(cls)
        methods = public_methods(cls, hooks)
        shown = class_name(cls)
        if check_names:
            check_method_names(shown, methods)
        groups = check_groups(shown, methods, concurrency_groups or {})
        if max_restarts < 0 or (max_concurrency is not None and max_concurrency < 1):
            raise ValueError("max_restarts must be >= 0 and max_concurrency >= 1")
        if name is not None and (not isinstance(name, str) or not name.strip()):
            raise ValueError(f"an actor's name must be a non-empty string, got {name!r}")
        try:
            template = Template(template)
        except ValueError:
            raise ValueError(f"template must be a Template, got {template!r}") from None
        if not wait_for_resources >= 0:
            raise ValueError(f"wait_for_resources must be >= 0 s, got {wait_for_resources!r}")
        try:
            init = codec.encode((args, kwargs), root="init", allow_pickle=pickle_allowed())
        except TypeError as exc:  # named in the caller's terms: argument 0 ['a']
            raise call_encode_error(exc, f"{shown}()", args_at="[0]") from None
        spec = SpawnSpec(
            cls=(ref.module, ref.qualname, ref.pickled),
            cls_name=shown,
            init=tuple(bytes(f) for f in init),
            owner=self.info.session,
            name=name,
            node=node,
            gpus=float(gpus),
            cpus=float(cpus),
            gpu_indices=tuple(int(i) for i in gpu_indices) if gpu_indices is not None else None,
            max_restarts=int(max_restarts),
            max_concurrency=None if max_concurrency is None else int(max_concurrency),
            concurrency_groups=groups,
            env={str(k): str(v) for k, v in (env or {}).items()},
            methods=methods,
            cwd=os.getcwd(),
            sys_path=code_paths(argv),
            timeout=float(timeout),
            wait_for_resources=float(wait_for_resources),
            template=template,
            imports=_template_imports(cls),
            hooks=bool(hooks),
            executable=argv,
            detached=bool(detached),
        )
        runtime = await self._runtime()
        if packages:
            spec = replace(spec, packages=await self._upload(runtime, packages))
        try:
            record = await runtime.head_request(
                Spawn(spec), timeout=timeout + wait_for_resources + _HEAD_MARGIN
            )
        except RemoteError as exc:  # the constructor or setup raised
            raise materialize(exc) from None
        return ActorHandle.from_record(record)  # its methods, as the actor process reported

    async def _upload(
        self, runtime: Runtime, packages: Sequence[Package | PackageRef]
    ) -> tuple[PackageRef, ...]:
        """The references of ``packages``, each on the head (sent once per cluster)."""
        refs = []
        for package in packages:
            if isinstance(package, Package):
                if package.ref.digest not in self._uploaded:
                    await upload(runtime.head_request, package)
                    self._uploaded.add(package.ref.digest)
                package = package.ref
            refs.append(package)
        return tuple(refs)

    async def spawn_group(self, cls: type, n: int, *args: Any, **kwargs: Any) -> list[ActorHandle]:
        """Spawn ``n`` actors of ``cls`` as one group (see ``actors.group.spawn_group``).

        With ``torch_distributed=True`` each member gets MASTER_ADDR, MASTER_PORT, RANK,
        WORLD_SIZE, LOCAL_RANK and LOCAL_WORLD_SIZE so it can ``init_process_group``.
        """
        return await spawn_group(self, cls, n, *args, **kwargs)

    async def spawn_component(
        self, cls: type, plan: Any, component: str, *args: Any, **kwargs: Any
    ) -> list[ActorHandle]:
        """Spawn a planned component's workers on exactly their slots, in worker-id order.

        ``plan`` is a ``placement.ResourcePoolPlanner`` (or its packed slots); see
        ``rayless.actors.api.components``.
        """
        return await spawn_component(self, cls, plan, component, *args, **kwargs)

    async def kill(self, handle: ActorHandle[Any]) -> bool:
        """Kill the actor for good (no restart); False if it was already dead."""
        runtime = await self._runtime()
        return await runtime.head_request(Kill(handle.actor_id))

    async def get_actor(self, name: str) -> ActorHandle[Any]:
        """The live actor called ``name``.

        Raises:
            ActorNotFoundError: no live actor has that name.
        """
        runtime = await self._runtime()
        return ActorHandle.from_record(await runtime.head_request(GetActor(name)))

    async def timeline(
        self, path: str | os.PathLike[str] = "timeline.json", *, since: float | None = None
    ) -> str:
        """Write the timeline of every live actor and of this process (``since``: only the
        last seconds) to ``path`` as Chrome trace-event JSON (open it in ui.perfetto.dev);
        returns the path. See ``rayless.actors.api.trace``.

        Raises:
            RaylessError: the head did not answer. OSError: ``path`` cannot be written.
        """
        from rayless.actors.api import trace

        await self._runtime()
        since_ns = 0 if since is None else time.time_ns() - int(since * 1e9)
        got = await trace.gather(
            self.info.address,
            self.info.token,
            since_ns=since_ns,
            local=True,
            session=self.info.session,
        )
        return await asyncio.to_thread(trace.write_trace, path, got)

    async def nodes(self, *, actors: bool = True) -> list[dict[str, Any]]:
        """Every node as plain values (:meth:`NodeView.as_dict`, Ray's ``ray.nodes()`` shape):
        its resources (GPUs free/used), ``num_actors`` and, unless ``actors`` is False, each
        live actor's record (``"actors"``: what makes this O(actors); with ``actors=False``
        it is O(nodes))."""
        return [view.as_dict() for view in await self.node_views(actors=actors)]

    async def node_views(self, *, actors: bool = False) -> list[NodeView]:
        """Every node as a typed :class:`NodeView` (``.node_id``, ``.alive``, ``.gpus``...);
        with ``actors`` also its live actors' records (O(actors)), else O(nodes)."""
        runtime = await self._runtime()
        views: list[NodeView] = await runtime.head_request(ListNodes(actors=actors))
        return views

    async def summary(self, limit: int | None = 100) -> ClusterSummary:
        """The whole cluster in one answer: node, CPU, GPU and live-actor totals, with the
        first ``limit`` nodes (``nodes(actors=False)``'s records) and live actors (None: all).
        Costs O(nodes + limit) at the head: what ``rayless status`` shows.

        Raises:
            ValueError: ``limit`` is not an int >= 0 or None.
        """
        _check_count("limit", limit, none_ok=True)
        runtime = await self._runtime()
        return await runtime.head_request(Summarize(limit=limit))

    async def list_actors(self, limit: int | None = 100, offset: int = 0) -> ActorPage:
        """A page of the live actors (as Ray's ``list_actors(limit=100)``): ``.actors``, their
        ``ActorView`` records node by node, from ``offset``, at most ``limit`` (None: all);
        ``.total``, how many there are. Costs O(nodes + offset + limit) at the head.

        Raises:
            ValueError: ``limit`` or ``offset`` is not an int >= 0 (``limit``: or None).
        """
        _check_count("limit", limit, none_ok=True)
        _check_count("offset", offset)
        runtime = await self._runtime()
        return await runtime.head_request(ListActors(limit=limit, offset=offset))

    async def shutdown(self) -> None:
        """Stop the whole cluster (head, agents, actors)."""
        runtime = await self._runtime()
        try:
            await runtime.head_request(Shutdown(), timeout=30)
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
                await runtime.head_request(EndSession(self.info.session), timeout=30)
        except RaylessError:
            pass
        finally:
            self._closed = True
            if self._published is not None:
                published.unpublish(self._published)
                self._published = None
            if self._owns_session:
                await close_runtimes()
            if self._local is not None:
                await asyncio.to_thread(self._local.stop)
            if self._owns_session and context._current is self.info:
                context.set_current(None)  # a joined cluster leaves the process's own alone

    @property
    def owns_session(self) -> bool:
        """Whether this handle's session is its own (a driver's): ``aclose`` then ends it and
        kills its actors; a handle joined inside an actor shares the actor's and leaves it."""
        return self._owns_session

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
        if procs.head is not None:
            cluster._published = published.publish(procs.address, procs.token, procs.head.pid)
    except BaseException:
        await cluster.aclose()
        raise
    return cluster


def connect(address: str | None = None, *, token: str | None = None) -> Opening[Cluster]:
    """Join a running cluster: ``cluster = await actors.connect(...)`` or
    ``async with actors.connect(...) as cluster``.

    ``address`` is ``host:port`` or ``tcp://host:port``; ``"auto"`` (or no arguments and no
    RAYLESS_ADDRESS) means the one local cluster ``Cluster.local()`` published on this host,
    token included. Without arguments the environment's RAYLESS_ADDRESS and
    RAYLESS_TOKEN[_FILE] (what ``rayless launch`` gives a driver) come first; an address
    without a token takes the one a local cluster published there, else RAYLESS_TOKEN[_FILE].
    The Cluster owns a session of its own: ``aclose()`` kills the actors it spawned at once, freeing
    their GPUs. Only inside an actor, or in a process that already called ``connect()`` or
    ``Cluster.local()``, does it give a Cluster on that existing session (closing it then
    kills nothing).

    Raises:
        ValueError: a malformed address (the message names the accepted forms).
        ConnectError: no address/token given, in the environment or published (or several
            local clusters are published and none was named).
        AuthError: the token is wrong.
    """
    if not os.environ.get(context.ENV_ACTOR_ID):  # a driver: SIGTERM/SIGHUP as Ctrl-C
        signals.install()
    return Opening(lambda: _connect(address, token))


def joined_address() -> str | None:
    """The address of the cluster this driver started (``Cluster.local``) or joined
    (``connect``) and has not closed; None when it has none, inside an actor, and for a
    cluster only named in the environment (``connect()`` joins that one first).

    A process belongs to one cluster at a time: code that would start another (``ray.init``)
    joins this one instead.
    """
    joined = context._current
    if joined is None or joined.actor_id is not None or joined.source == "env":
        return None
    return joined.address


async def _connect(address: str | None, token: str | None) -> Cluster:
    if address is None and token is None:
        joined = context._current
        if joined is not None and (joined.actor_id is not None or joined.source != "env"):
            return Cluster(joined, owns_session=False)  # inside an actor, or joined before
        if joined is None and os.environ.get(context.ENV_ACTOR_ID):
            return Cluster(context.current(), owns_session=False)
    if address == "auto":
        address = None
    elif address is not None:
        address = context.normalize_address(address)
    env = context.from_env() if address is None or token is None else None
    if address is None and token is None and env is None:
        entry = published.find_one()
        address, token = entry.address, entry.token()
    if address is not None and token is None and (env is None or env.address != address):
        entry_at = published.find_address(address)  # a local cluster's token is found for you
        token = entry_at.token() if entry_at is not None else None
    address = address or (env.address if env else None)
    token = token or (env.token if env else None)
    if address and not token:  # a cluster named by its address, its token in the environment
        token = context.env_token()
    if not address or not token:
        raise ConnectError(
            f"connect() needs an address and a token (or {context.ENV_ADDRESS} and "
            f"{context.ENV_TOKEN} in the environment)"
        )
    joined = context._current
    if joined is not None and joined.source == "env" and joined.address == address:
        info = joined  # a runtime this driver already started from the environment
        info.source = "explicit"
    else:
        info = context.ClusterInfo(address, token)
    context.set_current(info)
    await get_runtime()
    return Cluster(info)


def _spawn_span(args: tuple[Any, ...], kwargs: Mapping[str, Any], handle: Any) -> dict[str, Any]:
    """The arguments of a spawn's timeline span: the class, and the actor and its node."""
    cls = args[0] if args else None
    info: dict[str, Any] = {"class": class_name(cls) if isinstance(cls, type) else str(cls)}
    if handle is not None:
        info.update(actor=handle.name, node=handle.node_id)
    return info


def _template_imports(cls: type) -> tuple[str, ...]:
    """``cls.template_imports`` checked: a tuple of module names.

    Raises:
        TypeError: it is not a tuple or list of non-empty strings.
    """
    names = getattr(cls, "template_imports", ())
    if not isinstance(names, (tuple, list)) or not all(isinstance(n, str) and n for n in names):
        raise TypeError(f"{cls.__qualname__}.template_imports must be a tuple of module names")
    return tuple(names)


def _check_count(what: str, value: object, *, none_ok: bool = False) -> None:
    """Raise ValueError unless ``value`` is an int >= 0 (or None, with ``none_ok``)."""
    if value is None and none_ok:
        return
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        also = " or None" if none_ok else ""
        raise ValueError(f"{what} must be an int >= 0{also}, got {value!r}")
