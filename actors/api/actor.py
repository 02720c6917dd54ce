"""The ``Actor`` base class, and how an actor class travels to the process that runs it.

A class is named by ``(module, qualname, main_path)``. Classes defined in the driver's
``__main__`` are found the way multiprocessing's spawn finds them: the child imports the
driver's script under the name ``__mp_main__`` (so its ``if __name__ == "__main__":`` block
does not run) and aliases it as ``__main__``.
"""

from __future__ import annotations

import importlib
import inspect
import os
import runpy
import sys
from dataclasses import dataclass
from typing import Any

from rayless.transport.errors import ProtocolError


class Actor:
    """Base class of rayless actors. Subclassing it is optional but documents intent.

    ``setup`` runs in the actor's process after ``__init__`` and before the first call (and
    again after every restart); ``teardown`` runs on a clean shutdown. Both may be sync or
    async. Every public method (no leading underscore) is callable through a handle;
    async methods run concurrently on the actor's loop, sync ones one at a time in a worker
    thread.
    """

    async def setup(self) -> None:
        """Prepare the actor (open files, load models). Runs before the first call."""

    async def teardown(self) -> None:
        """Release what ``setup`` acquired. Runs on a clean shutdown."""


_LIFECYCLE = frozenset({"setup", "teardown"})


def public_methods(cls: type) -> dict[str, bool]:
    """The remotely callable methods of ``cls``: name → whether it is a coroutine function."""
    methods: dict[str, bool] = {}
    for name in dir(cls):
        if name.startswith("_") or name in _LIFECYCLE:
            continue
        attr = inspect.getattr_static(cls, name, None)
        if isinstance(attr, (staticmethod, classmethod)):
            attr = attr.__func__
        if callable(attr) and not isinstance(attr, type):
            methods[name] = inspect.iscoroutinefunction(attr)
    return methods


@dataclass(frozen=True)
class ClassRef:
    """Where an actor class can be imported from in another process."""

    module: str
    qualname: str
    main_path: str | None = None

    @classmethod
    def of(cls, klass: type) -> ClassRef:
        """The reference of ``klass``.

        Raises:
            TypeError: ``klass`` is not a class, or is defined inside a function.
        """
        if not isinstance(klass, type):
            raise TypeError(f"spawn needs a class, got {type(klass).__name__}")
        if "<locals>" in klass.__qualname__:
            raise TypeError(
                f"{klass.__qualname__} is defined inside a function; actor classes must be "
                "importable (define it at module level)"
            )
        main_path = None
        if klass.__module__ in ("__main__", "__mp_main__"):
            main = sys.modules.get("__main__")
            path = getattr(main, "__file__", None)
            if not path:
                raise TypeError(
                    f"{klass.__qualname__} is defined in an interactive __main__; move it to "
                    "a module or a script file"
                )
            main_path = os.path.abspath(path)
        return cls(klass.__module__, klass.__qualname__, main_path)

    def to_wire(self) -> list[str | None]:
        """Plain values for the wire."""
        return [self.module, self.qualname, self.main_path]

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
        ):
            raise ProtocolError(f"malformed class reference {value!r:.200}")
        return cls(value[0], value[1], value[2] if isinstance(value[2], str) else None)

    def load(self) -> type:
        """Import and return the class.

        Raises:
            ImportError / AttributeError: the module or the class cannot be found.
        """
        if self.module in ("__main__", "__mp_main__"):
            module = _load_main(self.main_path)
        else:
            module = importlib.import_module(self.module)
        obj: Any = module
        for part in self.qualname.split("."):
            obj = getattr(obj, part)
        if not isinstance(obj, type):
            raise TypeError(f"{self.module}.{self.qualname} is not a class")
        return obj


def _load_main(path: str | None) -> Any:
    """Import the driver's script as ``__mp_main__`` (once) and alias it as ``__main__``."""
    existing = sys.modules.get("__mp_main__")
    if existing is not None and getattr(existing, "__file__", None) == path:
        return existing
    if not path or not os.path.exists(path):
        raise ImportError(f"the driver's script {path!r} is not on this node")
    import types

    module = types.ModuleType("__mp_main__")
    module.__file__ = path
    sys.modules["__mp_main__"] = module
    directory = os.path.dirname(path)
    if directory not in sys.path:
        sys.path.insert(0, directory)
    namespace = runpy.run_path(path, run_name="__mp_main__")
    module.__dict__.update(namespace)
    sys.modules["__main__"] = module
    return module
