"""One lifecycle for every resource: ``x = await open_it()`` or ``async with open_it() as x``.

Openers (``Cluster.local``, ``actors.connect``, ``Store.create``, ``Store.connect``) return an
:class:`Opening`: awaiting it gives the resource (the caller then calls ``aclose()``);
``async with`` gives the same resource and closes it on exit. Every resource has an
idempotent ``aclose()`` and is itself an async context manager.
"""

from __future__ import annotations

import functools
from collections.abc import Awaitable, Callable, Generator
from typing import Any, Generic, ParamSpec, Protocol, TypeVar

__all__ = ["Closeable", "Opening", "opener"]


class Closeable(Protocol):
    """Anything with an idempotent ``aclose()``."""

    async def aclose(self) -> None: ...


R = TypeVar("R", bound=Closeable)
P = ParamSpec("P")


class Opening(Generic[R]):
    """A resource being opened: await it, or use it as an async context manager (once)."""

    __slots__ = ("_open", "_resource", "_used")

    def __init__(self, open_: Callable[[], Awaitable[R]]) -> None:
        self._open = open_
        self._resource: R | None = None
        self._used = False

    def _start(self) -> Awaitable[R]:
        if self._used:
            raise RuntimeError("this opening was already awaited or entered; call the opener again")
        self._used = True
        return self._open()

    def __await__(self) -> Generator[Any, None, R]:
        return self._start().__await__()

    async def __aenter__(self) -> R:
        self._resource = await self._start()
        return self._resource

    async def __aexit__(self, *exc: object) -> None:
        resource, self._resource = self._resource, None
        if resource is not None:
            await resource.aclose()


def opener(fn: Callable[P, Awaitable[R]]) -> Callable[P, Opening[R]]:
    """Decorate an async factory so that it returns an :class:`Opening` (same parameters).

    Argument errors surface when the opening is awaited or entered.
    """

    @functools.wraps(fn)
    def open_(*args: P.args, **kwargs: P.kwargs) -> Opening[R]:
        return Opening(lambda: fn(*args, **kwargs))

    return open_
