"""The sync-method worker of an actor: concurrency slots, dropped and abandoned calls."""

from __future__ import annotations

import asyncio
import functools
import threading
from typing import Any

import pytest

from rayless.actors.host.workers import Later, SyncWorker
from rayless.transport.counters import COUNTERS
from tests.waiting import wait_until


async def test_one_slot_runs_calls_in_order_and_drops_cancelled_queued_ones() -> None:
    worker = SyncWorker(asyncio.get_running_loop(), "t")
    gate = threading.Event()
    ran: list[str] = []

    def job(tag: str) -> str:
        ran.append(tag)
        gate.wait(20)
        return tag

    first = worker.submit(lambda: job("a"))
    dropped = worker.submit(lambda: job("b"))
    last = worker.submit(lambda: job("c"))
    dropped.cancel()
    gate.set()
    assert await asyncio.wait_for(asyncio.gather(first, last), 20) == ["a", "c"]
    assert ran == ["a", "c"] and worker.threads == 1
    worker.stop()


async def test_an_abandoned_running_call_keeps_its_slot_until_it_returns() -> None:
    """As Ray's max_concurrency: a running def call cannot be stopped, so it counts until it
    returns; a call after it waits (it does not start on an extra thread)."""
    worker = SyncWorker(asyncio.get_running_loop(), "t", concurrency=2)
    gate = threading.Event()
    ran: list[str] = []

    async def start_stuck() -> asyncio.Future[bool]:
        started = threading.Event()
        fut = worker.submit(lambda: started.set() or gate.wait(20))
        assert await asyncio.to_thread(started.wait, 20)
        return fut

    for _ in range(2):
        (await start_stuck()).cancel()
    later = worker.submit(lambda: ran.append("later") or "later")
    assert worker.running == 2 and worker.threads == 2  # queued: no third thread
    await asyncio.sleep(0)
    assert ran == []
    gate.set()
    assert await asyncio.wait_for(later, 10) == "later"
    # the stuck calls give their slots back as they return (on the loop, after ``later`` may
    # already have run on a freed thread)
    await wait_until(lambda: worker.running == 0, 10, "the released calls' slots")
    assert worker.threads == 2
    worker.stop()


async def test_concurrency_runs_calls_on_that_many_threads_at_once() -> None:
    worker = SyncWorker(asyncio.get_running_loop(), "t", concurrency=3)
    barrier = threading.Barrier(3, timeout=20)

    def meet() -> int:
        barrier.wait()
        return threading.get_ident()

    idents = await asyncio.wait_for(asyncio.gather(*(worker.submit(meet) for _ in range(3))), 30)
    assert len(set(idents)) == 3
    with pytest.raises(ZeroDivisionError):  # errors reach the caller
        await worker.submit(lambda: 1 / 0)
    worker.stop()


async def test_a_later_result_frees_the_thread_for_the_call_it_waits_for() -> None:
    """A job returning ``Later`` is answered from the loop; its one thread runs the next
    call meanwhile (here the call whose outcome the first one waits for)."""
    worker = SyncWorker(asyncio.get_running_loop(), "t")
    made: asyncio.Future[int] = asyncio.get_running_loop().create_future()

    async def answer() -> str:
        return f"made {await made}"

    first = worker.submit(lambda: Later(answer()))
    second = worker.submit(lambda: asyncio.get_running_loop)  # a def call after it
    await asyncio.wait_for(second, 10)
    assert not first.done()
    made.set_result(7)
    assert await asyncio.wait_for(first, 10) == "made 7"

    async def fails() -> None:
        raise KeyError("inside")

    with pytest.raises(KeyError):
        await asyncio.wait_for(worker.submit(lambda: Later(fails())), 10)
    worker.stop()


async def test_a_later_result_is_cancelled_with_its_call_and_by_stop() -> None:
    worker = SyncWorker(asyncio.get_running_loop(), "t")
    waiting: list[asyncio.Future[None]] = []

    async def forever() -> None:
        fut = asyncio.get_running_loop().create_future()
        waiting.append(fut)
        await fut

    gave_up = worker.submit(lambda: Later(forever()))
    await wait_until(lambda: len(waiting) == 1, 10, "the first wait started")
    gave_up.cancel()  # the caller gives up: the wait ends too
    await wait_until(lambda: waiting[0].cancelled(), 10, "the abandoned wait cancelled")
    stopped = worker.submit(lambda: Later(forever()))
    await wait_until(lambda: len(waiting) == 2, 10, "the second wait started")
    worker.stop()
    with pytest.raises(asyncio.CancelledError):
        await asyncio.wait_for(stopped, 10)


