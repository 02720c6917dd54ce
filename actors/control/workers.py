"""The threads that run an actor's ``def`` methods (and its constructor, ``setup``, ``teardown``).

:class:`SyncWorker` runs at most ``concurrency`` calls at a time: 1 by default (calls run one
after another, in order, so plain classes need no locks), ``max_concurrency`` when the actor
was spawned with one (Ray's threaded actors). Threads start on demand.

Cancellation is best effort, as in Ray: Python cannot stop a running thread safely.

* A queued call whose caller gave up (timed out, cancelled) is dropped without running.
* A running call runs to completion (its result is discarded) and keeps its slot until it
  returns, so at most ``concurrency`` calls ever run at once, abandoned ones included (as
  Ray's ``max_concurrency``); later calls wait for a slot.

The loop is woken once per batch of finished calls (not once per call, as with
``run_in_executor``), which keeps many in-flight sync calls cheap on few cores.
"""

from __future__ import annotations

import asyncio
import collections
import queue
import sys
import threading
from collections.abc import Callable
from typing import Any

from rayless.transport.counters import COUNTERS


def apply_torch_threads(n: int) -> None:
    """Set torch's thread count for the calling thread (it is per thread), if torch is loaded."""
    torch = sys.modules.get("torch")
    if torch is not None:
        torch.set_num_threads(n)


class _Job:
    __slots__ = ("cancelled", "fn", "fut", "slot")

    def __init__(self, fut: asyncio.Future[Any], fn: Callable[[], Any]) -> None:
        self.fut = fut
        self.fn = fn
        self.cancelled = False  # the caller gave up (set on the loop, read by the thread)
        self.slot = False  # holds one of the ``concurrency`` slots


class SyncWorker:
    """Runs sync calls on up to ``concurrency`` threads; results come back on ``loop``.

    Args:
        loop: the actor's event loop (every method but the threads' runs on it).
        name: names the threads (``actor-NAME-i``).
        threads: torch intra-op threads for each worker thread.
        concurrency: calls that may run at once.
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
        self._active = 0  # slots held: jobs handed to the threads and not yet back
        self._threads: list[threading.Thread] = []
        self._waiting: collections.deque[_Job] = collections.deque()
        self._work: queue.SimpleQueue[_Job | None] = queue.SimpleQueue()
        self._done: list[tuple[_Job, bool, Any]] = []
        self._lock = threading.Lock()
        self._posted = False
        self._stopped = False  # stop() ran

    @property
    def running(self) -> int:
        """Calls holding a slot now (started and not yet returned, abandoned ones too)."""
        return self._active

    @property
    def threads(self) -> int:
        """Worker threads started so far."""
        return len(self._threads)

    def submit(self, fn: Callable[[], Any]) -> asyncio.Future[Any]:
        """Queue ``fn()``; a future of its result on the loop. Cancelling the future drops
        the call if it has not started; a started one keeps its slot until it returns."""
        fut: asyncio.Future[Any] = self._loop.create_future()
        job = _Job(fut, fn)
        fut.add_done_callback(lambda _: self._on_fut_done(job))
        self._waiting.append(job)
        self._pump()
        return fut

    def _pump(self) -> None:
        while self._active < self.concurrency and self._waiting:
            job = self._waiting.popleft()
            if job.cancelled:
                continue
            self._active += 1
            job.slot = True
            if self._active > len(self._threads):
                self._start_thread()
            COUNTERS.thread_handoffs += 1
            self._work.put(job)

    def _start_thread(self) -> None:
        thread = threading.Thread(
            target=self._run, name=f"actor-{self._name}-{len(self._threads)}", daemon=True
        )
        self._threads.append(thread)
        COUNTERS.thread_starts += 1
        thread.start()

    def _on_fut_done(self, job: _Job) -> None:
        if job.fut.cancelled():
            job.cancelled = True  # queued: dropped; running: its slot is freed when it returns

    def _run(self) -> None:
        apply_torch_threads(self._torch_threads)
        while True:
            job = self._work.get()
            if job is None:
                return
            if job.cancelled:  # the caller gave up before it started
                outcome: tuple[_Job, bool, Any] = (job, False, None)
            else:
                try:
                    outcome = (job, True, job.fn())
                except BaseException as exc:  # delivered to the caller, never lost
                    outcome = (job, False, exc)
            job.fn = _noop  # drop references to the arguments at once
            with self._lock:
                COUNTERS.def_calls += 1
                self._done.append(outcome)
                post, self._posted = not self._posted, True
                if post:
                    COUNTERS.loop_wakeups += 1
            if post:
                try:
                    self._loop.call_soon_threadsafe(self._deliver)
                except RuntimeError:  # the loop is closed: we are shutting down
                    return

    def _deliver(self) -> None:
        with self._lock:
            done, self._done = self._done, []
            self._posted = False
        for job, ok, value in done:
            if job.slot:
                job.slot = False
                self._active -= 1
            fut = job.fut
            if fut.done() or isinstance(value, Exiting):  # Exiting: the actor exits, no reply
                continue
            if ok:
                fut.set_result(value)
            elif value is not None:
                fut.set_exception(value)
        self._pump()

    def stop(self) -> None:
        """Let the threads finish their current calls and exit. Idempotent."""
        if self._stopped:
            return
        self._stopped = True
        for _ in self._threads:
            self._work.put(None)


class Exiting(BaseException):
    """Raised by a job whose method called ``sys.exit``: its call gets no reply (the actor is
    exiting; its callers learn of it as ActorDiedError)."""


def _noop() -> None:
    return None
