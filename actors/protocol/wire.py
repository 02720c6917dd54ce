"""Typed control-plane messages: frozen dataclasses registered with the codec, and dispatch.

:func:`message` registers a frozen dataclass with the codec's explicit extension table
(``transport.codec.register_extension``) under a stable wire name: it travels as an extension
record ``[name, [field values...]]`` inside the ordinary msgpack envelope. Decoding looks the
name up in that table only (a peer can never name any other class), then checks every field
against the dataclass's annotations (str, int, float, bool, bytes, None, unions, ``list``,
``tuple``, ``dict``, Enums by value, other registered messages, ``RaylessError``, ``Any``):
a malformed message raises ProtocolError, which the receiving server answers as a typed
error reply (a request) or drops and counts (a one-way message).

:class:`Handlers` is a dispatch table keyed by message type: exactly the types a process
answers, each with its handler; anything else is a ProtocolError naming it. A process marks
each handler with :func:`handles` and builds its tables from its handlers' owners, so that
answering a new message is one decorated method (plus the message's dataclass). A request
message derives from :class:`Request` ``[R]``, the type of its reply: :func:`ask` sends one
and returns an ``R`` (checked), so that mypy checks what senders do with replies.
"""

from __future__ import annotations

import dataclasses
import enum
import inspect
import logging
import types
import typing
from collections.abc import Callable
from typing import Any, ClassVar, Generic, TypeVar, Union, cast

from rayless.transport.client import Client
from rayless.transport.codec import register_extension
from rayless.transport.errors import ProtocolError, RaylessError

__all__ = ["MESSAGES", "Handlers", "Request", "ask", "check_reply", "handles", "message"]

M = TypeVar("M")
R = TypeVar("R", covariant=True)
P = TypeVar("P")  # who sent it, as the receiver knows them (a server's Peer; None on a client)
S = TypeVar("S")  # the object a handler is a method of
H = TypeVar("H")  # what a handler returns
_Check = Callable[[Any], Any]  # returns the value as the field holds it, or raises _Bad
MESSAGES: dict[str, type] = {}  # wire name -> class: every message this process can decode
_NAMES: dict[type, str] = {}
_HANDLES = "__rayless_handles__"  # a handler function's marks: [(message type, one-way?)]
log = logging.getLogger("rayless.control")


class Request(Generic[R]):
    """Base of a request message whose reply is an ``R``; ``reply`` is the class a reply
    must be an instance of (``type(None)`` for no reply value)."""

    __slots__ = ()
    reply: ClassVar[type] = object


def check_reply(msg: Request[R], reply: object) -> R:
    """``reply``, once it is the kind of answer ``msg`` gets.

    Raises:
        ProtocolError: it is not (a peer of another rayless version).
    """
    if not isinstance(reply, msg.reply):
        raise ProtocolError(
            f"{describe(msg)} was answered with {type(reply).__name__}, not {msg.reply.__name__}"
        )
    return cast(R, reply)


async def ask(client: Client, msg: Request[R], *, timeout: float | None = 60.0) -> R:
    """Send request ``msg`` and return its reply, checked.

    Raises:
        ProtocolError: the reply is not of the kind ``msg`` gets.
        RaylessError: whatever the request raised (the handler's error, as itself).
    """
    return check_reply(msg, await client.request(msg, timeout=timeout))


class _Bad(Exception):
    """A field value of the wrong type (turned into a ProtocolError naming the field)."""


def message(name: str) -> Callable[[type[M]], type[M]]:
    """Register a frozen dataclass as the control message called ``name`` on the wire.

    Raises:
        TypeError: the class is not a frozen dataclass, or a field's type is not supported.
        ValueError: ``name`` is taken by another class.
    """

    def register(cls: type[M]) -> type[M]:
        params = getattr(cls, "__dataclass_params__", None)
        if params is None or not params.frozen:
            raise TypeError(f"{cls.__qualname__} must be a frozen dataclass")
        hints = typing.get_type_hints(cls)
        fields = [f.name for f in dataclasses.fields(cls)]  # type: ignore[arg-type]
        checks = [_checker(hints[f], f"{cls.__qualname__}.{f}") for f in fields]
        plain = [_plain(hints[f]) or frozenset() for f in fields]
        spec = list(zip(fields, plain, checks, strict=True))
        enums = [i for i, f in enumerate(fields) if _is_enum_field(hints[f])]

        def to_state(obj: Any) -> list[Any]:
            values = [getattr(obj, f) for f in fields]
            for i in enums:
                if isinstance(values[i], enum.Enum):
                    values[i] = values[i].value
            return values

        def from_state(state: Any) -> Any:
            if type(state) is not list or len(state) != len(fields):
                raise ProtocolError(f"malformed {name} message: expected {len(fields)} fields")
            values = []
            for (field, exact, check), value in zip(spec, state, strict=True):
                if type(value) in exact:  # the common case: no call
                    values.append(value)
                    continue
                try:
                    values.append(check(value))
                except _Bad as exc:
                    raise ProtocolError(f"malformed {name} message: {field} {exc}") from None
            return cls(*values)

        register_extension(cls, name, to_state, from_state)
        MESSAGES[name] = cls
        _NAMES[cls] = name
        return cls

    return register


