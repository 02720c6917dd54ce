"""Actor handles: how callers reach an actor. Plain, encodable data; any process can use one.

``await handle.method(x)`` calls and waits; ``handle.method.submit(x)`` (alias ``remote``)
returns an asyncio future at once; ``handle.method.call(x)`` is the blocking form for sync
code. Handles travel as arguments and results of calls (the codec knows them), so actors can
call each other. ``wait`` and ``gather`` work over the futures, like ``ray.wait``/``ray.get``.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Iterable
from typing import Any

from rayless.actors.api.runtime import fast_submit, get_runtime, run_sync
from rayless.transport.codec import register_extension
from rayless.transport.errors import Timeout


class ActorHandle:
    """A reference to a live actor. Attribute access gives its methods."""

    __slots__ = ("actor_id", "address", "cls_name", "methods", "name", "node_id")

    def __init__(
        self,
        actor_id: str,
        name: str,
        address: str,
        cls_name: str = "",
        methods: dict[str, bool] | None = None,
        node_id: str | None = None,
    ) -> None:
        self.actor_id = actor_id
        self.name = name
        self.address = address
        self.cls_name = cls_name
        self.methods = methods or {}
        self.node_id = node_id

    @classmethod
    def from_record(cls, record: dict[str, Any]) -> ActorHandle:
        """A handle from the head's record of an actor."""
        return cls(
            str(record["actor_id"]),
            str(record["name"]),
            str(record.get("address", "")),
            str(record.get("cls", "")),
            dict(record.get("methods") or {}),
            record.get("node_id"),
        )

    def __getattr__(self, method: str) -> ActorMethod:
        if method.startswith("__"):
            raise AttributeError(method)
        return ActorMethod(self, method)

    def __repr__(self) -> str:
        return f"ActorHandle({self.name!r}, {self.cls_name}, node={self.node_id})"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, ActorHandle) and other.actor_id == self.actor_id

    def __hash__(self) -> int:
        return hash(self.actor_id)

    def _state(self) -> list[Any]:
        return [self.actor_id, self.name, self.address, self.cls_name, self.methods, self.node_id]


class ActorMethod:
    """One method of an actor, bound to its handle."""

    __slots__ = ("handle", "method")

    def __init__(self, handle: ActorHandle, method: str) -> None:
        self.handle = handle
        self.method = method

    def __call__(self, *args: Any, **kwargs: Any) -> Awaitable[Any]:
        """Call the method; await the result.

        Raises (when awaited):
            ActorDiedError: the actor died before or during the call.
            RemoteError: the method raised; also an instance of the original type where that
                type is loaded in this process (``except ValueError`` works).
        """
        fut = fast_submit(self.handle, self.method, args, kwargs)
        return fut if fut is not None else _call(self.handle, self.method, args, kwargs)

    def submit(self, *args: Any, **kwargs: Any) -> asyncio.Future[Any]:
        """Start the call now and return a future of its result (needs a running loop)."""
        fut = fast_submit(self.handle, self.method, args, kwargs)
        if fut is not None:
            return fut
        return asyncio.ensure_future(_call(self.handle, self.method, args, kwargs))

    remote = submit  # Ray's spelling

    def call(self, *args: Any, timeout: float | None = None, **kwargs: Any) -> Any:
        """Call from sync code and block until the result (at most ``timeout`` seconds).

        Raises:
            Timeout: no result within ``timeout``.
            RuntimeError: called on the event loop's own thread (use ``await`` there).
        """
        return run_sync(_call(self.handle, self.method, args, kwargs), timeout)

    def __repr__(self) -> str:
        return f"<method {self.method} of {self.handle!r}>"


async def _call(handle: ActorHandle, method: str, args: tuple[Any, ...], kwargs: Any) -> Any:
    runtime = await get_runtime()
    return await runtime.call(handle, method, args, kwargs)


async def wait(
    futures: Iterable[Awaitable[Any]],
    *,
    num_returns: int = 1,
    timeout: float | None = None,
) -> tuple[list[asyncio.Future[Any]], list[asyncio.Future[Any]]]:
    """Wait until ``num_returns`` of ``futures`` are done or ``timeout`` passes (``ray.wait``).

    Returns (done, pending), each in the order given.

    Raises:
        ValueError: ``num_returns`` is not between 1 and the number of futures.
    """
    futs = [asyncio.ensure_future(f) for f in futures]
    if not 1 <= num_returns <= max(1, len(futs)):
        raise ValueError(f"num_returns must be in 1..{len(futs)}, got {num_returns}")
    if not futs:
        return [], []
    loop = asyncio.get_running_loop()
    deadline = None if timeout is None else loop.time() + timeout
    pending = {f for f in futs if not f.done()}
    while len(futs) - len(pending) < num_returns and pending:
        left = None if deadline is None else deadline - loop.time()
        if left is not None and left <= 0:
            break
        _, pending = await asyncio.wait(pending, timeout=left, return_when="FIRST_COMPLETED")
    done_set = {f for f in futs if f.done()}
    return [f for f in futs if f in done_set], [f for f in futs if f not in done_set]


async def gather(*aws: Awaitable[Any], timeout: float | None = None) -> list[Any]:
    """All results in order (``ray.get`` of a list); the first error is raised.

    Raises:
        Timeout: not all finished within ``timeout`` seconds (the rest are cancelled).
    """
    try:
        return list(await asyncio.wait_for(asyncio.gather(*aws), timeout))
    except asyncio.TimeoutError:
        raise Timeout(f"not all {len(aws)} results arrived within {timeout}s") from None


register_extension(
    ActorHandle, "rayless.actor_handle", ActorHandle._state, lambda s: ActorHandle(*s)
)
