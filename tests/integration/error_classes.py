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
