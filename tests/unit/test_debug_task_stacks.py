"""``format_stacks`` describes asyncio tasks whole, even while a step is running."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Iterator

import pytest

from rayless.actors.control import debug


class _LoopThread:
    """An event loop running ``coro_fn()`` in a thread of its own."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.stop.set()

        async def cancel_all() -> None:
            for task in asyncio.all_tasks():
                if task is not asyncio.current_task():
                    task.cancel()

        asyncio.run_coroutine_threadsafe(cancel_all(), self.loop).result(30)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(30)
        self.loop.close()


@pytest.fixture
def looping() -> Iterator[_LoopThread]:
    lt = _LoopThread()
    yield lt
    lt.close()


def _task_parts(text: str) -> list[str]:
    return text.split("--- asyncio task")[1:]


def test_a_task_busy_within_its_steps_is_described_down_to_its_innermost_coroutine(
    looping: _LoopThread,
) -> None:
    stop = looping.stop

    async def innermost_busy_coroutine() -> None:
        while not stop.is_set():  # not a wait: the task whose stack the test reads
            time.sleep(0.05)  # most of the time is spent within a step (the GIL released)
            await asyncio.sleep(0)

    async def outer_coroutine() -> None:
        await innermost_busy_coroutine()

    asyncio.run_coroutine_threadsafe(outer_coroutine(), looping.loop)
    time.sleep(0.1)
    for _ in range(5):  # taken from another thread mid-step, it stopped at outer_coroutine
        text = debug.format_stacks("t", looping.loop)
        part = next(p for p in _task_parts(text) if "in outer_coroutine" in p)
        assert "in innermost_busy_coroutine" in part, text
        assert "running a step now" not in part


def test_a_held_loop_is_described_from_the_listener_and_says_so(
    looping: _LoopThread, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(debug, "TASKS_FROM_LOOP_WAIT", 0.3)
    stop = looping.stop

    async def holds_the_loop() -> None:
        stop.wait(60)  # a blocking call in an async method: the loop never gets a step back

    asyncio.run_coroutine_threadsafe(holds_the_loop(), looping.loop)
    time.sleep(0.1)
    text = debug.format_stacks("t", looping.loop)
    stop.set()
    part = next(p for p in _task_parts(text) if "in holds_the_loop" in p)
    assert "running a step now" in part
    thread_part = text.split("--- asyncio task")[0]
    assert "stop.wait(60)" in thread_part  # where the loop's thread is
