"""``@ray.remote`` classes: ``ActorClass`` (``.remote()``, ``.options()``) and
``ActorHandle`` (``handle.method.remote(x)`` → ``ObjectRef``), over rayless actors.

``A.remote(...)`` starts a rayless actor of the class: at once and in the background for an
anonymous actor (a failed start fails its calls with ``ActorDiedError``, as in Ray), before
returning for a named one (so a taken name raises ``ValueError`` there, as in Ray). Method
calls go straight to rayless' call path; ``ObjectRef`` and ``ActorHandle`` arguments are
resolved first (refs at the top level, handles also inside a list, tuple or dict, where a
handle of an actor still starting is waited for). A ref inside such a list, tuple or dict is
waited for and travels as a ref, with its value (``object_ref``). A handle deeper inside a
value, or passed through a rayless handle's call, travels as the rayless handle it wraps once
its actor has started.

A handle that reaches another process (an argument of a task or actor call) arrives as
rayless' own ``rayless.actors.ActorHandle``: ``isinstance(h, ray.actor.ActorHandle)`` holds
for it too, and its ``h.method.remote(x)`` futures work with ``ray.get`` and ``ray.wait``.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import inspect
import sys
from collections.abc import Mapping
from typing import Any

from rayless.actors import BUILTIN_METHODS, Cluster, RemoteStream, concurrency_group
from rayless.actors import ActorHandle as _RaylessHandle
from rayless.actors.ext import (
    check_params,
    current_handle,
    method_of,
    params_of,
    public_methods,
)
from rayless.errors import ActorDiedError as _RaylessDied
from rayless.errors import (
    ActorNotFoundError,
    NameTakenError,
    RaylessError,
    RemoteError,
    ResourcesBusyError,
)
from rayless.ray import _lifetime, _worker
from rayless.ray.exceptions import ActorDiedError, _mixed, map_error
from rayless.ray.generator import ObjectRefGenerator
from rayless.ray.object_ref import ObjectRef
from rayless.ray.options import (
    ACTOR_OPTIONS,
    Placement,
    check,
    check_group,
    env_for,
    executable_for,
    packages_for,
    place,
    template_for,
)
from rayless.transport import ProtocolError, register_extension

__all__ = ["ActorClass", "ActorHandle", "ActorMethod", "exit_actor", "method"]

# where an actor process finds a decorated class by its qualified name: the attribute of the
# ActorClass that stands for it in its module
_HIDDEN = "_ray_cls"
_RETRY_PAUSE = 0.05  # seconds before a call retried on a restarting actor
STREAMING = "streaming"  # num_returns of a generator task or method (an ObjectRefGenerator)
# rayless.actors.Cluster.spawn's own keyword arguments: a constructor keyword of one of
# these names is passed positionally
_SPAWN_KEYWORDS = frozenset(inspect.signature(Cluster.spawn).parameters) - {
    "self",
    "cls",
    "args",
    "kwargs",
}


def _shown(cls: type) -> str:
    """The class's qualified name as its user wrote it (without ``._ray_cls``)."""
    return cls.__qualname__.removesuffix("." + _HIDDEN)


def is_generator(fn: Any) -> bool:
    """Whether ``fn`` is a ``def`` or ``async def`` generator (Ray streams its results)."""
    return inspect.isgeneratorfunction(fn) or inspect.isasyncgenfunction(fn)


def method(*args: Any, **kwargs: Any) -> Any:
    """``@ray.method(num_returns=k, concurrency_group=name)``: a method's default call options
    (``concurrency_group``: the actor's group its calls run in).

    Raises:
        ValueError: ``concurrency_group`` is not a non-empty string.
    """
    group = kwargs.get("concurrency_group")
    in_group = None if group is None else concurrency_group(group)

    def mark(fn: Any) -> Any:
        fn.__ray_method_options__ = dict(kwargs)
        return fn if in_group is None else in_group(fn)

    if args and callable(args[0]) and not kwargs:
        return mark(args[0])
    return mark


def exit_actor() -> None:
    """End this actor (``sys.exit(0)``: callers get ``ActorDiedError``)."""
    raise SystemExit(0)


