"""``@ray.remote`` functions: tasks run by a pool of reusable task-worker actors.

``f.remote(x)`` returns an ObjectRef at once; the task waits for its ref arguments, takes an
idle worker of its kind (resources, node or bundle, ``runtime_env``) or starts one while the
kind has fewer than its cap (the cluster's CPUs divided by the task's ``num_cpus``; for GPU
tasks its GPUs divided by ``num_gpus``), and otherwise queues for one, first come first
served. A driver fanning out thousands of tasks so holds a handful of workers and
connections. A worker that holds GPUs is stopped when no task waits for it, so idle task
workers never keep GPUs from actors. The function travels pickled (cloudpickle) once per
worker. A worker that dies under a task is replaced and the task retried up to
``max_retries`` (3, as Ray; -1: without end); ``retry_exceptions`` retries on the function's
own errors too. Tasks may submit tasks (the worker's process has its own pool).

A generator function (``def`` or ``async def`` with ``yield``) is a streaming generator task,
as in Ray: ``.remote()`` returns an ``ObjectRefGenerator`` (``rayless.ray.generator``) and
the task holds its worker until the generator ends or is closed (a start that fails is
retried as any task's; once items flow, a dead worker ends the stream with its error). An
explicit int ``num_returns`` makes it a plain task returning that many values.
"""

from __future__ import annotations

import asyncio
import collections
import functools
import uuid
import weakref
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from rayless.actors import ActorHandle as _RaylessHandle
from rayless.actors import RemoteStream
from rayless.actors.ext import Package, PackageRef, check_params, dumps_by_value, params_of
from rayless.errors import ActorDiedError, PlacementError, RemoteError
from rayless.ray import _worker
from rayless.ray._task_worker import TaskWorker
from rayless.ray.actor import STREAMING, drain, is_generator, resolve_all, split
from rayless.ray.generator import ObjectRefGenerator
from rayless.ray.object_ref import ObjectRef
from rayless.ray.options import (
    TASK_OPTIONS,
    Placement,
    check,
    check_group,
    env_for,
    executable_for,
    packages_for,
    place,
    template_for,
)

__all__ = ["RemoteFunction", "TaskPools"]

DEFAULT_RETRIES = 3
_RETIRING: set[asyncio.Task[None]] = set()  # workers being stopped in the background
GPU_WAIT = 3600.0  # a GPU task's worker waits this long for GPUs others hold (Ray: forever)


@dataclass(eq=False)
class Worker:
    """One task-worker actor and the functions it already holds."""

    handle: _RaylessHandle[Any]
    sent: set[str] = field(default_factory=set)


@dataclass(eq=False)
class _Pool:
    cap: int
    holds_gpus: bool = False  # its workers hold GPUs: none is kept idle
    idle: list[Worker] = field(default_factory=list)
    size: int = 0
    waiters: collections.deque[asyncio.Future[Worker | None]] = field(
        default_factory=collections.deque
    )


@dataclass(eq=False)
class TaskState:
    """What ``ray.cancel`` needs of a running task: its worker."""

    worker: Worker | None = None
    force: bool = False


class TaskKind(NamedTuple):
    """What makes two task workers interchangeable: where they run (node or bundle, GPU
    indices), their resources and their ``runtime_env``."""

    where: Any  # Placement.key
    gpus: float
    cpus: float | None
    env_vars: tuple[tuple[str, str], ...]
    executable: tuple[str, ...]
    packages: tuple[PackageRef, ...]  # its working_dir and py_modules


