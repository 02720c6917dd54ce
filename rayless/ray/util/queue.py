"""``ray.util.queue``: a first-in, first-out queue held by an actor, shared by every process
that has it (``Queue``, and its errors ``Empty`` and ``Full``).

The same methods, arguments, blocking rules and errors as Ray's: ``put``/``get`` block (at
most ``timeout`` seconds) unless ``block=False``; ``put_async``/``get_async`` are the
coroutine forms; ``put_nowait_batch``/``get_nowait_batch`` move many items in one call; a
full or empty queue raises ``Full``/``Empty``; ``shutdown`` ends the actor. The actor holds
no CPU unless ``actor_options`` asks for one (as in Ray), and starts from the fork template
any other actor of this process would (``rayless.ray.options.template_for``).

A queue travels as an argument of a task or actor call (its actor handle and ``maxsize``;
items are values rayless' codec carries). ``Queue()`` waits for its actor to start when it is
made outside a running event loop (so that it can be sent at once: tens of milliseconds, or
what is left of the torch template's warm-up just after ``ray.init``); made inside one, it
can be sent once its actor has started.
"""

from __future__ import annotations

import asyncio
import queue
from collections.abc import Iterable
from typing import Any

from rayless.actors import ActorHandle as _RaylessHandle
from rayless.transport import register_extension
from rayless.transport.errors import ProtocolError

__all__ = ["Empty", "Full", "Queue"]

EXTENSION = "rayless.ray.queue"  # the codec's name for a Queue (transport._foreign)


class Empty(queue.Empty):
    """The queue has no item (or not as many as asked for)."""


class Full(queue.Full):
    """The queue has no room (or not for as many items as offered)."""


class _QueueActor:
    """The actor that holds the items. Every method runs on the actor's event loop, the
    only thread that touches the ``asyncio.Queue``."""

    def __init__(self, maxsize: int) -> None:
        self.maxsize = maxsize
        self.queue: asyncio.Queue[Any] = asyncio.Queue(maxsize)

    async def qsize(self) -> int:
        return self.queue.qsize()

    async def empty(self) -> bool:
        return self.queue.empty()

    async def full(self) -> bool:
        return self.queue.full()

    async def put(self, item: Any, timeout: float | None = None) -> None:
        try:
            await asyncio.wait_for(self.queue.put(item), timeout)
        except asyncio.TimeoutError:
            raise Full from None

    async def get(self, timeout: float | None = None) -> Any:
        try:
            return await asyncio.wait_for(self.queue.get(), timeout)
        except asyncio.TimeoutError:
            raise Empty from None

    async def put_nowait(self, item: Any) -> None:
        try:
            self.queue.put_nowait(item)
        except asyncio.QueueFull:
            raise Full from None

    async def put_nowait_batch(self, items: list[Any]) -> None:
        if self.maxsize > 0 and len(items) + self.queue.qsize() > self.maxsize:
            raise Full(
                f"Cannot add {len(items)} items to queue of size {self.queue.qsize()} and "
                f"maxsize {self.maxsize}."
            )
        for item in items:
            self.queue.put_nowait(item)

    async def get_nowait(self) -> Any:
        try:
            return self.queue.get_nowait()
        except asyncio.QueueEmpty:
            raise Empty from None

    async def get_nowait_batch(self, num_items: int) -> list[Any]:
        if num_items > self.queue.qsize():
            raise Empty(f"Cannot get {num_items} items from queue of size {self.queue.qsize()}.")
        return [self.queue.get_nowait() for _ in range(num_items)]


def _check_timeout(timeout: float | None) -> None:
    if timeout is not None and timeout < 0:
        raise ValueError("'timeout' must be a non-negative number")


