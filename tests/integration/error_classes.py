"""Actor and exception classes for tests/integration/test_faithful_errors.py.

They live in a module (not the test file) so actor processes import them by name.
"""

from __future__ import annotations

import asyncio
import builtins
import errno
import sys
from typing import Any


class CodeErr(Exception):
    """An exception with a required argument and a public attribute."""

    def __init__(self, code: int, message: str) -> None:
        super().__init__(code, message)
        self.code = code
        self.where = {"stage": "rollout", "step": code}
        self.opaque = object()  # not encodable: dropped, never a failed reply
        self._private = "hidden"


class Unencodable(Exception):
    """An exception whose argument cannot travel as a plain value (it travels as its repr)."""


class Custom(BaseException):
    """A BaseException that is neither SystemExit nor KeyboardInterrupt."""


class Faulty:
    """Methods that raise every kind of exception, sync and async."""

    def __init__(self) -> None:
        self.calls = 0

    def ok(self) -> int:
        self.calls += 1
        return self.calls

    def exit(self, code: Any = None) -> None:
        sys.exit(code)

    async def aexit(self, code: Any = None) -> None:
        await asyncio.sleep(0)
        sys.exit(code)

    def raise_base(self, kind: str) -> None:
        raise _base(kind)

    async def araise_base(self, kind: str) -> None:
        await asyncio.sleep(0)
        raise _base(kind)

    def code_err(self, code: int) -> None:
        raise CodeErr(code, "msg")

    async def key_err(self, key: str) -> None:
        raise KeyError(key)

    def unencodable(self) -> None:
        raise Unencodable({1, 2}, "plain")


def _base(kind: str) -> BaseException:
    kinds: dict[str, type[BaseException]] = {
        "KeyboardInterrupt": KeyboardInterrupt,
        "GeneratorExit": GeneratorExit,
        "Custom": Custom,
    }
    return kinds[kind](f"a {kind}")


# Arguments that each builtin exception class needs (others take one message).
_BUILTIN_ARGS: dict[str, tuple[Any, ...]] = {
    "UnicodeDecodeError": ("utf-8", b"\xff", 0, 1, "invalid start byte"),
    "UnicodeEncodeError": ("ascii", "\xe9", 0, 1, "ordinal not in range(128)"),
    "UnicodeTranslateError": ("\xe9", 0, 1, "cannot translate"),
    "BaseExceptionGroup": ("a group", [ValueError("inside")]),
    "ExceptionGroup": ("a group", [ValueError("inside")]),
    "SyntaxError": ("bad syntax", ("f.py", 3, 5, "x y z", 3, 6)),
    "IndentationError": ("bad indent", ("f.py", 3, 5, "x y z", 3, 6)),
    "TabError": ("bad tabs", ("f.py", 3, 5, "x y z", 3, 6)),
}


def builtin_error(name: str) -> BaseException:
    """An instance of the builtin exception class ``name`` with fitting arguments."""
    cls: type[BaseException] = getattr(builtins, name)
    if name in _BUILTIN_ARGS:
        return cls(*_BUILTIN_ARGS[name])
    if issubclass(cls, OSError):
        return cls(errno.ENOENT, f"a {name}", "/no/such/path")
    return cls(f"a {name}")


class Relay:
    """Calls another actor for its caller: that actor's death is this method's error."""

    def __init__(self) -> None:
        self.calls = 0

    async def ok_of(self, other: Any) -> int:
        self.calls += 1
        return int(await other.ok())

    def count(self) -> int:
        return self.calls

    async def lose_a_peer(self) -> None:
        from rayless.transport.errors import BrokenError

        raise BrokenError("a peer of the relay broke")

    async def time_out(self) -> None:
        from rayless.transport.errors import Timeout

        raise Timeout("the relay's own wait ran out")


class Raiser:
    """Raises any builtin exception from a def method (an async one for the coroutine case)."""

    def ok(self) -> int:
        return 1

    def raise_builtin(self, name: str) -> None:
        raise builtin_error(name)

    async def araise_builtin(self, name: str) -> None:
        await asyncio.sleep(0)
        raise builtin_error(name)

    def stop_iteration(self) -> Any:
        return next(iter([]))


class FailsInInit:
    """A constructor that raises the builtin exception ``name``."""

    def __init__(self, name: str) -> None:
        raise builtin_error(name)


class KwOnlyErr(Exception):
    """Its constructor takes a required keyword-only argument."""

    def __init__(self, *, code: int) -> None:
        super().__init__(f"code {code}")
        self.code = code


class InitRaisesErr(Exception):
    """Rebuilding it by calling its constructor raises."""

    def __init__(self, message: str, _made: bool = False) -> None:
        if not _made:
            raise RuntimeError("built only through make()")
        super().__init__(message)

    @classmethod
    def make(cls, message: str) -> InitRaisesErr:
        return cls(message, True)


class NewOtherErr(Exception):
    """``__new__`` without arguments returns something else."""

    def __new__(cls, *args: Any) -> Any:
        return super().__new__(cls, *args) if args else 42


class BadReduceErr(Exception):
    def __reduce__(self) -> Any:
        raise TypeError("cannot be pickled")


class SlotsErr(Exception):
    __slots__ = ("code",)

    def __init__(self, code: int) -> None:
        super().__init__(code)
        self.code = code


class BadStrErr(Exception):
    def __str__(self) -> str:
        raise ValueError("no str for you")


class NoSubclassErr(Exception):
    def __init_subclass__(cls, **kwargs: Any) -> None:
        raise TypeError("no subclasses")


class BadSetterErr(Exception):
    """A public attribute whose property setter refuses."""

    def __init__(self, level: int) -> None:
        super().__init__(level)
        self.__dict__["level"] = level

    @property
    def shown(self) -> int:
        return 1

    @shown.setter
    def shown(self, value: int) -> None:
        raise AttributeError("read only")


ODD: dict[str, Any] = {
    "kw_only": lambda: KwOnlyErr(code=7),
    "init_raises": lambda: InitRaisesErr.make("made"),
    "new_other": lambda: NewOtherErr("other"),
    "bad_reduce": lambda: BadReduceErr("reduce"),
    "slots": lambda: SlotsErr(5),
    "bad_str": lambda: BadStrErr("str"),
    "no_subclass": lambda: NoSubclassErr("sub"),
    "bad_setter": lambda: BadSetterErr(3),
}


class OddRaiser:
    def ok(self) -> int:
        return 1

    def raise_odd(self, kind: str) -> None:
        raise ODD[kind]()
