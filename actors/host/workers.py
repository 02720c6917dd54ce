"""The threads that run an actor's ``def`` methods (and its constructor, ``setup``, ``teardown``).

:class:`SyncWorker` runs at most ``concurrency`` calls at a time: 1 by default (calls run one
after another, in order, so plain classes need no locks), ``max_concurrency`` when the actor
was spawned with one (Ray's threaded actors). Threads start on demand.

Calls queue for the threads, which take them back to back without going through the loop:
a thread that finishes a call takes the next queued one itself; the loop wakes a thread only
when one sleeps, once per loop callback that queued calls (a whole batch of requests read
from a socket); and a thread wakes the loop only for the first result of a batch (the loop
then delivers every result finished by the time it runs). With calls pipelined to an actor,
both hand-offs cost far less than one per call (``transport.counters`` counts them;
docs/performance.md has the budget).

The threads read a queued call's future (``cancelled()``) without the loop: a cancel that
comes after a thread has taken the call lets it run.

A job may return :class:`Later`: its call's future then gets the outcome of an awaitable run
on the loop, while the thread goes on with the next call (a result that waits for something
made elsewhere, perhaps by a later call to this same actor).

Cancellation is best effort, as in Ray: Python cannot stop a running thread safely.

* A queued call whose caller gave up (timed out, cancelled) is dropped without running.
* A running call runs to completion (its result is discarded) and keeps its slot until it
  returns, so at most ``concurrency`` calls ever run at once, abandoned ones included (as
  Ray's ``max_concurrency``); later calls wait for a slot.
"""

from __future__ import annotations

import asyncio
import collections
import queue
import threading
from collections.abc import Awaitable, Callable
from typing import Any

from rayless.actors.core.threads import apply_torch_threads
from rayless.transport.counters import COUNTERS
from rayless.transport.errors import RemoteError


class _Job:
    __slots__ = ("fn", "fut")

    def __init__(self, fut: asyncio.Future[Any], fn: Callable[[], Any]) -> None:
        self.fut = fut
        self.fn = fn


class Later:
    """What a job returns for its call to be answered once ``awaitable`` (run on the loop)
    gives the result, the job's thread being free meanwhile."""

    __slots__ = ("awaitable",)

    def __init__(self, awaitable: Awaitable[Any]) -> None:
        self.awaitable = awaitable


