"""Which methods of an actor class are remote, what each looks like to a caller, and checking
a call's arguments on the caller's side.

* :func:`endpoint_marker` is ``@endpoint`` on a method (``rayless.actors.endpoint``, Monarch's
  model): a class that marks any of its methods exposes only the marked ones; a class that
  marks none exposes every public method (no leading underscore) as before. ``@endpoint
  (timeout=S)`` also gives the method's calls a default deadline.
* :func:`concurrency_group_marker` is ``@concurrency_group(name)`` on a method
  (``rayless.actors.concurrency_group``, Ray's ``@ray.method(concurrency_group=...)``): its
  calls run in that group of the actor's ``concurrency_groups``, beside the other groups' and
  the default group's calls, each group with its own limit.
* :func:`public_methods` builds each remote method's :class:`MethodInfo` once, when the class
  is spawned: async or not, its parameter list, its default timeout, its concurrency group.
  Handles carry them.
* :data:`READY`, :data:`EXIT` and :data:`CALL` are the methods every actor answers besides
  its class's own (Ray's names): ``READY`` returns True once the calls queued before it have
  run; ``EXIT`` ends the actor after them, as ``sys.exit(0)`` in a method would
  (``teardown`` runs; callers, its own included, get ``ActorDiedError``); ``CALL(fn, *args,
  **kwargs)`` returns ``fn(instance, *args, **kwargs)`` run in the actor (``fn`` travels by
  value, cloudpickled; an ``async def`` ``fn`` is awaited on the actor's loop).
* :func:`check_arguments` binds a call's arguments to that parameter list before anything is
  sent, so a wrong call is a ``TypeError`` in the caller, as calling the method locally would
  be (Ray checks ``.remote()`` arguments the same way).
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, TypeVar

from rayless.actors.protocol.messages import MethodInfo

__all__ = [
    "BUILTINS",
    "CALL",
    "EXIT",
    "READY",
    "EndpointOptions",
    "check_arguments",
    "check_params",
    "check_groups",
    "concurrency_group_marker",
    "endpoint_marker",
    "params_of",
    "public_methods",
]

FN = TypeVar("FN")
_MARK = "__rayless_endpoint__"
_GROUP = "__rayless_concurrency_group__"
_LIFECYCLE = frozenset({"setup", "teardown"})
READY = "__ray_ready__"  # → True, after the calls queued before it
EXIT = "__ray_terminate__"  # ends the actor after the calls queued before it
CALL = "__ray_call__"  # runs a function the caller sends on the instance (Ray's name)
BUILTINS = frozenset({READY, EXIT, CALL})


class _Default:
    """Stands for a default value: printed as nothing, so ``x=1`` reads ``x=``."""

    def __repr__(self) -> str:
        return ""


_DEFAULT = _Default()


@dataclass(frozen=True)
class EndpointOptions:
    """What ``@endpoint(...)`` said of a method."""

    timeout: float | None = None


def endpoint_marker(fn: Any = None, *, timeout: float | None = None) -> Any:
    """``@endpoint`` / ``@endpoint(timeout=S)``: mark a method as remotely callable.

    Raises:
        ValueError: ``timeout`` is not a positive number.
        TypeError: what is marked is not callable.
    """
    if timeout is not None and (
        isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or not timeout > 0
    ):
        raise ValueError(f"an endpoint's timeout must be a positive number, got {timeout!r}")
    mark = _marker("endpoint", _MARK, EndpointOptions(None if timeout is None else float(timeout)))
    return mark if fn is None else mark(fn)


def concurrency_group_marker(name: str) -> Callable[[FN], FN]:
    """``@concurrency_group(name)``: the method's calls run in the actor's concurrency group
    ``name`` (one of the ``concurrency_groups`` it is spawned with).

    Raises:
        ValueError: ``name`` is not a non-empty string.
        TypeError: what is marked is not callable.
    """
    if not isinstance(name, str) or not name:
        raise ValueError(f"a concurrency group's name must be a non-empty string, got {name!r}")
    return _marker("concurrency_group", _GROUP, name)


def _marker(decorator: str, attr: str, value: Any) -> Callable[[FN], FN]:
    """A decorator that sets ``attr`` to ``value`` on a method's function (a static or class
    method's own); ``TypeError`` for what is not callable."""

    def mark(f: FN) -> FN:
        inner = f.__func__ if isinstance(f, (staticmethod, classmethod)) else f
        if not callable(inner):
            raise TypeError(f"@{decorator} marks methods, not {type(f).__name__}")
        setattr(inner, attr, value)
        return f

    return mark


