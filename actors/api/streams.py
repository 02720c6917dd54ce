"""Streaming results: an actor method that is a generator (``def`` with ``yield``) or an async
generator sends its items to the caller as they are produced.

A call to such a method answers at once with a :class:`RemoteStream`: ``stream = await
h.tokens(prompt)``, then ``async for item in stream`` (or ``for item in stream`` in blocking
code, ``h.tokens.call(prompt)`` from the sync face). Each pull brings every item produced
since the last one (at most ``STREAM_BATCH``); the actor runs at most ``STREAM_AHEAD`` items
ahead of what its caller took (backpressure: a generator nobody reads stops at a ``yield``).

* An exception the generator raises reaches the caller after the items produced before it,
  as any remote error of a call does.
* Leaving the loop early (``break``), ``await stream.aclose()``, dropping the stream, or the
  caller's connection going away closes the generator in the actor: its ``finally`` blocks
  run (``GeneratorExit`` at its ``yield``).
* A ``def`` generator's body runs on the actor's worker thread, one ``next()`` at a time,
  taking turns with the actor's other ``def`` methods; an ``async def`` generator runs on
  the actor's loop.
* A stream is read once, by the process that called; it can be passed to another process
  (it names its actor), but only one reader may pull.

Ray's ``num_returns="streaming"`` returns a generator of object refs; here the items come
themselves (docs/moving-from-ray.md).
"""

from __future__ import annotations

import asyncio
import collections
import functools
import inspect
import itertools
from collections.abc import Callable
from typing import Any

from rayless.actors.api.handle import ActorHandle
from rayless.transport.codec import register_extension
from rayless.transport.errors import RaylessError

__all__ = ["STREAM_AHEAD", "STREAM_BATCH", "RemoteStream", "StreamHost", "is_stream"]

STREAM_AHEAD = 64  # items an actor produces ahead of its caller
STREAM_BATCH = 256  # items one pull brings at most
_END = object()
NEXT, CLOSE = "s", "x"  # the call body's kinds of a pull and a close (``("s", id, n)``)


def is_stream(value: Any) -> bool:
    """Whether a method's return value is a generator to stream."""
    return inspect.isgenerator(value) or inspect.isasyncgen(value)


Submit = Callable[[Callable[[], Any]], "asyncio.Future[Any]"]


class _Stream:
    __slots__ = ("caller", "error", "gen", "items", "submit", "task")

    def __init__(self, gen: Any, caller: str, submit: Submit) -> None:
        self.gen = gen
        self.caller = caller
        self.submit = submit  # runs a def generator's steps (its method's threads)
        self.items: asyncio.Queue[Any] = asyncio.Queue(STREAM_AHEAD)
        self.task: asyncio.Task[None] | None = None
        self.error: BaseException | None = None


class StreamHost:
    """The actor's side: the generators its methods returned, served item by item.

    ``submit`` runs a function on the actor's worker thread (a ``def`` generator's steps);
    ``to_error`` turns an exception the generator raised into the error its caller gets.
    """

    def __init__(
        self,
        loop: asyncio.AbstractEventLoop,
        submit: Submit,
        to_error: Callable[[BaseException], BaseException],
    ) -> None:
        self._loop = loop
        self._submit = submit
        self._to_error = to_error
        self._ids = itertools.count(1)
        self._streams: dict[int, _Stream] = {}
        self.handle: ActorHandle[Any] | None = None  # this actor's own handle, once it serves

    def __len__(self) -> int:
        return len(self._streams)

    def open(self, gen: Any, caller: str, submit: Submit | None = None) -> RemoteStream:
        """Register ``gen`` and return the caller's stream of it (from the actor's loop or
        its worker thread: the generator starts on the loop). ``submit``: where a ``def``
        generator's steps run (its method's concurrency group's threads), by default the
        actor's worker thread."""
        if self.handle is None:
            raise RuntimeError("an actor streams results only once it serves")
        sid = next(self._ids)
        stream = self._streams[sid] = _Stream(gen, caller, submit or self._submit)
        self._loop.call_soon_threadsafe(self._start, sid, stream)
        return RemoteStream(self.handle, sid)

    def _start(self, sid: int, stream: _Stream) -> None:
        if self._streams.get(sid) is stream:  # not closed before it started
            stream.task = asyncio.ensure_future(self._produce(stream))
        else:
            self._close_gen(stream)

    async def _produce(self, stream: _Stream) -> None:
        gen, items = stream.gen, stream.items
        try:
            if inspect.isasyncgen(gen):
                async for item in gen:
                    await items.put(item)
            else:
                step = functools.partial(next, gen, _END)
                while True:
                    item = await stream.submit(step)
                    if item is _END:
                        break
                    await items.put(item)
        except asyncio.CancelledError:
            self._close_gen(stream)
            raise
        except BaseException as exc:  # StopIteration, KeyboardInterrupt...: the caller's
            stream.error = self._to_error(exc)
        await items.put(_END)

    def _close_gen(self, stream: _Stream) -> None:
        gen = stream.gen
        if inspect.isasyncgen(gen):
            asyncio.ensure_future(_quietly(gen.aclose()))
        else:
            stream.submit(functools.partial(_close_quietly, gen)).add_done_callback(_consume)

    async def pull(self, sid: Any, most: Any) -> tuple[list[Any], bool]:
        """The items produced since the last pull (at least one, or the end): ``(items,
        ended)``.

        Raises:
            ValueError: no such stream (closed, ended, or never opened here).
            the generator's own error, once its earlier items were taken.
        """
        stream = self._streams.get(sid) if type(sid) is int else None
        if stream is None:
            raise ValueError(f"no open stream {sid!r} (it ended or was closed)")
        limit = most if type(most) is int and 0 < most <= STREAM_BATCH else STREAM_BATCH
        out = [await stream.items.get()]
        while len(out) < limit and not stream.items.empty() and out[-1] is not _END:
            out.append(stream.items.get_nowait())
        if out[-1] is not _END:
            return out, False
        del self._streams[sid]
        out.pop()
        if stream.error is not None and not out:
            raise stream.error
        if stream.error is not None:  # the items first, the error at the next pull
            self._streams[sid] = stream
            stream.items.put_nowait(_END)
        return out, stream.error is None

    def close(self, sid: Any) -> bool:
        """Close stream ``sid`` (its generator's ``finally`` runs); False if it was not open."""
        stream = self._streams.pop(sid, None) if type(sid) is int else None
        if stream is None:
            return False
        if stream.task is not None and not stream.task.done():
            stream.task.cancel()  # the producer closes the generator
        return True

    def caller_gone(self, caller: str) -> None:
        """Close every stream of a caller whose connection went away."""
        for sid in [s for s, st in self._streams.items() if st.caller == caller]:
            self.close(sid)

    def close_all(self) -> None:
        """Close every stream (the actor stops)."""
        for sid in list(self._streams):
            self.close(sid)


