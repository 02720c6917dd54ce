"""Remote classes and functions of the ``rayless.ray`` tests, written as Ray programs are
(``@ray.remote`` on module-level classes and functions); importable by actor processes."""

from __future__ import annotations

import asyncio
import os
import threading
import time
from typing import Any

from rayless import ray


class AppError(Exception):
    """A user exception with a field of its own."""

    def __init__(self, msg: str, code: int = 0) -> None:
        super().__init__(msg)
        self.code = code


@ray.remote
class Counter:
    def __init__(self, start: int = 0, *, step: int = 1) -> None:
        self.value = start
        self.step = step

    def incr(self, by: int | None = None) -> int:
        self.value += self.step if by is None else by
        return self.value

    def get(self) -> int:
        return self.value

    def fail(self, msg: str) -> None:
        raise AppError(msg, code=7)

    def pid(self) -> int:
        return os.getpid()

    def context(self) -> dict[str, Any]:
        ctx = ray.get_runtime_context()
        return {
            "actor_id": ctx.get_actor_id(),
            "node_id": ctx.get_node_id(),
            "job_id": ctx.get_job_id(),
            "namespace": ctx.namespace,
            "gpus": ray.get_gpu_ids(),
            "accelerators": ctx.get_accelerator_ids(),
            "cuda": os.environ.get("CUDA_VISIBLE_DEVICES", ""),
            "env": os.environ.get("RAYLESS_TEST_FLAG", ""),
        }

    def call_other(self, other: Any, by: int) -> int:
        return ray.get(other.incr.remote(by))

    def sleep(self, seconds: float) -> float:
        time.sleep(seconds)
        return seconds

    @ray.method(num_returns=2)
    def pair(self) -> tuple[int, int]:
        return self.value, -self.value

    def exit(self) -> None:
        os._exit(3)


@ray.remote
class Failing:
    def __init__(self) -> None:
        raise AppError("constructor failed", code=1)

    def ping(self) -> str:
        return "pong"


@ray.remote
class AsyncActor:
    def __init__(self) -> None:
        self.event = asyncio.Event()
        self.cancelled = 0
        self.started = 0

    async def wait_for_go(self) -> str:
        await self.event.wait()
        return "went"

    async def go(self) -> None:
        self.event.set()

    async def forever(self) -> None:
        self.started += 1
        try:
            await asyncio.sleep(3600)
        except asyncio.CancelledError:
            self.cancelled += 1
            raise

    async def cancelled_count(self) -> int:
        return self.cancelled

    async def started_count(self) -> int:
        return self.started

    async def await_ref(self, other: Any) -> int:
        return await other.incr.remote(5)

    async def blocking_get(self, other: Any) -> None:
        ray.get(other.sleep.remote(0.5))  # would block this loop: refused


@ray.remote(max_concurrency=2)
class Threaded:
    def __init__(self) -> None:
        self.barrier = threading.Barrier(2, timeout=30)

    def meet(self) -> int:
        return self.barrier.wait()


@ray.remote
def add(a: Any, b: Any = 0) -> Any:
    return a + b


@ray.remote
def echo(x: Any) -> Any:
    return x


@ray.remote(num_returns=3)
def three(x: int) -> tuple[int, int, int]:
    return x, x + 1, x + 2


@ray.remote
def nested_sum(n: int) -> int:
    return sum(ray.get([add.remote(i, 1) for i in range(n)]))


@ray.remote
def nested_refs(refs: list[Any], table: dict[str, list[Any]]) -> list[Any]:
    """The values of refs passed inside a list and a dict (done ones deeper travel too)."""
    return [*ray.get(refs), *ray.get(table["k"])]


@ray.remote
def returns_pending_refs() -> list[Any]:
    """Refs of tasks it submits, still running when it returns (its worker waits for them)."""
    return [sleepy.remote(0.5), add.remote(3, 4)]


@ray.remote
def sleepy(seconds: float) -> float:
    time.sleep(seconds)
    return seconds


@ray.remote
def raises(msg: str) -> None:
    raise AppError(msg, code=42)


@ray.remote
def times_out() -> None:
    raise TimeoutError("the task's own timeout")


@ray.remote
def task_context() -> dict[str, Any]:
    ctx = ray.get_runtime_context()
    return {
        "actor_id": ctx.get_actor_id(),
        "node_id": ctx.get_node_id(),
        "job_id": ctx.get_job_id(),
        "env": os.environ.get("RAYLESS_TEST_FLAG", ""),
        "gpus": ray.get_gpu_ids(),
        "cuda": os.environ.get("CUDA_VISIBLE_DEVICES", ""),
    }


@ray.remote
def use_handle(counter: Any, by: int) -> int:
    assert isinstance(counter, ray.actor.ActorHandle)
    return ray.get(counter.incr.remote(by))


@ray.remote(max_retries=2)
def die_once(marker: str) -> str:
    if not os.path.exists(marker):
        with open(marker, "w"):
            pass
        os._exit(1)
    return "survived"


@ray.remote(max_retries=0)
def die_always() -> None:
    os._exit(1)


@ray.remote(max_retries=2, retry_exceptions=True)
def flaky(marker: str) -> str:
    count = 0
    if os.path.exists(marker):
        with open(marker) as f:
            count = int(f.read() or 0)
    with open(marker, "w") as f:
        f.write(str(count + 1))
    if count < 2:
        raise AppError(f"attempt {count}")
    return f"ok after {count}"


@ray.remote
def pid_of_worker() -> int:
    return os.getpid()


@ray.remote(max_restarts=1, max_task_retries=1)
class Restartable:
    def __init__(self) -> None:
        self.calls = 0

    def pid(self) -> int:
        return os.getpid()

    def die_first_time(self, marker: str) -> int:
        if not os.path.exists(marker):
            with open(marker, "w"):
                pass
            os._exit(1)
        return os.getpid()


@ray.remote(num_gpus=1)
def gpu_task(seconds: float) -> str:
    time.sleep(seconds)
    return os.environ.get("CUDA_VISIBLE_DEVICES", "")


class PlainBase:
    """A base class that is not remote: its methods are the actor's too."""

    def base_method(self) -> str:
        return "from the base"


@ray.remote
class Derived(PlainBase):
    def own(self) -> str:
        return "own"

    def run_tasks(self, n: int) -> int:
        return sum(ray.get([add.remote(i, 1) for i in range(n)]))

    def make_counter(self, start: int) -> int:
        inner = Counter.remote(start)
        return ray.get(inner.incr.remote())


@ray.remote
def endless() -> Any:
    """A generator task that never ends by itself."""
    i = 0
    while True:
        yield i
        i += 1


@ray.remote
class Streamer:
    """An actor with a generator method."""

    def items(self, n: int) -> Any:
        yield from range(n)


@ray.remote
class AsksItself:
    """Waits for calls to itself: from a def method (the one thread that would run them),
    from an async method, and from its constructor where ``in_init``."""

    def __init__(self, in_init: bool = False) -> None:
        self.me = ray.get_runtime_context().current_actor
        if in_init:
            ray.get(self.me.double.remote(1))

    def double(self, i: int) -> int:
        return i * 2

    def blocking(self) -> int:
        return ray.get(self.me.double.remote(2))

    def with_timeout(self) -> int:
        return ray.get(self.me.double.remote(3), timeout=0.5)

    def done_first(self) -> int:
        ref = self.me.double.remote(4)
        ray.wait([ref], timeout=0.5)  # cannot finish: it needs this thread
        return len(ray.wait([ref], timeout=0)[0])

    async def awaits(self) -> int:
        return await self.me.double.remote(5)