class Queue:
    """A FIFO queue on an actor, usable from the driver, tasks and actors.

    ``maxsize``: at most this many items (0: unbounded). ``actor_options``: options of the
    queue's actor (``Queue(actor_options={"num_cpus": 1})``).
    """

    def __init__(self, maxsize: int = 0, actor_options: dict[str, Any] | None = None) -> None:
        from rayless import ray

        self.maxsize = maxsize
        options = {"num_cpus": 0, **(actor_options or {})}
        self.actor: Any = ray.remote(_QueueActor).options(**options).remote(maxsize)
        try:
            asyncio.get_running_loop()
        except RuntimeError:  # no loop to stall: wait for the actor, so the queue can travel
            self.actor._wait_started()

    def __len__(self) -> int:
        return self.size()

    def size(self) -> int:
        """How many items the queue holds."""
        from rayless import ray

        n: int = ray.get(self.actor.qsize.remote())
        return n

    qsize = size

    def empty(self) -> bool:
        """Whether the queue holds no item."""
        from rayless import ray

        return bool(ray.get(self.actor.empty.remote()))

    def full(self) -> bool:
        """Whether the queue holds ``maxsize`` items."""
        from rayless import ray

        return bool(ray.get(self.actor.full.remote()))

    def put(self, item: Any, block: bool = True, timeout: float | None = None) -> None:
        """Add ``item``; with ``block``, wait for room (at most ``timeout`` seconds).

        Raises:
            Full: no room (at once without ``block``, else after ``timeout``).
            ValueError: ``timeout`` is negative.
        """
        from rayless import ray

        if not block:
            try:
                ray.get(self.actor.put_nowait.remote(item))
            except Full:
                raise Full from None
            return
        _check_timeout(timeout)
        ray.get(self.actor.put.remote(item, timeout))

    async def put_async(self, item: Any, block: bool = True, timeout: float | None = None) -> None:
        """:meth:`put` for async code (awaits instead of blocking).

        Raises:
            Full: no room (at once without ``block``, else after ``timeout``).
            ValueError: ``timeout`` is negative.
        """
        if not block:
            try:
                await self.actor.put_nowait.remote(item)
            except Full:
                raise Full from None
            return
        _check_timeout(timeout)
        await self.actor.put.remote(item, timeout)

    def get(self, block: bool = True, timeout: float | None = None) -> Any:
        """Take the oldest item; with ``block``, wait for one (at most ``timeout`` seconds).

        Raises:
            Empty: no item (at once without ``block``, else after ``timeout``).
            ValueError: ``timeout`` is negative.
        """
        from rayless import ray

        if not block:
            try:
                return ray.get(self.actor.get_nowait.remote())
            except Empty:
                raise Empty from None
        _check_timeout(timeout)
        return ray.get(self.actor.get.remote(timeout))

    async def get_async(self, block: bool = True, timeout: float | None = None) -> Any:
        """:meth:`get` for async code (awaits instead of blocking).

        Raises:
            Empty: no item (at once without ``block``, else after ``timeout``).
            ValueError: ``timeout`` is negative.
        """
        if not block:
            try:
                return await self.actor.get_nowait.remote()
            except Empty:
                raise Empty from None
        _check_timeout(timeout)
        return await self.actor.get.remote(timeout)

    def put_nowait(self, item: Any) -> None:
        """``put(item, block=False)``.

        Raises:
            Full: the queue is full.
        """
        self.put(item, block=False)

    def put_nowait_batch(self, items: Iterable[Any]) -> None:
        """Add every item of ``items`` in order, or none of them.

        Raises:
            TypeError: ``items`` is not iterable.
            Full: they do not all fit.
        """
        from rayless import ray

        if not isinstance(items, Iterable):
            raise TypeError("Argument 'items' must be an Iterable")
        ray.get(self.actor.put_nowait_batch.remote(list(items)))

    def get_nowait(self) -> Any:
        """``get(block=False)``.

        Raises:
            Empty: the queue is empty.
        """
        return self.get(block=False)

    def get_nowait_batch(self, num_items: int) -> list[Any]:
        """Take the ``num_items`` oldest items, or none.

        Raises:
            TypeError: ``num_items`` is not an int.
            ValueError: ``num_items`` is negative.
            Empty: the queue holds fewer items.
        """
        from rayless import ray

        if not isinstance(num_items, int):
            raise TypeError("Argument 'num_items' must be an int")
        if num_items < 0:
            raise ValueError("'num_items' must be nonnegative")
        items: list[Any] = ray.get(self.actor.get_nowait_batch.remote(num_items))
        return items

    def shutdown(self, force: bool = False, grace_period_s: int = 5) -> None:
        """End the queue's actor: at once with ``force``, else after the calls sent before
        this one have run (killed if that takes over ``grace_period_s`` seconds)."""
        from rayless import ray

        if self.actor is None:
            return
        if force:
            ray.kill(self.actor, no_restart=True)
        else:
            done = self.actor.__ray_terminate__.remote()
            _, not_done = ray.wait([done], timeout=grace_period_s)
            if not_done:
                ray.kill(self.actor, no_restart=True)
        self.actor = None


def _state(q: Queue) -> list[Any]:
    """A queue as the codec carries it: ``[maxsize, its actor's rayless handle]``.

    Raises:
        TypeError: the queue was shut down, or its actor has not started yet.
    """
    actor = q.actor
    inner = None if actor is None else getattr(actor, "_inner", actor)
    if not isinstance(inner, _RaylessHandle):
        raise TypeError(
            "a Queue can be sent once its actor has started (and until it is shut down)"
        )
    return [q.maxsize, inner]


def _from_state(state: Any) -> Queue:
    """Rebuild a queue from :func:`_state`'s state.

    Raises:
        ProtocolError: a malformed state.
    """
    from rayless.ray.actor import from_rayless

    if type(state) is not list or len(state) != 2:
        raise ProtocolError("bad Queue record")
    maxsize, inner = state
    if type(maxsize) is not int or not isinstance(inner, _RaylessHandle):
        raise ProtocolError("bad Queue record")
    q = Queue.__new__(Queue)
    q.maxsize = maxsize
    q.actor = from_rayless(inner)
    return q


register_extension(Queue, EXTENSION, _state, _from_state)
