"""The ``Actor`` base class, and how an actor class travels to the process that runs it.

An importable class travels by name (``module``, ``qualname``): the actor process imports it.
A class defined in the driver's ``__main__`` — a script with or without the ``__main__`` guard,
a script read from stdin, ``python -c``, IPython or Jupyter — travels by value: the spawn
request carries it pickled with cloudpickle (with the functions and globals of ``__main__`` it
references; imported modules still travel by name) and the source lines of its file, so that
tracebacks, ``rayless stack`` and pdb in the actor show the driver's file and lines. The actor
process unpickles it and never runs the driver's script. Code travels only in the spawn
request, between peers that passed the token handshake (docs/security.md); arguments, results
and store data never travel as pickle.
"""

from __future__ import annotations

import contextvars
import importlib
import linecache
import types
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, ClassVar

from rayless.transport.errors import ProtocolError


class Actor:
    """Base class of rayless actors. Subclassing it is optional but documents intent.

    ``setup`` runs in the actor's process after ``__init__`` and before the first call (and
    again after every restart); ``teardown`` runs on a clean shutdown. Both may be sync or
    async. Every public method (no leading underscore) is callable through a handle;
    async methods run concurrently on the actor's loop, sync ones one at a time in a worker
    thread. A class that marks methods with ``@endpoint`` (``rayless.actors.endpoint``)
    exposes only those. A method may ask :func:`current_caller` which connection called it;
    an actor that defines ``_caller_gone(caller)`` (sync, quick) is told when such a
    connection is gone.

    ``template_imports`` names modules the host's fork template imports before it forks this
    class's actors, beside the class's own module: with ``zygote_preload="demand"`` the way to
    fork an actor with torch already in (``("torch",)``) although its module imports torch
    only where used. A class need not subclass Actor to set it.
    """

    template_imports: ClassVar[tuple[str, ...]] = ()

    async def setup(self) -> None:
        """Prepare the actor (open files, load models). Runs before the first call."""

    async def teardown(self) -> None:
        """Release what ``setup`` acquired. Runs on a clean shutdown."""


_CALLER: contextvars.ContextVar[str | None] = contextvars.ContextVar("caller", default=None)


def current_caller() -> str | None:
    """The connection whose call this actor method serves (an opaque id, the one later passed
    to the actor's ``_caller_gone`` hook when that connection is gone); None outside a call."""
    return _CALLER.get()


class _Self:
    handle: Any = None  # this actor process's own handle, once it serves
    # (method, group) -> whether this thread waiting for that call on its own actor waits
    # for good (set by the actor process)
    blocks: Callable[[str, str | None], bool] | None = None


def self_call_blocks(method: str, group: str | None = None) -> bool:
    """Whether this thread, waiting for a call of ``method`` (in concurrency group ``group``)
    on this same actor, would wait for good: it is the only thread that runs such calls
    (a ``def`` method of an actor that runs one at a time, or its constructor). False outside
    an actor process."""
    blocks = _Self.blocks
    return blocks is not None and blocks(method, group)


def set_self_call_check(check: Callable[[str, str | None], bool]) -> None:
    """Record how :func:`self_call_blocks` decides (``actors.host.process``)."""
    _Self.blocks = check


def current_handle() -> Any:
    """This actor's own handle (``rayless.actors.ActorHandle``: what other processes call it
    through), once the actor serves; None in a process that is no actor (a driver)."""
    return _Self.handle


def set_current_handle(handle: Any) -> None:
    """Record this actor process's own handle (``actors.host.process``, once it serves)."""
    _Self.handle = handle


_MAIN = ("__main__", "__mp_main__")


def class_name(klass: type) -> str:
    """``klass``'s name for people (actor names, errors): its qualified name, less an alias
    a wrapper parked it under (``rayless.ray`` keeps a decorated ``A`` importable as
    ``A._ray_cls``: shown ``A``). A qualified name's last part is the class's own name unless
    such a wrapper renamed it."""
    qualname = klass.__qualname__
    head, _, last = qualname.rpartition(".")
    return head if head and last != klass.__name__ else qualname


def by_value(klass: type) -> bool:
    """Whether ``klass`` travels by value: it was defined in a driver's ``__main__``."""
    return getattr(klass, "__module__", None) in _MAIN


