"""Actor handles: how callers reach an actor. Plain, encodable data; any process can use one.

A handle knows its class's public methods (the actor process reports them when it starts;
the list travels inside the handle, so a handle passed to another actor is just as strict):
``handle.typo`` raises AttributeError at once, naming the class and its methods, and
``dir(handle)`` lists them. Names starting with ``_`` are refused locally.

One call semantics:

* ``handle.method(x)`` (alias ``.submit(x)``) sends the call at once and returns an
  ``asyncio.Future`` of its result; await it, gather it, or drop it (fire and forget). It
  needs a running event loop (RuntimeError otherwise, naming ``.call``/``.remote``).
* ``handle.method.remote(x)`` (Ray's spelling) is the same inside a running loop; from plain
  threaded code it runs on the process's home loop (``actors.api.portal``) and returns a
  ``concurrent.futures.Future`` that ``SyncCluster.get``/``wait`` accept.
* ``handle.method.call(x)`` blocks until the result, from threads without a running loop;
  inside an event loop (an actor's async method, async code) it raises RuntimeError instead of
  blocking the loop (an actor calling itself that way would deadlock).

A call's arguments are checked against the method's parameters before it is sent (a wrong
call is a TypeError in the caller, ``actors.api.binding``), and a method marked
``@endpoint(timeout=S)`` has S as its calls' default deadline.

``actors.endpoint`` is also how a class marks its remote methods (``@endpoint``, then only
those are remote) and, as ``endpoint(handle, Cls.method)``, a typed view of one method (its
parameters and result type checked by mypy); ``wait`` and ``gather`` work over the futures,
like ``ray.wait``/``ray.get``.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
from collections.abc import Awaitable, Callable, Coroutine, Iterable, Mapping
from typing import Any, Concatenate, Generic, ParamSpec, TypeVar, overload

from rayless.actors.api.actor import dumps_by_value
from rayless.actors.api.binding import BUILTINS, CALL, check_arguments, endpoint_marker
from rayless.actors.api.calls import has_futures, resolve_futures
from rayless.actors.api.portal import run_sync, submit_sync
from rayless.actors.api.runtime import fast_submit, get_runtime
from rayless.actors.protocol.messages import ActorView, MethodInfo
from rayless.transport.codec import register_extension
from rayless.transport.errors import Timeout

P = ParamSpec("P")
R = TypeVar("R")
T = TypeVar("T")
F = TypeVar("F", asyncio.Future[Any], concurrent.futures.Future[Any])
FN = TypeVar("FN")

_FIELDS = ("actor_id", "address", "call_timeout", "cls_name", "methods", "name", "node_id")
# the handle's own names: an actor class whose public methods use one is refused at spawn
HANDLE_NAMES = frozenset({*_FIELDS, "from_record", "with_timeout"})
_INFLIGHT: set[asyncio.Future[Any]] = set()  # calls started by handle.m(x): owned until done


class ActorHandle(Generic[T]):
    """A reference to a live actor of class ``T``. Attribute access gives its methods.

    ``methods`` maps each remote method's name to its :class:`MethodInfo` (a bool, for a
    handle built by hand: whether it is async, its arguments unchecked); None means unknown,
    and then any public name is tried (the actor refuses unknown ones).
    """

    __slots__ = (*_FIELDS, "__dict__")  # the dict caches the methods looked up (one each)

    def __init__(
        self,
        actor_id: str,
        name: str,
        address: str,
        cls_name: str = "",
        methods: Mapping[str, MethodInfo | bool] | None = None,
        node_id: str | None = None,
        call_timeout: float | None = None,
    ) -> None:
        self.call_timeout = _check_timeout(call_timeout)
        self.actor_id = actor_id
        self.name = name
        self.address = address
        self.cls_name = cls_name
        self.methods: dict[str, MethodInfo] | None = None if methods is None else _infos(methods)
        self.node_id = node_id

    @classmethod
    def from_record(cls, record: ActorView) -> ActorHandle[Any]:
        """A handle from the head's record of an actor."""
        return ActorHandle(
            record.actor_id, record.name, record.address, record.cls, record.methods, record.node_id
        )

    def with_timeout(self, seconds: float | None) -> ActorHandle[T]:
        """This handle with a default timeout for every call made through it (None: none).

        A call that times out raises Timeout and is cancelled in the actor; a method's own
        ``.options(timeout=...)`` wins. The timeout travels with the handle.

        Raises:
            ValueError: ``seconds`` is not a positive number.
        """
        h = self
        return ActorHandle(
            h.actor_id, h.name, h.address, h.cls_name, h.methods, h.node_id, call_timeout=seconds
        )

    def _describe(self) -> str:
        return f"actor {self.name!r} ({self.cls_name or '?'})"

    def __getattr__(self, method: str) -> ActorMethod[..., Any]:
        """The remote method ``method`` (also the built-ins ``__ray_ready__``,
        ``__ray_terminate__`` and ``__ray_call__``: ``actors.api.binding``).

        Raises:
            AttributeError: a private/dunder name, or not a public method of the class.
        """
        if method in BUILTINS:  # every actor answers these (Ray's names)
            return ActorMethod(self, method)
        if method.startswith("__") or method in _FIELDS:  # also: slots not set yet (copying)
            raise AttributeError(method)
        if method.startswith("_"):
            raise AttributeError(
                f"{self._describe()} has no public method {method!r} (names starting with '_' "
                "are never callable remotely)"
            )
        methods = self.methods
        if methods is not None and method not in methods:
            listed = ", ".join(sorted(methods)) or "none"
            raise AttributeError(
                f"{self._describe()} has no public method {method!r}; its methods: {listed}"
            )
        bound: ActorMethod[..., Any] = ActorMethod(self, method)
        self.__dict__[method] = bound  # found without __getattr__ from now on
        return bound

    def __dir__(self) -> list[str]:
        return sorted({*_FIELDS, "from_record", "with_timeout", *(self.methods or {})})

    def __repr__(self) -> str:
        return f"ActorHandle({self.name!r}, {self.cls_name}, node={self.node_id})"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, ActorHandle) and other.actor_id == self.actor_id

    def __hash__(self) -> int:
        return hash(self.actor_id)

    def _state(self) -> list[Any]:
        state = [self.actor_id, self.name, self.address, self.cls_name, self.methods, self.node_id]
        return state if self.call_timeout is None else [*state, self.call_timeout]


