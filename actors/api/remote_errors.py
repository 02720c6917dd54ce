"""Remote exceptions rebuilt at the caller as instances of their original type.

An actor's exception travels as a plain :class:`~rayless.transport.errors.RemoteError`
(type name, message, traceback, plain args and attributes). :func:`materialize` turns it into
an instance of ``RemoteError[Original]``, a class derived from both, where the original type
is found here and can be combined safely. It never raises and never runs the original type's
Python code (``__new__``, ``__init__``, ``__init_subclass__`` errors all leave the plain
RemoteError), so nothing a remote side raises can break or hang the caller.

Never combined (a plain RemoteError, ``remote_type`` names the original):

* BaseExceptions that are not Exceptions (``SystemExit``, ``KeyboardInterrupt``,
  ``GeneratorExit``, user ones): a remote failure must not exit, interrupt or close the
  caller.
* ``StopIteration`` and ``StopAsyncIteration``: the interpreter reads them as "this iterator,
  generator or coroutine is finished". One raised into a coroutine becomes a RuntimeError, one
  raised into a ``for`` loop's ``__next__`` ends the loop silently, and on CPython 3.11 one
  delivered through a Future into nested coroutines crashes the process (SIGSEGV).
* ``BaseExceptionGroup`` and ``ExceptionGroup``: their members cannot travel, and an empty
  group would mislead ``except*``.

Materialised errors (and plain RemoteErrors) can be pickled and deep-copied: they rebuild
through :func:`rebuild_materialized`, which materialises again where the original type is
found, else gives the plain RemoteError.

A rayless error a method raises travels as itself. One of the lost-peer family
(``BrokenError``: an ``ActorDiedError`` of an actor the method called, say) is the method's
outcome, not a break of the caller's own connection: a caller's client (:func:`caller_hook`)
notes it, and the runtime's checks for broken connections pass what :func:`replied` names on
as it is.
"""

from __future__ import annotations

import builtins
import sys
import weakref
from typing import Any

from rayless.actors.api.actor import loads_by_value
from rayless.transport.errors import BrokenError, RaylessError, RemoteError, Timeout

__all__ = ["caller_hook", "materialize", "materialize_any", "rebuild_materialized", "replied"]

# Exceptions the interpreter itself gives a meaning to, or that cannot be rebuilt faithfully.
_NEVER_COMBINED: tuple[type[BaseException], ...] = (StopIteration, StopAsyncIteration)
_GROUPS: tuple[type[BaseException], ...] = tuple(
    t for t in (getattr(builtins, "BaseExceptionGroup", None),) if isinstance(t, type)
)
_HEAPTYPE = 1 << 9  # Py_TPFLAGS_HEAPTYPE: a class made by a class statement or type()

_MATERIALIZED: weakref.WeakKeyDictionary[type, type[RemoteError] | None] = (
    weakref.WeakKeyDictionary()
)
_BY_VALUE: dict[bytes, type[BaseException] | None] = {}


def _resolve(qualified: str) -> type[BaseException] | None:
    module_name, _, qualname = qualified.rpartition(".")
    module = builtins if module_name == "builtins" else sys.modules.get(module_name)
    obj: Any = module
    for part in qualname.split("."):
        obj = getattr(obj, part, None)
    if isinstance(obj, type) and issubclass(obj, BaseException):
        return obj
    return None


def _unpickle_class(data: bytes) -> type[BaseException] | None:
    """The exception class an actor shipped by value (a class of the driver's __main__)."""
    if data not in _BY_VALUE:
        try:
            obj = loads_by_value(data)
        except Exception:
            obj = None
        ok = isinstance(obj, type) and issubclass(obj, BaseException)
        _BY_VALUE[data] = obj if ok else None
    return _BY_VALUE[data]


def _reduce_materialized(self: RemoteError) -> tuple[Any, ...]:
    return (rebuild_materialized, (self.args, dict(self.__dict__)))


def _combinable(original: type[BaseException]) -> bool:
    return (
        issubclass(original, Exception)
        and not issubclass(original, RaylessError)
        and not issubclass(original, _NEVER_COMBINED)
        and not issubclass(original, _GROUPS)
    )


