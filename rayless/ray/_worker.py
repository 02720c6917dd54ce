"""The process-wide state of the Ray layer: the session ``ray.init`` opened, and where its
work runs.

A driver's session owns a sync facade (``Cluster.local_sync`` or ``Cluster.connect_sync``):
its loop thread runs every call of the layer. Inside an actor or task worker the session is
the actor's own cluster and loop, joined on first use (as Ray's workers are connected). Code
on the session's loop (an ``async def`` actor method) gets asyncio futures; code on any other
thread gets ``concurrent.futures`` ones.
"""

from __future__ import annotations

import asyncio
import atexit
import concurrent.futures
import concurrent.futures.thread  # its exit hook before ours: see _close_at_exit's registration
import difflib
import json
import os
import threading
import uuid
from collections.abc import Coroutine
from dataclasses import dataclass, field
from types import ModuleType
from typing import TYPE_CHECKING, Any, TypeVar

from rayless.actors import Cluster, connect
from rayless.actors.ext import (
    Package,
    PackageRef,
    pack_module,
    pack_working_dir,
    parse_executable,
)
from rayless.ray import _internals

if TYPE_CHECKING:
    from rayless.actors.ext import SyncCluster
    from rayless.ray.remote_function import TaskPools
    from rayless.ray.util.placement_group import PlacementGroup

T = TypeVar("T")

ENV_NAMESPACE = "RAYLESS_RAY_NAMESPACE"
ENV_JOB_ID = "RAYLESS_RAY_JOB_ID"
ENV_ANONYMOUS_NAMESPACE = "RAYLESS_RAY_ANONYMOUS_NAMESPACE"
ENV_ENV_VARS = "RAYLESS_RAY_ENV_VARS"  # the session's runtime_env env var names, for children
ENV_PY_EXECUTABLE = "RAYLESS_RAY_PY_EXECUTABLE"  # the worker's py_executable, for its children
ENV_JOB_RUNTIME_ENV = "RAYLESS_RAY_JOB_RUNTIME_ENV"  # `rayless job submit`'s, JSON, for drivers
ENV_PACKAGES = "RAYLESS_RAY_PACKAGES"  # the worker's working_dir and py_modules, for children
RUNTIME_ENV_KEYS = frozenset(
    {"env_vars", "py_executable", "working_dir", "py_modules", "excludes", "config"}
)


@dataclass
class Session:
    """One ``ray.init``: the cluster, the loop its work runs on, and the session's defaults."""

    loop: asyncio.AbstractEventLoop
    sync: SyncCluster | None
    namespace: str | None
    job_id: str
    env_vars: dict[str, str]
    py_executable: tuple[str, ...] = ()  # the runtime_env's, for every actor and task
    packages: tuple[Package | PackageRef, ...] = ()  # its working_dir and py_modules, too
    num_cpus: float | None = None
    num_gpus: float | None = None
    generation: int = 0
    _cluster: Cluster | None = None
    tasks: TaskPools | None = None
    groups: dict[str, PlacementGroup] = field(default_factory=dict)
    placements: dict[str, Any] = field(default_factory=dict)  # actor id → its Placement
    anonymous_namespace: str = field(default_factory=lambda: uuid.uuid4().hex)
    joined: str | None = None  # a driver's own cluster it joined (not started by ray.init)

    async def cluster(self) -> Cluster:
        """The cluster (inside an actor: joined on first use)."""
        if self._cluster is None:
            self._cluster = await connect()
        return self._cluster

    @property
    def effective_namespace(self) -> str:
        """The namespace named actors live in (Ray's anonymous one when none was given)."""
        return self.namespace if self.namespace is not None else self.anonymous_namespace


_session: Session | None = None
_generation = 0
_lock = threading.RLock()


def _forget_parent() -> None:
    """In a forked child (a DataLoader worker): the parent's session is not this process's
    (its loop thread is not here); closing it at exit would wait on that loop for good."""
    global _session, _lock
    _session = None
    _lock = threading.RLock()


os.register_at_fork(after_in_child=_forget_parent)


def in_actor() -> bool:
    """Whether this process is an actor (or task worker) of a rayless cluster."""
    return bool(os.environ.get(_internals.ENV_ACTOR_ID))