def method_of(handle: ActorHandle[Any], name: str) -> ActorMethod[..., Any]:
    """``handle``'s remote method ``name``, also one named as an attribute of the handle's own
    (``name``, ``address``...: a class spawned with ``check_names=False``).

    Raises:
        AttributeError: as attribute access does for a name that is no method.
    """
    if name in HANDLE_NAMES and (handle.methods is None or name in handle.methods):
        return ActorMethod(handle, name)
    method: ActorMethod[..., Any] = getattr(handle, name)
    return method


def _infos(methods: Mapping[str, MethodInfo | bool]) -> dict[str, MethodInfo]:
    return {
        name: info if isinstance(info, MethodInfo) else MethodInfo(is_async=bool(info))
        for name, info in methods.items()
    }


def check_method_names(cls_name: str, methods: Mapping[str, object]) -> None:
    """Refuse an actor class whose public methods would be shadowed by the handle's own
    attributes (``h.address`` would be the handle's address, not the method).

    Raises:
        TypeError: naming each clashing method and what to do.
    """
    clash = sorted(HANDLE_NAMES.intersection(methods))
    if clash:
        names = ", ".join(f"{n!r}" for n in clash)
        raise TypeError(
            f"actor class {cls_name} defines {names}, a name of the actor handle's own "
            f"attributes ({', '.join(sorted(HANDLE_NAMES))}): a call through the handle could "
            "not reach it; rename the method"
        )


def _check_timeout(seconds: float | None) -> float | None:
    """``seconds`` if None or a positive number.

    Raises:
        ValueError: anything else.
    """
    if seconds is None:
        return None
    if isinstance(seconds, bool) or not isinstance(seconds, (int, float)) or not seconds > 0:
        raise ValueError(f"a call timeout must be a positive number of seconds, got {seconds!r}")
    return float(seconds)