class ActorClass:
    """A class made remote by ``@ray.remote``: ``A.remote(...)`` starts an actor of it."""

    def __init__(self, cls: type, options: dict[str, Any]) -> None:
        self._ray_cls = cls
        self._options = check(options, ACTOR_OPTIONS, "actor")
        # name -> what a caller needs of the method (its parameters: calls are checked)
        self._methods = public_methods(cls, hooks=False)
        init = inspect.getattr_static(cls, "__init__", None)
        new: object = cls.__new__
        plain = init is object.__init__ and new is object.__new__  # takes no arguments
        self._init_params = "" if plain else params_of(init, method=True)
        # a generator method streams (an ObjectRefGenerator) unless @ray.method says how
        # many values it returns, as in Ray
        self._num_returns = {
            n: getattr(getattr(cls, n), "__ray_method_options__", {}).get(
                "num_returns", STREAMING if is_generator(getattr(cls, n)) else 1
            )
            for n in self._methods
        }
        self.__doc__ = cls.__doc__
        self.__name__ = cls.__name__
        self.__qualname__ = _shown(cls)
        self.__module__ = cls.__module__

    def __mro_entries__(self, bases: tuple[Any, ...]) -> tuple[type, ...]:
        raise TypeError(
            "Inheriting from actor classes is not allowed. Inherit from the undecorated class "
            "instead (as in Ray)."
        )

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        raise TypeError(
            f"Actors cannot be instantiated directly. Instead of '{self.__name__}()', use "
            f"'{self.__name__}.remote()'."
        )

    def options(self, **options: Any) -> ActorClass:
        """This class with ``options`` over its own (``A.options(num_gpus=1).remote()``).

        Raises:
            ValueError: an unsupported option (named).
        """
        derived = ActorClass.__new__(ActorClass)
        derived.__dict__.update(self.__dict__)
        derived._options = check({**self._options, **options}, ACTOR_OPTIONS, "actor")
        return derived

    def remote(self, *args: Any, **kwargs: Any) -> ActorHandle:
        """Start an actor of the class; its handle.

        Raises:
            ValueError: a named actor's name is taken (unless ``get_if_exists``), or the
                options schedule it into a removed placement group.
            ActorDiedError: (a named actor, started before this returns) its constructor
                raised, or no node can hold it (the rayless error kept as its cause).
        """
        check_params(self._init_params, lambda: f"{_shown(self._ray_cls)}()", args, kwargs)
        s = _worker.session()
        opts = self._options
        check_group(opts)
        name = opts.get("name")
        if name is not None and (not isinstance(name, str) or not name):
            raise ValueError(f"an actor's name must be a non-empty string, got {name!r}")
        coro = _spawn(s, self._ray_cls, args, kwargs, opts)
        handle = ActorHandle(
            _shown(self._ray_cls),
            self._methods,
            {**opts, "__num_returns__": self._num_returns},
        )
        if name is not None and not _worker.on_loop(s):
            try:
                handle._inner = _worker.run(s, coro)
            except BaseException as exc:
                raise _start_error(exc) from None
            return handle
        handle._pending = _worker.submit(s, coro)
        if name is None and opts.get("lifetime") != "detached":
            # ended once its handle is gone, as in Ray (named and detached ones are kept)
            handle._scope = _lifetime.own(s, handle, handle._pending)
        return handle

    def __repr__(self) -> str:
        return f"ActorClass({self.__qualname__})"


def remote_class(cls: type, options: dict[str, Any]) -> ActorClass:
    """``@ray.remote`` on a class: the ActorClass that stands for it in its module. The class
    itself stays reachable by its qualified name (``A._ray_cls``), so an actor
    process importing it by name finds the class, not the ActorClass; ``ray.remote(A)`` called
    on a class its module keeps as it is changes nothing. A class defined inside a
    function travels by value (cloudpickle), as a class of the driver's ``__main__`` does."""
    if "<locals>" in cls.__qualname__:
        cls.__module__ = "__main__"  # not importable: it travels by value, as in Ray
    elif _found_at(cls) is not cls and not cls.__qualname__.endswith("." + _HIDDEN):
        # the decorator form: the module's name for it is about to be the ActorClass
        cls.__qualname__ = f"{cls.__qualname__}.{_HIDDEN}"
    return ActorClass(cls, options)


def _found_at(cls: type) -> Any:
    """What the class's module holds at its qualified name now (None: nothing)."""
    obj: Any = sys.modules.get(cls.__module__)
    for part in cls.__qualname__.split("."):
        obj = getattr(obj, part, None)
    return obj


def qualified_name(s: _worker.Session, name: str, namespace: str | None) -> str:
    """The rayless name of a named actor: ``namespace/name`` when a namespace applies."""
    ns = namespace if namespace is not None else s.namespace
    return name if ns is None else f"{ns}/{name}"


