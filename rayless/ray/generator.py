"""``ObjectRefGenerator``: what ``.remote()`` of a generator function or generator actor method
returns (Ray's streaming generator): one ObjectRef per item the remote generator yields, as it
yields it.

``for ref in gen`` and ``next(gen)`` block for the next item (not on the session's loop: in an
``async def`` actor method use ``async for ref in gen``); each ref is already resolved. An
exception the remote generator raises comes as the next ref (``ray.get`` of it raises it as
Ray's error), and the iteration ends after it. The remote side runs at most 64 items ahead of
the reader (rayless' stream backpressure). ``close()``, or dropping the generator, stops the
remote generator (its ``finally`` runs) and, for a task, gives its worker back.

Ray's readiness API: ``ray.wait([gen, ...])`` counts a generator ready once its next ref is
(``next(gen)`` then returns at once; a finished generator counts as ready), ``next_ready()``
says so without blocking, and ``completed()`` is a ref that is ready once the remote
generator has ended (``ray.get`` of it returns None, also after the generator's own error,
which is an item's; it raises where the call failed: a lost actor).
These read ahead into the generator's own buffer: one item for ``wait`` and ``next_ready``,
every item for ``completed()`` (as Ray keeps every yielded item in its object store until it
is taken).

Built on rayless' streamed results (``rayless.actors.RemoteStream``): the call returns the
stream, and each ``next`` pulls the next item through it on the session's loop.
"""

from __future__ import annotations

import asyncio
import collections
import concurrent.futures
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any, TypeVar

from rayless.actors import RemoteError, RemoteStream
from rayless.ray import _worker
from rayless.ray.object_ref import ObjectRef

__all__ = ["ObjectRefGenerator"]

Fut = asyncio.Future[Any] | concurrent.futures.Future[Any]
T = TypeVar("T")
# what a generator task's start resolves to: the call's result and what gives its worker back
Started = tuple[Any, Callable[[], Awaitable[None]] | None]