def current() -> Session | None:
    """The open session, if any."""
    return _session


def session() -> Session:
    """The open session; a default ``ray.init()`` first if there is none (as Ray does)."""
    s = _session
    if s is not None:
        return s
    with _lock:
        if _session is None:
            open_session()
        assert _session is not None
        return _session


@dataclass(frozen=True)
class RuntimeEnvSpec:
    """What rayless does with a ``runtime_env``: the variables it sets, the command that
    runs the worker's Python (``py_executable``; empty: the node's own interpreter), and the
    files it ships (``working_dir``, ``py_modules``: None when not given; ``excludes``)."""

    env_vars: tuple[tuple[str, str], ...] = ()
    py_executable: tuple[str, ...] = ()
    working_dir: str | None = None
    py_modules: tuple[str | ModuleType, ...] | None = None
    excludes: tuple[str, ...] = ()

    @property
    def ships(self) -> bool:
        """Whether it names files to ship."""
        return self.working_dir is not None or self.py_modules is not None

    def packages(self) -> tuple[Package, ...]:
        """Its files, packed (the working_dir first); blocking (it reads the files).

        Raises:
            ValueError: a path that is not there, a URI.
            PackageError: files too big to ship.
        """
        wd = (
            () if self.working_dir is None else (pack_working_dir(self.working_dir, self.excludes),)
        )
        mods = tuple(pack_module(m, self.excludes) for m in self.py_modules or ())
        return wd + mods

    @property
    def env(self) -> dict[str, str]:
        """The variables, as a dict."""
        return dict(self.env_vars)


def parse_runtime_env(runtime_env: dict[str, Any] | None) -> RuntimeEnvSpec:
    """What a ``runtime_env`` asks for (``config``, Ray's setup options, has no effect).

    Raises:
        ValueError: it has other keys (rayless ships no code or packages per job), or a
            malformed ``env_vars`` or ``py_executable``.
    """
    if not runtime_env:
        return RuntimeEnvSpec()
    if not isinstance(runtime_env, dict):
        raise ValueError(f"runtime_env must be a dict, got {type(runtime_env).__name__}")
    other = sorted(set(runtime_env) - RUNTIME_ENV_KEYS)
    if other:
        close = {k: difflib.get_close_matches(k, RUNTIME_ENV_KEYS, n=1) for k in other}
        hints = "".join(f"; {k!r}: did you mean {m[0]!r}?" for k, m in close.items() if m)
        raise ValueError(
            f"runtime_env keys {other} are not supported by rayless.ray: only 'env_vars', "
            "'py_executable', 'working_dir', 'py_modules' and 'excludes' (install packages on "
            f"every node instead; see docs/moving-from-ray.md){hints}"
        )
    env = runtime_env.get("env_vars") or {}
    if not isinstance(env, dict):
        raise ValueError("runtime_env['env_vars'] must be a dict of str to str")
    working_dir = runtime_env.get("working_dir")
    if working_dir is not None and not isinstance(working_dir, (str, os.PathLike)):
        raise ValueError(f"runtime_env['working_dir'] must be a path, got {working_dir!r}")
    modules = runtime_env.get("py_modules")
    if modules is not None and (
        not isinstance(modules, (list, tuple))
        or not all(isinstance(m, (str, os.PathLike, ModuleType)) for m in modules)
    ):
        raise ValueError("runtime_env['py_modules'] must be a list of paths or modules")
    excludes = runtime_env.get("excludes") or []
    if not isinstance(excludes, (list, tuple)) or not all(isinstance(e, str) for e in excludes):
        raise ValueError("runtime_env['excludes'] must be a list of strings")
    return RuntimeEnvSpec(
        tuple(sorted((str(k), str(v)) for k, v in env.items())),
        parse_executable(runtime_env.get("py_executable")),
        None if working_dir is None else os.fspath(working_dir),
        None
        if modules is None
        else tuple(m if isinstance(m, ModuleType) else os.fspath(m) for m in modules),
        tuple(excludes),
    )


