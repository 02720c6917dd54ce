"""``ObjectRef``: the future of one task or actor call result, or of a ``ray.put`` value.

It wraps the rayless future of the call (an asyncio future on the session's loop, or a
``concurrent.futures.Future`` elsewhere). ``ray.get`` and ``ray.wait`` read it; ``await ref``
works in any event loop; as a top-level argument of another call it resolves to its value
(rayless resolves futures passed as arguments). Errors come out as Ray's
(``rayless.ray.exceptions``).

Inside a value (a list of refs passed to a task, a dict of refs returned by one), a ref
travels as itself, as in Ray, carrying its outcome: it must be made by the time it is
encoded. A call waits for the refs one level inside its list, tuple and dict arguments
(``actor.resolve``), an actor or task worker for those in its method's result (the
result itself, or one level inside a list, tuple or dict: a hook on the actor's results);
the receiver gets a ref that is already done (its value, or its error for ``ray.get`` to
raise there).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import sys
import uuid
from collections.abc import Awaitable, Callable, Generator
from typing import Any

from rayless.actors.ext import ResultHook, add_result_hook, materialize, self_call_blocks
from rayless.errors import RaylessError, RemoteError
from rayless.ray import _worker
from rayless.ray.exceptions import ObjectLostError, map_error
from rayless.transport import (
    ProtocolError,
    decode,
    encode,
    pickle_allowed,
    register_extension,
)

__all__ = ["ObjectRef", "put_ref", "snapshot"]

Fut = asyncio.Future[Any] | concurrent.futures.Future[Any]
ARRIVED = -1  # the generation of a ref that came inside a value: it holds its own outcome


class ObjectRef:
    """A reference to a value that a task, an actor call or ``ray.put`` produces."""

    __slots__ = (
        "__weakref__",
        "_future",
        "_generation",
        "_hex",
        "_on_cancel",
        "_self_call",
        "_task",
    )

    def __init__(
        self,
        future: Fut,
        generation: int,
        *,
        task: bool = False,
        on_cancel: Callable[[bool], None] | None = None,
        self_call: tuple[str, str | None] | None = None,
    ) -> None:
        self._future = future
        self._generation = generation
        self._task = task
        self._on_cancel = on_cancel
        self._hex: str | None = None
        # (method, group) of a call an actor made on itself: a blocking get of it may be
        # one that never ends (``result``)
        self._self_call = self_call

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
        if self._generation == ARRIVED:
            return
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
            RuntimeError: with no timeout, a pending call this actor made on itself, which
                needs the very thread that would wait for it.
        """
        fut = self._future
        if self._self_call is not None and timeout is None and not fut.done():
            method, group = self._self_call
            if self_call_blocks(method, group):
                raise RuntimeError(
                    f"ray.get of this actor's own call {method!r} would wait for good: the "
                    "actor runs that call on the thread that would wait for it, one call at "
                    "a time. Return the ref instead, give the actor max_concurrency > 1, "
                    "make the method async, or pass a timeout"
                )
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

    async def settled(self) -> None:
        """Wait until the value (or the error) is made, without raising either."""
        try:
            await self._await()
        except Exception:  # the error travels with the ref; it is not ours to raise
            pass

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
            "an ObjectRef cannot be pickled: send it in a call's arguments or result (it "
            "travels with its value), or ray.get it first"
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


_AS_IS = frozenset({int, float, bool, str, bytes, type(None)})


def snapshot(value: Any) -> Any:
    """What ``ray.put`` keeps of ``value``: a copy made now, as a receiver would get it
    (Ray serializes a put value at once, so later changes to ``value`` are not seen).
    Tensors are copied once, and stay on their device. A value rayless cannot send (it
    would fail when sent), or one holding a ref still pending, is kept as it is."""
    if type(value) in _AS_IS:
        return value
    try:
        frames = encode(value, allow_pickle=pickle_allowed())
        copies = [f if type(f) is bytes else _copy(f) for f in frames]
        return decode(copies, allow_pickle=pickle_allowed(), device="origin")
    except Exception:  # cannot be sent: kept by reference (the send fails, as it would)
        return value


_BIG = 1 << 20  # bytes from which a buffer is copied by torch (about 2x bytearray's speed)


def _copy(frame: Any) -> Any:
    """A writable copy of an encoded buffer."""
    view = memoryview(frame)
    torch = sys.modules.get("torch")  # loaded where a tensor is put; not imported for this
    if view.nbytes < _BIG or view.readonly or torch is None:
        return bytearray(view)
    return torch.frombuffer(view, dtype=torch.uint8).clone().numpy()


def put_ref(value: Any, generation: int) -> ObjectRef:
    """An ObjectRef already holding ``value`` (``ray.put``)."""
    fut: concurrent.futures.Future[Any] = concurrent.futures.Future()
    fut.set_result(value)
    return ObjectRef(fut, generation)


def _ref_state(ref: ObjectRef) -> list[Any]:
    """A ref inside a value: its id, whether a task made it, and its outcome.

    Raises:
        TypeError: the ref's value is not made yet (only refs one level inside a call's
            list, tuple and dict arguments, and inside a method's result, are waited for).
    """
    fut = ref._future
    if not fut.done():
        raise TypeError(
            "an ObjectRef inside a value travels once its value is made: refs one level "
            "inside a list, tuple or dict argument are waited for; for this one, ray.wait "
            "or ray.get it first"
        )
    if fut.cancelled():
        return [ref.hex(), ref._task, "cancelled", None]
    exc = fut.exception()
    if exc is None:
        return [ref.hex(), ref._task, "value", fut.result()]
    if not isinstance(exc, RaylessError):
        exc = RemoteError.from_exception(exc)
    return [ref.hex(), ref._task, "error", exc]


def _ref_from_state(state: Any) -> ObjectRef:
    """A ref that arrived inside a value: done, with the outcome it carried."""
    if not (type(state) is list and len(state) == 4 and type(state[0]) is str):
        raise ProtocolError("bad ObjectRef record")
    ref_id, task, outcome, payload = state
    fut: concurrent.futures.Future[Any] = concurrent.futures.Future()
    if outcome == "value":
        fut.set_result(payload)
    elif outcome == "error" and isinstance(payload, RaylessError):
        # as a reply's error is: also an instance of the original type, where it is found here
        fut.set_exception(materialize(payload) if type(payload) is RemoteError else payload)
    elif outcome == "cancelled":
        fut.cancel()
    else:
        raise ProtocolError("bad ObjectRef record")
    ref = ObjectRef(fut, ARRIVED, task=bool(task))
    ref._hex = ref_id
    return ref


def _refs_in(result: Any) -> list[ObjectRef]:
    """The refs a method's result holds: itself, or one level inside a list, tuple or dict."""
    kind = type(result)
    if kind is ObjectRef:
        return [result]
    if kind is dict:
        result = result.values()
    elif kind is not list and kind is not tuple:
        return []
    if ObjectRef not in map(type, result):  # the common case, decided in C
        return []
    return [v for v in result if type(v) is ObjectRef]


def _pending(result: Any) -> Awaitable[None] | None:
    """What a method's result waits for before it is sent: its refs not made yet."""
    refs = _refs_in(result)
    if not refs:
        return None
    waiting = [ref for ref in refs if not ref._future.done()]
    return _settled(waiting) if waiting else None


async def _settled(refs: list[ObjectRef]) -> None:
    for ref in refs:
        await ref.settled()


register_extension(ObjectRef, "rayless.ray.object_ref", _ref_state, _ref_from_state)
add_result_hook(ResultHook(_pending))
