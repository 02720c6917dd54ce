"""The error tree of rayless: one root, typed children, all of them able to cross processes.

Every error rayless raises derives from :class:`RaylessError`. It lives here, at the bottom of
the layering, so every layer can extend it. Subclasses register themselves (by module and
qualified name) so the codec can send them between processes and rebuild the same type on the
other side, with their ``args`` and plain attributes intact.

The tree (modelled on trio's Closed vs Broken and torch.distributed.elastic's one-root tree)::

    RaylessError
    ├── TransportError
    │   ├── ClosedError      this side closed the endpoint; pending requests fail with it
    │   ├── BrokenError      the peer vanished or the connection broke
    │   ├── AuthError        the handshake failed (wrong or missing token)
    │   ├── ProtocolError    a message that does not follow the wire protocol
    │   │   └── LimitError   a message or a peer went past a configured limit
    │   └── Timeout          a wait ran past its deadline (also a builtin TimeoutError)
    ├── ActorDiedError       the actor's process is gone (pid, exit code or signal, node)
    ├── RemoteError          an exception raised inside an actor, with its remote traceback
    ├── PlacementError       a request that no node or plan can satisfy
    └── StoreError           the store cannot serve a request (higher layers refine it)
"""

from __future__ import annotations

import importlib
import signal
from typing import Any, ClassVar

__all__ = [
    "ActorDiedError",
    "AuthError",
    "BrokenError",
    "ClosedError",
    "LimitError",
    "PlacementError",
    "ProtocolError",
    "RaylessError",
    "RemoteError",
    "StoreError",
    "Timeout",
    "TransportError",
    "error_from_state",
    "error_to_state",
]

# Packages whose modules may be imported to find an error type named by a peer. A peer can
# never make us import anything outside our own code.
_OWN_PACKAGES = frozenset({"transport", "placement", "actors", "store", "rayless"})
_REGISTRY: dict[str, type[RaylessError]] = {}
_PLAIN = (str, int, float, bool, bytes, type(None))


def wire_name(cls: type) -> str:
    """The name under which an error type travels: ``module.QualName``."""
    return f"{cls.__module__}.{cls.__qualname__}"


class RaylessError(Exception):
    """Root of every error rayless raises. Subclasses are registered for the wire."""

    _rayless_wire: ClassVar[bool] = True

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if cls.__dict__.get("_rayless_wire", True):
            _REGISTRY[wire_name(cls)] = cls


_REGISTRY["transport.errors.RaylessError"] = RaylessError


class TransportError(RaylessError):
    """A failure of the wire: sockets, peers, the protocol, deadlines."""


class ClosedError(TransportError):
    """This endpoint was closed; every pending and later request fails with this."""


class BrokenError(TransportError):
    """The peer vanished (died, stopped answering heartbeats, or reset the session)."""


class AuthError(TransportError):
    """The handshake failed: the peer does not know the cluster token (or we do not)."""


class ProtocolError(TransportError):
    """A message does not follow the wire protocol (bad frames, bad header, bad type)."""


class LimitError(ProtocolError):
    """A message or a peer went past a configured limit (size, frames, in-flight requests)."""


class Timeout(TransportError, TimeoutError):
    """A wait ran past its deadline. Also a builtin ``TimeoutError``."""


class ActorDiedError(RaylessError):
    """The actor's process is gone; every pending and later call fails with this.

    Attributes name the actor, its pid and node, and how it ended (exit code or signal).
    """

    def __init__(
        self,
        actor: str,
        *,
        pid: int | None = None,
        exitcode: int | None = None,
        node: str | None = None,
        reason: str = "",
    ) -> None:
        self.actor = actor
        self.pid = pid
        self.exitcode = exitcode
        self.node = node
        self.reason = reason
        super().__init__(self._describe())

    def _describe(self) -> str:
        parts = [f"actor {self.actor!r} died"]
        where = []
        if self.pid is not None:
            where.append(f"pid {self.pid}")
        if self.node:
            where.append(f"node {self.node}")
        if where:
            parts.append(f"({', '.join(where)})")
        if self.exitcode is not None:
            if self.exitcode < 0:
                try:
                    name = signal.Signals(-self.exitcode).name
                except ValueError:
                    name = f"signal {-self.exitcode}"
                parts.append(f"killed by {name}")
            else:
                parts.append(f"with exit code {self.exitcode}")
        if self.reason:
            parts.append(f": {self.reason}")
        return " ".join(parts).replace(" :", ":")


class RemoteError(RaylessError):
    """An exception raised inside an actor, re-raised at the caller.

    Carries the remote type's qualified name, its message, the remote traceback text and the
    actor's name. Where the original type is importable at the caller, the raised object is
    also an instance of it (see ``actors``).
    """

    def __init__(
        self, remote_type: str, message: str, traceback: str = "", actor: str | None = None
    ) -> None:
        self.remote_type = remote_type
        self.remote_message = message
        self.remote_traceback = traceback
        self.actor = actor
        super().__init__(remote_type, message, traceback, actor)

    def __str__(self) -> str:
        where = f" in actor {self.actor!r}" if self.actor else ""
        text = f"{self.remote_type}{where}: {self.remote_message}"
        if self.remote_traceback:
            text += "\n\nRemote traceback:\n" + self.remote_traceback.rstrip()
        return text


class PlacementError(RaylessError):
    """A resource request that no node, pool or plan can satisfy."""


class StoreError(RaylessError):
    """The store cannot serve a request; ``store`` defines finer subclasses."""


def _plain(value: Any) -> Any:
    if isinstance(value, _PLAIN):
        return value
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    return repr(value)


def error_to_state(exc: RaylessError) -> dict[str, Any]:
    """Describe ``exc`` with plain values only: its wire type name, args and attributes."""
    cls: type = type(exc)
    while wire_name(cls) not in _REGISTRY:  # dynamic subclasses travel as their parent
        cls = cls.__mro__[1]
    attrs = {k: _plain(v) for k, v in vars(exc).items() if not k.startswith("__")}
    return {"type": wire_name(cls), "args": _plain(list(exc.args)), "attrs": attrs}


def _lookup(name: str) -> type[RaylessError]:
    cls = _REGISTRY.get(name)
    module = name.rpartition(".")[0]
    if cls is None and module.split(".")[0] in _OWN_PACKAGES:
        try:  # the type may live in a module of ours this process has not imported yet
            importlib.import_module(module)
        except ImportError:
            pass
        cls = _REGISTRY.get(name)
    return cls if cls is not None else RaylessError


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
    if cls is RaylessError and name != "transport.errors.RaylessError":
        exc.args = (f"{name}: {' '.join(map(str, exc.args))}",)
    return exc
