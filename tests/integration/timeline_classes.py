"""Actor classes for tests/integration/test_timeline.py: two actors that call each other."""

from __future__ import annotations

import asyncio
import os
import weakref
from typing import Any


class Peer:
    """Calls another Peer, answers its calls; ``fail`` raises."""

    def pid(self) -> int:
        return os.getpid()

    async def pong(self, x: int) -> int:
        return x + 1

    def square(self, x: int) -> int:
        return x * x

    def fail(self) -> None:
        raise ValueError("failing on purpose")

    async def ping(self, other: Any, n: int) -> int:
        total = 0
        for i in range(n):
            total += await other.pong(i)
            total += await other.square(i)
        return total

    async def stuck(self) -> None:
        """Never returns (a hung call)."""
        await asyncio.Event().wait()


class Keeper:
    """Fails holding its argument; says whether the argument is still alive afterwards."""

    def fail_with(self, t: Any) -> None:
        self.ref = weakref.ref(t)
        raise ValueError("failing with an argument")

    async def afail_with(self, t: Any) -> None:
        self.ref = weakref.ref(t)
        raise ValueError("failing with an argument")

    def alive(self) -> bool:
        return self.ref() is not None