def merge_job_runtime_env(job: dict[str, Any], driver: dict[str, Any] | None) -> dict[str, Any]:
    """A submitted job's runtime_env with its driver's ``ray.init(runtime_env=...)``, as Ray
    merges them: per key, ``env_vars`` per variable.

    Raises:
        ValueError: both name the same key or variable (unless ``RAY_OVERRIDE_JOB_RUNTIME_ENV``
            is ``1``: then the driver's wins).
    """
    job, driver = dict(job or {}), dict(driver or {})
    job_vars, driver_vars = (
        dict(job.pop("env_vars", {}) or {}),
        dict(driver.pop("env_vars", {}) or {}),
    )
    both = sorted(set(job) & set(driver)) + sorted(set(job_vars) & set(driver_vars))
    if both and os.environ.get("RAY_OVERRIDE_JOB_RUNTIME_ENV") != "1":
        raise ValueError(
            f"the job's runtime_env and ray.init's both set {both}: give each once, or set "
            "RAY_OVERRIDE_JOB_RUNTIME_ENV=1 for ray.init's to win (as in Ray)"
        )
    merged = {**job, **driver}
    if job_vars or driver_vars:
        merged["env_vars"] = {**job_vars, **driver_vars}
    return merged


def encode_packages(refs: tuple[PackageRef, ...]) -> str:
    """``refs`` as :data:`ENV_PACKAGES` holds them (``digest:size:w|m``, comma-separated)."""
    return ",".join(f"{r.digest}:{r.size}:{'w' if r.working_dir else 'm'}" for r in refs)


def decode_packages(text: str) -> tuple[PackageRef, ...]:
    """The references :func:`encode_packages` wrote (malformed entries are skipped)."""
    refs = []
    for item in text.split(","):
        digest, _, rest = item.partition(":")
        size, _, kind = rest.partition(":")
        if len(digest) == 64 and size.isdigit() and kind in ("w", "m"):
            refs.append(PackageRef(digest, int(size), kind == "w"))
    return tuple(refs)


def check_runtime_env(runtime_env: dict[str, Any] | None) -> dict[str, str]:
    """The ``env_vars`` of a ``runtime_env`` (see :func:`parse_runtime_env`).

    Raises:
        ValueError: as :func:`parse_runtime_env`.
    """
    return parse_runtime_env(runtime_env).env


def open_session(
    address: str | None = None,
    *,
    num_cpus: float | None = None,
    num_gpus: float | None = None,
    namespace: str | None = None,
    runtime_env: dict[str, Any] | None = None,
    num_nodes: int = 1,
) -> Session:
    """Start or join a cluster and make it this process's session.

    Raises:
        ValueError: unsupported ``runtime_env`` keys, bad resource amounts.
        ConnectError / StartError: no cluster to join, or the local one did not start.
    """
    global _session, _generation
    if not in_actor() and os.environ.get(ENV_JOB_RUNTIME_ENV):
        runtime_env = merge_job_runtime_env(
            json.loads(os.environ[ENV_JOB_RUNTIME_ENV]), runtime_env
        )
    renv = parse_runtime_env(runtime_env)
    env_vars = renv.env
    packages: tuple[Package | PackageRef, ...] = renv.packages()  # before a cluster starts
    if not renv.ships and not in_actor() and os.environ.get(ENV_JOB_RUNTIME_ENV):
        # a submitted job's entrypoint: its supervisor runs from the job's files already
        packages = decode_packages(os.environ.get(ENV_PACKAGES, ""))
    if in_actor():
        loop = _internals.home_loop()
        ns = namespace if namespace is not None else os.environ.get(ENV_NAMESPACE) or None
        job = os.environ.get(ENV_JOB_ID) or uuid.uuid4().hex[:8]
        inherited = [k for k in os.environ.get(ENV_ENV_VARS, "").split(",") if k]
        env_vars = {**{k: os.environ[k] for k in inherited if k in os.environ}, **env_vars}
        inherited_exe = parse_executable(os.environ.get(ENV_PY_EXECUTABLE) or None)
        s = Session(loop, None, ns, job, env_vars, renv.py_executable or inherited_exe)
        if not renv.ships:  # its own actors and tasks get the files it runs with
            packages = decode_packages(os.environ.get(ENV_PACKAGES, ""))
        s.anonymous_namespace = os.environ.get(ENV_ANONYMOUS_NAMESPACE) or s.anonymous_namespace
    elif (joined := _joined(address)) is not None:
        # this driver already started or joined a cluster (actors.Cluster.local_sync, a
        # worker group's cluster): a process belongs to one cluster, so the session uses it
        # as an actor's does (its loop, a Cluster on the existing session) and leaves it be
        s = Session(
            _internals.home_loop(),
            None,
            namespace,
            uuid.uuid4().hex[:8],
            env_vars,
            renv.py_executable,
        )
        s.joined = joined
        s.num_cpus = num_cpus
        s.num_gpus = num_gpus
    else:
        if num_gpus is not None and (num_gpus < 0 or num_gpus != int(num_gpus)):
            raise ValueError(f"num_gpus must be a whole number >= 0, got {num_gpus!r}")
        if num_cpus is not None and not num_cpus > 0:
            raise ValueError(f"num_cpus must be > 0, got {num_cpus!r}")
        if address is None:
            sync = Cluster.local_sync(nodes=num_nodes, gpus_per_node=int(num_gpus or 0))
        else:
            sync = Cluster.connect_sync(address)
        s = Session(
            sync.portal.loop, sync, namespace, uuid.uuid4().hex[:8], env_vars, renv.py_executable
        )
        s._cluster = sync.cluster
        s.num_cpus = num_cpus
        s.num_gpus = num_gpus
    s.packages = packages
    _generation += 1
    s.generation = _generation
    _session = s
    return s


