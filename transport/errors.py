"""The root of rayless's error tree and the transport's errors; every error can cross processes.

Every error rayless raises derives from :class:`RaylessError`. It lives here, at the bottom of
the layering, so every layer can extend it; each layer defines its own children (actors:
``rayless.actors.errors``, placement: ``rayless.placement.errors``, store:
``rayless.store.errors``; ``rayless.errors`` re-exports them all). This module never names
the layers above it.

Each error class travels under an explicit, stable wire name given as a class keyword
(``class LimitError(ProtocolError, wire="rayless.LimitError")``), never its module path, so
moving a class never changes the protocol. A subclass without one travels under
``module.QualName`` (user subclasses) or, when marked ``wire=None``, as its nearest
registered ancestor. A peer cannot make us import anything: unknown names decode as a plain
:class:`RaylessError` whose message starts with the name.

The transport's part of the tree (modelled on trio's Closed vs Broken)::

    RaylessError
    ├── TransportError
    │   ├── ClosedError      this side closed the endpoint; pending requests fail with it
    │   ├── BrokenError      the peer vanished or the connection broke
    │   ├── AuthError        the handshake failed (wrong or missing token)
    │   ├── ProtocolError    a message that does not follow the wire protocol
    │   │   └── LimitError   a message or a peer went past a configured limit
    │   └── Timeout          a wait ran past its deadline (also a builtin TimeoutError)
    └── RemoteError          an exception raised by the remote handler, with its traceback
"""

from __future__ import annotations

import traceback as traceback_module
import types
from typing import Any

__all__ = [
    "AuthError",
    "BrokenError",
    "ClosedError",
    "LimitError",
    "ProtocolError",
    "RaylessError",
    "RemoteError",
    "Timeout",
    "TransportError",
    "describe",
    "error_from_state",
    "error_to_state",
    "safe_text",
    "wire_name",
]

_REGISTRY: dict[str, type[RaylessError]] = {}
_NAMES: dict[type, str] = {}
_PLAIN = (str, int, float, bool, bytes, type(None))
_UNSET: Any = object()
_FIELD_TYPES = (types.MemberDescriptorType, types.GetSetDescriptorType)


def wire_name(cls: type) -> str | None:
    """The name under which an error type travels, or None when it travels as its parent."""
    return _NAMES.get(cls)