class ActorMethod(Generic[P, R]):
    """One method of an actor, bound to its handle (parameters ``P``, result ``R``)."""

    __slots__ = ("group", "handle", "info", "method", "timeout")

    def __init__(
        self,
        handle: ActorHandle[Any],
        method: str,
        timeout: float | None = None,
        group: str | None = None,
    ) -> None:
        self.handle = handle
        self.method = method
        self.group = group  # the concurrency group its calls run in (None: the method's)
        methods = handle.methods
        self.info = None if methods is None else methods.get(method)
        if timeout is None:
            timeout = handle.call_timeout
        if timeout is None and self.info is not None:
            timeout = self.info.timeout
        self.timeout = timeout

    def _describe(self) -> str:
        return f"{self.method}() of {self.handle._describe()}"

    def options(
        self, *, timeout: float | None = None, concurrency_group: str | None = None
    ) -> ActorMethod[P, R]:
        """This method with per-call options (Ray's ``actor.f.options(...)``).

        ``timeout``: seconds each call may take; past it the call raises Timeout and is
        cancelled in the actor (an async method's task is cancelled; a queued sync call is
        dropped, a running one runs to completion and keeps its concurrency slot until it returns).
        ``concurrency_group``: the actor's group its calls run in instead of the method's own
        (Ray's ``actor.f.options(concurrency_group=...)``); a group the actor does not define
        fails the call with a ``ValueError``.

        Raises:
            ValueError: ``timeout`` is not a positive number, ``concurrency_group`` is not a
                non-empty string.
        """
        if concurrency_group is not None and (
            not isinstance(concurrency_group, str) or not concurrency_group
        ):
            raise ValueError(
                f"concurrency_group must be a non-empty string, got {concurrency_group!r}"
            )
        group = self.group if concurrency_group is None else concurrency_group
        return ActorMethod(self.handle, self.method, _check_timeout(timeout), group)

    def __call__(self, *args: P.args, **kwargs: P.kwargs) -> asyncio.Future[R]:
        """Send the call now; an ``asyncio.Future`` of its result.

        Raises:
            TypeError: the arguments do not fit the method's parameters.
            RuntimeError: no event loop runs in this thread (use ``.call``/``.remote``).
        Raises (from the future):
            ActorDiedError: the actor died before or during the call.
            RemoteError: the method raised; also an instance of the original type where that
                type is loaded in this process (``except ValueError`` works).
        """
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            raise RuntimeError(
                f"{self.method}(...) of {self.handle._describe()} needs a running event loop; "
                f"from sync code use .{self.method}.call(...) (blocks) or "
                f".{self.method}.remote(...) (a concurrent.futures.Future)"
            ) from None
        if self.info is not None:
            check_arguments(self.info, self._describe, args, kwargs)
        sent: tuple[Any, ...] = self._shipped(args) if self.method == CALL else args
        fut: asyncio.Future[R] | None = None
        if not (sent or kwargs) or not has_futures(sent, kwargs):
            fut = fast_submit(self.handle, self.method, sent, kwargs, self.timeout, self.group)
        if fut is None:
            fut = loop.create_task(
                _call(self.handle, self.method, sent, kwargs, self.timeout, self.group)
            )
            _INFLIGHT.add(fut)
            fut.add_done_callback(_INFLIGHT.discard)
        return fut

    submit = __call__

    def remote(
        self, *args: P.args, **kwargs: P.kwargs
    ) -> asyncio.Future[R] | concurrent.futures.Future[R]:
        """Ray's spelling: ``handle.m(x)`` inside a running loop; from plain threads the call
        runs on the home loop and this returns a ``concurrent.futures.Future`` (for
        ``SyncCluster.get``/``wait``).

        Raises:
            TypeError: the arguments do not fit the method's parameters.
        """
        try:
            asyncio.get_running_loop()
        except RuntimeError:
            if self.info is not None:
                check_arguments(self.info, self._describe, args, kwargs)
            sent: tuple[Any, ...] = self._shipped(args) if self.method == CALL else args
            return submit_sync(
                _call(self.handle, self.method, sent, kwargs, self.timeout, self.group)
            )
        return self(*args, **kwargs)

    def call(self, *args: Any, timeout: float | None = None, **kwargs: Any) -> R:
        """Call from sync code and block until the result (at most ``timeout`` seconds,
        default the method's or handle's timeout).

        Raises:
            Timeout: no result within ``timeout`` (the call is cancelled in the actor).
            RuntimeError: an event loop runs in this thread (an actor's async method, async
                code): blocking it would stall it, and an actor calling itself would deadlock;
                ``await handle.method(x)`` there.
            TypeError: the arguments do not fit the method's parameters.
        """
        if self.info is not None:
            check_arguments(self.info, self._describe, args, kwargs)
        if self.method == CALL:
            args = self._shipped(args)
        timeout = self.timeout if timeout is None else timeout
        result: R = run_sync(
            _call(self.handle, self.method, args, kwargs, timeout, self.group), timeout
        )
        return result

    def _shipped(self, args: tuple[Any, ...]) -> tuple[Any, ...]:
        """``CALL``'s arguments as they travel: its function pickled by value.

        Raises:
            TypeError: the first argument is not callable, or cannot be pickled.
        """
        if not args or not callable(args[0]):
            raise TypeError(
                f"{CALL}(fn, *args, **kwargs) of {self.handle._describe()} takes a function "
                f"first, got {args[:1]!r:.80}"
            )
        return (dumps_by_value(args[0]), *args[1:])

    def __repr__(self) -> str:
        return f"<method {self.method} of {self.handle!r}>"