class ObjectRefGenerator:
    """The refs of a remote generator's items, in order (see the module docstring)."""

    # what the codec says of one met in a call's arguments
    __rayless_refusal__ = "a generator stays with its caller: send the values of its refs"

    def __init__(self, s: _worker.Session, started: Fut, *, task: bool) -> None:
        self._s = s
        self._started = started  # resolves to Started (a task) or to the call's result
        self._task = task
        self._stream: RemoteStream | None = None
        self._single: list[Any] = []  # a result that was no stream: the one item
        self._on_end: Callable[[], Awaitable[None]] | None = None
        self._done = False  # the remote generator ended (its items may still be ahead)
        # read ahead, in order, on the session's loop: (True, item) or (False, error), and
        # _END once the generator ended
        self._ahead: collections.deque[Any] = collections.deque()
        self._want: float = 0  # how many items the reader keeps ahead (inf: all)
        self._reader: asyncio.Task[None] | None = None
        self._arrived: asyncio.Event | None = None
        self._completed: concurrent.futures.Future[None] | None = None
        # done once the stream ended, was closed or dropped (an actor's end waits for it)
        self.finished: concurrent.futures.Future[None] = concurrent.futures.Future()

    # -- on the session's loop ----------------------------------------------------------

    async def _start(self) -> None:
        fut = self._started
        if isinstance(fut, asyncio.Future):
            value = await asyncio.shield(fut)
        else:
            value = await asyncio.wrap_future(fut)
        if self._task:
            value, self._on_end = value
        if isinstance(value, RemoteStream):
            self._stream = value
        else:  # the function returned a value, not a generator: that value is the one item
            self._single.append(value)

    async def _next(self) -> tuple[bool, Any]:
        """``(True, item)``, or ``(False, error)`` for an error of the call or the generator:
        the item read ahead, or the next one pulled.

        Raises:
            StopAsyncIteration: the generator ended (after an error too).
        """
        await self._until_ahead()
        if self._ahead:
            got = self._ahead.popleft()
            if got is _END:
                self._ahead.append(_END)  # every later next() ends too
                raise StopAsyncIteration
            return got
        return await self._pull()

    async def _until_ahead(self) -> None:
        """Wait while nothing is read ahead and the reader (if any) still reads."""
        while not self._ahead and self._reader is not None and not self._reader.done():
            assert self._arrived is not None  # internal invariant: made with the reader
            self._arrived.clear()
            await self._arrived.wait()

    def _read_ahead(self, want: float) -> None:
        """Keep ``want`` items read ahead (a reader task on the session's loop)."""
        self._want = max(self._want, want)
        if self._arrived is None:
            self._arrived = asyncio.Event()
        if self._reader is None or self._reader.done():
            self._reader = self._s.loop.create_task(self._read())

    async def _read(self) -> None:
        assert self._arrived is not None  # internal invariant: made before the task
        last: Any = None
        try:
            while len(self._ahead) < self._want and not self._ended_ahead():
                try:
                    last = await self._pull()
                except StopAsyncIteration:
                    self._ahead.append(_END)
                    self._settle(last)
                    return
                self._ahead.append(last)
                self._arrived.set()
        finally:
            self._arrived.set()

    def _ended_ahead(self) -> bool:
        return bool(self._ahead) and self._ahead[-1] is _END

    def _settle(self, last: Any) -> None:
        """The generator ended after ``last``: settle ``completed()``'s future (as Ray: the
        generator's own error is an item's, not the end's; a failed call or a lost actor
        fails it)."""
        fut = self._completed
        if fut is None or fut.done():
            return
        if last is not None and not last[0] and not isinstance(last[1], RemoteError):
            fut.set_exception(last[1])
        else:
            fut.set_result(None)

    async def _pull(self) -> tuple[bool, Any]:
        """The next item from the remote generator (see :meth:`_next`)."""
        if self._done:
            raise StopAsyncIteration
        try:
            if self._stream is None and not self._single:
                await self._start()
            if self._single:
                item = self._single.pop()
                await self._end()
                return True, item
            assert self._stream is not None  # internal invariant: set by _start
            return True, await self._stream.__anext__()
        except StopAsyncIteration:
            await self._end()
            raise
        except Exception as exc:  # the task's or the generator's error: the next ref's
            await self._end()
            return False, exc

    async def _end(self) -> None:
        """The stream ended (or was closed): give a task's worker back, once."""
        self._done = True
        if not self.finished.done():
            self.finished.set_result(None)
        on_end, self._on_end = self._on_end, None
        if on_end is not None:
            try:
                await on_end()
            except Exception:  # the session's pools are closing: nothing to give back to
                pass

    async def _aclose(self) -> None:
        reader, self._reader = self._reader, None
        if reader is not None and not reader.done():
            reader.cancel()
            try:
                await reader
            except BaseException:
                pass
        self._ahead.clear()
        self._ahead.append(_END)
        if self._completed is not None and not self._completed.done():
            self._completed.set_result(None)  # closed: it ends no later than now
        if self._stream is None and not self._single and not self._done:
            try:  # never read: its stream (and a task's worker) come with the call's result
                await self._start()
            except Exception:
                pass
        stream = self._stream
        self._done = True
        if stream is not None:
            await stream.aclose()
        await self._end()

    # -- the caller's side --------------------------------------------------------------

    def _ref(self, ok: bool, value: Any) -> ObjectRef:
        fut: concurrent.futures.Future[Any] = concurrent.futures.Future()
        if ok:
            fut.set_result(value)
        else:
            fut.set_exception(value)
        return ObjectRef(fut, self._s.generation, task=self._task)

    def __iter__(self) -> ObjectRefGenerator:
        return self

    def __next__(self) -> ObjectRef:
        """The ref of the next item, once it is yielded.

        Raises:
            StopIteration: the generator ended. RuntimeError: called on the session's loop
                (an ``async def`` actor method): use ``async for`` there.
        """
        try:
            return self._ref(*_worker.run(self._s, self._next()))
        except StopAsyncIteration:
            raise StopIteration from None

    def __aiter__(self) -> ObjectRefGenerator:
        return self

    async def __anext__(self) -> ObjectRef:
        """The ref of the next item, once it is yielded (any event loop)."""
        return self._ref(*await self._on_session_loop(self._next()))

    async def _on_session_loop(self, coro: Coroutine[Any, Any, T]) -> T:
        """``await coro`` run on the session's loop, from any event loop."""
        if asyncio.get_running_loop() is self._s.loop:
            return await coro
        return await asyncio.wrap_future(asyncio.run_coroutine_threadsafe(coro, self._s.loop))

    def is_finished(self) -> bool:
        """Whether every item has been taken (or the generator was closed)."""
        ahead = self._ahead
        return self._done and (not ahead or ahead[0] is _END)

    def next_ready(self) -> bool:
        """Whether ``next(gen)`` would return a ref at once (False once finished: see
        :meth:`is_finished`). Never blocks; the first call starts reading the item ahead."""
        return _worker.run(self._s, self._peek())

    async def _peek(self) -> bool:
        if self._ahead:
            return self._ahead[0] is not _END
        if self._done:
            return False
        self._read_ahead(1)
        return False

    def completed(self) -> ObjectRef:
        """A ref that is ready once the remote generator has ended: ``ray.get`` of it returns
        None (also after the generator's own error: that is an item's), or raises where the
        call failed (a lost actor). Reads every item ahead; they stay for ``next`` in order."""
        if self._completed is None:
            self._completed = concurrent.futures.Future()
            self._s.loop.call_soon_threadsafe(self._complete)
        return ObjectRef(self._completed, self._s.generation, task=self._task)

    def _complete(self) -> None:
        """On the session's loop: settle ``completed()`` now, or read to the end."""
        assert self._completed is not None  # internal invariant: set by completed()
        if self._completed.done():
            return
        if self._ended_ahead():
            errors = [a for a in self._ahead if a is not _END and not a[0]]
            self._settle(errors[-1] if errors else None)
        elif self._done:
            self._completed.set_result(None)  # every item was taken: it ended
        else:
            self._read_ahead(float("inf"))

    def _ready_future(self) -> concurrent.futures.Future[None]:
        """Done once ``next(gen)`` returns at once (its item read ahead, or the end):
        what ``ray.wait`` waits for."""
        return asyncio.run_coroutine_threadsafe(self._wait_ready(), self._s.loop)

    async def _wait_ready(self) -> None:
        if self._ahead or self._done:
            return
        self._read_ahead(1)
        await self._until_ahead()

    def close(self) -> None:
        """Stop the remote generator (its ``finally`` runs); a task's worker is given back.
        Idempotent; from blocking code (``await gen.aclose()`` in async code)."""
        if not self._done or self._on_end is not None:
            _worker.run(self._s, self._aclose())

    async def aclose(self) -> None:
        """``close`` from async code (any event loop)."""
        if not self._done or self._on_end is not None:
            await self._on_session_loop(self._aclose())

    def __del__(self) -> None:
        if self._done and self._on_end is None:
            return
        loop = self._s.loop
        if loop.is_closed():
            return
        try:
            loop.call_soon_threadsafe(lambda: loop.create_task(_quietly(self._aclose())))
        except RuntimeError:
            pass  # the loop is closing: the session's end stops the worker

    def __repr__(self) -> str:
        return f"ObjectRefGenerator({'finished' if self._done else 'running'})"

    def __reduce__(self) -> Any:
        raise TypeError("an ObjectRefGenerator cannot be pickled or passed to another call")


_END = object()  # the generator ended (in ObjectRefGenerator._ahead)


async def _quietly(coro: Awaitable[None]) -> None:
    try:
        await coro
    except Exception:
        pass
