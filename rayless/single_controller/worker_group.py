"""verl's ``WorkerGroup``: one handle on N ranks of a Worker class, with group methods.

``WorkerGroup(resource_pool, ClassWithInitArgs(Cls, *args, **kwargs), cluster=sync_cluster)``
spawns one actor per bundle of the pool (``spawn_group`` on the pool's slots, with the
torch.distributed environment) and binds every ``@register`` method of ``Cls`` as a group
method: ``wg.compute(batch)`` dispatches the arguments over the ranks, calls them, and
collects the results (``rayless.single_controller.decorator``). A method without
``@register`` is no group method (AttributeError naming those that are); call it on every rank
with ``execute_all_sync(name, ...)``.

Two faces over the same group:

* blocking, for verl's plain synchronous driver code: ``wg.compute(x)`` returns the result
  (``blocking=False`` methods: a ``concurrent.futures.Future`` of it, which
  ``SyncCluster.get`` accepts); ``wg.compute.remote(x)`` is always a future.
* awaitable, for async code: ``await wg.compute.aio(x)``; ``wg.compute.submit(x)`` is an
  ``asyncio.Future``; ``await WorkerGroup.create(pool, cia, cluster=cluster)`` builds one.

A future of an earlier group call passed as an argument is resolved before the dispatch.
A function passed as a top-level argument travels as code (``FunctionRef``): by name when it
is a module-level function of an importable module, else by value (cloudpickle); a registered
method gets it back as a function.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import copy
import functools
import inspect
import secrets
import threading
from collections.abc import Callable, Sequence
from typing import Any

from rayless.actors import ActorHandle, Cluster, gather
from rayless.single_controller.decorator import (
    PADDING_SIZE_KEY,
    Dispatch,
    Execute,
    FunctionRef,
    MethodAttrs,
    importable,
    method_attrs,
    mode_functions,
    resolve_mode,
    trim,
)
from rayless.single_controller.resource_pool import ResourcePool
from rayless.transport import register_extension
from rayless.transport.errors import ProtocolError

_OWNED: set[asyncio.Future[Any]] = set()  # group calls started by .submit(): held until done
ROLE_METHOD = "execute_role"  # the FusedWorker method that runs a role's method
# verl's RayWorkerGroup arguments that mean nothing here (accepted so ported code runs)
_VERL_EXTRAS = frozenset({"device_name", "ray_wait_register_center_timeout"})


class ClassWithInitArgs:
    """A worker class with its constructor arguments, for a group to spawn (verl's
    ``RayClassWithInitArgs``). ``update_options`` takes ``cluster.spawn`` options
    (``max_restarts``, ``max_concurrency``, ``env``, ``timeout``, ...)."""

    def __init__(self, cls: type, *args: Any, **kwargs: Any) -> None:
        if not isinstance(cls, type):
            raise TypeError(f"ClassWithInitArgs needs a class, got {cls!r}")
        self.cls = cls
        self.args = args
        self.kwargs = kwargs
        self.fused_worker_used = False
        self.raw_cls_dict: dict[str, type] = {}
        self._options: dict[str, Any] = {}

    def update_options(self, options: dict[str, Any]) -> None:
        """Add spawn options for every rank."""
        self._options.update(options)

    def __call__(self) -> Any:
        """An instance built here, in this process (verl's base behaviour)."""
        return self.cls(*self.args, **self.kwargs)


class GroupMethod:
    """A registered method bound to a group: call it (blocking face) or ``await .aio()``.

    ``refs``: its mode's dispatch and collect functions by name, for a group that arrived
    from another process (imported at the first call, not when the group arrives).
    """

    __slots__ = ("_fns", "attrs", "method", "refs", "role", "wg")

    def __init__(
        self,
        wg: WorkerGroup,
        method: str,
        attrs: MethodAttrs,
        role: str | None,
        refs: tuple[FunctionRef, FunctionRef] | None = None,
    ) -> None:
        self.wg = wg
        self.method = method
        self.attrs = attrs
        self.role = role
        self.refs = refs
        self._fns = resolve_mode(attrs) if refs is None else None

    def _resolved(self) -> tuple[Callable[..., Any], Callable[..., Any]]:
        if self._fns is None:
            assert self.refs is not None  # internal invariant: one or the other is set
            fns = {"dispatch_fn": self.refs[0].load(), "collect_fn": self.refs[1].load()}
            self._fns = resolve_mode(self.attrs, fns)
        return self._fns

    @property
    def dispatch_fn(self) -> Callable[..., Any]:
        """The mode's dispatch function (padding bound in)."""
        return self._resolved()[0]

    @property
    def collect_fn(self) -> Callable[..., Any]:
        """The mode's collect function."""
        return self._resolved()[1]

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        """Run it on the ranks; the collected result (``blocking=False``: a future of it).

        Raises:
            RuntimeError: an event loop runs in this thread (use ``await .aio(...)``).
            ValueError / TypeError: the dispatch refused the arguments (an uneven batch...).
            RemoteError / ActorDiedError: a rank raised or died (the first to fail, at once:
                the other ranks are not waited for).
        """
        future = self.remote(*args, **kwargs)
        return future if not self.attrs.blocking else future.result()

    def remote(self, *args: Any, **kwargs: Any) -> concurrent.futures.Future[Any]:
        """Start it on the ranks; a ``concurrent.futures.Future`` of the collected result.

        Raises:
            RuntimeError: an event loop runs in this thread.
        """
        _no_loop(f"{self.method}(...)")
        args, kwargs = _resolve_sync(args, kwargs)
        calls, padding = self.wg._plan(self, args, kwargs)
        futures = [self.wg._send(h, self.method, self.role, a, k) for h, a, k in calls]
        return _combine(futures, lambda outs: self.wg._finish(self, outs, padding))

    async def aio(self, *args: Any, **kwargs: Any) -> Any:
        """The awaitable face: run it on the ranks and return the collected result."""
        args, kwargs = await _resolve_async(args, kwargs)
        calls, padding = self.wg._plan(self, args, kwargs)
        outs = await gather([self.wg._send(h, self.method, self.role, a, k) for h, a, k in calls])
        return self.wg._finish(self, outs, padding)

    def submit(self, *args: Any, **kwargs: Any) -> asyncio.Future[Any]:
        """Start :meth:`aio` now (inside a running loop); an ``asyncio.Future`` of it."""
        task = asyncio.ensure_future(self.aio(*args, **kwargs))
        _OWNED.add(task)
        task.add_done_callback(_OWNED.discard)
        return task

    def __repr__(self) -> str:
        return f"<group method {self.method} of {self.wg!r}>"


def _sync_face(cluster: Any, need: str) -> tuple[Callable[[Any], Any], Cluster]:
    """``(cluster.run, cluster.cluster)`` of a SyncCluster, for the blocking constructors.

    Raises:
        TypeError: ``cluster`` is not a SyncCluster (``need`` says what to do instead).
    """
    run = getattr(cluster, "run", None)
    inner = getattr(cluster, "cluster", None)
    if not callable(run) or not isinstance(inner, Cluster):
        raise TypeError(need)
    return run, inner


class WorkerGroup:
    """N ranks of a Worker class on a resource pool (verl's ``RayWorkerGroup``).

    ``call_timeout``: seconds every call to a rank may take (past it: Timeout, and the call is
    cancelled in the rank); None waits as long as the call runs (a dead rank still fails its
    calls at once with ActorDiedError).

    Raises (constructor):
        TypeError: a pool without a ``SyncCluster`` as ``cluster`` (async code: use
            :meth:`create`), or neither a pool nor detached workers.
        ValueError: ``call_timeout`` is not a positive number.
        PlacementError: the pool does not fit the live cluster.
        RemoteError: a rank's constructor raised (the other ranks are killed).
    """

    def __init__(
        self,
        resource_pool: ResourcePool | None = None,
        ray_cls_with_init: ClassWithInitArgs | None = None,
        bin_pack: bool = True,
        name_prefix: str | None = None,
        detached: bool = False,
        worker_names: Sequence[str] | None = None,
        worker_handles: Sequence[ActorHandle[Any]] | None = None,
        *,
        cluster: Any = None,
        call_timeout: float | None = None,
        **kwargs: Any,
    ) -> None:
        unknown = sorted(set(kwargs) - _VERL_EXTRAS)
        if unknown:
            raise TypeError(f"WorkerGroup() got unexpected keyword arguments {unknown}")
        self.ray_cls_with_init = ray_cls_with_init
        self.name_prefix = name_prefix if name_prefix is not None else secrets.token_hex(3)
        self.resource_pool = resource_pool
        self.fused_worker_used = bool(ray_cls_with_init and ray_cls_with_init.fused_worker_used)
        self.sub_cls_name = ""
        self._role: str | None = None
        self._methods: dict[str, GroupMethod] = {}
        if resource_pool is not None:
            if ray_cls_with_init is None:
                raise TypeError("a worker group on a resource pool needs ray_cls_with_init")
            run, inner = _sync_face(
                cluster,
                "WorkerGroup(resource_pool, ...) needs cluster=<a SyncCluster>; in async "
                "code use `await WorkerGroup.create(pool, cls_with_init, cluster=cluster)`",
            )
            handles = run(_spawn_workers(inner, resource_pool, ray_cls_with_init, self.name_prefix))
        elif worker_handles is not None:
            handles = list(worker_handles)
        elif worker_names is not None:
            run, inner = _sync_face(
                cluster,
                "from_detached(worker_names=...) needs cluster=<a SyncCluster> to look the "
                "names up; in async code use `await WorkerGroup.afrom_detached(...)`",
            )
            handles = run(_lookup(inner, list(worker_names)))
        else:
            raise TypeError("give a resource_pool, worker_handles or worker_names")
        if call_timeout is not None:
            handles = [h.with_timeout(call_timeout) for h in handles]
        self._workers: list[ActorHandle[Any]] = handles
        self._worker_names = [h.name for h in handles]
        if ray_cls_with_init is not None:
            self._bind(ray_cls_with_init)

    # ------------------------------------------------------------------ construction

    @classmethod
    async def create(
        cls,
        resource_pool: ResourcePool,
        ray_cls_with_init: ClassWithInitArgs,
        *,
        cluster: Cluster,
        name_prefix: str | None = None,
        call_timeout: float | None = None,
    ) -> WorkerGroup:
        """The awaitable constructor: spawn the ranks on ``cluster`` (a ``Cluster``).

        Raises: as the constructor.
        """
        prefix = name_prefix if name_prefix is not None else secrets.token_hex(3)
        handles = await _spawn_workers(cluster, resource_pool, ray_cls_with_init, prefix)
        wg = cls(
            None,
            ray_cls_with_init,
            name_prefix=prefix,
            worker_handles=handles,
            call_timeout=call_timeout,
        )
        wg.resource_pool = resource_pool
        return wg

    @classmethod
    def from_detached(
        cls,
        name_prefix: str | None = None,
        worker_names: Sequence[str] | None = None,
        worker_handles: Sequence[ActorHandle[Any]] | None = None,
        ray_cls_with_init: ClassWithInitArgs | None = None,
        *,
        cls_with_init: ClassWithInitArgs | None = None,
        cluster: Any = None,
        **kwargs: Any,
    ) -> WorkerGroup:
        """A group over running workers: their handles, or their names (then ``cluster``, a
        SyncCluster, looks them up). Works in any process, another actor's included.

        verl's spellings all work: ``ray_cls_with_init=`` or ``cls_with_init=``, and older
        verl's positional ``from_detached(worker_names, ray_cls_with_init)``; other keywords
        are the constructor's (verl's extras such as ``device_name`` accepted).

        Raises:
            ActorNotFoundError: a name is not a live actor.
            TypeError: two different classes given, or an unknown keyword.
        """
        if not isinstance(name_prefix, (str, type(None))):
            # older verl's order: from_detached(worker_names=None, ray_cls_with_init=None)
            old_cia = worker_names if isinstance(worker_names, ClassWithInitArgs) else None
            if worker_names is not None and old_cia is None:
                raise TypeError("name_prefix must be a str (worker names go in worker_names=)")
            name_prefix, worker_names = None, name_prefix
            ray_cls_with_init = _one_class(ray_cls_with_init, old_cia)
        cia = _one_class(ray_cls_with_init, cls_with_init)
        return cls(
            None,
            cia,
            name_prefix=name_prefix,
            worker_names=worker_names,
            worker_handles=worker_handles,
            cluster=cluster,
            **kwargs,
        )

    @classmethod
    async def afrom_detached(
        cls,
        worker_names: Sequence[str],
        ray_cls_with_init: ClassWithInitArgs | None = None,
        *,
        cls_with_init: ClassWithInitArgs | None = None,
        cluster: Cluster,
        name_prefix: str | None = None,
        **kwargs: Any,
    ) -> WorkerGroup:
        """:meth:`from_detached` by names, awaitable (``cluster``: a ``Cluster``, e.g.
        ``await actors.connect()`` inside an actor).

        Raises:
            ActorNotFoundError: a name is not a live actor.
            TypeError: two different classes given, or an unknown keyword.
        """
        cia = _one_class(ray_cls_with_init, cls_with_init)
        handles = await _lookup(cluster, list(worker_names))
        return cls(None, cia, name_prefix=name_prefix, worker_handles=handles, **kwargs)

    def _bind(self, cia: ClassWithInitArgs) -> None:
        if cia.fused_worker_used:
            for key, role_cls in cia.raw_cls_dict.items():
                for name, attrs in method_attrs(role_cls).items():
                    self._bind_one(f"{key}_{name}", GroupMethod(self, name, attrs, key))
        for name, attrs in method_attrs(cia.cls).items():
            self._bind_one(name, GroupMethod(self, name, attrs, None))

    def _bind_one(self, name: str, method: GroupMethod) -> None:
        self._methods[name] = method
        setattr(self, name, method)

    def spawn(self, prefix_set: Sequence[str] | set[str]) -> dict[str, WorkerGroup]:
        """Role views: for each prefix, a group on the same workers whose ``{prefix}_m``
        methods are its ``m`` (verl's ``spawn``; for fused workers, the role's methods run
        in the shared processes).

        Raises:
            ValueError: a prefix no bound method has.
        """
        views = {}
        for prefix in prefix_set:
            view = copy.copy(self)
            view.__dict__ = {k: v for k, v in self.__dict__.items() if k not in self._methods}
            view._methods = {}
            lead = f"{prefix}_"
            for name, method in self._methods.items():
                if name.startswith(lead):
                    bound = GroupMethod(view, method.method, method.attrs, method.role, method.refs)
                    view._bind_one(name.removeprefix(lead), bound)
            if not view._methods:
                raise ValueError(f"no group method starts with {lead!r} (prefixes are roles)")
            view.sub_cls_name = prefix if self.fused_worker_used else ""
            view._role = prefix if self.fused_worker_used else None
            views[prefix] = view
        return views

    # -------------------------------------------------------------------- properties

    @property
    def world_size(self) -> int:
        """The number of ranks."""
        return len(self._workers)

    @property
    def workers(self) -> list[ActorHandle[Any]]:
        """The ranks' handles, in rank order."""
        return list(self._workers)

    @property
    def worker_names(self) -> list[str]:
        """The ranks' actor names, in rank order (``from_detached`` takes them)."""
        return list(self._worker_names)

    @property
    def method_names(self) -> list[str]:
        """The group methods (registered methods) of this group."""
        return sorted(self._methods)

    def __getattr__(self, name: str) -> Any:
        if name.startswith("_"):
            raise AttributeError(name)
        methods = self.__dict__.get("_methods", {})
        listed = ", ".join(sorted(methods)) or "none"
        raise AttributeError(
            f"worker group {self.__dict__.get('name_prefix')!r} has no group method {name!r}: "
            f"only @register methods are; its group methods: {listed}. Call an unregistered "
            f"method with execute_all_sync({name!r}, ...)"
        )

    def __repr__(self) -> str:
        role = f", role={self._role!r}" if self._role else ""
        return f"WorkerGroup({self.name_prefix!r}, world_size={self.world_size}{role})"

    # --------------------------------------------------------------------- execution

    def _plan(
        self, gm: GroupMethod, args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> tuple[list[tuple[ActorHandle[Any], tuple[Any, ...], dict[str, Any]]], int]:
        d_args, d_kwargs = gm.dispatch_fn(self, *args, **kwargs)
        d_kwargs = dict(d_kwargs)
        padding = int(d_kwargs.pop(PADDING_SIZE_KEY, 0))
        rank_zero = (
            gm.attrs.execute_mode is Execute.RANK_ZERO
            or gm.attrs.dispatch_mode is Dispatch.RANK_ZERO
        )
        if rank_zero:
            return [(self._workers[0], tuple(d_args), d_kwargs)], padding
        return self._per_rank(tuple(d_args), d_kwargs), padding

    def _per_rank(
        self, args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> list[tuple[ActorHandle[Any], tuple[Any, ...], dict[str, Any]]]:
        """verl's rule: when every argument is a list of one item per rank, rank i gets item
        i of each; otherwise every rank gets the arguments as they are."""
        n = len(self._workers)
        values = [*args, *kwargs.values()]
        if values and all(isinstance(v, (list, tuple)) and len(v) == n for v in values):
            return [
                (h, tuple(a[i] for a in args), {k: v[i] for k, v in kwargs.items()})
                for i, h in enumerate(self._workers)
            ]
        return [(h, args, kwargs) for h in self._workers]

    def _finish(self, gm: GroupMethod, outs: list[Any], padding: int) -> Any:
        rank_zero = (
            gm.attrs.execute_mode is Execute.RANK_ZERO
            or gm.attrs.dispatch_mode is Dispatch.RANK_ZERO
        )
        output = gm.collect_fn(self, outs[0] if rank_zero else outs)
        return trim(output, padding)

    def _send(
        self,
        handle: ActorHandle[Any],
        method: str,
        role: str | None,
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
    ) -> Any:
        args = tuple(_by_name(a) for a in args)
        kwargs = {k: _by_name(v) for k, v in kwargs.items()}
        if role is not None:
            return getattr(handle, ROLE_METHOD).remote(role, method, *args, **kwargs)
        return getattr(handle, method).remote(*args, **kwargs)

    def execute_all_async(self, method_name: str, *args: Any, **kwargs: Any) -> list[Any]:
        """Start ``method_name`` on every rank (lists of one item per rank are split); the
        futures in rank order (``concurrent.futures`` from threads, ``asyncio`` in a loop)."""
        return [
            self._send(h, method_name, self._role, a, k) for h, a, k in self._per_rank(args, kwargs)
        ]

    execute_all = execute_all_async

    def execute_all_sync(self, method_name: str, *args: Any, **kwargs: Any) -> list[Any]:
        """Run ``method_name`` on every rank and return the results in rank order.

        Raises:
            RuntimeError: an event loop runs in this thread (use :meth:`aexecute_all`).
        """
        _no_loop(f"execute_all_sync({method_name!r})")
        result: list[Any] = _combine(
            self.execute_all_async(method_name, *args, **kwargs), list
        ).result()
        return result

    async def aexecute_all(self, method_name: str, *args: Any, **kwargs: Any) -> list[Any]:
        """:meth:`execute_all_sync`, awaitable."""
        return await gather(self.execute_all_async(method_name, *args, **kwargs))

    def execute_rank_zero_async(self, method_name: str, *args: Any, **kwargs: Any) -> Any:
        """Start ``method_name`` on rank 0; its future."""
        return self._send(self._workers[0], method_name, self._role, args, kwargs)

    execute_rank_zero = execute_rank_zero_async

    def execute_rank_zero_sync(self, method_name: str, *args: Any, **kwargs: Any) -> Any:
        """Run ``method_name`` on rank 0 and return its result.

        Raises:
            RuntimeError: an event loop runs in this thread (use :meth:`aexecute_rank_zero`).
        """
        _no_loop(f"execute_rank_zero_sync({method_name!r})")
        return self.execute_rank_zero_async(method_name, *args, **kwargs).result()

    async def aexecute_rank_zero(self, method_name: str, *args: Any, **kwargs: Any) -> Any:
        """:meth:`execute_rank_zero_sync`, awaitable."""
        return await self.execute_rank_zero_async(method_name, *args, **kwargs)


# ------------------------------------------------------------------------------ helpers


async def _spawn_workers(
    cluster: Cluster, pool: ResourcePool, cia: ClassWithInitArgs, prefix: str
) -> list[ActorHandle[Any]]:
    """Spawn one rank of ``cia`` per bundle of ``pool`` (choosing its bundles first)."""
    if not pool.resolved and (pool._parent is None or not pool._parent.resolved):
        pool.choose(cluster.address, await cluster.node_views())
    slots = pool.slots(prefix)
    options = dict(cia._options)
    env = {"WG_PREFIX": prefix, "WG_BACKEND": "rayless", **dict(options.pop("env", None) or {})}
    return await cluster.spawn_group(
        cia.cls,
        len(slots),
        *cia.args,
        plan=slots,
        component=prefix,
        torch_distributed=True,
        name_prefix=prefix,
        env=env,
        **options,
        **cia.kwargs,
    )


def _one_class(
    ray_cls_with_init: ClassWithInitArgs | None, cls_with_init: ClassWithInitArgs | None
) -> ClassWithInitArgs | None:
    """verl's two names for the workers' class: either, or both when they are the same."""
    both = ray_cls_with_init is not None and cls_with_init is not None
    if both and ray_cls_with_init is not cls_with_init:
        raise TypeError("give ray_cls_with_init or cls_with_init, not two different classes")
    return ray_cls_with_init if ray_cls_with_init is not None else cls_with_init


async def _lookup(cluster: Cluster, names: list[str]) -> list[ActorHandle[Any]]:
    return list(await asyncio.gather(*(cluster.get_actor(n) for n in names)))


def _by_name(value: Any) -> Any:
    """A function argument as code (``FunctionRef``: by name, or by value where the workers
    cannot import it); anything else as it is."""
    if inspect.isfunction(value) or inspect.ismethod(value):
        return FunctionRef.of(value)
    if isinstance(value, functools.partial):
        return FunctionRef.of(value)
    return value


def _no_loop(what: str) -> None:
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return
    raise RuntimeError(
        f"{what} blocks; an event loop runs in this thread, so await the group's awaitable "
        "face instead (`await wg.method.aio(...)`, `await wg.aexecute_all(...)`)"
    )


def _resolve_sync(args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[Any, Any]:
    if any(isinstance(a, concurrent.futures.Future) for a in (*args, *kwargs.values())):
        args = tuple(a.result() if isinstance(a, concurrent.futures.Future) else a for a in args)
        kwargs = {
            k: v.result() if isinstance(v, concurrent.futures.Future) else v
            for k, v in kwargs.items()
        }
    return args, kwargs


async def _resolve_async(args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[Any, Any]:
    async def one(v: Any) -> Any:
        if isinstance(v, concurrent.futures.Future):
            return await asyncio.wrap_future(v)
        if isinstance(v, asyncio.Future):
            return await v
        return v

    kinds = (concurrent.futures.Future, asyncio.Future)
    if any(isinstance(a, kinds) for a in (*args, *kwargs.values())):
        args = tuple([await one(a) for a in args])
        kwargs = {k: await one(v) for k, v in kwargs.items()}
    return args, kwargs


def _combine(
    futures: list[concurrent.futures.Future[Any]], finish: Callable[[list[Any]], Any]
) -> concurrent.futures.Future[Any]:
    """One future of ``finish(results)`` once every future is done, or of the first error as
    soon as one fails (a dead rank: the others may be blocked in a collective that never
    returns, as ``ray.get`` does, they are left running, never waited for)."""
    out: concurrent.futures.Future[Any] = concurrent.futures.Future()
    left = [len(futures)]
    lock = threading.Lock()

    def done(f: concurrent.futures.Future[Any]) -> None:
        with lock:
            if out.done():
                return
            left[0] -= 1
            error = f.exception() if not f.cancelled() else concurrent.futures.CancelledError()
            if error is None and left[0]:
                return
            if error is not None:
                out.set_exception(error)
                return
        try:
            result = finish([f.result() for f in futures])
        except BaseException as exc:
            out.set_exception(exc)
        else:
            out.set_result(result)

    if not futures:
        out.set_result(finish([]))
    for f in futures:
        f.add_done_callback(done)
    return out


# ------------------------------------------------------------- a group as an argument


def _by_name_only(fn: Any, wg: WorkerGroup, method: str) -> FunctionRef:
    """``fn`` (a dispatch or collect function) by name: a travelling group is data, and data
    never carries code by value.

    Raises:
        TypeError: ``fn`` is not a module-level function of an importable module.
    """
    if not importable(fn):
        name = getattr(fn, "__qualname__", repr(fn))
        raise TypeError(
            f"{wg!r} cannot travel: its group method {method!r} uses {name}, which is not a "
            "module-level function of an importable module (a group travels as data, its "
            "dispatch functions by name); define it in a module, or pass wg.worker_names or "
            "wg.workers and rebuild the group there with WorkerGroup.from_detached"
        )
    return FunctionRef(fn.__module__, fn.__qualname__)


def _group_state(wg: WorkerGroup) -> dict[str, Any]:
    methods = []
    for name, gm in wg._methods.items():
        attrs = gm.attrs
        mode = attrs.dispatch_mode
        if gm.refs is not None:
            refs = list(gm.refs)
        else:
            fns = mode_functions(attrs)
            refs = [_by_name_only(fns[k], wg, name) for k in ("dispatch_fn", "collect_fn")]
        mode_name = mode.name if isinstance(mode, Dispatch) else None
        flags = [attrs.execute_mode.name, attrs.blocking, attrs.auto_padding]
        methods.append([name, gm.method, gm.role, mode_name, *refs, *flags])
    return {
        "prefix": wg.name_prefix,
        "workers": list(wg._workers),
        "fused": wg.fused_worker_used,
        "sub_cls_name": wg.sub_cls_name,
        "role": wg._role,
        "methods": methods,
    }


def _group_from_state(state: Any) -> WorkerGroup:
    """Rebuild a group from :func:`_group_state`'s state (imports nothing: its dispatch
    functions are imported by name at a method's first call).

    Raises:
        ProtocolError: a malformed state.
    """
    keys = {"prefix", "workers", "fused", "sub_cls_name", "role", "methods"}
    if type(state) is not dict or set(state) != keys:
        raise ProtocolError("bad worker group record")
    workers, methods = state["workers"], state["methods"]
    if type(workers) is not list or not all(isinstance(h, ActorHandle) for h in workers):
        raise ProtocolError("bad worker group record: workers")
    if type(methods) is not list or not isinstance(state["prefix"], str):
        raise ProtocolError("bad worker group record")
    wg = WorkerGroup(None, None, name_prefix=state["prefix"], worker_handles=workers)
    wg.fused_worker_used = bool(state["fused"])
    wg.sub_cls_name = str(state["sub_cls_name"] or "")
    wg._role = state["role"] if isinstance(state["role"], str) else None
    for entry in methods:
        if type(entry) is not list or len(entry) != 9:
            raise ProtocolError("bad worker group record: a method")
        name, method, role, mode_name, dref, cref, execute, blocking, padding = entry
        texts_ok = isinstance(name, str) and isinstance(method, str) and isinstance(execute, str)
        refs_ok = isinstance(dref, FunctionRef) and isinstance(cref, FunctionRef)
        if not (texts_ok and refs_ok and name.isidentifier() and not name.startswith("_")):
            raise ProtocolError(f"bad worker group record: method {name!r:.100}")
        if dref.pickled is not None or cref.pickled is not None:
            raise ProtocolError("bad worker group record: dispatch functions travel by name")
        if execute not in Execute._registry or not isinstance(role, (str, type(None))):
            raise ProtocolError(f"bad worker group record: method {name!r}")
        try:
            mode: Any = (
                Dispatch.register(mode_name)
                if isinstance(mode_name, str)
                else {"dispatch_fn": _unresolved, "collect_fn": _unresolved}
            )
        except ValueError:
            raise ProtocolError(f"bad dispatch mode {mode_name!r:.100}") from None
        attrs = MethodAttrs(mode, Execute._registry[execute], bool(blocking), bool(padding))
        wg._bind_one(name, GroupMethod(wg, method, attrs, role, (dref, cref)))
    return wg


def _unresolved(*args: Any, **kwargs: Any) -> Any:
    raise AssertionError("a travelled group's dispatch functions are resolved from its refs")


register_extension(
    WorkerGroup, "rayless.single_controller.worker_group", _group_state, _group_from_state
)