def _positional(
    cls: type, args: tuple[Any, ...], kwargs: dict[str, Any]
) -> tuple[tuple[Any, ...], dict[str, Any]]:
    """Constructor arguments with keywords that ``spawn`` would take as its own made
    positional.

    Raises:
        TypeError: a keyword-only constructor parameter has such a name.
    """
    if not _SPAWN_KEYWORDS.intersection(kwargs):
        return args, kwargs
    bound = inspect.signature(cls).bind(*args, **kwargs)
    clash = _SPAWN_KEYWORDS.intersection(bound.kwargs)
    if clash:
        raise TypeError(
            f"{_shown(cls)}(): keyword-only parameters {sorted(clash)} clash with "
            "rayless spawn options; make them positional-or-keyword"
        )
    return tuple(bound.args), dict(bound.kwargs)


async def resolve(value: Any) -> Any:
    """``value`` ready to send: a ref's value, an ActorHandle's rayless handle (also one
    level inside lists, tuples and dicts); refs one level inside those made (they travel as
    refs, with their outcome: ``object_ref``), also in a ref's value (``ray.put([r1, r2])``)."""
    if isinstance(value, ObjectRef):
        value = await value
    if type(value) is ActorHandle:
        return await value_handle(value)
    is_dict = isinstance(value, dict)
    if not (is_dict or isinstance(value, (list, tuple))):
        return value
    kinds = set(map(type, value.values() if is_dict else value))  # one pass, in C
    if ObjectRef in kinds:
        for v in value.values() if is_dict else value:
            if type(v) is ObjectRef:
                await v.settled()
    if ActorHandle not in kinds:
        return value
    if is_dict:
        return {k: await value_handle(v) for k, v in value.items()}
    items = [await value_handle(v) for v in value]
    return type(value)(items) if isinstance(value, tuple) else items


async def value_handle(v: Any) -> Any:
    """``v``'s rayless handle when it is an ActorHandle about to leave this process."""
    if type(v) is not ActorHandle:
        return v
    v._escaped()
    return await v._resolved()


def needs_resolve(args: tuple[Any, ...], kwargs: dict[str, Any]) -> bool:
    """Whether an argument is a ref or a handle (or a container holding one)."""
    for v in (*args, *kwargs.values()):
        t = type(v)
        if t is ObjectRef or t is ActorHandle:
            return True
        if t in (list, tuple) and not _RESOLVED.isdisjoint(map(type, v)):
            return True
        if t is dict and not _RESOLVED.isdisjoint(map(type, v.values())):
            return True
    return False


async def resolve_all(
    args: tuple[Any, ...], kwargs: dict[str, Any]
) -> tuple[tuple[Any, ...], dict[str, Any]]:
    """Every argument :func:`resolve`d."""
    return tuple([await resolve(a) for a in args]), {k: await resolve(v) for k, v in kwargs.items()}


async def _spawn(
    s: _worker.Session,
    cls: type,
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
    opts: dict[str, Any],
) -> _RaylessHandle[Any]:
    cluster = await s.cluster()
    name = opts.get("name")
    rname = qualified_name(s, name, opts.get("namespace")) if name else None
    if rname is not None and opts.get("get_if_exists"):
        try:
            return await cluster.get_actor(rname)
        except ActorNotFoundError:
            pass
    args, kwargs = await resolve_all(args, kwargs)
    args, kwargs = _positional(cls, args, kwargs)
    where: Placement = await place(s, opts)

    async def start() -> _RaylessHandle[Any]:
        packages = await packages_for(s, opts)
        return await cluster.spawn(
            cls,
            *args,
            name=rname,
            node=where.node,
            gpus=float(opts.get("num_gpus") or 0),
            cpus=float(opts["num_cpus"]) if opts.get("num_cpus") is not None else 1.0,
            max_restarts=max(0, int(opts.get("max_restarts") or 0)),
            max_concurrency=opts.get("max_concurrency"),
            concurrency_groups=opts.get("concurrency_groups"),
            template=template_for(),
            hooks=False,  # a Ray class's setup/teardown are its own methods
            check_names=False,  # so are its `name`, `address`...: reached by method_of
            env=env_for(s, opts, packages),
            packages=packages,
            executable=executable_for(s, opts),
            detached=opts.get("lifetime") == "detached",
            gpu_indices=where.gpu_indices,
            **kwargs,
        )

    try:
        deadline = s.loop.time() + _lifetime.END_WAIT
        while True:
            try:
                handle: _RaylessHandle[Any] = await start()
                break
            except ResourcesBusyError:
                # actors whose handles were just dropped are still ending: their resources
                # come back as they end (a drop-then-start loop must not fail on its own
                # leftovers); tried again after each end
                if not await _lifetime.ended(s, deadline - s.loop.time()):
                    raise
    except NameTakenError:
        where.release()
        if rname is None or not opts.get("get_if_exists"):
            raise
        # another driver or actor started it since the lookup above: that one, as in Ray
        return await cluster.get_actor(rname)
    except BaseException:
        where.release()
        raise
    if where.group is not None:
        where.group.actors.append(handle)
    if where.bundle is not None:
        s.placements[handle.actor_id] = where
    return handle