@overload
def endpoint(
    handle: ActorHandle[T], fn: Callable[Concatenate[T, P], Coroutine[Any, Any, R]]
) -> ActorMethod[P, R]: ...
@overload
def endpoint(handle: ActorHandle[T], fn: Callable[Concatenate[T, P], R]) -> ActorMethod[P, R]: ...
@overload
def endpoint(handle: FN, fn: None = None) -> FN: ...
@overload
def endpoint(*, timeout: float | None = None) -> Callable[[FN], FN]: ...
def endpoint(
    handle: Any = None, fn: Callable[..., Any] | None = None, *, timeout: float | None = None
) -> Any:
    """Three forms, one concept (a remote method of an actor):

    * ``@endpoint`` on a method marks it remote; a class that marks any method exposes only
      the marked ones (a class that marks none: every public method);
    * ``@endpoint(timeout=S)`` also gives its calls a default deadline of S seconds;
    * ``endpoint(counter, Counter.add)(1)`` is a typed view of one method of a handle,
      checked by mypy against ``Counter.add``'s parameters and result (async methods give
      their awaited result).

    Raises:
        AttributeError: (a view) ``fn`` is not a public method of the handle's class.
        ValueError: ``timeout`` is not a positive number.
        TypeError: (a mark) what is marked is not callable.
    """
    if isinstance(handle, ActorHandle):
        name = getattr(fn, "__name__", None)
        if not isinstance(name, str):
            raise AttributeError(f"{fn!r} is not a method")
        method: ActorMethod[..., Any] = getattr(handle, name)
        return method
    if handle is None:
        return endpoint_marker(timeout=timeout)
    return endpoint_marker(handle, timeout=timeout)


async def _call(
    handle: ActorHandle[Any],
    method: str,
    args: tuple[Any, ...],
    kwargs: Any,
    timeout: float | None = None,
    group: str | None = None,
) -> Any:
    if (args or kwargs) and has_futures(args, kwargs):  # Ray resolves ObjectRef arguments
        args, kwargs = await resolve_futures(args, kwargs)
    runtime = await get_runtime()
    return await runtime.call(handle, method, args, kwargs, timeout, group)


async def wait(
    futures: Iterable[Awaitable[Any]],
    *,
    num_returns: int = 1,
    timeout: float | None = None,
) -> tuple[list[asyncio.Future[Any]], list[asyncio.Future[Any]]]:
    """Wait until ``num_returns`` of ``futures`` are done or ``timeout`` passes (``ray.wait``).

    Returns (ready, not_ready), each in the order given: ``ready`` holds at most
    ``num_returns`` futures, the first done ones in that order (fewer at a timeout);
    ``not_ready`` holds all the others, done or not (as Ray's remaining list).

    Raises:
        ValueError: ``num_returns`` is not between 1 and the number of futures.
    """
    futs: list[asyncio.Future[Any]] = [asyncio.ensure_future(f) for f in futures]
    if not 1 <= num_returns <= max(1, len(futs)):
        raise ValueError(f"num_returns must be in 1..{len(futs)}, got {num_returns}")
    if not futs:
        return [], []
    loop = asyncio.get_running_loop()
    deadline = None if timeout is None else loop.time() + timeout
    pending = {f for f in futs if not f.done()}
    while len(futs) - len(pending) < num_returns and pending:
        left = None if deadline is None else deadline - loop.time()
        if left is not None and left <= 0:
            break
        _, pending = await asyncio.wait(pending, timeout=left, return_when="FIRST_COMPLETED")
    return split_ready(futs, num_returns)


def split_ready(futs: list[F], num_returns: int) -> tuple[list[F], list[F]]:
    """``ray.wait``'s answer: the first ``num_returns`` done futures in the order given, and
    the rest in the order given."""
    ready: list[F] = []
    rest: list[F] = []
    for f in futs:
        (ready if len(ready) < num_returns and f.done() else rest).append(f)
    return ready, rest


async def gather(
    *aws: Awaitable[Any] | Iterable[Awaitable[Any]], timeout: float | None = None
) -> list[Any]:
    """All results in order (``ray.get`` of a list); the first error is raised.

    ``gather(f1, f2)`` and ``gather([f1, f2])`` (Ray's habit) are the same.

    Raises:
        Timeout: not all finished within ``timeout`` seconds (the rest are cancelled, in
            their actors too).
    """
    first = aws[0] if len(aws) == 1 else None
    items: list[Any] = list(first) if isinstance(first, (list, tuple)) else list(aws)
    gathered = asyncio.gather(*items)
    try:
        return list(await asyncio.wait_for(gathered, timeout))
    except asyncio.TimeoutError as exc:
        if gathered.done() and not gathered.cancelled() and gathered.exception() is exc:
            raise  # a result's own TimeoutError (e.g. a method's), not our timeout
        raise Timeout(f"not all {len(items)} results arrived within {timeout}s") from None


def _from_state(state: list[Any]) -> ActorHandle[Any]:
    return ActorHandle(*state)


register_extension(ActorHandle, "rayless.actor_handle", ActorHandle._state, _from_state)