def _combined(original: type[BaseException]) -> type[RemoteError] | None:
    """``RemoteError[original]``: an instance of both (None where they cannot be combined)."""
    if original not in _MATERIALIZED:
        cls: type[RemoteError] | None = None
        if _combinable(original):
            try:
                cls = type(
                    f"RemoteError[{original.__qualname__}]",
                    (RemoteError, original),
                    {"__module__": __name__, "__reduce__": _reduce_materialized},
                    wire=None,  # travels as a plain RemoteError
                )
            except Exception:  # incompatible layouts, a metaclass or __init_subclass__ refused
                cls = None
        _MATERIALIZED[original] = cls
    return _MATERIALIZED[original]


def _instance(cls: type[RemoteError], args: tuple[Any, ...]) -> RemoteError | None:
    """A bare instance of ``cls`` made by its nearest builtin base, never by Python code of
    the original type (whose ``__new__``/``__init__`` may need arguments we do not have, or
    raise). A builtin base's ``__init__`` fills its C fields (``OSError.errno``,
    ``UnicodeDecodeError.start``) from the args where they fit. None where it cannot be made."""
    static: type = cls
    while static.__flags__ & _HEAPTYPE:
        static = static.__base__  # type: ignore[assignment]
    new: Any = None
    for call_args in (args, ()):
        try:
            new = static.__new__(cls, *call_args)
            break
        except Exception:
            continue
    if new is None:
        return None
    try:
        static.__init__(new, *args)  # type: ignore[misc]
    except Exception:  # the args do not fit the C fields: leave them unset
        pass
    assert isinstance(new, RemoteError)
    return new


def materialize(exc: RemoteError) -> RemoteError:
    """``exc`` as an instance of both RemoteError and the original type, where it is found.

    The original type is looked up among the modules already imported in this process (a
    remote peer can never make us import anything), else taken from the class the actor
    shipped by value (a class of the driver's ``__main__``). The rebuilt exception has the
    original's args and plain public attributes (RemoteError's own attributes win a clash).
    See the module docstring for the types that stay plain RemoteErrors. Never raises: where
    anything fails, ``exc`` itself is returned.
    """
    if type(exc) is not RemoteError:
        return exc
    try:
        original = _resolve(str(exc.remote_type))
        pickled = getattr(exc, "remote_class", None)  # absent in errors from older peers
        if original is None and isinstance(pickled, bytes):
            original = _unpickle_class(pickled)
        cls = _combined(original) if original is not None else None
        if cls is None:
            return exc
        new = _instance(cls, exc.args)
        if new is None:
            return exc
        attrs = getattr(exc, "remote_attrs", None)
        attrs = attrs if isinstance(attrs, dict) else {}
        for key, value in attrs.items():
            if isinstance(key, str) and not key.startswith("_"):
                try:
                    setattr(new, key, value)
                except Exception:  # a read-only property, or a setter that refuses
                    pass
        new.__dict__.update(exc.__dict__)
        new.args = exc.args
        return new
    except Exception:
        return exc


def materialize_any(exc: BaseException) -> BaseException:
    """:func:`materialize` for RemoteErrors, anything else unchanged (a client's error hook)."""
    return materialize(exc) if isinstance(exc, RemoteError) else exc


def rebuild_materialized(args: tuple[Any, ...], state: dict[str, Any]) -> RemoteError:
    """Unpickle or deep-copy a materialised remote error: materialised again where its
    original type is found here, else a plain RemoteError."""
    plain = RemoteError.__new__(RemoteError)
    plain.__dict__.update(state)
    plain.args = tuple(args)
    return materialize(plain)


# The lost-peer errors actors replied with (RaylessErrors can be weakly referenced; each goes
# once nothing holds it).
_REPLIED: weakref.WeakSet[BaseException] = weakref.WeakSet()


def caller_hook(exc: BaseException) -> BaseException:
    """The error hook of a caller's client of an actor: :func:`materialize_any`, noting a
    ``BrokenError`` or ``Timeout`` the actor replied with (see :func:`replied`)."""
    exc = materialize_any(exc)
    if isinstance(exc, (BrokenError, Timeout)):
        _REPLIED.add(exc)
    return exc


def replied(exc: BaseException) -> bool:
    """Whether ``exc`` is a lost-peer error or a timeout an actor replied with (its method's
    outcome), not a break of this process's connection to that actor or its own deadline."""
    return exc in _REPLIED