@dataclass(frozen=True)
class ClassRef:
    """An actor class as it travels: by name (importable) or by value (``pickled``)."""

    module: str
    qualname: str
    pickled: bytes | None = None

    @classmethod
    def of(cls, klass: type) -> ClassRef:
        """The reference of ``klass``: by value for classes of ``__main__``, else by name.

        Raises:
            TypeError: ``klass`` is not a class, is defined inside a function of an
                importable module, or (in ``__main__``) cannot be pickled.
        """
        if not isinstance(klass, type):
            raise TypeError(f"spawn needs a class, got {type(klass).__name__}")
        if by_value(klass):
            return cls(klass.__module__, klass.__qualname__, dumps_by_value(klass))
        if "<locals>" in klass.__qualname__:
            raise TypeError(
                f"{klass.__qualname__} is defined inside a function; actor classes must be "
                "importable (define it at module level)"
            )
        return cls(klass.__module__, klass.__qualname__)

    def to_wire(self) -> list[str | bytes | None]:
        """Plain values for the wire."""
        return [self.module, self.qualname, self.pickled]

    @classmethod
    def from_wire(cls, value: Any) -> ClassRef:
        """Parse :meth:`to_wire` output.

        Raises:
            ProtocolError: a malformed reference.
        """
        if (
            not isinstance(value, (list, tuple))
            or len(value) != 3
            or not all(isinstance(v, str) for v in value[:2])
            or not isinstance(value[2], (bytes, type(None)))
        ):
            raise ProtocolError(f"malformed class reference {value!r:.200}")
        return cls(value[0], value[1], value[2])

    def load(self) -> type:
        """Import (by name) or unpickle (by value) the class.

        Raises:
            ImportError / AttributeError: the module or the class cannot be found.
            TypeError: the reference names something that is not a class.
            Exception: whatever unpickling a by-value class raises (a module it needs is
                missing here, say).
        """
        if self.pickled is not None:
            obj: Any = loads_by_value(self.pickled)
        elif self.module in _MAIN:
            raise ImportError(
                f"{self.qualname} was defined in a driver's __main__ but arrived without its "
                "code (a peer of an older version?)"
            )
        else:
            obj = importlib.import_module(self.module)
            for part in self.qualname.split("."):
                obj = getattr(obj, part)
        if not isinstance(obj, type):
            raise TypeError(f"{self.module}.{self.qualname} is not a class")
        return obj


_SHIPPED = "rayless.by-value.1"  # marks a payload that carries source lines
_MAX_SOURCE = 4 << 20  # bytes of source shipped per file at most


def dumps_by_value(obj: Any) -> bytes:
    """``obj`` (a class of ``__main__``) pickled by value with cloudpickle, with the source
    lines of the files its code comes from.

    Its code keeps its file name (cloudpickle would write ``<dynamic-code>``), and the
    receiver puts the lines into ``linecache``, so tracebacks, ``rayless stack`` and pdb's
    ``l`` show the driver's file and source there too.

    Raises:
        TypeError: it (or a global it references) cannot be pickled.
    """
    import io
    import pickle

    import cloudpickle

    filenames: set[str] = set()

    class _Pickler(cloudpickle.Pickler):
        def reducer_override(self, value: Any) -> Any:
            if type(value) is types.CodeType:
                filenames.add(value.co_filename)
                rebuild, args = self.dispatch_table[types.CodeType](value)
                keep = value.co_filename
                return rebuild, tuple(keep if a == "<dynamic-code>" else a for a in args)
            return super().reducer_override(value)

    buf = io.BytesIO()
    try:
        _Pickler(buf, protocol=pickle.DEFAULT_PROTOCOL).dump(obj)
    except Exception as exc:
        name = getattr(obj, "__qualname__", type(obj).__qualname__)
        raise TypeError(f"cannot ship {name} of __main__ by value: {exc}") from exc
    sources: dict[str, list[str]] = {}
    for filename in sorted(filenames):
        lines = linecache.getlines(filename)
        if lines and sum(map(len, lines)) <= _MAX_SOURCE:
            sources[filename] = lines
    return pickle.dumps((_SHIPPED, buf.getvalue(), sources), protocol=pickle.DEFAULT_PROTOCOL)


def loads_by_value(data: bytes) -> Any:
    """Unpickle what :func:`dumps_by_value` made, registering its source lines in
    ``linecache`` (never evicted: they are the lines the driver runs). Only for bytes from an
    authenticated peer."""
    import pickle

    import cloudpickle

    shipped = pickle.loads(data)
    if not (isinstance(shipped, tuple) and len(shipped) == 3 and shipped[0] == _SHIPPED):
        return shipped  # plain cloudpickle (a payload without sources)
    _, payload, sources = shipped
    for filename, lines in dict(sources).items():
        if isinstance(filename, str):  # the lines the driver runs, even where its file is not
            text = [str(line) for line in lines]
            linecache.cache[filename] = (sum(map(len, text)), None, text, filename)
    return cloudpickle.loads(payload)
