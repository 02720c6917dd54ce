"""Actor and exception classes for tests/integration/test_faithful_errors.py.

They live in a module (not the test file) so actor processes import them by name.
"""

from __future__ import annotations

import asyncio
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