def check_groups(
    cls_name: str, methods: Mapping[str, MethodInfo], groups: Mapping[str, int]
) -> dict[str, int]:
    """``groups`` (a spawn's ``concurrency_groups``) checked against the methods they serve.

    Raises:
        ValueError: a group's name is not a non-empty string or its limit not an int >= 1, or
            a method names a group that ``groups`` does not define.
    """
    out: dict[str, int] = {}
    for name, limit in groups.items():
        if not isinstance(name, str) or not name:
            raise ValueError(f"a concurrency group's name must be a non-empty string: {name!r}")
        if isinstance(limit, bool) or not isinstance(limit, int) or limit < 1:
            raise ValueError(f"concurrency group {name!r} must allow an int >= 1, got {limit!r}")
        out[name] = limit
    for method, info in methods.items():
        if info.group is not None and info.group not in out:
            raise ValueError(
                f"{cls_name}.{method} runs in concurrency group {info.group!r}, which the "
                f"actor does not define (its concurrency_groups: {sorted(out)})"
            )
    return out


def _options(attr: Any) -> EndpointOptions | None:
    inner = attr.__func__ if isinstance(attr, (staticmethod, classmethod)) else attr
    found = getattr(inner, _MARK, None)
    return found if isinstance(found, EndpointOptions) else None


def public_methods(cls: type, hooks: bool = True) -> dict[str, MethodInfo]:
    """The remotely callable methods of ``cls`` and what callers need of each: its endpoints
    when it marks any, else every public method but the lifecycle hooks."""
    found: dict[str, tuple[Any, EndpointOptions | None]] = {}
    for name in dir(cls):
        if name.startswith("_") or (hooks and name in _LIFECYCLE):
            continue
        attr = inspect.getattr_static(cls, name, None)
        inner = attr.__func__ if isinstance(attr, (staticmethod, classmethod)) else attr
        if callable(inner) and not isinstance(inner, type):
            found[name] = (attr, _options(attr))
    if any(options is not None for _, options in found.values()):
        found = {n: (a, o) for n, (a, o) in found.items() if o is not None}
    return {
        name: MethodInfo(
            is_async=inspect.iscoroutinefunction(_function(attr)),
            params=_params(attr),
            timeout=None if options is None else options.timeout,
            is_generator=inspect.isgeneratorfunction(_function(attr))
            or inspect.isasyncgenfunction(_function(attr)),
            group=_group(attr),
        )
        for name, (attr, options) in found.items()
    }


def _group(attr: Any) -> str | None:
    """The concurrency group ``@concurrency_group`` gave the method, if any."""
    found = getattr(_function(attr), _GROUP, None)
    return found if isinstance(found, str) else None


def _function(attr: Any) -> Any:
    """The function of a class attribute (a static or class method's own)."""
    return attr.__func__ if isinstance(attr, (staticmethod, classmethod)) else attr


def _params(attr: Any) -> str | None:
    """``attr``'s parameters as a caller passes them (``self``/``cls`` dropped), as text; None
    where they cannot be read."""
    if isinstance(attr, staticmethod):
        fn, drop = attr.__func__, 0
    elif isinstance(attr, classmethod) or inspect.isfunction(attr):
        fn, drop = (attr.__func__ if isinstance(attr, classmethod) else attr), 1
    else:
        return None  # a callable object or a C function: its binding to the instance is unknown
    try:
        params = list(inspect.signature(fn).parameters.values())[drop:]
    except (TypeError, ValueError):
        return None
    plain = [
        p.replace(annotation=p.empty, default=p.empty if p.default is p.empty else _DEFAULT)
        for p in params
    ]
    return str(inspect.Signature(plain))[1:-1]