def _is_enum_field(hint: Any) -> bool:
    args = typing.get_args(hint) if _is_union(hint) else (hint,)
    return any(isinstance(a, type) and issubclass(a, enum.Enum) for a in args)


def _is_union(hint: Any) -> bool:
    return typing.get_origin(hint) is Union or isinstance(hint, types.UnionType)


_PLAIN = (str, int, bool, bytes, float, type(None))  # checked by exact type


def _plain(hint: Any) -> frozenset[type] | None:
    """The exact types a value of ``hint`` may have when that is all there is to check
    (``str``, ``int | None``...); None for anything else."""
    options = typing.get_args(hint) if _is_union(hint) else (hint,)
    options = tuple(type(None) if a is None else a for a in options)
    if all(a in _PLAIN for a in options):
        return frozenset(options)
    return None


def _exact_plain(hint: Any) -> frozenset[type] | None:
    """The types a value of ``hint`` may have unchanged, where checking them is all there is
    to do (a plain type that widens nothing), else None."""
    plain = _plain(hint)
    if plain is None or (float in plain and int not in plain):
        return None
    return plain


def _checker(hint: Any, where: str) -> _Check:
    """The function that checks (and, for Enums and ints given as floats, converts) a decoded
    value of type ``hint``; values of a plain type pass through without a call per item."""
    if hint is Any:
        return lambda v: v
    plain = _plain(hint)
    if plain is not None:
        widen = float in plain and int not in plain  # an int is a valid float
        expected = " | ".join(sorted(t.__name__ for t in plain))

        def exact(v: Any) -> Any:
            if type(v) in plain:
                return v
            if widen and type(v) is int:
                return float(v)
            raise _Bad(f"must be {expected}, not {type(v).__name__}")

        return exact
    if _is_union(hint):
        options = [_checker(a, where) for a in typing.get_args(hint)]

        def union(v: Any) -> Any:
            for check in options:
                try:
                    return check(v)
                except _Bad:
                    pass
            raise _Bad(f"has the wrong type {type(v).__name__}")

        return union
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin is list or (origin is tuple and len(args) == 2 and args[1] is Ellipsis):
        return _sequence(origin, args[0], where)
    if origin is tuple:
        fixed = [_checker(a, where) for a in args]
        size = len(fixed)
        # fields of plain types are checked inline (no call per field: a layout row of a
        # state dict of 10,000 tensors is one such tuple each); the others by their checker
        plains = [_exact_plain(a) for a in args]
        plain_at = [(i, p) for i, p in enumerate(plains) if p is not None]
        other_at = [(i, fixed[i]) for i, p in enumerate(plains) if p is None]

        def fixed_tuple(v: Any) -> Any:
            if type(v) is not tuple or len(v) != size:
                raise _Bad(f"must be a tuple of {size}")
            for i, types in plain_at:
                if type(v[i]) not in types:  # the slow path says which, or widens an int
                    return tuple(check(x) for check, x in zip(fixed, v, strict=True))
            changed: list[Any] | None = None
            for i, check in other_at:
                x = v[i]
                y = check(x)
                if y is not x:
                    changed = changed or list(v)
                    changed[i] = y
            return v if changed is None else tuple(changed)

        return fixed_tuple
    if origin is dict:
        return _mapping(args[0], args[1], where)
    if isinstance(hint, type) and issubclass(hint, enum.Enum):
        enum_cls = hint

        def member(v: Any) -> Any:
            if isinstance(v, enum_cls):
                return v
            try:
                return enum_cls(v)
            except (ValueError, TypeError):
                raise _Bad(f"is not a {enum_cls.__name__}: {v!r:.60}") from None

        return member
    if isinstance(hint, type) and (hint in _NAMES or issubclass(hint, RaylessError)):
        return _instance(hint)
    raise TypeError(f"{where}: unsupported message field type {hint!r}")


def _sequence(kind: type[list[Any]] | type[tuple[Any, ...]], item_hint: Any, where: str) -> _Check:
    """A ``list[X]`` or ``tuple[X, ...]`` checker."""
    plain = _plain(item_hint)
    item = _checker(item_hint, where)
    name = kind.__name__

    def check(v: Any) -> Any:
        if type(v) is not kind:
            raise _Bad(f"must be {name}, not {type(v).__name__}")
        if plain is not None and all(type(x) in plain for x in v):
            return v
        return kind(item(x) for x in v)

    return check


