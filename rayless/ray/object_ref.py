"""``ObjectRef``: the future of one task or actor call result, or of a ``ray.put`` value.

It wraps the rayless future of the call (an asyncio future on the session's loop, or a
``concurrent.futures.Future`` elsewhere). ``ray.get`` and ``ray.wait`` read it; ``await ref``
works in any event loop; as a top-level argument of another call it resolves to its value
(rayless resolves futures passed as arguments). Errors come out as Ray's
(``rayless.ray.exceptions``).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import uuid
from collections.abc import Callable, Generator
from typing import Any

from rayless.errors import RaylessError, RemoteError
from rayless.ray import _worker
from rayless.ray.exceptions import ObjectLostError, map_error

__all__ = ["ObjectRef"]

Fut = asyncio.Future[Any] | concurrent.futures.Future[Any]


class ObjectRef:
    """A reference to a value that a task, an actor call or ``ray.put`` produces."""

    __slots__ = ("__weakref__", "_future", "_generation", "_hex", "_on_cancel", "_task")
    # what the codec says of a ref it meets inside an argument (Ray passes one through)
    __rayless_refusal__ = (
        "a ref is resolved only as an argument of its own: pass it as one, or ray.get it first"
    )

    def __init__(
        self,
        future: Fut,
        generation: int,
        *,
        task: bool = False,
        on_cancel: Callable[[bool], None] | None = None,
    ) -> None:
        self._future = future
        self._generation = generation
        self._task = task
        self._on_cancel = on_cancel
        self._hex: str | None = None

    def hex(self) -> str:
        """A unique id of this ref (Ray's ``ObjectRef.hex()``)."""
        if self._hex is None:
            self._hex = uuid.uuid4().hex + "0" * 8
        return self._hex

    def binary(self) -> bytes:
        """The id as bytes."""
        return bytes.fromhex(self.hex())

    def task_id(self) -> str:
        """The id of the task (or call) that makes the value."""
        return self.hex()[:32]

    def future(self) -> concurrent.futures.Future[Any]:
        """A ``concurrent.futures.Future`` of the value (Ray errors mapped)."""
        out: concurrent.futures.Future[Any] = concurrent.futures.Future()

        def done(f: Fut) -> None:
            if f.cancelled():
                out.set_exception(map_error(asyncio.CancelledError()))
            elif f.exception() is not None:
                out.set_exception(map_error(f.exception(), task=self._task))  # type: ignore[arg-type]
            else:
                out.set_result(f.result())

        self._future.add_done_callback(done)
        return out

    def check_alive(self) -> None:
        """Raise ObjectLostError when this ref's session was shut down before its value was
        made (the call was still running, or failed because the session closed)."""
        s = _worker.current()
        if s is not None and s.generation == self._generation:
            return
        fut = self._future
        lost = not fut.done() or fut.cancelled()
        if not lost:
            exc = fut.exception()
            lost = isinstance(exc, RaylessError) and not isinstance(exc, RemoteError)
        if lost:
            raise ObjectLostError(
                f"ObjectRef {self.hex()[:16]} belongs to a ray session that was shut down "
                "before its value was made"
            )

    def result(self, timeout: float | None) -> Any:
        """Block for the value (``ray.get`` of one ref).

        Raises:
            the mapped Ray error; concurrent.futures.TimeoutError past ``timeout``.
        """
        fut = self._future
        if isinstance(fut, asyncio.Future):
            if not fut.done():
                s = _worker.current()
                if s is None or _worker.on_loop(s):
                    raise RuntimeError(
                        "ray.get of a pending ref inside an async actor method would block "
                        "the actor's event loop for good: use `await ref` there"
                    )
                try:
                    return _worker.run(s, _awaited(fut), timeout)
                except concurrent.futures.TimeoutError:
                    if fut.done():  # the call's own TimeoutError, not the wait's
                        return _value(fut, self._task)
                    raise
                except BaseException as exc:
                    raise map_error(exc, task=self._task) from None
            return _value(fut, self._task)
        try:
            return fut.result(timeout)
        except concurrent.futures.TimeoutError:
            if fut.done():
                raise map_error(fut.exception(), task=self._task) from None  # type: ignore[arg-type]
            raise
        except concurrent.futures.CancelledError as exc:
            raise map_error(exc) from None
        except BaseException as exc:
            raise map_error(exc, task=self._task) from None

    def __await__(self) -> Generator[Any, None, Any]:
        return self._await().__await__()

    async def _await(self) -> Any:
        fut = self._future
        try:
            if isinstance(fut, asyncio.Future):
                if fut.get_loop() is asyncio.get_running_loop():
                    return await asyncio.shield(fut)
                return await asyncio.wrap_future(self.future())
            return await asyncio.shield(asyncio.wrap_future(fut))
        except asyncio.CancelledError:
            if fut.cancelled():
                raise map_error(asyncio.CancelledError()) from None
            raise
        except BaseException as exc:
            raise map_error(exc, task=self._task) from None

    def __repr__(self) -> str:
        return f"ObjectRef({self.hex()})"

    def __reduce__(self) -> Any:
        raise TypeError(
            "an ObjectRef cannot be pickled or sent inside a container: pass it as a top-level "
            "argument (it resolves to its value) or ray.get it first"
        )


async def _awaited(fut: asyncio.Future[Any]) -> Any:
    return await asyncio.shield(fut)


def _value(fut: asyncio.Future[Any], task: bool) -> Any:
    if fut.cancelled():
        raise map_error(asyncio.CancelledError())
    exc = fut.exception()
    if exc is not None:
        raise map_error(exc, task=task)
    return fut.result()


def put_ref(value: Any, generation: int) -> ObjectRef:
    """An ObjectRef already holding ``value`` (``ray.put``)."""
    fut: concurrent.futures.Future[Any] = concurrent.futures.Future()
    fut.set_result(value)
    return ObjectRef(fut, generation)