def test_concurrency_must_be_positive() -> None:
    with pytest.raises(ValueError):
        SyncWorker(asyncio.new_event_loop(), "t", concurrency=0)


async def test_queued_calls_run_back_to_back_while_the_loop_is_busy() -> None:
    """The thread takes the next queued call itself: with the loop held (here: blocked in a
    plain wait) once it has rung the thread, three queued calls all run, after one wake-up of
    the thread; their results then reach the loop in one batch."""
    worker = SyncWorker(asyncio.get_running_loop(), "t")
    await worker.submit(lambda: None)  # the thread is started and asleep
    before = COUNTERS.snapshot()
    ran: list[int] = []
    last = threading.Event()
    futs = [worker.submit(functools.partial(_record, ran, i)) for i in range(2)]
    futs.append(worker.submit(functools.partial(_record, ran, 2, last)))
    await asyncio.sleep(0)  # the wake-up is rung once the callback that queued them returns
    assert last.wait(20), f"queued calls did not run while the loop was held: ran {ran}"
    assert await asyncio.wait_for(asyncio.gather(*futs), 20) == [0, 1, 2]
    after = COUNTERS.snapshot()
    assert after["thread_handoffs"] - before["thread_handoffs"] <= 1  # 0: it had not slept yet
    assert after["loop_wakeups"] - before["loop_wakeups"] == 1
    worker.stop()


async def test_calls_run_in_submission_order() -> None:
    worker = SyncWorker(asyncio.get_running_loop(), "t")
    ran: list[int] = []
    futs = [worker.submit(functools.partial(_record, ran, i)) for i in range(500)]
    assert await asyncio.wait_for(asyncio.gather(*futs), 30) == list(range(500))
    assert ran == list(range(500)) and worker.threads == 1
    worker.stop()


async def test_stop_cancels_queued_calls_and_refuses_new_ones() -> None:
    worker = SyncWorker(asyncio.get_running_loop(), "t")
    gate, started = threading.Event(), threading.Event()
    running = worker.submit(functools.partial(_record, [], True, started, gate))
    assert await asyncio.to_thread(started.wait, 20)
    queued = worker.submit(lambda: "never")
    worker.stop()
    assert queued.cancelled()
    with pytest.raises(RuntimeError, match="stopped"):
        await worker.submit(lambda: None)
    gate.set()
    assert await asyncio.wait_for(running, 20) is True  # the running call finished
    assert worker.running == 0


def _record(
    ran: list[Any],
    value: Any,
    then: threading.Event | None = None,
    gate: threading.Event | None = None,
) -> Any:
    """Append ``value`` to ``ran``, set ``then``, wait for ``gate``; return ``value``."""
    ran.append(value)
    if then is not None:
        then.set()
    if gate is not None:
        gate.wait(20)
    return value


async def test_a_call_that_ends_the_actor_drops_the_calls_queued_after_it() -> None:
    # a method's sys.exit (Ray's exit_actor, or __ray_terminate__) ends the actor: the calls
    # queued behind it never run and get no reply (their callers get ActorDiedError once the
    # process is gone); before, the worker ran the next queued call first
    from rayless.actors.host.workers import Exiting

    worker = SyncWorker(asyncio.get_running_loop(), "t")
    gate = threading.Event()
    ran: list[str] = []

    def first() -> str:
        gate.wait(20)
        ran.append("first")
        return "first"

    def leave() -> None:
        ran.append("exit")
        raise Exiting

    done = worker.submit(first)
    exiting = worker.submit(leave)
    after = [worker.submit(lambda i=i: ran.append(f"after{i}")) for i in range(3)]
    gate.set()
    assert await asyncio.wait_for(done, 20) == "first"
    await wait_until(lambda: worker.exited, 10, "the exit")
    await asyncio.sleep(0.05)
    assert ran == ["first", "exit"] and worker.exited
    assert not exiting.done() and not any(f.done() for f in after)  # no reply
    with pytest.raises(RuntimeError, match="stopped"):
        await worker.submit(lambda: None)
    worker.stop()