def _mapping(key_hint: Any, value_hint: Any, where: str) -> _Check:
    """A ``dict[K, V]`` checker."""
    plain_k, plain_v = _plain(key_hint), _plain(value_hint)
    key, val = _checker(key_hint, where), _checker(value_hint, where)

    def check(v: Any) -> Any:
        if type(v) is not dict:
            raise _Bad(f"must be dict, not {type(v).__name__}")
        if (
            plain_k is not None
            and plain_v is not None
            and all(type(k) in plain_k and type(x) in plain_v for k, x in v.items())
        ):
            return v
        return {key(k): val(x) for k, x in v.items()}

    return check


def _instance(kind: type) -> _Check:
    def check(v: Any) -> Any:
        if not isinstance(v, kind):
            raise _Bad(f"must be {kind.__name__}, not {type(v).__name__}")
        return v

    return check


def describe(body: object) -> str:
    """How an unexpected body is named in an error: its message name, or a short repr."""
    name = _NAMES.get(type(body))
    return name if name is not None else f"{body!r:.100}"


def handles(
    cls: type[M], *, oneway: bool = False
) -> Callable[[Callable[[S, P, M], H]], Callable[[S, P, M], H]]:
    """Mark a method ``handler(self, peer, message)`` as what answers messages of exactly type
    ``cls`` (requests; with ``oneway``, one-way messages). :class:`Handlers` built from the
    method's owner dispatches them to it; one method may carry several marks."""

    def mark(fn: Callable[[S, P, M], H]) -> Callable[[S, P, M], H]:
        vars(fn).setdefault(_HANDLES, []).append((cls, oneway))
        return fn

    return mark


class Handlers(Generic[P]):
    """A dispatch table keyed by message type: ``who`` (``head``, ``agent``...) answers the
    messages of exactly the types its handlers are given for; ``P`` is what each handler
    learns of the sender (a server's ``Peer``)."""

    def __init__(self, who: str, *owners: object, oneway: bool = False) -> None:
        """A table of the methods of ``owners`` marked with :func:`handles` (those for
        requests, or with ``oneway`` for one-way messages), each bound to its owner; more can
        be added with :meth:`on`.

        Raises:
            ValueError: two marked methods answer the same message type.
        """
        self.who = who
        self._table: dict[type, Callable[[P, Any], Any]] = {}
        self.dropped = 0  # one-way messages of a type this table does not answer
        for owner in owners:
            for cls, handler in _marked(owner, oneway):
                if cls in self._table:
                    raise ValueError(f"{who}: two handlers of {cls.__qualname__}")
                self._table[cls] = handler

    def on(self, cls: type[M], handler: Callable[[P, M], object]) -> None:
        """Answer messages of exactly type ``cls`` with ``handler(peer, message)``."""
        self._table[cls] = handler

    @property
    def types(self) -> frozenset[type]:
        """The message types this table answers."""
        return frozenset(self._table)

    def handle(self, peer: P, body: object) -> Any:
        """Run the handler of ``body``'s type and return what it returns.

        Raises:
            ProtocolError: ``body`` is no message this table answers (unknown, or malformed).
        """
        handler = self._table.get(type(body))
        if handler is None:
            if type(body) in _NAMES:
                raise ProtocolError(f"unknown {self.who} request {describe(body)}")
            raise ProtocolError(f"malformed {self.who} request {describe(body)}")
        return handler(peer, body)

    def oneway(self, peer: P, body: object) -> None:
        """Run the handler of a one-way message; one of an unknown type is counted, logged and
        dropped (a one-way message has no reply to carry an error)."""
        handler = self._table.get(type(body))
        if handler is None:
            self.dropped += 1
            log.debug("%s dropped an unexpected one-way message %s", self.who, describe(body))
            return
        handler(peer, body)


def _marked(owner: object, oneway: bool) -> list[tuple[type, Callable[[Any, Any], Any]]]:
    """``(message type, bound handler)`` for each :func:`handles` mark of ``owner``'s methods
    of that kind (a subclass's override replaces its base's method)."""
    attrs: dict[str, Any] = {}
    for klass in reversed(type(owner).__mro__):
        attrs.update(vars(klass))
    found = []
    for name, attr in attrs.items():
        if not inspect.isfunction(attr):
            continue
        for cls, is_oneway in vars(attr).get(_HANDLES, ()):
            if is_oneway == oneway:
                found.append((cls, getattr(owner, name)))
    return found