class SyncWorker:
    """Runs sync calls on up to ``concurrency`` threads; results come back on ``loop``.

    Args:
        loop: the actor's event loop (every method but the threads' runs on it).
        name: names the threads (``actor-NAME-i``).
        threads: torch intra-op threads for each worker thread.
        concurrency: calls that may run at once.

    Raises:
        ValueError: ``concurrency`` is below 1.
    """

    def __init__(
        self, loop: asyncio.AbstractEventLoop, name: str, threads: int = 1, concurrency: int = 1
    ) -> None:
        if concurrency < 1:
            raise ValueError(f"concurrency must be >= 1, got {concurrency}")
        self._loop = loop
        self._name = name
        self._torch_threads = threads
        self.concurrency = concurrency
        self._threads: list[threading.Thread] = []
        # guarded by ``_lock``: the queue, the threads' states, the finished calls
        self._lock = threading.Lock()
        self._bell: queue.SimpleQueue[None] = queue.SimpleQueue()  # one token wakes a sleeper
        self._waiting: collections.deque[_Job] = collections.deque()
        self._asleep = 0  # threads waiting for work and not yet woken
        self._busy = 0  # threads running a call: the slots held
        self._done: list[tuple[_Job, bool, Any]] = []
        self._posted = False  # a delivery is scheduled on the loop
        self._to_wake = 0  # sleepers taken by submits, woken by the scheduled ``_ring``
        self._stopped = False  # stop() ran, or a call ended the actor
        self.exited = False  # a call ended the actor (sys.exit): later calls get no reply
        self._later: set[asyncio.Future[Any]] = set()  # results being awaited (``Later``)

    @property
    def running(self) -> int:
        """Calls holding a slot now (started and not yet returned, abandoned ones too)."""
        return self._busy

    def on_own_thread(self) -> bool:
        """Whether the calling thread is one of this worker's threads."""
        return threading.current_thread() in self._threads

    @property
    def threads(self) -> int:
        """Worker threads started so far."""
        return len(self._threads)

    def submit(self, fn: Callable[[], Any]) -> asyncio.Future[Any]:
        """Queue ``fn()``; a future of its result on the loop. Cancelling the future drops
        the call if it has not started; a started one keeps its slot until it returns.
        After :meth:`stop` the future fails with RuntimeError."""
        fut: asyncio.Future[Any] = self._loop.create_future()
        start = False
        with self._lock:
            if self._stopped:
                fut.set_exception(RuntimeError(f"actor {self._name}: its worker has stopped"))
                return fut
            self._waiting.append(_Job(fut, fn))
            if self._asleep:
                self._asleep -= 1  # this sleeper is taken: the next submit wakes another
                self._to_wake += 1
                if self._to_wake == 1:  # rung once the callback queuing calls has returned
                    self._loop.call_soon(self._ring)
            elif self._busy + len(self._waiting) > len(self._threads) < self.concurrency:
                start = True  # every thread busy (or about to be): one more, up to the limit
        if start:
            self._start_thread()
        return fut

    def _ring(self) -> None:
        """Wake the sleepers that submits took, on the loop once the callback that queued
        calls (e.g. a whole batch of requests) has returned: the threads then find them all
        queued, and do not fight the loop for the GIL while it is still queuing them."""
        with self._lock:
            wake, self._to_wake = self._to_wake, 0
            COUNTERS.thread_handoffs += wake
            for _ in range(wake):
                self._bell.put(None)

    def _start_thread(self) -> None:
        thread = threading.Thread(
            target=self._run, name=f"actor-{self._name}-{len(self._threads)}", daemon=True
        )
        self._threads.append(thread)
        COUNTERS.thread_starts += 1
        thread.start()

    def _run(self) -> None:
        apply_torch_threads(self._torch_threads)
        lock, waiting = self._lock, self._waiting
        while True:
            with lock:
                if not waiting:
                    if self._stopped:
                        return
                    self._asleep += 1
                    job = None
                else:
                    job = waiting.popleft()
                    # read on this thread: a cancel on the loop after this starts it anyway
                    if job.fut.cancelled():  # the caller gave up before it started: dropped
                        job.fn = _noop
                        continue
                    self._busy += 1
            if job is None:
                self._bell.get()  # until a submit (or stop) rings: then look again
                continue
            try:
                outcome: tuple[_Job, bool, Any] = (job, True, job.fn())
            except BaseException as exc:  # delivered to the caller, never lost
                outcome = (job, False, exc)
            job.fn = _noop  # drop references to the arguments at once
            with lock:
                self._busy -= 1
                COUNTERS.def_calls += 1
                if isinstance(outcome[2], Exiting) and not self._stopped:
                    self._exit_now(outcome[2])
                self._done.append(outcome)
                # not kept until the next job: a failed call's error holds its frames (and so
                # its arguments) through its traceback
                del outcome
                post, self._posted = not self._posted, True
                if post:
                    COUNTERS.loop_wakeups += 1
            if post:
                try:
                    self._loop.call_soon_threadsafe(self._deliver)
                except RuntimeError:  # the loop is closed: we are shutting down
                    return

    def _exit_now(self, exiting: Exiting) -> None:
        """A call ended the actor (``sys.exit``): the calls queued after it never run and get
        no reply either; the threads stop. Called with the lock held."""
        self.exited = self._stopped = True
        self._done.extend((job, False, exiting) for job in self._waiting)
        self._waiting.clear()
        for _ in range(self._asleep + self._to_wake):
            self._bell.put(None)
        self._asleep = self._to_wake = 0

    def _deliver(self) -> None:
        with self._lock:
            done, self._done = self._done, []
            self._posted = False
        for job, ok, value in done:
            fut = job.fut
            if fut.done() or isinstance(value, Exiting):  # Exiting: the actor exits, no reply
                continue
            if ok:
                if type(value) is Later:
                    self._answer_later(fut, value.awaitable)
                else:
                    fut.set_result(value)
            elif isinstance(value, StopIteration):  # a Future refuses one (a constructor's)
                fut.set_exception(RemoteError.from_exception(value, self._name))
            else:
                fut.set_exception(value)

    def _answer_later(self, fut: asyncio.Future[Any], awaitable: Awaitable[Any]) -> None:
        """Answer ``fut`` with ``awaitable``'s outcome, run on the loop; a caller that gives
        up cancels it."""
        task = asyncio.ensure_future(awaitable)
        self._later.add(task)

        def answered(task: asyncio.Future[Any]) -> None:
            self._later.discard(task)
            if fut.done():
                return
            if task.cancelled():
                fut.cancel()
            elif task.exception() is not None:
                fut.set_exception(task.exception())  # type: ignore[arg-type]
            else:
                fut.set_result(task.result())

        task.add_done_callback(answered)
        fut.add_done_callback(lambda fut: task.cancel() if fut.cancelled() else None)

    def stop(self) -> None:
        """Let the threads finish their current calls and exit; queued calls are cancelled
        without running. Idempotent; call it on the loop."""
        with self._lock:
            if self._stopped:
                return
            self._stopped = True
            dropped = list(self._waiting)
            self._waiting.clear()
            for _ in range(self._asleep + self._to_wake):
                self._bell.put(None)
            self._asleep = self._to_wake = 0
        for job in dropped:
            job.fut.cancel()
        for task in list(self._later):
            task.cancel()


class Exiting(BaseException):
    """Raised by a job whose method called ``sys.exit``: its call gets no reply (the actor is
    exiting; its callers learn of it as ActorDiedError)."""


def _noop() -> None:
    return None