class RaylessError(Exception):
    """Root of every error rayless raises. Subclasses are registered for the wire."""

    def __init_subclass__(cls, wire: str | None = _UNSET, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if wire is _UNSET:
            wire = f"{cls.__module__}.{cls.__qualname__}"
        if wire is None:
            return
        known = _REGISTRY.get(wire)
        if known is not None and known.__qualname__ != cls.__qualname__:
            raise TypeError(f"wire name {wire!r} is taken by {known.__qualname__}")
        _REGISTRY[wire] = cls
        _NAMES[cls] = wire

    def __reduce__(self) -> tuple[Any, ...]:
        """Pickle and deep-copy without calling ``__init__``, whose parameters are not
        ``args`` (BaseException's default calls ``cls(*args)``)."""
        return (_rebuild, (type(self), self.args, dict(self.__dict__)))


def _rebuild(cls: type[RaylessError], args: tuple[Any, ...], state: dict[str, Any]) -> Any:
    exc = cls.__new__(cls)
    exc.args = tuple(args)
    exc.__dict__.update(state)
    return exc


_REGISTRY["rayless.RaylessError"] = RaylessError
_NAMES[RaylessError] = "rayless.RaylessError"


class TransportError(RaylessError, wire="rayless.TransportError"):
    """A failure of the wire: sockets, peers, the protocol, deadlines."""


class ClosedError(TransportError, wire="rayless.ClosedError"):
    """This endpoint was closed; every pending and later request fails with this."""


class BrokenError(TransportError, wire="rayless.BrokenError"):
    """The peer vanished (died, stopped answering heartbeats, or reset the session)."""


class AuthError(TransportError, wire="rayless.AuthError"):
    """The handshake failed: the peer does not know the cluster token (or we do not)."""


class ProtocolError(TransportError, wire="rayless.ProtocolError"):
    """A message does not follow the wire protocol (bad frames, bad header, bad type)."""


class LimitError(ProtocolError, wire="rayless.LimitError"):
    """A message or a peer went past a configured limit (size, frames, in-flight requests)."""


class Timeout(TransportError, TimeoutError, wire="rayless.Timeout"):
    """A wait ran past its deadline. Also a builtin ``TimeoutError``."""


class RemoteError(RaylessError, wire="rayless.RemoteError"):
    """An exception raised inside an actor (or any request handler), re-raised at the caller.

    Carries the remote type's qualified name (``remote_type``), its message, the remote
    traceback text and the actor's name. ``args`` are the original exception's args (each one
    plain-encodable, else its ``repr``), ``remote_attrs`` its public plain-encodable attributes
    (tuples stay tuples; the message names each attribute that was not sent), and
    ``remote_class`` the class pickled by value where the actor layer ships it (classes of a
    driver's ``__main__``). Where the original type can be found at the caller, the raised
    object is also an instance of it (see ``actors``). ``raised_in`` says what ``actor``
    names in the message: an actor, or (set by the Ray layer) a task.
    """

    raised_in = "actor"

    def __init__(
        self,
        remote_type: str,
        message: str,
        traceback: str = "",
        actor: str | None = None,
        *,
        args: tuple[Any, ...] | None = None,
        attrs: dict[str, Any] | None = None,
        remote_class: bytes | None = None,
    ) -> None:
        self.remote_type = remote_type
        self.remote_message = message
        self.remote_traceback = traceback
        self.actor = actor
        self.remote_attrs = dict(attrs or {})
        self.remote_class = remote_class
        super().__init__(*(args if args is not None else (message,)))

    @classmethod
    def from_exception(
        cls, exc: BaseException, actor: str | None = None, remote_class: bytes | None = None
    ) -> RemoteError:
        """``exc`` described with plain values: type name, message, traceback, args, attrs."""
        kind = type(exc)
        tb = "".join(traceback_module.format_exception(kind, exc, exc.__traceback__))
        public = {
            k: v for k, v in vars(exc).items() if isinstance(k, str) and not k.startswith("_")
        }
        attrs = {k: v for k, v in public.items() if _is_plain(v)}
        attrs.update({k: v for k, v in _builtin_fields(exc).items() if k not in public})
        message = safe_text(exc, str)
        dropped = [f"{k!r} ({type(v).__qualname__})" for k, v in public.items() if k not in attrs]
        if dropped:  # said, not silently lost
            message += f" [attribute {', '.join(dropped)} not sent: only plain values travel]"
        return cls(
            f"{kind.__module__}.{kind.__qualname__}",
            message,
            tb,
            actor,
            args=tuple(v if _is_plain(v) else safe_text(v, repr) for v in exc.args),
            attrs=attrs,
            remote_class=remote_class,
        )

    def __str__(self) -> str:
        where = f" in {self.raised_in} {self.actor!r}" if self.actor else ""
        text = f"{self.remote_type}{where}: {self.remote_message}"
        if self.remote_traceback:
            text += "\n\nRemote traceback:\n" + self.remote_traceback.rstrip()
        return text


def describe(exc: BaseException, limit: int = 300) -> str:
    """An error in one bounded line for records and logs: its type and message, at most
    ``limit`` characters. Never raises: an error whose ``__str__`` fails is named by its
    type."""
    try:
        return f"{type(exc).__name__}: {exc}"[:limit]
    except Exception:
        return f"{type(exc).__name__}: <unprintable>"


def safe_text(value: Any, how: Any) -> str:
    """``str(value)`` or ``repr(value)``, never raising: a ``__str__`` that raises is named."""
    try:
        return str(how(value))
    except Exception as exc:
        return f"<{type(value).__qualname__}: {how.__name__}() raised {type(exc).__qualname__}>"


def _builtin_fields(exc: BaseException) -> dict[str, Any]:
    """The plain values of the fields ``vars()`` does not show: the C-level ones of builtin
    classes (``OSError.errno`` and ``.filename``, ``UnicodeDecodeError.start``,
    ``SyntaxError.lineno``...) and ``__slots__``; unset ones and others are left out."""
    fields: dict[str, Any] = {}
    for klass in type(exc).__mro__:
        if klass in (BaseException, object):
            continue
        for name, attr in vars(klass).items():
            if name.startswith("_") or not isinstance(attr, _FIELD_TYPES):
                continue
            try:
                value = getattr(exc, name)
            except Exception:  # an unset field (OSError.characters_written)
                continue
            if value is not None and _is_plain(value):
                fields.setdefault(name, value)
    return fields


def _is_plain(value: Any, depth: int = 0) -> bool:
    """Whether ``value`` is made of msgpack-plain values only (bounded nesting)."""
    if isinstance(value, _PLAIN):
        return True
    if depth > 8:
        return False
    if isinstance(value, (list, tuple)):
        return all(_is_plain(v, depth + 1) for v in value)
    if isinstance(value, dict):
        return all(isinstance(k, str) and _is_plain(v, depth + 1) for k, v in value.items())
    return False


def _plain(value: Any) -> Any:
    """``value`` with anything but plain values, lists, tuples and dicts as its ``repr``."""
    if isinstance(value, _PLAIN):
        return value
    if isinstance(value, tuple):  # kept a tuple: the codec carries tuples as such
        return tuple(_plain(v) for v in value)
    if isinstance(value, list):
        return [_plain(v) for v in value]
    if isinstance(value, dict):
        return {safe_text(k, str): _plain(v) for k, v in value.items()}
    return safe_text(value, repr)


def error_to_state(exc: RaylessError) -> dict[str, Any]:
    """Describe ``exc`` with plain values only: its wire type name, args and attributes."""
    # a subclass marked wire=None travels as its nearest registered class (RaylessError at
    # the latest), also where other classes come first in its MRO (Ray's errors mixed in)
    cls = next(c for c in type(exc).__mro__ if c in _NAMES)
    attrs = {k: _plain(v) for k, v in vars(exc).items() if not k.startswith("__")}
    return {"type": _NAMES[cls], "args": _plain(list(exc.args)), "attrs": attrs}


def _lookup(name: str) -> type[RaylessError]:
    return _REGISTRY.get(name, RaylessError)


def error_from_state(state: dict[str, Any]) -> RaylessError:
    """Rebuild an error described by :func:`error_to_state`.

    An unknown type name becomes a plain :class:`RaylessError` carrying the same message.
    """
    name = str(state.get("type", ""))
    cls = _lookup(name)
    exc = cls.__new__(cls)
    args = state.get("args") or []
    exc.args = tuple(args) if isinstance(args, (list, tuple)) else (args,)
    attrs = state.get("attrs") or {}
    if isinstance(attrs, dict):
        for key, value in attrs.items():
            if isinstance(key, str) and not key.startswith("__"):
                setattr(exc, key, value)
    if cls is RaylessError and name != "rayless.RaylessError":
        exc.args = (f"{name}: {' '.join(map(str, exc.args))}",)
    return exc