def _start_error(exc: BaseException) -> BaseException:
    """The error a failed actor start raises: a taken name or a bad option as itself, a
    constructor's error or an unplaceable request as Ray's ActorDiedError (keeping it)."""
    if isinstance(exc, NameTakenError):
        return map_error(exc)  # Ray's ActorAlreadyExistsError, a ValueError
    if isinstance(exc, (ValueError, TypeError)) and not isinstance(exc, RemoteError):
        return exc
    if isinstance(exc, (RaylessError, RemoteError)):
        out = _mixed(ActorDiedError, exc)
        if isinstance(out, ActorDiedError):
            out.error_msg = f"The actor died because of an error raised in its creation task: {exc}"
        return out
    return exc


class _HandleType(type):
    def __instancecheck__(cls, obj: Any) -> bool:
        return type.__instancecheck__(cls, obj) or isinstance(obj, _RaylessHandle)


class ActorHandle(metaclass=_HandleType):
    """A handle on a Ray-style actor: ``handle.method.remote(x)`` returns an ObjectRef.

    ``isinstance(h, ActorHandle)`` also holds for a rayless handle (how a handle arrives in
    another process).
    """

    def __init__(
        self,
        cls_name: str,
        methods: Mapping[str, Any] | None,  # name -> MethodInfo
        options: dict[str, Any],
        inner: _RaylessHandle[Any] | None = None,
    ) -> None:
        self._cls_name = cls_name
        self._methods = methods
        self._opts = options
        self._inner: _RaylessHandle[Any] | None = inner
        self._pending: asyncio.Future[Any] | concurrent.futures.Future[Any] | None = None
        self._scope: _lifetime.Scope | None = None  # started here: ended when collected

    def _escaped(self) -> None:
        """This handle is leaving the process: its actor is no longer ended by its scope."""
        if self._scope is not None:
            self._scope.escaped = True

    async def _resolved(self) -> _RaylessHandle[Any]:
        if self._inner is None:
            assert self._pending is not None
            fut = self._pending
            try:
                if isinstance(fut, asyncio.Future):
                    inner = await asyncio.shield(fut)
                else:
                    inner = await asyncio.shield(asyncio.wrap_future(fut))
            except BaseException as exc:
                raise _start_error(exc) from None
            self._inner = inner
        return self._inner

    def _wait_started(self) -> _RaylessHandle[Any]:
        if self._inner is None:
            s = _worker.session()
            return _worker.run(s, self._resolved())
        return self._inner

    def _method_infos(self) -> Mapping[str, Any] | None:
        """The actor's methods (name -> MethodInfo): its records once started, else its
        class's; None where unknown."""
        inner = self._inner
        return self._methods if inner is None or inner.methods is None else inner.methods

    def __getattr__(self, name: str) -> ActorMethod:
        # (methods are not cached on the handle: a method holds its handle, and that cycle
        # would keep the handle from being collected when its caller drops it)
        if name in BUILTIN_METHODS:  # __ray_ready__, __ray_terminate__: every actor answers them
            return ActorMethod(self, name)
        if name.startswith("_"):
            raise AttributeError(name)
        methods = self._method_infos()
        if methods is not None and name not in methods:
            raise AttributeError(
                f"'{self._cls_name}' actor has no method {name!r}; its methods: "
                f"{', '.join(sorted(methods)) or 'none'}"
            )
        num_returns = self._opts.get("__num_returns__", {}).get(name)
        if num_returns is None:  # a handle of ray.get_actor: what the actor's records say
            info = methods.get(name) if methods is not None else None
            num_returns = STREAMING if getattr(info, "is_generator", False) else 1
        return ActorMethod(self, name, num_returns)

    @property
    def _actor_id(self) -> Any:
        return _Id(self._wait_started().actor_id)

    def __repr__(self) -> str:
        inner = self._inner
        return f"Actor({self._cls_name}, {inner.actor_id if inner is not None else 'starting'})"

    def __eq__(self, other: object) -> bool:
        if isinstance(other, ActorHandle) and type(other) is ActorHandle:
            if self is other:
                return True
            return (
                self._inner is not None and other._inner is not None and self._inner == other._inner
            )
        return False

    def __hash__(self) -> int:
        return id(self) if self._inner is None else hash(self._inner)

    def __reduce__(self) -> Any:
        raise TypeError(
            "a ray ActorHandle travels as an argument of a task or actor call (top level, or "
            "inside a list, tuple or dict), not pickled"
        )