class TaskPools:
    """The task workers of one session, by kind. Lives on the session's loop."""

    def __init__(self, s: _worker.Session) -> None:
        self.session = s
        self.pools: dict[TaskKind, _Pool] = {}
        self.totals: tuple[float, float] | None = None  # (CPUs, GPUs) of the cluster
        self.closed = False

    async def _totals(self) -> tuple[float, float]:
        if self.totals is None:
            cluster = await self.session.cluster()
            nodes = [n for n in await cluster.nodes(actors=False) if n.get("alive", True)]
            cpus = self.session.num_cpus
            if cpus is None:
                cpus = sum(float(n.get("cpus", 1)) for n in nodes)
            self.totals = (float(cpus), float(sum(len(n.get("gpus", [])) for n in nodes)))
        return self.totals

    async def acquire(
        self,
        key: TaskKind,
        opts: dict[str, Any],
        where: Placement,
        packages: tuple[Package | PackageRef, ...] = (),
    ) -> Worker:
        """An idle worker of kind ``key``, a new one, or the next one released.

        Raises:
            PlacementError: no node can ever hold a worker of this kind.
        """
        pool = self.pools.get(key)
        if pool is None:
            cpus_total, gpus_total = await self._totals()
            pool = self.pools.get(key)
            if pool is None:
                cpus = float(opts["num_cpus"]) if opts.get("num_cpus") is not None else 1.0
                gpus = float(opts.get("num_gpus") or 0)
                if gpus > 0 and where.gpu_indices is None:
                    cap = int(gpus_total // gpus) if gpus_total else 1
                else:
                    cap = int(cpus_total // cpus) if cpus > 0 else int(cpus_total)
                pool = self.pools[key] = _Pool(max(1, cap), holds_gpus=gpus > 0)
        while True:
            if pool.idle:
                return pool.idle.pop()
            if pool.size < pool.cap:
                pool.size += 1
                try:
                    return Worker(await self._spawn(opts, where, packages))
                except BaseException:
                    pool.size -= 1
                    self._wake(pool)
                    raise
            waiter: asyncio.Future[Worker | None] = asyncio.get_running_loop().create_future()
            pool.waiters.append(waiter)
            got = await waiter
            if got is not None:
                return got

    async def _spawn(
        self,
        opts: dict[str, Any],
        where: Placement,
        packages: tuple[Package | PackageRef, ...],
    ) -> _RaylessHandle[Any]:
        s = self.session
        cluster = await s.cluster()
        gpus = float(opts.get("num_gpus") or 0)
        kwargs: dict[str, Any] = {
            "gpus": gpus,
            "cpus": float(opts["num_cpus"]) if opts.get("num_cpus") is not None else 1.0,
            "env": env_for(s, opts, packages),
            "executable": executable_for(s, opts),
            "packages": packages,
            "gpu_indices": where.gpu_indices,
            "wait_for_resources": GPU_WAIT if gpus > 0 and where.gpu_indices is None else 0.0,
            "template": template_for(),
        }
        try:
            return await cluster.spawn(TaskWorker, node=where.node, **kwargs)
        except PlacementError:
            if not where.soft_node:
                raise
            return await cluster.spawn(TaskWorker, **kwargs)

    def release(self, key: TaskKind, worker: Worker) -> bool:
        """Give ``worker`` back: to the first task waiting, else to the idle list. False for a
        worker that holds GPUs and nobody waits for: the caller stops it (:meth:`retire`), so
        idle workers never keep GPUs from actors."""
        pool = self.pools[key]
        while pool.waiters:
            waiter = pool.waiters.popleft()
            if not waiter.done():
                waiter.set_result(worker)
                return True
        if pool.holds_gpus:
            pool.size -= 1
            return False
        pool.idle.append(worker)
        return True

    async def retire(self, worker: Worker) -> None:
        """Stop a worker :meth:`release` did not keep (its GPUs free once this returns)."""
        cluster = await self.session.cluster()
        try:
            await cluster.kill(worker.handle)
        except Exception:
            pass

    async def give_back(self, key: TaskKind, worker: Worker) -> None:
        """:meth:`release`, then :meth:`retire` what it did not keep."""
        if not self.release(key, worker):
            await self.retire(worker)

    def discard(self, key: TaskKind, worker: Worker) -> None:
        """Forget a dead worker; a waiting task may start a new one."""
        pool = self.pools[key]
        pool.size -= 1
        if worker in pool.idle:
            pool.idle.remove(worker)
        self._wake(pool)

    @staticmethod
    def _wake(pool: _Pool) -> None:
        while pool.waiters:
            waiter = pool.waiters.popleft()
            if not waiter.done():
                waiter.set_result(None)
                return

    def idle_cpus(self) -> dict[str, float]:
        """The CPUs idle workers hold, by node (on the session's loop): free in Ray's terms,
        where an idle worker holds no resources."""
        out: dict[str, float] = {}
        for kind, pool in self.pools.items():
            cpus = float(kind.cpus) if kind.cpus is not None else 1.0
            for w in pool.idle:
                node = w.handle.node_id or ""
                out[node] = out.get(node, 0.0) + cpus
        return out

    async def aclose(self) -> None:
        """Kill every idle worker (busy ones die with the session)."""
        self.closed = True
        cluster = await self.session.cluster()
        for pool in self.pools.values():
            for w in pool.idle:
                try:
                    await cluster.kill(w.handle)
                except Exception:
                    pass
            pool.idle.clear()


def _pools(s: _worker.Session) -> TaskPools:
    if s.tasks is None:
        s.tasks = TaskPools(s)
    return s.tasks


def _retry_on(exc: BaseException, retry_exceptions: Any) -> bool:
    if retry_exceptions is True:
        return True
    if isinstance(retry_exceptions, (list, tuple)):
        return isinstance(exc, tuple(retry_exceptions))
    return False


async def run_task(
    s: _worker.Session,
    key: str,
    code: bytes,
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
    opts: dict[str, Any],
    state: TaskState,
    stream: bool = False,
) -> Any:
    """Run one task to its result (see the module docstring). ``stream``: a generator task,
    whose result is ``(its stream, what gives the worker back)``: the worker stays its own
    until then."""
    args, kwargs = await resolve_all(args, kwargs)
    pools = _pools(s)
    where = await place(s, opts)
    packages = await packages_for(s, opts)
    kind = TaskKind(
        where.key,
        float(opts.get("num_gpus") or 0),
        opts.get("num_cpus"),
        _worker.parse_runtime_env(opts.get("runtime_env")).env_vars,
        executable_for(s, opts),
        tuple(p.ref if isinstance(p, Package) else p for p in packages),
    )
    retries = opts.get("max_retries", DEFAULT_RETRIES)
    attempt = 0
    held = False
    try:
        while True:
            worker = await pools.acquire(kind, opts, where, packages)
            state.worker = worker
            try:
                code_now = None if key in worker.sent else code
                result = await worker.handle.run(key, code_now, args, kwargs)
                if not stream and isinstance(result, RemoteStream):
                    # a generator with an int num_returns: its items are the values
                    result = await drain(result, opts.get("num_returns", 1))
            except ActorDiedError:
                pools.discard(kind, worker)
                if state.force:
                    raise asyncio.CancelledError() from None
                if retries != -1 and attempt >= retries:
                    raise
                attempt += 1
                continue
            except RemoteError as exc:
                worker.sent.add(key)
                await pools.give_back(kind, worker)
                if _retry_on(exc, opts.get("retry_exceptions")) and (
                    retries == -1 or attempt < retries
                ):
                    attempt += 1
                    continue
                # named as Ray names it: the function, not the worker that ran it
                exc.raised_in = "task"
                exc.actor = f"ray::{key.rpartition('-')[0]}() on {exc.actor}"
                raise
            except BaseException as exc:
                if not pools.release(kind, worker):  # cancelled: stop it in the background
                    retiring = asyncio.get_running_loop().create_task(pools.retire(worker))
                    _RETIRING.add(retiring)
                    retiring.add_done_callback(_RETIRING.discard)
                if isinstance(exc, TypeError):
                    raise _argument_error(exc, key.rpartition("-")[0]) from None
                raise
            worker.sent.add(key)
            if stream:
                held = True  # until the stream ends: give_back releases the placement
                return result, functools.partial(_give_back, pools, kind, worker, where)
            await pools.give_back(kind, worker)
            return result
    finally:
        state.worker = None
        if not held:
            where.release()


def _argument_error(exc: TypeError, name: str) -> TypeError:
    """An argument the codec refused, named in the task's terms: ``argument 0 [1]`` of
    ``name``, not of the worker's ``run(key, code, args, kwargs)`` that carried it."""
    path, reason = getattr(exc, "path", None), getattr(exc, "reason", None)
    if not isinstance(path, tuple) or not isinstance(reason, str) or len(path) < 3:
        return exc
    if path[1] not in ("[2]", "[3]"):
        return exc
    what = "argument" if path[1] == "[2]" else "keyword argument"
    where = "".join((" ", *path[3:])) if path[3:] else ""
    error = TypeError(f"{what} {path[2][1:-1]}{where}: {reason} (calling {name})")
    error.path, error.reason = path, reason  # type: ignore[attr-defined]
    return error


async def _give_back(pools: TaskPools, kind: TaskKind, worker: Worker, where: Placement) -> None:
    """A generator task's stream ended: its worker and placement are free again."""
    try:
        await pools.give_back(kind, worker)
    finally:
        where.release()


def _checked(options: dict[str, Any]) -> dict[str, Any]:
    """A task's options checked (``num_returns`` an int, or ``"streaming"``).

    Raises:
        ValueError: an unsupported option or value.
    """
    out = check(options, TASK_OPTIONS, "task")
    nr = out.get("num_returns", 1)
    if nr != STREAMING and (isinstance(nr, bool) or not isinstance(nr, int) or nr < 0):
        raise ValueError(
            f"num_returns must be an int >= 0 or {STREAMING!r}, got {nr!r} (Ray's deprecated "
            "'dynamic' generators are not supported by rayless.ray)"
        )
    return out


class RemoteFunction:
    """A function made remote by ``@ray.remote``: ``f.remote(x)`` runs it as a task."""

    def __init__(self, fn: Any, options: dict[str, Any]) -> None:
        self._function = fn
        self._options = _checked(options)
        # a generator function streams unless num_returns says how many values it returns
        self._generator = is_generator(fn)
        self._key = f"{getattr(fn, '__qualname__', 'fn')}-{uuid.uuid4().hex[:12]}"
        self._code: bytes | None = None
        self._params = params_of(fn)  # what .remote() checks its arguments against
        self.__doc__ = fn.__doc__
        self.__name__ = getattr(fn, "__name__", "remote_function")
        self.__qualname__ = getattr(fn, "__qualname__", self.__name__)
        self.__module__ = getattr(fn, "__module__", __name__)
        self.__wrapped__ = fn

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        raise TypeError(
            f"Remote functions cannot be called directly. Instead of running "
            f"'{self.__name__}()', try '{self.__name__}.remote()'."
        )

    def options(self, **options: Any) -> RemoteFunction:
        """This function with ``options`` over its own."""
        derived = RemoteFunction.__new__(RemoteFunction)
        derived.__dict__.update(self.__dict__)
        derived._options = _checked({**self._options, **options})
        return derived

    def _pickled(self) -> bytes:
        if self._code is None:
            # by value where cloudpickle would (a function of __main__), with its file's name
            # and source lines, so a task's traceback shows the driver's lines
            self._code = dumps_by_value(self._function)
        return self._code

    def remote(self, *args: Any, **kwargs: Any) -> Any:
        """Run the function as a task: its ObjectRef (a list of refs for ``num_returns``
        other than 1; None for 0).

        Raises:
            TypeError: the arguments do not fit the function's parameters (at once, as Ray).
        """
        check_params(self._params, self._describe, args, kwargs)
        s = _worker.session()
        check_group(self._options)
        state = TaskState()
        n = self._options.get("num_returns", STREAMING if self._generator else 1)
        if n == STREAMING:
            coro = run_task(s, self._key, self._pickled(), args, kwargs, self._options, state, True)
            return ObjectRefGenerator(s, _worker.submit(s, coro), task=True)
        coro = run_task(s, self._key, self._pickled(), args, kwargs, self._options, state)
        fut = _worker.submit(s, coro)
        if n == 1:
            ref = ObjectRef(fut, s.generation, task=True)
            _CANCEL[ref] = state
            return ref
        refs = split(s, fut, n, task=True) if n else []
        return refs if n else None

    def bind(self, *args: Any, **kwargs: Any) -> Any:
        """Ray's DAG API is not supported."""
        raise NotImplementedError("Ray DAGs (.bind) are not supported by rayless.ray")

    def _describe(self) -> str:
        return f"remote function {self.__qualname__}"


_CANCEL: weakref.WeakKeyDictionary[ObjectRef, TaskState] = weakref.WeakKeyDictionary()


def task_state(ref: ObjectRef) -> TaskState | None:
    """The running state of the task ``ref`` is the result of (``ray.cancel(force=True)``)."""
    return _CANCEL.get(ref)
