"""The one bridge from blocking code to the event loop: a portal (like anyio's ``from_thread``).

A :class:`Portal` is an event loop running in a daemon thread; blocking code hands it
awaitables (``run`` blocks, ``submit`` returns a ``concurrent.futures.Future``). Every sync face
uses it: ``SyncCluster`` owns one, ``SyncStore`` uses the one of its cluster, and
``handle.method.call(x)`` / ``.remote(x)`` from plain threads use the process's *home loop*:

* in a driver with a ``SyncCluster``: that facade's portal;
* in an actor process: the actor's own loop (its sync methods run in a worker thread, so they
  may block on it);
* otherwise a portal started on demand.

Blocking on a loop from the thread that runs a loop always deadlocks or stalls it, so every
blocking entry point raises RuntimeError there (use ``await``).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading
from collections.abc import Awaitable, Coroutine
from typing import Any, TypeVar

from rayless.actors.api.runtime import close_runtimes
from rayless.transport.errors import ClosedError, Timeout

__all__ = [
    "Portal",
    "check_blocking_allowed",
    "home_loop",
    "run_sync",
    "set_home_loop",
    "submit_sync",
]

T = TypeVar("T")


async def _awaited(aw: Awaitable[T]) -> T:
    return await aw


def _as_coroutine(aw: Awaitable[T]) -> Coroutine[Any, Any, T]:
    return aw if isinstance(aw, Coroutine) else _awaited(aw)


def check_blocking_allowed(what: str = "a blocking call") -> None:
    """Raise RuntimeError when an event loop runs in this thread (blocking would stall it).

    Raises:
        RuntimeError: this thread runs an event loop (an actor's async method, async code).
    """
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return
    raise RuntimeError(
        f"{what} inside a running event loop would block it (and deadlock an actor that "
        "calls itself): use `await handle.method(x)` there"
    )


class Portal:
    """An event loop in a daemon thread that blocking code runs awaitables on."""

    def __init__(self, name: str = "rayless-portal") -> None:
        self.loop = asyncio.new_event_loop()
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._main, name=name, daemon=True)
        self._thread.start()
        self._ready.wait()

    def _main(self) -> None:
        asyncio.set_event_loop(self.loop)
        self.loop.call_soon(self._ready.set)
        self.loop.run_forever()

    @property
    def closed(self) -> bool:
        """Whether :meth:`stop` ran."""
        return self.loop.is_closed()

    def submit(self, aw: Awaitable[T]) -> concurrent.futures.Future[T]:
        """Start ``aw`` on the loop now; a ``concurrent.futures.Future`` of its result.

        Raises:
            ClosedError: the portal was stopped.
        """
        return _submit(self.loop, aw)

    def run(self, aw: Awaitable[T], timeout: float | None = None) -> T:
        """Run ``aw`` on the loop and block until its result (at most ``timeout`` s).

        Raises:
            Timeout: no result within ``timeout`` (the work is cancelled).
            RuntimeError: called from a thread that runs an event loop.
            ClosedError: the portal was stopped.
        """
        check_blocking_allowed()
        return _wait(self.submit(aw), timeout)

    def stop(self) -> None:
        """Close this loop's cluster connections, stop the loop, join the thread. Idempotent."""
        if self.loop.is_closed():
            return
        if threading.current_thread() is self._thread:
            raise RuntimeError("a portal cannot stop itself from its own loop")
        try:
            asyncio.run_coroutine_threadsafe(close_runtimes(), self.loop).result(10)
        except Exception:  # best effort: the loop stops regardless
            pass
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(10)
        self.loop.close()


def _submit(loop: asyncio.AbstractEventLoop, aw: Awaitable[T]) -> concurrent.futures.Future[T]:
    coro = _as_coroutine(aw)
    if loop.is_closed():
        coro.close()
        raise ClosedError("the event loop of this sync face is closed")
    return asyncio.run_coroutine_threadsafe(coro, loop)


def _wait(fut: concurrent.futures.Future[T], timeout: float | None) -> T:
    try:
        return fut.result(timeout)
    except concurrent.futures.TimeoutError:
        if fut.done():  # the work's own TimeoutError (e.g. a method's): as itself
            raise
        fut.cancel()
        raise Timeout(f"no result within {timeout}s") from None
    except BaseException:  # Ctrl-C (SIGTERM, SIGHUP) while waiting: cancel the work too,
        fut.cancel()  # so that it unwinds on its loop instead of being dropped there pending
        raise


_home: asyncio.AbstractEventLoop | None = None
_on_demand: Portal | None = None
_lock = threading.Lock()


def set_home_loop(loop: asyncio.AbstractEventLoop | None) -> None:
    """Make ``loop`` the one sync calls of this process run on (None: back to on demand)."""
    global _home
    _home = loop


def home_loop() -> asyncio.AbstractEventLoop:
    """The home loop (see the module docstring), starting the on-demand portal if needed."""
    global _on_demand
    loop = _home
    if loop is not None and not loop.is_closed():
        return loop
    with _lock:
        if _on_demand is None or _on_demand.closed:
            _on_demand = Portal("rayless-portal")
        return _on_demand.loop


def submit_sync(aw: Awaitable[T]) -> concurrent.futures.Future[T]:
    """Start ``aw`` on the home loop; a ``concurrent.futures.Future`` of its result.

    Raises:
        RuntimeError: called from a thread that runs an event loop (use ``await``).
    """
    check_blocking_allowed("a sync-face call")
    return _submit(home_loop(), aw)


def run_sync(aw: Awaitable[T], timeout: float | None = None) -> T:
    """Run ``aw`` on the home loop and block until its result (at most ``timeout`` s).

    Raises:
        RuntimeError: called from a thread that runs an event loop (use ``await``).
        Timeout: no result within ``timeout`` (the work is cancelled).
    """
    if not isinstance(aw, Coroutine):
        aw = _awaited(aw)
    try:
        check_blocking_allowed()
    except RuntimeError:
        aw.close()
        raise
    return _wait(_submit(home_loop(), aw), timeout)