class _Id:
    def __init__(self, value: str) -> None:
        self._value = value

    def hex(self) -> str:
        return self._value


class ActorMethod:
    """One method of a Ray-style actor: ``.remote(...)`` and ``.options(...)``."""

    __slots__ = ("_group", "_handle", "_name", "_num_returns")

    def __init__(
        self,
        handle: ActorHandle,
        name: str,
        num_returns: int | str = 1,
        group: str | None = None,
    ) -> None:
        self._handle = handle
        self._name = name
        self._num_returns = num_returns
        self._group = group  # the call's own concurrency group (None: the method's)

    def options(
        self,
        *,
        num_returns: int | str = 1,
        name: str | None = None,
        concurrency_group: str | None = None,
        **_: Any,
    ) -> ActorMethod:
        """The method with call options (``num_returns``: an int, or ``"streaming"`` for a
        generator method; ``name`` only names the call; ``concurrency_group``: the actor's
        group the call runs in instead of the method's, an undefined one failing the call).

        Raises:
            ValueError: a bad ``num_returns`` or ``concurrency_group``.
        """
        if concurrency_group is not None and (
            not isinstance(concurrency_group, str) or not concurrency_group
        ):
            raise ValueError(
                f"concurrency_group must be a non-empty string, got {concurrency_group!r}"
            )
        if num_returns != STREAMING and (not isinstance(num_returns, int) or num_returns < 0):
            raise ValueError(
                f"num_returns must be an int >= 0 or {STREAMING!r}, got {num_returns!r}"
            )
        return ActorMethod(self._handle, self._name, num_returns, concurrency_group)

    def remote(self, *args: Any, **kwargs: Any) -> Any:
        """Call the method; its ObjectRef (a list of ``num_returns`` refs when that is not 1;
        an ObjectRefGenerator for a generator method)."""
        handle = self._handle
        inner = handle._inner
        name = self._name
        methods = handle._method_infos()
        info = methods.get(name) if methods else None
        if info is not None and info.params is not None:  # Ray checks them at once too
            check_params(info.params, lambda: f"{handle._cls_name}.{name}", args, kwargs)
        s = _worker.session()
        retries = handle._opts.get("max_task_retries") or 0
        fut: Any
        group = self._group
        if retries and handle._opts.get("max_restarts"):
            fut = _worker.submit(s, _call_retrying(handle, name, args, kwargs, retries, group))
        elif inner is not None and (not (args or kwargs) or not needs_resolve(args, kwargs)):
            fut = _send(s, inner, name, args, kwargs, group)
        else:
            fut = _worker.submit(s, _call_resolved(handle, name, args, kwargs, group))
        scope = handle._scope
        if scope is not None:  # ended by scope: only once this call is answered
            scope.track(fut)
        if self._num_returns == 1:
            own = current_handle()  # None but in an actor process
            if own is None or inner is None or inner.actor_id != own.actor_id:
                return ObjectRef(fut, s.generation)
            return ObjectRef(fut, s.generation, self_call=(name, group))
        if self._num_returns == STREAMING:
            gen = ObjectRefGenerator(s, fut, task=False)
            if scope is not None:  # and its stream ended (read out, closed or dropped)
                scope.track(gen.finished)
            return gen
        return split(s, fut, int(self._num_returns))

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        raise TypeError(
            f"Actor methods cannot be called directly. Instead of '{self._name}()', try "
            f"'{self._name}.remote()'."
        )

    def bind(self, *args: Any, **kwargs: Any) -> Any:
        """Ray's DAG API is not supported."""
        raise NotImplementedError("Ray DAGs (.bind) are not supported by rayless.ray")


