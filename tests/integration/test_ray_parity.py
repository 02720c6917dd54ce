"""The same Ray programs on ``rayless.ray`` and, where Ray is installed (``pip install -e
'.[bench]'``), on Ray itself: our expectations are Ray's, not ours. Without Ray the Ray
half is skipped.

Each scenario is written once against a ``ray`` module argument, with its classes and
functions defined inside it (Ray ships them by value; so does rayless.ray).
"""

from __future__ import annotations

import importlib.util
import os
import time
from collections.abc import Iterator
from types import ModuleType
from typing import Any

import pytest

pytestmark = [pytest.mark.integration, pytest.mark.xdist_group("rayless_ray_parity")]

_HAS_RAY = importlib.util.find_spec("ray") is not None


@pytest.fixture(
    scope="module",
    params=[
        "rayless",
        pytest.param("ray", marks=pytest.mark.skipif(not _HAS_RAY, reason="no Ray")),
    ],
)
def ray(request: pytest.FixtureRequest) -> Iterator[ModuleType]:
    if request.param == "rayless":
        from rayless import ray as module
    else:
        import ray as module  # type: ignore[import-not-found,no-redef]
    module.init(num_cpus=2, num_gpus=2)
    yield module
    module.shutdown()


def test_wait_probe_order_and_shapes(ray: Any) -> None:
    # test_wait.py::test_wait and rLightning's probe (timeout=0.01, num_returns=len)
    @ray.remote
    def nap(s: float) -> float:
        time.sleep(s)
        return s

    refs = [nap.remote(3), nap.remote(0), nap.remote(0)]
    ray.get(refs[1:])
    ready, pending = ray.wait(refs, num_returns=len(refs), timeout=0.01)
    assert ready == refs[1:] and pending == refs[:1]
    assert ray.wait([]) == ([], [])
    x = ray.put(1)
    with pytest.raises(ValueError):
        ray.wait([x, x])


def test_get_raises_the_users_error(ray: Any) -> None:
    # test_failure.py::test_failed_task: RayTaskError, also the user's class
    @ray.remote
    def bad(i: int) -> int:
        if i == 1:
            raise KeyError("k")
        return i

    with pytest.raises(KeyError) as info:
        ray.get([bad.remote(0), bad.remote(1)])
    assert isinstance(info.value, ray.exceptions.RayTaskError)


def test_get_timeout_is_a_timeout_error(ray: Any) -> None:
    # test_basic.py::test_get_with_timeout
    @ray.remote
    def nap(s: float) -> float:
        time.sleep(s)
        return s

    with pytest.raises(ray.exceptions.GetTimeoutError):
        ray.get(nap.remote(2), timeout=0.1)
    assert issubclass(ray.exceptions.GetTimeoutError, TimeoutError)


def test_num_returns_and_refs_as_arguments(ray: Any) -> None:
    # test_basic.py::test_multiple_return_values, test_passing_arguments_by_value
    @ray.remote(num_returns=2)
    def two(x: int) -> tuple[int, int]:
        return x, x * 10

    @ray.remote
    def add(a: int, b: int) -> int:
        return a + b

    a, b = two.remote(2)
    assert ray.get(add.remote(a, b)) == 22


def test_actor_spelling_errors(ray: Any) -> None:
    # test_actor.py: direct instantiation and direct method calls are TypeErrors; a taken
    # name is a ValueError
    @ray.remote
    class A:
        def f(self) -> int:
            return 1

    with pytest.raises(TypeError):
        A()
    a = A.options(name="parity-a").remote()
    assert isinstance(a, ray.actor.ActorHandle)
    with pytest.raises(TypeError):
        a.f()
    with pytest.raises(ValueError):
        A.options(name="parity-a").remote()
    assert ray.get(ray.get_actor("parity-a").f.remote()) == 1


