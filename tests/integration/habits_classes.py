"""Actor classes of the Ray-habits tests (cancellation, threaded actors, futures as arguments);
importable by actor processes."""

from __future__ import annotations

import asyncio
import threading
import time
from typing import Any

from rayless.actors import Actor, concurrency_group


class Blocker(Actor):
    """Async and sync methods that block until told otherwise, counting what ran."""

    def __init__(self) -> None:
        self.started = 0
        self.cancelled = 0
        self.changed = asyncio.Condition()
        self.release = threading.Event()
        self.sync_ran: list[str] = []

    async def block(self) -> None:
        """Wait forever (until cancelled)."""
        self.started += 1
        async with self.changed:
            self.changed.notify_all()
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            self.cancelled += 1
            async with self.changed:
                self.changed.notify_all()
            raise

    async def ping(self) -> str:
        return "pong"

    async def wait_cancelled(self, n: int) -> dict[str, int]:
        """Once ``n`` calls of ``block`` were cancelled: how many started and were cancelled."""
        async with self.changed:
            await self.changed.wait_for(lambda: self.cancelled >= n)
        return {"started": self.started, "cancelled": self.cancelled}

    async def wait_started(self, n: int) -> int:
        """Once ``n`` calls of ``block`` started: how many did."""
        async with self.changed:
            await self.changed.wait_for(lambda: self.started >= n)
        return self.started

    def hold(self, tag: str) -> str:
        """A sync method that blocks until ``let_go`` (at most 60 s)."""
        self.sync_ran.append(tag)
        self.release.wait(60)
        return tag

    def quick(self) -> str:
        return "quick"

    async def let_go(self) -> None:
        self.release.set()

    async def ran(self) -> list[str]:
        return list(self.sync_ran)


class Threaded(Actor):
    """``meet`` returns only once ``n`` calls are inside it at the same time."""

    def __init__(self, n: int) -> None:
        self.barrier = threading.Barrier(n, timeout=20)

    def meet(self) -> int:
        self.barrier.wait()
        return threading.get_ident()


class Gate(Actor):
    """``wait`` blocks its thread until ``open`` runs: in one concurrency group each, they
    meet; in the default group's single thread, ``open`` would wait behind ``wait``."""

    def __init__(self) -> None:
        self.opened = threading.Event()

    @concurrency_group("waiting")
    def wait(self) -> bool:
        return self.opened.wait(20)

    @concurrency_group("opening")
    def open(self) -> str:
        self.opened.set()
        return threading.current_thread().name

    def thread(self) -> str:
        return threading.current_thread().name

    def hold(self) -> bool:
        """Block the default group's thread until ``open``."""
        return self.opened.wait(20)

    @concurrency_group("opening")
    def count(self, n: int) -> Any:
        """A generator whose steps run on the "opening" group's thread."""
        for i in range(n):
            yield i, threading.current_thread().name


class Adder(Actor):
    async def add(self, a: Any, b: Any = 0) -> Any:
        return a + b

    def slow(self, value: int, seconds: float) -> int:
        time.sleep(seconds)
        return value

    async def echo(self, value: Any) -> Any:
        return value


class Reward(Actor):
    """A Ray user's actor: slow producers, consumers of their results, and a
    method that raises its own TimeoutError (an HTTP reward server that did not answer)."""

    async def slow_gen(self, n: int, seconds: float) -> list[int]:
        await asyncio.sleep(seconds)
        return list(range(n))

    async def total(self, values: list[int], scale: int = 1) -> int:
        return sum(values) * scale

    async def ask_server(self, what: str) -> str:
        raise TimeoutError(f"HTTP reward server did not answer {what}")

    def ask_server_sync(self, what: str) -> str:
        raise TimeoutError(f"HTTP reward server did not answer {what}")


class Shadowing(Actor):
    """Its ``address`` method would be hidden by the handle's own ``address``."""

    def address(self) -> str:
        return "221B Baker Street"


class Joiner(Actor):
    """Joins its own cluster from inside an actor, closes the handle, joins again."""

    async def join_twice(self) -> int:
        from rayless.actors import connect

        first = await connect()
        owned = getattr(first, "owns_session", False)
        await first.aclose()
        second = await connect()  # before: ConnectError "not connected to a rayless cluster"
        nodes = len(await second.nodes())
        await second.aclose()
        return -1 if owned else nodes