def _send(
    s: _worker.Session,
    inner: _RaylessHandle[Any],
    name: str,
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
    group: str | None = None,
) -> Any:
    """Start the call on the session's loop: rayless' own path from this thread."""
    method = _method(inner, name, group)
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return method.remote(*args, **kwargs)  # a thread: the home loop
    if _worker.on_loop(s):
        return method(*args, **kwargs)
    return asyncio.run_coroutine_threadsafe(_invoke(method, args, kwargs), s.loop)


def _method(inner: _RaylessHandle[Any], name: str, group: str | None) -> Any:
    """The rayless method ``name`` of ``inner``, its calls in concurrency group ``group``."""
    method = method_of(inner, name)
    return method if group is None else method.options(concurrency_group=group)


async def _invoke(method: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    return await method(*args, **kwargs)


async def _call_resolved(
    handle: ActorHandle,
    name: str,
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
    group: str | None = None,
) -> Any:
    inner = await handle._resolved()
    args, kwargs = await resolve_all(args, kwargs)
    return await _method(inner, name, group)(*args, **kwargs)


async def _call_retrying(
    handle: ActorHandle,
    name: str,
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
    retries: int,
    group: str | None = None,
) -> Any:
    """A call retried on the restarted actor when the actor dies under it
    (``max_task_retries``; -1: as long as it restarts)."""
    attempt = 0
    while True:
        try:
            return await _call_resolved(handle, name, args, kwargs, group)
        except _RaylessDied:
            if retries != -1 and attempt >= retries:
                raise
            attempt += 1
            await asyncio.sleep(_RETRY_PAUSE)


async def drain(stream: RemoteStream, n: int) -> Any:
    """The items of a generator's stream as the values of ``num_returns=n`` (the one item for
    n=1).

    Raises:
        ValueError: it yielded another number of items.
    """
    items = [item async for item in stream]
    if len(items) != n:
        raise ValueError(f"num_returns={n}, but the generator yielded {len(items)} values")
    return items[0] if n == 1 else items


def split(s: _worker.Session, fut: Any, n: int, *, task: bool = False) -> list[ObjectRef]:
    """``n`` refs for the items of one result (``num_returns=n``)."""
    outs: list[concurrent.futures.Future[Any]] = [concurrent.futures.Future() for _ in range(n)]

    def done(f: Any) -> None:
        if f.cancelled():
            for o in outs:
                o.cancel()
            return
        exc = f.exception()
        if exc is None:
            value = f.result()
            if isinstance(value, RemoteStream):  # a generator method: its items are the values
                drained = asyncio.run_coroutine_threadsafe(drain(value, n), s.loop)
                drained.add_done_callback(done)
                return
            if not isinstance(value, (list, tuple)) or len(value) != n:
                exc = ValueError(
                    f"num_returns={n}, but the result is {type(value).__name__} {value!r:.80}"
                )
            else:
                for o, v in zip(outs, value, strict=True):
                    o.set_result(v)
                return
        for o in outs:
            o.set_exception(exc)

    fut.add_done_callback(done)
    return [ObjectRef(o, s.generation, task=task) for o in outs]


def from_rayless(handle: _RaylessHandle[Any]) -> ActorHandle:
    """A Ray-style handle on a rayless actor (``ray.get_actor``)."""
    return ActorHandle(handle.cls_name.removesuffix("." + _HIDDEN), None, {}, handle)


def _handle_state(h: ActorHandle) -> _RaylessHandle[Any]:
    """A Ray-style handle inside a value (a list an actor sends, a handle passed through a
    rayless handle's call): it travels as the rayless handle it wraps.

    Raises:
        TypeError: the actor is still starting (a top-level argument of a call waits for it;
            a handle inside a value cannot).
    """
    if h._inner is None:
        raise TypeError(
            f"actor {h._cls_name} is still starting: pass its handle as an argument of a call, "
            "or wait for it (ray.get(handle.__ray_ready__.remote())) before sending it in a value"
        )
    h._escaped()
    return h._inner


def _handle_from_state(inner: Any) -> _RaylessHandle[Any]:
    if not isinstance(inner, _RaylessHandle):
        raise ProtocolError("bad Ray actor handle record")
    return inner  # it arrives as rayless' own handle, as every handle passed to a process does


register_extension(ActorHandle, "rayless.ray.actor_handle", _handle_state, _handle_from_state)
_RESOLVED = frozenset((ObjectRef, ActorHandle))  # what needs_resolve looks for in a container
