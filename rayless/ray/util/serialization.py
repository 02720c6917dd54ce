"""``ray.util.register_serializer`` and ``deregister_serializer``: how instances of a class
the codec cannot send (a loguru logger, a third-party record type) travel.

As in Ray, a registration holds in the process that made it and applies to exactly that
class (not its subclasses); a value travels as what ``serializer`` returned (any value the
codec sends: plain values, tensors, dataclasses...) together with ``deserializer`` pickled
with cloudpickle (by reference where it is importable, by value where it is the driver's),
so a receiver rebuilds it without registering anything. That unpickling is code from a token
holder, as a remote function is: drivers, actors and task workers run it; the head and node
agents, which run no user code, refuse such a value (``ProtocolError``).

A class the codec already sends itself (tensors, numpy arrays, builtins) keeps its own
encoding: its registration is ignored with a warning. A registered dataclass or Enum travels
through its serializer, not as its own record.
"""

from __future__ import annotations

import pickle
import warnings
from collections.abc import Callable
from typing import Any

from rayless.actors.ext import loads_by_value
from rayless.transport import ProtocolError, join_family, leave_family, register_family

__all__ = ["deregister_serializer", "register_serializer"]

FAMILY = "rayless.ray.custom"
_CACHED = 256  # deserializers kept unpickled per distinct pickle
_LOADED: dict[bytes, Callable[[Any], Any]] = {}


def register_serializer(
    cls: type, *, serializer: Callable[[Any], Any], deserializer: Callable[[Any], Any]
) -> None:
    """Send instances of exactly ``cls`` from this process as ``serializer(obj)``, rebuilt
    by the receiver as ``deserializer(that)``. Registering ``cls`` again replaces both.

    Raises:
        TypeError: ``cls`` is not a class, a function is not callable, or ``deserializer``
            cannot be pickled (a lambda that holds a lock, say).
    """
    if not isinstance(cls, type):
        raise TypeError(f"register_serializer needs a class, got {cls!r:.100}")
    if not callable(serializer) or not callable(deserializer):
        raise TypeError("serializer and deserializer must be callable")
    import cloudpickle

    try:
        pickled = cloudpickle.dumps(deserializer, protocol=pickle.DEFAULT_PROTOCOL)
    except Exception as exc:
        raise TypeError(f"the deserializer of {cls.__qualname__} cannot be pickled: {exc}") from exc

    def to_state(obj: Any) -> list[Any]:
        return [pickled, serializer(obj)]

    try:
        join_family(cls, FAMILY, to_state)
    except ValueError as exc:  # the codec sends it itself (a tensor, a builtin)
        warnings.warn(
            f"register_serializer({cls.__qualname__}) has no effect: {exc} itself",
            stacklevel=2,
        )


def deregister_serializer(cls: type) -> None:
    """Forget ``cls``'s registration in this process (nothing happens if it has none)."""
    leave_family(cls, FAMILY)


def _rebuilt(state: Any) -> Any:
    """A value sent through a registration: its deserializer applied to what was sent.

    Raises:
        ProtocolError: a malformed record, a deserializer that cannot be loaded here (its
            module is missing), or one that raised.
    """
    if type(state) is not list or len(state) != 2 or type(state[0]) is not bytes:
        raise ProtocolError("bad custom-serialized value")
    pickled, sent = state
    deserializer = _LOADED.get(pickled)
    if deserializer is None:
        try:
            deserializer = loads_by_value(pickled)
        except Exception as exc:
            raise ProtocolError(
                f"a value's deserializer (ray.util.register_serializer) cannot be loaded "
                f"here: {type(exc).__name__}: {exc}"[:400]
            ) from None
        if not callable(deserializer):
            raise ProtocolError("bad custom-serialized value: its deserializer is not callable")
        if len(_LOADED) >= _CACHED:
            _LOADED.pop(next(iter(_LOADED)))
        _LOADED[pickled] = deserializer
    try:
        return deserializer(sent)
    except Exception as exc:
        name = getattr(deserializer, "__qualname__", type(deserializer).__qualname__)
        raise ProtocolError(
            f"the deserializer {name} (ray.util.register_serializer) raised "
            f"{type(exc).__name__}: {exc}"[:400]
        ) from None


register_family(FAMILY, _rebuilt, runs_code=True)