async def _quietly(aw: Any) -> None:
    try:
        await aw
    except BaseException:  # the generator's cleanup raised: nobody is left to tell
        pass


def _close_quietly(gen: Any) -> None:
    try:
        gen.close()
    except BaseException:  # running in another thread, or its cleanup raised
        pass


def _consume(fut: asyncio.Future[Any]) -> None:
    if not fut.cancelled():
        fut.exception()


class RemoteStream:
    """The caller's side of a streaming method's result: an async iterator (and a blocking
    one) over the items the actor's generator yields. See the module docstring."""

    def __init__(self, handle: ActorHandle[Any], sid: int) -> None:
        self.handle = handle
        self.sid = sid
        self._buffer: collections.deque[Any] = collections.deque()
        self._ended = False
        self._loop: asyncio.AbstractEventLoop | None = None

    def __repr__(self) -> str:
        return f"RemoteStream({self.handle.name!r}, {self.sid})"

    def _state(self) -> list[Any]:
        return [self.handle, self.sid]

    def __aiter__(self) -> RemoteStream:
        return self

    async def __anext__(self) -> Any:
        if not self._buffer:
            if self._ended:
                raise StopAsyncIteration
            items, self._ended = await self._request((NEXT, self.sid, STREAM_BATCH))
            self._buffer.extend(items)
            if not self._buffer:
                raise StopAsyncIteration
        return self._buffer.popleft()

    async def _request(self, body: tuple[Any, ...]) -> Any:
        from rayless.actors.api.runtime import get_runtime

        self._loop = asyncio.get_running_loop()
        runtime = await get_runtime()
        try:
            return await runtime.request(self.handle, body)
        except BaseException:
            self._ended = True  # an error ends the stream (the actor dropped it)
            raise

    async def aclose(self) -> None:
        """Stop the stream: the actor closes the generator (its ``finally`` runs). Idempotent."""
        if self._ended:
            return
        self._ended = True
        self._buffer.clear()
        try:
            await self._request((CLOSE, self.sid))
        except RaylessError:
            pass  # the actor is gone: so is the generator

    def __iter__(self) -> RemoteStream:
        return self

    def __next__(self) -> Any:
        from rayless.actors.api.portal import run_sync

        try:
            return run_sync(self.__anext__())
        except StopAsyncIteration:
            raise StopIteration from None

    def close(self) -> None:
        """``aclose`` from blocking code."""
        from rayless.actors.api.portal import run_sync

        run_sync(self.aclose())

    def __del__(self) -> None:
        loop = self._loop
        if self._ended or loop is None or loop.is_closed():
            return
        try:
            loop.call_soon_threadsafe(lambda: asyncio.ensure_future(_quietly(self.aclose())))
        except RuntimeError:
            pass  # the loop is closing


def _from_state(state: list[Any]) -> RemoteStream:
    if len(state) != 2 or not isinstance(state[0], ActorHandle) or type(state[1]) is not int:
        raise ValueError("bad stream record")
    return RemoteStream(state[0], state[1])


register_extension(RemoteStream, "rayless.stream", RemoteStream._state, _from_state)