def test_cancel_queued_task(ray: Any) -> None:
    # test_cancel.py: a cancelled task's ref raises TaskCancelledError
    @ray.remote
    def nap(s: float) -> float:
        time.sleep(s)
        return s

    blockers = [nap.remote(1) for _ in range(2)]
    queued = nap.remote(0)
    ray.cancel(queued)
    with pytest.raises(ray.exceptions.TaskCancelledError):
        ray.get(queued, timeout=30)
    ray.get(blockers)


def test_runtime_context_in_task_and_actor(ray: Any) -> None:
    # test_runtime_context.py: no actor id in a task, one in an actor, one job
    @ray.remote
    def ids() -> tuple[Any, Any]:
        ctx = ray.get_runtime_context()
        return ctx.get_actor_id(), ctx.get_job_id()

    @ray.remote
    class A:
        def ids(self) -> tuple[Any, Any]:
            ctx = ray.get_runtime_context()
            return ctx.get_actor_id(), ctx.get_job_id()

    task_actor, task_job = ray.get(ids.remote())
    actor_id, actor_job = ray.get(A.remote().ids.remote())
    assert task_actor is None and actor_id
    assert task_job == actor_job == ray.get_runtime_context().get_job_id()


def test_fractional_gpu_actors_share_a_bundle(ray: Any) -> None:
    # OpenRLHF/verl colocation: two num_gpus=0.5 actors in one {"GPU": 1} bundle
    from importlib import import_module

    util = import_module(ray.__name__ + ".util")
    strategies = import_module(ray.__name__ + ".util.scheduling_strategies")

    @ray.remote(num_gpus=0.5, num_cpus=0.5)  # both fit the bundle's one CPU on Ray too
    class G:
        def where(self) -> tuple[Any, str]:
            return ray.get_gpu_ids(), os.environ.get("CUDA_VISIBLE_DEVICES", "")

    pg = util.placement_group([{"GPU": 1, "CPU": 1}], strategy="STRICT_PACK")
    ray.get(pg.ready())
    strategy = strategies.PlacementGroupSchedulingStrategy(pg, placement_group_bundle_index=0)
    a, b = (G.options(scheduling_strategy=strategy).remote() for _ in range(2))
    (gpus_a, cuda_a), (gpus_b, cuda_b) = ray.get([a.where.remote(), b.where.remote()])
    assert [int(g) for g in gpus_a] == [int(g) for g in gpus_b] and len(gpus_a) == 1
    assert cuda_a == cuda_b == str(int(gpus_a[0]))
    util.remove_placement_group(pg)


def test_generator_tasks_and_methods_stream_refs(ray: Any) -> None:
    # test_streaming_generator.py: a generator task or method returns an ObjectRefGenerator
    # of one ref per item; an exception in the generator is the next ref's error, then the
    # iteration ends; an int num_returns makes it a plain multi-return call.
    import asyncio

    @ray.remote
    def numbers(n: int) -> Any:
        for i in range(n):
            yield i * 10

    @ray.remote
    def broken() -> Any:
        yield 1
        raise ValueError("bad item")

    @ray.remote
    class Gen:
        def items(self, n: int) -> Any:
            for i in range(n):
                yield f"a{i}"

        async def aitems(self, n: int) -> Any:
            for i in range(n):
                await asyncio.sleep(0)
                yield i

        def plain(self) -> int:
            return 5

    gen = numbers.remote(4)
    assert isinstance(gen, ray.ObjectRefGenerator)
    assert [ray.get(ref) for ref in gen] == [0, 10, 20, 30]
    refs = list(broken.remote())
    assert len(refs) == 2 and ray.get(refs[0]) == 1
    with pytest.raises(ValueError, match="bad item"):
        ray.get(refs[1])
    assert ray.get(numbers.options(num_returns=2).remote(2)) == [0, 10]
    actor = Gen.remote()
    assert [ray.get(ref) for ref in actor.items.remote(3)] == ["a0", "a1", "a2"]
    assert [ray.get(ref) for ref in actor.aitems.remote(2)] == [0, 1]
    assert ray.get(actor.plain.remote()) == 5

    async def read() -> list[int]:
        return [await ref async for ref in numbers.remote(3)]

    assert asyncio.run(read()) == [0, 10, 20]