@functools.lru_cache(maxsize=4096)
def _signature(params: str) -> inspect.Signature:
    """The signature that ``params`` (:func:`_params`' text) describes, defaults as markers."""
    out: list[inspect.Parameter] = []
    kind: inspect._ParameterKind = inspect.Parameter.POSITIONAL_OR_KEYWORD
    for token in (t.strip() for t in params.split(",")) if params else ():
        if token == "/":
            out = [p.replace(kind=inspect.Parameter.POSITIONAL_ONLY) for p in out]
        elif token == "*":
            kind = inspect.Parameter.KEYWORD_ONLY
        elif token.startswith("**"):
            out.append(inspect.Parameter(token[2:], inspect.Parameter.VAR_KEYWORD))
        elif token.startswith("*"):
            out.append(inspect.Parameter(token[1:], inspect.Parameter.VAR_POSITIONAL))
            kind = inspect.Parameter.KEYWORD_ONLY
        else:
            name, eq, _ = token.partition("=")
            default = _DEFAULT if eq else inspect.Parameter.empty
            out.append(inspect.Parameter(name.strip(), kind, default=default))
    return inspect.Signature(out)


@dataclass(frozen=True)
class _Shape:
    """What a call must look like, precomputed from a parameter list for a quick check."""

    positional: tuple[str, ...]  # positional parameters in order
    positional_only: frozenset[str]
    var_positional: bool
    keywords: frozenset[str]  # names a keyword argument may have
    var_keyword: bool
    required: frozenset[str]  # parameters without a default

    least: int  # positional parameters without a default (they come first)
    keyword_required: bool  # a keyword-only parameter without a default

    def fits(self, args: tuple[Any, ...], kwargs: Mapping[str, Any]) -> bool:
        """Whether the call surely binds (False: let ``Signature.bind`` decide and explain)."""
        n = len(args)
        if n > len(self.positional) and not self.var_positional:
            return False
        if not kwargs:
            return n >= self.least and not self.keyword_required
        given = self.positional[:n]
        if kwargs:
            for key in kwargs:
                if key in given or key in self.positional_only:
                    return False
                if key not in self.keywords and not self.var_keyword:
                    return False
        return all(name in kwargs or name in given for name in self.required)


@functools.lru_cache(maxsize=4096)
def _shape(params: str) -> _Shape:
    sig = _signature(params).parameters.values()
    kinds = inspect.Parameter
    return _Shape(
        positional=tuple(
            p.name for p in sig if p.kind in (kinds.POSITIONAL_ONLY, kinds.POSITIONAL_OR_KEYWORD)
        ),
        positional_only=frozenset(p.name for p in sig if p.kind is kinds.POSITIONAL_ONLY),
        var_positional=any(p.kind is kinds.VAR_POSITIONAL for p in sig),
        keywords=frozenset(
            p.name for p in sig if p.kind in (kinds.POSITIONAL_OR_KEYWORD, kinds.KEYWORD_ONLY)
        ),
        var_keyword=any(p.kind is kinds.VAR_KEYWORD for p in sig),
        required=frozenset(
            p.name
            for p in sig
            if p.default is p.empty and p.kind not in (kinds.VAR_POSITIONAL, kinds.VAR_KEYWORD)
        ),
        least=sum(
            1
            for p in sig
            if p.default is p.empty
            and p.kind in (kinds.POSITIONAL_ONLY, kinds.POSITIONAL_OR_KEYWORD)
        ),
        keyword_required=any(p.default is p.empty and p.kind is kinds.KEYWORD_ONLY for p in sig),
    )


def check_arguments(
    info: MethodInfo | None,
    describe: Callable[[], str],
    args: tuple[Any, ...],
    kwargs: Mapping[str, Any],
) -> None:
    """Check that ``args``/``kwargs`` fit the method ``info`` describes (nothing to check
    where ``info`` or its parameters are unknown).

    Raises:
        TypeError: they do not, with Python's reason and the method ``describe()`` names.
    """
    if info is not None:
        check_params(info.params, describe, args, kwargs)


def check_params(
    params: str | None,
    describe: Callable[[], str],
    args: tuple[Any, ...],
    kwargs: Mapping[str, Any],
) -> None:
    """Check that ``args``/``kwargs`` fit the parameter list ``params`` (:func:`params_of`'s
    text; nothing to check where it is None).

    Raises:
        TypeError: they do not, with Python's reason and what ``describe()`` names.
    """
    if params is None or _shape(params).fits(args, kwargs):
        return
    try:
        _signature(params).bind(*args, **kwargs)
    except TypeError as exc:
        raise TypeError(f"{describe()}: {exc}") from None


def params_of(fn: Any, method: bool = False) -> str | None:
    """A function's parameters as :func:`check_params` takes them (a ``method``'s without
    ``self``); None where they cannot be read (a C function, a callable object)."""
    if not inspect.isfunction(fn):
        return None
    return _params(fn if method else staticmethod(fn))