def _joined(address: str | None) -> str | None:
    """The cluster this driver already belongs to, when ``address`` names no other one."""
    joined = _internals.joined_address()
    if joined is None or address not in (None, "auto", joined):
        return None
    return joined


def close_session() -> None:
    """End the session: its actors, task workers and (a local one) the cluster. Idempotent."""
    global _session
    with _lock:
        s, _session = _session, None
    if s is None:
        return
    if s.sync is not None:
        s.sync.close()
    elif s.tasks is not None and not s.loop.is_closed():
        # inside an actor, or a driver on a cluster of its own: give back the task workers
        # it started (a closed loop: that cluster, and so they, ended already)
        try:
            run(s, s.tasks.aclose(), timeout=30)
        except Exception:
            pass


def _close_at_exit() -> None:
    """A script that never called ``ray.shutdown``: end its session while the interpreter
    can still run threads (a local cluster also dies with its driver in any case)."""
    if in_actor():  # an actor's task workers die with it; its loop may be stopping
        return
    try:
        close_session()
    except Exception:
        pass


# before concurrent.futures stops its executors (atexit handlers run after that). Threading's
# exit hooks run last-registered first: the thread pools' own hook is registered when
# concurrent.futures.thread is first imported, so it is imported above, or it could come later
# and stop every pool before the close runs (whose steps hand blocking work to threads).
_register = getattr(threading, "_register_atexit", None)
if _register is not None:
    _register(_close_at_exit)
else:  # pragma: no cover
    atexit.register(_close_at_exit)


def on_loop(s: Session) -> bool:
    """Whether this thread runs the session's loop (work must not block it)."""
    try:
        return asyncio.get_running_loop() is s.loop
    except RuntimeError:
        return False


def submit(
    s: Session, coro: Coroutine[Any, Any, T]
) -> asyncio.Future[T] | concurrent.futures.Future[T]:
    """Start ``coro`` on the session's loop: an asyncio task there when called from that
    loop, else a ``concurrent.futures.Future``."""
    if on_loop(s):
        return s.loop.create_task(coro)
    return asyncio.run_coroutine_threadsafe(coro, s.loop)


def run(s: Session, coro: Coroutine[Any, Any, T], timeout: float | None = None) -> T:
    """Run ``coro`` on the session's loop and block for its result.

    Raises:
        RuntimeError: called on the session's loop (an ``async def`` actor method), where
            blocking would deadlock: ``await`` there.
    """
    if on_loop(s):
        coro.close()
        raise RuntimeError(
            "a blocking ray call inside an async actor method would block the actor's event "
            "loop for good: use `await ref` (or `await asyncio.gather(*refs)`) there"
        )
    return asyncio.run_coroutine_threadsafe(coro, s.loop).result(timeout)
