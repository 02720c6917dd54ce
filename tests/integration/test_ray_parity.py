"""The same Ray programs on ``rayless.ray`` and, where Ray is installed (``pip install -e
'.[bench]'``), on Ray itself: our expectations are Ray's, not ours. Without Ray the Ray
half is skipped.

Each scenario is written once against a ``ray`` module argument, with its classes and
functions defined inside it (Ray ships them by value; so does rayless.ray).
"""

from __future__ import annotations

import gc
import importlib.util
import os
import threading
import time
from collections.abc import Iterator
from types import ModuleType
from typing import Any

import pytest

from tests.venvs import make_venv
from tests.waiting import wait_until_sync

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

    @ray.remote
    def oom() -> None:
        raise MemoryError("out of memory in the task")

    @ray.remote
    class Big:
        def grow(self) -> None:
            raise MemoryError("out of memory in the actor")

    # a builtin with a __new__ of its own: it reaches the caller as itself, not a TypeError
    with pytest.raises(MemoryError, match="in the task") as info:
        ray.get(oom.remote())
    assert isinstance(info.value, ray.exceptions.RayTaskError)
    with pytest.raises(MemoryError, match="in the actor"):
        ray.get(Big.remote().grow.remote())


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


def test_refs_inside_arguments_and_results_travel_as_refs(ray: Any) -> None:
    # Ray's docs, "Passing object arguments": a ref inside a list is passed as the ref
    # (test_basic.py::test_passing_arguments_by_value_out_of_the_box's nested form)
    @ray.remote
    def make(i: int) -> int:
        if i < 0:
            raise KeyError(f"bad {i}")
        return i * 10

    @ray.remote
    def kinds(refs: list[Any], table: dict[str, Any]) -> tuple[Any, ...]:
        return (
            [type(r).__name__ for r in refs],
            sum(ray.get(refs)),
            {k: ray.get(v) for k, v in table.items()},
            len(ray.wait(refs, num_returns=len(refs), timeout=30)[0]),
        )

    @ray.remote
    def catches(refs: list[Any]) -> str:
        try:
            ray.get(refs)
        except KeyError as exc:  # the inner task's error, also its own class
            return f"{type(exc).__name__}|{isinstance(exc, ray.exceptions.RayTaskError)}"
        return "no error"

    @ray.remote
    def returns_a_ref() -> Any:
        return ray.put(5)

    @ray.remote
    def returns_refs() -> list[Any]:  # (refs of tasks it submits: test_ray_api.py)
        return [ray.put(30), ray.put(40)]

    @ray.remote
    class Summer:
        def add(self, refs: list[Any]) -> int:
            return sum(ray.get(refs))

        async def aadd(self, refs: tuple[Any, ...]) -> int:
            return sum([await r for r in refs])

    refs = [make.remote(i) for i in range(4)]
    names, total, table, ready = ray.get(kinds.remote(refs, {"a": refs[1], "p": ray.put(7)}))
    assert names == ["ObjectRef"] * 4 and total == 60 and table == {"a": 10, "p": 7}
    assert ready == 4
    kind, mapped = ray.get(catches.remote([make.remote(1), make.remote(-1)])).split("|")
    assert kind.startswith("RayTaskError") and kind.endswith("(KeyError)") and mapped == "True"
    inner = ray.get(returns_a_ref.remote())
    assert isinstance(inner, ray.ObjectRef) and ray.get(inner) == 5
    assert ray.get(ray.get(returns_refs.remote())) == [30, 40]
    summer = Summer.remote()
    assert ray.get(summer.add.remote(refs)) == 60
    assert ray.get(summer.aadd.remote(tuple(refs))) == 60
    boxed = ray.put([make.remote(5), make.remote(6)])  # a put of refs: its value holds refs
    assert ray.get(summer.add.remote(boxed)) == 110


def test_an_actor_returns_refs_of_the_calls_it_made(ray: Any) -> None:
    # a controller actor handing its workers' refs to the driver (still running as it returns)
    @ray.remote(num_cpus=0)
    class Worker:
        def step(self, i: int) -> int:
            time.sleep(0.3)
            return i * 2

    @ray.remote(num_cpus=0)
    class Controller:
        def __init__(self) -> None:
            self.workers = [Worker.remote() for _ in range(2)]

        def dispatch(self) -> list[Any]:
            return [w.step.remote(i + 1) for i, w in enumerate(self.workers)]

        async def adispatch(self) -> dict[str, Any]:
            return {"a": self.workers[0].step.remote(5)}

        def one(self) -> Any:
            return self.workers[1].step.remote(7)

    controller = Controller.remote()
    refs = ray.get(controller.dispatch.remote())
    assert all(isinstance(r, ray.ObjectRef) for r in refs) and ray.get(refs) == [2, 4]
    assert {k: ray.get(v) for k, v in ray.get(controller.adispatch.remote()).items()} == {"a": 10}
    assert ray.get(ray.get(controller.one.remote())) == 14
    ray.kill(controller)


def test_an_actor_returns_refs_of_calls_to_itself(ray: Any) -> None:
    # a single-threaded actor hands back refs of calls it queued on itself: they run once
    # the method has returned (its thread is free), and the driver gets them, never a hang
    @ray.remote(num_cpus=0)
    class Self:
        def __init__(self) -> None:
            self.me = ray.get_runtime_context().current_actor

        def double(self, i: int) -> int:
            return i * 2

        def ask_myself(self) -> list[Any]:
            return [self.me.double.remote(1), self.me.double.remote(2)]

        def one(self) -> Any:
            return self.me.double.remote(3)

    @ray.remote(num_cpus=0)
    class AsyncSelf:
        def __init__(self) -> None:
            self.me = ray.get_runtime_context().current_actor

        async def double(self, i: int) -> int:
            return i * 2

        async def ask_myself(self) -> dict[str, Any]:
            return {"a": self.me.double.remote(4)}

    @ray.remote(num_cpus=0)
    class CallsItselfEarly:
        def __init__(self) -> None:
            self.seen: list[str] = []
            self.first = ray.get_runtime_context().current_actor.note.remote("from __init__")

        async def note(self, text: str) -> None:
            self.seen.append(text)

        async def read(self) -> list[str]:
            await self.first
            return self.seen

    early = CallsItselfEarly.remote()
    assert ray.get(early.read.remote(), timeout=60) == ["from __init__"]
    ray.kill(early)
    actor = Self.remote()
    refs = ray.get(actor.ask_myself.remote(), timeout=60)
    assert ray.get(refs, timeout=60) == [2, 4]
    assert ray.get(ray.get(actor.one.remote(), timeout=60), timeout=60) == 6
    one_slot = AsyncSelf.options(max_concurrency=1).remote()
    assert ray.get(ray.get(one_slot.ask_myself.remote(), timeout=60)["a"], timeout=60) == 8
    ray.kill(actor)
    ray.kill(one_slot)


def test_kill_of_an_actor_that_failed_to_start_is_quiet(ray: Any) -> None:
    # cleanup code kills every actor it started, also one whose constructor raised
    @ray.remote(num_cpus=0)
    class Broken:
        def __init__(self) -> None:
            raise ValueError("bad config")

        def f(self) -> int:
            return 1

    broken = Broken.remote()
    with pytest.raises(ray.exceptions.RayActorError):
        ray.get(broken.f.remote(), timeout=60)
    ray.kill(broken)
    ray.kill(broken)
    ray.kill(Broken.remote())  # while it starts (and fails)


def test_a_put_value_is_the_value_at_the_put(ray: Any) -> None:
    # Ray serializes at ray.put: a driver that changes its weights after putting them
    # (an optimizer step in place) sends the weights of the put
    import torch

    @ray.remote
    def total(state: dict[str, Any]) -> float:
        return float(sum(t.sum() for t in state.values()))

    state = {"w": torch.zeros(4), "b": torch.zeros(2)}
    meta = {"step": 1, "names": ["w", "b"]}
    ref, meta_ref = ray.put(state), ray.put(meta)
    for t in state.values():
        t.add_(1.0)
    meta["step"] = 2
    meta["names"].append("c")
    assert ray.get(total.remote(ref), timeout=60) == 0.0
    assert float(ray.get(ref)["w"].sum()) == 0.0
    assert ray.get(meta_ref) == {"step": 1, "names": ["w", "b"]}


def test_arguments_that_do_not_fit_fail_at_remote(ray: Any) -> None:
    # Ray binds a call's arguments to the signature at .remote(): a TypeError at the call
    @ray.remote
    def f(a: int, *, b: int = 2) -> int:
        return a + b

    @ray.remote(num_cpus=0)
    class A:
        def __init__(self, x: int) -> None:
            self.x = x

        def m(self, y: int, /, z: int = 0) -> int:
            return self.x + y + z

    @ray.remote(num_cpus=0)
    class Plain:
        def m(self) -> int:
            return 1

    for call in (
        lambda: f.remote(),
        lambda: f.remote(1, 2),
        lambda: f.remote(1, c=3),
        lambda: A.remote(),
        lambda: A.remote(1, 2),
        lambda: Plain.remote(1),
    ):
        with pytest.raises(TypeError):
            call()
    a = A.remote(1)
    with pytest.raises(TypeError):
        a.m.remote()
    with pytest.raises(TypeError):
        a.m.remote(y=1)  # positional-only
    assert ray.get([f.remote(1), f.remote(1, b=3), a.m.remote(2, z=1)], timeout=60) == [3, 4, 4]
    ray.kill(a)


def test_methods_may_have_any_public_name(ray: Any) -> None:
    # a rendezvous actor's `address`, a worker's `name`: a Ray handle reaches every method
    @ray.remote(num_cpus=0)
    class Named:
        def name(self) -> str:
            return "worker-0"

        def address(self) -> str:
            return "127.0.0.1:29500"

        async def methods(self) -> list[str]:
            return ["name", "address"]

        def actor_id(self, x: int) -> int:
            return x

        def with_timeout(self) -> str:
            return "mine"

    actor = Named.remote()
    assert ray.get(
        [
            actor.name.remote(),
            actor.address.remote(),
            actor.methods.remote(),
            actor.actor_id.remote(3),
            actor.with_timeout.remote(),
        ],
        timeout=60,
    ) == ["worker-0", "127.0.0.1:29500", ["name", "address"], 3, "mine"]
    ray.kill(actor)
    named = Named.options(name="parity-named-methods").remote()
    found = ray.get_actor("parity-named-methods")
    assert ray.get(found.address.remote(), timeout=60) == "127.0.0.1:29500"
    ray.kill(named)


def test_register_serializer_sends_a_class_nothing_else_sends(ray: Any) -> None:
    # Ray's docs ("Customized Serialization"): a class holding a lock travels through the
    # functions registered for it in the driver; the receivers register nothing
    class Guarded:
        def __init__(self, x: int) -> None:
            self.x = x
            self.lock = threading.Lock()

    def rebuild(x: int) -> Guarded:
        return Guarded(x)

    ray.util.register_serializer(Guarded, serializer=lambda g: g.x, deserializer=rebuild)
    try:

        @ray.remote
        def read(g: Guarded, more: list[Guarded]) -> list[Any]:
            return [type(g).__name__, g.x, [m.x for m in more], type(g.lock).__name__]

        @ray.remote(num_cpus=0)
        class Keeper:
            def __init__(self, first: Guarded) -> None:
                self.kept = [first.x]

            def keep(self, table: dict[str, Guarded]) -> list[int]:
                self.kept.extend(g.x for g in table.values())
                return self.kept

        assert ray.get(read.remote(Guarded(1), [Guarded(2), Guarded(3)]), timeout=60) == [
            "Guarded",
            1,
            [2, 3],
            "lock",
        ]
        keeper = Keeper.remote(Guarded(4))
        assert ray.get(keeper.keep.remote({"a": Guarded(5)}), timeout=60) == [4, 5]
        assert ray.get(ray.put(Guarded(6))).x == 6
        ray.kill(keeper)
    finally:
        ray.util.deregister_serializer(Guarded)


def test_an_error_raised_through_a_chain_of_actors_reaches_the_driver(ray: Any) -> None:
    # an actor method that ray.gets a failing call of another actor and lets the error go:
    # the driver gets it (its class too), it never waits for good
    @ray.remote
    class Inner:
        def boom(self) -> None:
            raise ValueError("from the inner actor")

    @ray.remote
    class Outer:
        def __init__(self, inner: Any) -> None:
            self.inner = inner

        def call(self) -> None:
            ray.get(self.inner.boom.remote())

        async def acall(self) -> None:
            await self.inner.boom.remote()

    inner = Inner.remote()
    outer = Outer.remote(inner)
    for method in (outer.call, outer.acall):
        with pytest.raises(ValueError, match="from the inner actor") as info:
            ray.get(method.remote(), timeout=120)
        assert isinstance(info.value, ray.exceptions.RayTaskError)
    for actor in (outer, inner):  # rayless keeps an actor whose handle went to another process
        ray.kill(actor)


def test_actor_spelling_errors(ray: Any) -> None:
    # test_actor.py: direct instantiation and direct method calls are TypeErrors; a taken
    # name is Ray's ActorAlreadyExistsError, a ValueError (rayless raised a plain one)
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
    with pytest.raises(ray.exceptions.ActorAlreadyExistsError) as info:
        A.options(name="parity-a").remote()
    assert isinstance(info.value, ValueError) and isinstance(info.value, ray.exceptions.RayError)
    assert ray.get(ray.get_actor("parity-a").f.remote()) == 1
    ray.kill(a)  # (Ray would end it with its handles; rayless keeps a named actor)


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


def test_ray_call_runs_a_function_on_the_instance(ray: Any) -> None:
    # actor.py's __ray_call__(fn, *args, **kwargs) -> fn(instance, ...): verl's rollout
    # servers ask each worker for its node and GPU this way, from an async actor; the
    # function's error is the caller's, and what it changes stays changed
    import asyncio

    @ray.remote(num_cpus=0)
    class Worker:
        def __init__(self) -> None:
            self.x = 41

        def get(self) -> int:
            return self.x

    @ray.remote(num_cpus=0)
    class AsyncWorker:
        def __init__(self) -> None:
            self.x = 1

        async def get(self) -> int:
            return self.x

    @ray.remote(num_cpus=0)
    class Server:
        async def probe(self, workers: list[Any]) -> list[Any]:
            return list(
                await asyncio.gather(
                    *[
                        w.__ray_call__.remote(
                            lambda self: (ray.get_runtime_context().get_node_id(), self.x)
                        )
                        for w in workers
                    ]
                )
            )

    def bump(self: Any, n: int) -> int:  # a plain function, also on an async actor (Ray
        self.x += n  # would return an async def's coroutine unawaited, and fail to pickle it)
        return int(self.x)

    def bad(self: Any) -> None:
        raise KeyError("nope")

    w, a = Worker.remote(), AsyncWorker.remote()
    assert ray.get(w.__ray_call__.remote(lambda self, d, k=0: self.x + d + k, 1, k=10)) == 52
    ray.get(w.__ray_call__.remote(lambda self: setattr(self, "x", 7)))
    assert ray.get(w.get.remote()) == 7
    assert ray.get(a.__ray_call__.remote(bump, 5)) == 6 == ray.get(a.get.remote())
    with pytest.raises(KeyError):
        ray.get(w.__ray_call__.remote(bad))
    node = ray.get_runtime_context().get_node_id()
    assert ray.get(Server.remote().probe.remote([w, a])) == [(node, 7), (node, 6)]


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


def test_generator_readiness_wait_next_ready_and_completed(ray: Any, tmp_path: Any) -> None:
    # Ray's ObjectRefGenerator: ray.wait takes generators (ready once next(gen) returns at
    # once), next_ready() never blocks, completed() is ready once the generator ended (its own
    # error is an item's, not completed()'s), is_finished() once every item was taken
    go = tmp_path / "go"

    @ray.remote
    def gated(path: str, n: int) -> Any:
        import os
        import time

        deadline = time.monotonic() + 120
        while not os.path.exists(path) and time.monotonic() < deadline:  # not a wait: a gate
            time.sleep(0.01)
        for i in range(n):  # noqa: UP028 (Ray's executor sends into a `yield from`: it fails)
            yield i

    @ray.remote
    def bad() -> Any:
        yield 1
        raise ValueError("bad item")

    gen = gated.remote(str(go), 3)
    assert gen.next_ready() is False
    ready, rest = ray.wait([gen], timeout=0)
    assert ready == [] and rest == [gen]
    go.touch()
    ref = gated.remote(str(go), 0)
    ready, rest = ray.wait([gen, ref.completed()], num_returns=2, timeout=60)
    assert len(ready) == 2 and ready[0] is gen and rest == []
    assert gen.next_ready() is True
    assert [ray.get(r) for r in gen] == [0, 1, 2]
    assert gen.is_finished() and gen.next_ready() is False
    later = gated.remote(str(go), 4)
    assert ray.get(later.completed(), timeout=60) is None
    assert [ray.get(r) for r in later] == [0, 1, 2, 3]  # kept for next, in order
    failing = bad.remote()
    assert ray.get(failing.completed(), timeout=60) is None
    refs = list(failing)
    assert len(refs) == 2 and ray.get(refs[0]) == 1
    with pytest.raises(ValueError, match="bad item"):
        ray.get(refs[1])


def test_as_completed_and_map_unordered(ray: Any) -> None:
    # ray.util's helpers (Ray's util/helpers.py): results as they finish, in batches of
    # chunk_size, map_unordered with at most backpressure_size in flight; errors as Ray's
    from importlib import import_module

    util = import_module(ray.__name__ + ".util")

    @ray.remote
    def square(x: int) -> int:
        return x * x

    @ray.remote
    def boom(x: int) -> int:
        raise ValueError(f"bad {x}")

    squares = [i * i for i in range(25)]
    refs = [square.remote(i) for i in range(25)]
    assert sorted(util.as_completed(refs, chunk_size=4)) == squares
    taken = list(util.as_completed(refs, chunk_size=100, yield_obj_refs=True))
    assert all(isinstance(r, ray.ObjectRef) for r in taken)
    assert sorted(ray.get(taken)) == squares
    assert list(util.as_completed([])) == []
    assert sorted(util.map_unordered(square, range(30), backpressure_size=5, chunk_size=2)) == [
        i * i for i in range(30)
    ]
    assert sorted(util.map_unordered(square, iter(range(7)), backpressure_size=None)) == [
        i * i for i in range(7)
    ]
    with pytest.raises(ValueError, match="chunk_size"):
        list(util.as_completed(refs, chunk_size=0))
    with pytest.raises(ValueError, match="instead of `num_returns`"):
        list(util.as_completed(refs, num_returns=2))
    with pytest.raises(ValueError, match="backpressure_size"):
        list(util.map_unordered(square, [1], backpressure_size=0))
    with pytest.raises(ValueError, match="bad 1"):
        list(util.map_unordered(boom, [1]))


def _settled_cpus(ray: Any) -> Any:
    """``available_resources()["CPU"]`` once three reads 0.2 s apart agree (Ray's view of
    resources lags the work that gives them back; within 30 s)."""
    reads: list[Any] = []

    def settled() -> bool:
        reads.append(ray.available_resources().get("CPU"))
        return len(reads) >= 3 and reads[-1] == reads[-2] == reads[-3]

    wait_until_sync(settled, 30, "three equal reads of the available CPUs", interval=0.2)
    return reads[-1]


def _queue_module(ray: Any) -> Any:
    from importlib import import_module

    return import_module(ray.__name__ + ".util.queue")


def test_queue_put_get_and_its_errors(ray: Any) -> None:
    # test_queue.py: test_simple_usage, test_get, test_put, test_batch, test_qsize
    qm = _queue_module(ray)
    q = qm.Queue()
    for item in range(10):
        q.put(item)
        assert q.qsize() == item + 1
    assert [q.get() for _ in range(10)] == list(range(10))
    assert q.empty() and len(q) == q.size() == 0
    q.put(0)
    assert q.get(block=False) == 0
    q.put(1)
    assert q.get(timeout=0.2) == 1
    with pytest.raises(ValueError):
        q.get(timeout=-1)
    with pytest.raises(qm.Empty):
        q.get_nowait()
    with pytest.raises(qm.Empty):
        q.get(timeout=0.2)

    one = qm.Queue(1)
    one.put(0, block=False)
    assert one.full()
    with pytest.raises(ValueError):
        one.put(0, timeout=-1)
    with pytest.raises(qm.Full):
        one.put_nowait(1)
    with pytest.raises(qm.Full):
        one.put(1, timeout=0.2)
    with pytest.raises(qm.Full):
        one.put_nowait_batch([1, 2])
    assert one.get() == 0
    with pytest.raises(qm.Empty):
        one.get_nowait_batch(1)
    with pytest.raises(TypeError):
        one.get_nowait_batch("1")
    big = qm.Queue(100)
    big.put_nowait_batch(list(range(100)))
    assert big.get_nowait_batch(100) == list(range(100))
    for queue in (q, one, big):
        queue.shutdown()


def test_queue_travels_to_tasks(ray: Any) -> None:
    # test_queue.py: test_concurrent_get, test_concurrent_put (the queue is a task argument)
    qm = _queue_module(ray)

    @ray.remote
    def take(queue: Any) -> Any:
        return queue.get(block=True)

    @ray.remote
    def give(queue: Any, item: Any) -> None:
        queue.put(item, block=True)

    q = qm.Queue()
    future = take.remote(q)
    with pytest.raises(qm.Empty):
        q.get_nowait()
    with pytest.raises(ray.exceptions.GetTimeoutError):
        ray.get(future, timeout=0.1)  # still waiting: not cancelled by the timeout
    q.put(1)
    assert ray.get(future, timeout=30) == 1

    one = qm.Queue(1)
    one.put(1)
    future = give.remote(one, 2)
    with pytest.raises(qm.Full):
        one.put_nowait(3)
    with pytest.raises(ray.exceptions.GetTimeoutError):
        ray.get(future, timeout=0.1)
    assert one.get() == 1
    assert one.get(timeout=30) == 2
    ray.get(future, timeout=30)
    q.shutdown()
    one.shutdown()


def test_queue_async_forms_shutdown_and_resources(ray: Any) -> None:
    # test_queue.py: test_get_async, test_put_async, test_shutdown, test_custom_resources
    import asyncio

    qm = _queue_module(ray)

    async def use() -> None:
        q = qm.Queue(1)
        await q.put_async(0)
        assert await q.get_async(block=False) == 0
        await q.put_async(1, timeout=0.2)
        with pytest.raises(qm.Full):
            await q.put_async(2, block=False)
        with pytest.raises(qm.Full):
            await q.put_async(2, timeout=0.2)
        with pytest.raises(ValueError):
            await q.put_async(2, timeout=-1)
        assert await q.get_async(timeout=0.2) == 1
        with pytest.raises(qm.Empty):
            await q.get_async(block=False)
        with pytest.raises(qm.Empty):
            await q.get_async(timeout=0.2)
        q.shutdown()

    asyncio.run(use())
    q = qm.Queue()
    q.put(1)
    # the queue's actor holds no CPU: with it alive, every CPU comes free once the actors of
    # the tests before are gone (their handles are; Ray ends such actors asynchronously)
    gc.collect()
    total = ray.cluster_resources().get("CPU")
    wait_until_sync(
        lambda: ray.available_resources().get("CPU") == total,
        30,
        "every CPU to be free while a Queue's actor lives",
        interval=0.2,
    )
    actor = q.actor
    q.shutdown()
    assert q.actor is None
    with pytest.raises(ray.exceptions.RayActorError):
        ray.get(actor.empty.remote(), timeout=30)


def test_actor_pool(ray: Any) -> None:
    # test_actor_pool.py: get_next, get_next_unordered, map, map_unordered, timeouts,
    # multiple returns, pop_idle, push
    util = __import__(ray.__name__ + ".util", fromlist=["ActorPool"])

    @ray.remote(num_cpus=0)
    class W:
        def f(self, x: int) -> int:
            return x + 1

        def double(self, x: int) -> int:
            return 2 * x

        def forever(self, x: int) -> None:
            time.sleep(3)

        @ray.method(num_returns=2)
        def pair(self) -> tuple[int, int]:
            return 1, 2

    actors = [W.remote() for _ in range(3)]
    pool = util.ActorPool(actors)
    for i in range(5):
        pool.submit(lambda a, v: a.f.remote(v), i)
        assert pool.get_next() == i + 1
    for i in range(5):
        pool.submit(lambda a, v: a.f.remote(v), i)
    got = []
    while pool.has_next():
        got.append(pool.get_next_unordered())
    assert sorted(got) == [1, 2, 3, 4, 5]
    with pytest.raises(StopIteration):
        pool.get_next()
    assert list(pool.map(lambda a, v: a.double.remote(v), range(7))) == [2 * v for v in range(7)]
    assert sorted(pool.map_unordered(lambda a, v: a.double.remote(v), range(7))) == [
        2 * v for v in range(7)
    ]
    for _ in range(4):
        pool.submit(lambda a, v: a.pair.remote(), None)
    while pool.has_next():
        assert pool.get_next(timeout=None) == [1, 2]

    pool.submit(lambda a, v: a.forever.remote(v), 0)
    with pytest.raises(TimeoutError):
        pool.get_next(timeout=0.1)
    with pytest.raises(TimeoutError):
        pool.get_next_unordered(timeout=0.1)
    with pytest.raises(TimeoutError, match="ignored"):
        pool.get_next(timeout=0.1, ignore_if_timedout=True)
    assert not pool.has_next() and pool.has_free()

    one = util.ActorPool([actors[0]])
    one.submit(lambda a, v: a.double.remote(v), 1)
    assert one.pop_idle() is None and one.has_free() is False
    with pytest.raises(ValueError):
        one.push(actors[0])
    one.push(actors[1])
    assert one.has_free()
    one.submit(lambda a, v: a.double.remote(v), 2)
    one.submit(lambda a, v: a.double.remote(v), 3)
    assert one.has_free() is False and len(one._pending_submits) == 1
    one.push(actors[2])
    assert one.has_free() is False and len(one._pending_submits) == 0
    assert list(one.map(lambda a, v: a.double.remote(v), [5])) == [10]
    one.pop_idle()
    assert one.has_free()


def test_ready_and_terminate_built_in_methods(ray: Any) -> None:
    # test_actor.py / ray.kill's docs: __ray_ready__ is True once the actor is up;
    # __ray_terminate__ ends it after the calls queued before it, and its ref (and every
    # later call's) raises RayActorError
    @ray.remote
    class Slow:
        def __init__(self) -> None:
            self.n = 0

        def step(self) -> int:
            time.sleep(0.3)
            self.n += 1
            return self.n

    @ray.remote
    class Async:
        async def f(self) -> int:
            return 1

    a = Slow.remote()
    assert ray.get(a.__ray_ready__.remote(), timeout=60) is True
    first = a.step.remote()
    done = a.__ray_terminate__.remote()
    later = a.step.remote()
    assert ray.get(first, timeout=30) == 1
    for ref in (done, later):
        with pytest.raises(ray.exceptions.RayActorError):
            ray.get(ref, timeout=30)
    b = Async.remote()
    assert ray.get(b.__ray_ready__.remote(), timeout=60) is True
    ready, _ = ray.wait([b.__ray_terminate__.remote()], timeout=30)
    assert ready
    with pytest.raises(ray.exceptions.RayActorError):
        ray.get(b.f.remote(), timeout=30)


def test_named_actor_listing_timeline_and_cloudpickle(ray: Any, tmp_path: Any) -> None:
    # verl's rendezvous (ray.util.list_named_actors + ray.get_actor(**entry)), its main_ppo
    # (ray.timeline(filename=...)) and fully-async policy (ray.cloudpickle)
    import json

    @ray.remote(num_cpus=0)
    class N:
        def f(self) -> int:
            return 1

    named = N.options(name="parity-listed").remote()
    anonymous = N.remote()
    assert ray.get([named.f.remote(), anonymous.f.remote()]) == [1, 1]
    names = ray.util.list_named_actors()
    assert "parity-listed" in names and len(names) == len(set(names))
    assert not [n for n in names if n.startswith("N-")]  # an anonymous actor is not listed
    entries = ray.util.list_named_actors(all_namespaces=True)
    mine = [e for e in entries if e["name"] == "parity-listed"]
    assert len(mine) == 1 and set(mine[0]) == {"name", "namespace"}
    assert ray.get(ray.get_actor(**mine[0]).f.remote()) == 1
    ray.kill(named)
    wait_until_sync(
        lambda: "parity-listed" not in ray.util.list_named_actors(), 30, "the killed actor unlisted"
    )

    assert isinstance(ray.timeline(), list)
    path = tmp_path / "timeline.json"
    assert ray.timeline(filename=str(path)) is None
    json.loads(path.read_text())
    assert ray.cloudpickle.loads(ray.cloudpickle.dumps(lambda x: x + 1))(1) == 2


def test_collective_groups_over_gloo(ray: Any) -> None:
    # test_collective (gloo): init_collective_group in each member, or create_collective_group
    # in the driver (members join at their first call); allreduce, broadcast, allgather,
    # send/recv, barrier, get_rank, destroy (verl's and OpenRLHF's weight broadcasts)
    from importlib import import_module

    import torch

    col = import_module(ray.__name__ + ".util.collective")

    @ray.remote(num_cpus=0)
    class Member:
        def __init__(self, rank: int, world: int) -> None:
            self.rank, self.world = rank, world

        def join(self, name: str) -> tuple[int, int]:
            col.init_collective_group(self.world, self.rank, backend="gloo", group_name=name)
            return col.get_rank(name), col.get_collective_group_size(name)

        def ops(self, name: str) -> tuple[Any, ...]:
            import torch

            t = torch.full((4,), float(self.rank + 1))
            col.allreduce(t, name)
            b = torch.full((2,), float(self.rank))
            col.broadcast(b, src_rank=1, group_name=name)
            outs = [torch.zeros(1) for _ in range(self.world)]
            col.allgather(outs, torch.tensor([float(self.rank)]), name)
            m = torch.tensor([float(self.rank)])
            col.allreduce(m, name, op=col.types.ReduceOp.MAX)
            got = torch.zeros(3)
            if self.rank == 0:
                col.send(torch.tensor([1.0, 2.0, 3.0]), 2, name)
            if self.rank == 2:
                col.recv(got, 0, name)
            col.barrier(name)
            return t.tolist(), b.tolist(), [o.item() for o in outs], m.item(), got.tolist()

        def declared(self, name: str) -> tuple[float, int]:
            import torch

            t = torch.full((1,), float(self.rank))
            col.allreduce(t, name)
            return t.item(), col.get_rank(name)

        def leave(self, name: str) -> bool:
            col.destroy_collective_group(name)
            return bool(col.is_group_initialized(name))

    members = [Member.remote(r, 3) for r in range(3)]
    joined = ray.get([m.join.remote("parity-g1") for m in members], timeout=120)
    assert joined == [(r, 3) for r in range(3)]
    outs = ray.get([m.ops.remote("parity-g1") for m in members], timeout=120)
    for rank, (t, b, gathered, top, got) in enumerate(outs):
        assert t == [6.0] * 4 and b == [1.0, 1.0] and gathered == [0.0, 1.0, 2.0] and top == 2.0
        assert got == ([1.0, 2.0, 3.0] if rank == 2 else [0.0] * 3)
    assert ray.get([m.leave.remote("parity-g1") for m in members], timeout=60) == [False] * 3

    pair = [Member.remote(r, 2) for r in range(2)]
    col.create_collective_group(pair, 2, [1, 0], backend="gloo", group_name="parity-g2")
    assert ray.get([m.declared.remote("parity-g2") for m in pair], timeout=120) == [
        (1.0, 1),
        (1.0, 0),
    ]
    with pytest.raises(RuntimeError):
        col.create_collective_group(pair, 2, [0, 1], backend="gloo", group_name="parity-g2")
    with pytest.raises(RuntimeError):
        col.allreduce(torch.zeros(1), "parity-g2")  # the driver is not an actor


def test_state_api_lists_actors_and_nodes(ray: Any) -> None:
    # ray.util.state as monitoring code and vLLM's data-parallel placement use it
    module = __import__(ray.__name__ + ".util.state", fromlist=["list_actors"])
    # Ray finds its API server from the address (several Ray instances run beside each other
    # under xdist); rayless' session is the only one there is
    where = {"address": ray.get_runtime_context().gcs_address} if ray.__name__ == "ray" else {}

    class state:  # the module, bound to this session's address
        exception = module.exception

        @staticmethod
        def list_actors(**kw: Any) -> Any:
            return module.list_actors(**where, **kw)

        @staticmethod
        def list_nodes(**kw: Any) -> Any:
            return module.list_nodes(**where, **kw)

        @staticmethod
        def get_actor(i: str) -> Any:
            return module.get_actor(i, **where)

        @staticmethod
        def get_node(i: str) -> Any:
            return module.get_node(i, **where)

    @ray.remote
    class StateProbe:
        def pid(self) -> int:
            return os.getpid()

    free = _settled_cpus(ray)
    named = StateProbe.options(name="state-probe").remote()
    plain = StateProbe.remote()
    pids = {ray.get(named.pid.remote()), ray.get(plain.pid.remote())}
    cls = "test_state_api_lists_actors_and_nodes.<locals>.StateProbe"  # Ray's: the qualname
    mine = state.list_actors(filters=[("class_name", "=", cls)])
    assert {a.pid for a in mine} == pids and {a["state"] for a in mine} == {"ALIVE"}
    assert {a.name for a in mine} == {"state-probe", ""}
    assert state.list_actors(filters=[("class_name", "=", cls), ("state", "=", "alive")])
    one = state.list_actors(filters=[("name", "=", "state-probe")])
    assert [a.class_name for a in one] == [cls]
    assert state.get_actor(one[0].actor_id).pid in pids
    assert state.get_actor(one[0].actor_id)["name"] == "state-probe"
    # Ray's older spelling, which verl's single controller imports
    older = __import__(ray.__name__ + ".experimental.state.api", fromlist=["get_actor"])
    assert older.get_actor is module.get_actor and older.list_actors is module.list_actors
    assert len(state.list_actors(filters=[("class_name", "=", cls)], limit=1)) == 1
    assert not state.list_actors(filters=[("class_name", "!=", cls), ("name", "=", "state-probe")])
    with pytest.raises(state.exception.RayStateApiException):
        state.list_actors(filters=[("no_such_column", "=", "1")])
    with pytest.raises(ValueError):
        state.list_actors(filters=[("state", ">", "ALIVE")])

    nodes = state.list_nodes()
    assert len(nodes) == 1 and nodes[0].state == "ALIVE" and nodes[0]["is_head_node"] is True
    assert nodes[0].resources_total["CPU"] == 2.0 and nodes[0].node_ip
    assert state.list_nodes(filters=[("is_head_node", "=", "True")]) == nodes
    assert state.get_node(nodes[0].node_id).node_id == nodes[0].node_id
    assert state.get_node("ff" * 28) is None
    for handle in (named, plain):
        ray.kill(handle)
    # (the CPUs come back late on Ray: later programs count the free ones)
    wait_until_sync(
        lambda: ray.available_resources().get("CPU") == free, 30, "the probes' CPUs back"
    )


def test_private_state_gives_resources_per_node(ray: Any) -> None:
    # verl's ResourcePoolManager._check_resource_available: the GPUs free on each node, from
    # ray._private.state; an actor holding a GPU takes it from its node's count
    from importlib import import_module

    state = import_module(ray.__name__ + "._private.state")
    assert ray._private.state.available_resources_per_node is state.available_resources_per_node

    def free_gpus() -> dict[str, float]:
        per_node = ray._private.state.available_resources_per_node()
        return {node: info.get("GPU", 0) for node, info in per_node.items()}

    @ray.remote(num_gpus=1, num_cpus=0)
    class Holder:
        def ready(self) -> bool:
            return True

    alive = {n["NodeID"] for n in ray.nodes() if n["Alive"]}
    (node,) = alive
    assert set(state.total_resources_per_node()) == alive
    total = state.total_resources_per_node()[node]
    assert total["GPU"] == 2.0 and total["CPU"] == 2.0
    wait_until_sync(lambda: free_gpus() == {node: 2.0}, 30, "both GPUs free")
    holder = Holder.remote()
    assert ray.get(holder.ready.remote(), timeout=60)
    wait_until_sync(lambda: free_gpus() == {node: 1.0}, 30, "one GPU held")
    assert sum(free_gpus().values()) == ray.available_resources()["GPU"]
    assert state.current_node_id().startswith("node:")
    assert state.current_node_id() in state.node_ids()
    ray.kill(holder)
    wait_until_sync(lambda: free_gpus() == {node: 2.0}, 30, "the GPU back")
    # verl's sort_placement_group_by_node_ip: a group's node from its record
    groups = import_module(ray.__name__ + ".util.placement_group")
    pg = groups.placement_group([{"CPU": 1, "GPU": 1}], strategy="STRICT_PACK")
    assert ray.get(pg.ready(), timeout=60)
    assert ray._private.state.state.placement_group_table(pg.id)["bundles_to_node_id"][0] == node
    groups.remove_placement_group(pg)


def test_noset_visible_devices_leaves_the_gpu_choice_to_the_actor(ray: Any) -> None:
    # verl's Worker, OpenRLHF's and SGLang's rollouts: with
    # RAY_EXPERIMENTAL_NOSET_CUDA_VISIBLE_DEVICES in runtime_env, CUDA_VISIBLE_DEVICES is not
    # set for the actor; get_gpu_ids() and get_accelerator_ids() still name its GPU
    @ray.remote(num_gpus=1, num_cpus=0)
    class Gpu:
        def seen(self) -> tuple[list[int], list[str], str | None]:
            ctx = ray.get_runtime_context()
            ids = ray.get_gpu_ids()
            return ids, ctx.get_accelerator_ids()["GPU"], os.environ.get("CUDA_VISIBLE_DEVICES")

    noset = {"env_vars": {"RAY_EXPERIMENTAL_NOSET_CUDA_VISIBLE_DEVICES": "1"}}
    plain, free = Gpu.remote(), Gpu.options(runtime_env=noset).remote()
    ids, accelerators, visible = ray.get(plain.seen.remote(), timeout=60)
    assert len(ids) == 1 and accelerators == [str(ids[0])] and visible == str(ids[0])
    ids, accelerators, visible = ray.get(free.seen.remote(), timeout=60)
    assert len(ids) == 1 and accelerators == [str(ids[0])]
    assert visible == os.environ.get("CUDA_VISIBLE_DEVICES")  # the node's, as it started
    for handle in (plain, free):
        ray.kill(handle)


def test_private_services_gives_the_node_ip(ray: Any) -> None:
    # OpenRLHF's BaseDistributedActor._get_current_node_ip, slime's and NeMo-RL's master
    # address: ray._private.services.get_node_ip_address(), in the driver and in an actor
    from importlib import import_module

    name = ray.__name__ + "._private.services"
    assert import_module(name).get_node_ip_address() == ray.util.get_node_ip_address()

    @ray.remote(num_cpus=0)
    class Probe:
        def ip(self) -> str:
            return str(import_module(name).get_node_ip_address())

    probe = Probe.remote()
    assert ray.get(probe.ip.remote(), timeout=60) == ray.util.get_node_ip_address()
    ray.kill(probe)


def test_concurrency_groups_keep_a_blocked_group_from_blocking_another(ray: Any) -> None:
    # verl's TokenBucketWorker (verl/tools/search_tool.py): a def acquire() that blocks on a
    # semaphore in group "acquire" (1 at a time) while release() runs in group "release"
    # (rayless refused concurrency_groups; without them the two deadlock); and
    # test_concurrency_group.py's async limits per group
    import threading

    @ray.remote(concurrency_groups={"acquire": 1, "release": 10})
    class TokenBucketWorker:
        def __init__(self, rate_limit: int) -> None:
            self.current_count = 0
            self._semaphore = threading.Semaphore(rate_limit)

        @ray.method(concurrency_group="acquire")
        def acquire(self) -> None:
            self._semaphore.acquire()
            self.current_count += 1

        @ray.method(concurrency_group="release")
        def release(self) -> None:
            self._semaphore.release()
            self.current_count -= 1

        def count(self) -> int:
            return self.current_count

    bucket = TokenBucketWorker.remote(2)
    ray.get([bucket.acquire.remote(), bucket.acquire.remote()], timeout=60)
    third = bucket.acquire.remote()  # waits in its group for a release
    assert ray.wait([third], timeout=0.5)[0] == []
    # a call's own group: queued behind the blocked acquire, in its group of 1
    queued = bucket.count.options(concurrency_group="acquire").remote()
    assert ray.wait([queued], timeout=0.5)[0] == []
    assert ray.get(bucket.count.remote(), timeout=60) == 2  # the default group still serves
    ray.get(bucket.release.remote(), timeout=60)
    ray.get(third, timeout=60)
    assert ray.get(queued, timeout=60) == 2  # it ran after the third acquire
    assert ray.get(bucket.count.remote(), timeout=60) == 2

    @ray.remote(concurrency_groups={"io": 2, "compute": 4})
    class Limits:
        def __init__(self) -> None:
            self.running = {"io": 0, "compute": 0}
            self.peak = {"io": 0, "compute": 0}

        async def _work(self, group: str, limit: int) -> None:
            # each call waits (5 s at most) until its group's limit of calls runs at once
            import asyncio

            self.running[group] += 1
            self.peak[group] = max(self.peak[group], self.running[group])
            loop = asyncio.get_running_loop()
            deadline = loop.time() + 5
            while self.peak[group] < limit and loop.time() < deadline:  # not a wait: an actor's
                await asyncio.sleep(0.01)
            self.running[group] -= 1

        @ray.method(concurrency_group="io")
        async def io(self) -> None:
            await self._work("io", 2)

        @ray.method(concurrency_group="compute")
        async def compute(self) -> None:
            await self._work("compute", 4)

        async def peaks(self) -> dict[str, int]:
            return self.peak

    limits = Limits.remote()
    ray.get([limits.io.remote() for _ in range(6)], timeout=60)
    ray.get([limits.compute.remote() for _ in range(8)], timeout=60)
    assert ray.get(limits.peaks.remote(), timeout=60) == {"io": 2, "compute": 4}
    for handle in (bucket, limits):
        ray.kill(handle)


def test_dataclasses_enums_sets_and_configs_travel(ray: Any) -> None:
    # Ray pickles what it sends; rayless carries these by name (transport._objects), and a
    # DictConfig as a config (verl's workers take one): a trainer's dataclass samples, Enums,
    # sets and OmegaConf configs reach an actor, a task and a queue, and come back
    omegaconf = pytest.importorskip("omegaconf")
    import torch

    from tests.unit.codec_classes import Batch, Color, Level, Sample

    queue = importlib.import_module(ray.__name__ + ".util.queue")
    config = omegaconf.OmegaConf.create({"optim": {"lr": 1e-6}, "n": "${optim.lr}"})

    @ray.remote(num_cpus=0)
    class Learner:
        def __init__(self, config: Any) -> None:
            self.config = config

        def step(self, batch: Any, seen: set[int]) -> Any:
            first = batch.samples[0]
            grown = Sample(first.prompt + "!", first.tokens * 2)
            extra = {"seen": seen | {3}, "lr": self.config.n, "color": Color.BLUE}
            return Batch([*batch.samples, grown], Level.LOW, extra)

    @ray.remote(num_cpus=0)
    def lengths(batch: Any) -> list[int]:
        return [s.length for s in batch.samples]

    batch = Batch([Sample("hi", torch.arange(3))], Level.HIGH)
    learner = Learner.remote(config)
    out = ray.get(learner.step.remote(batch, {1, 2}), timeout=60)
    assert [s.prompt for s in out.samples] == ["hi", "hi!"] and out.level is Level.LOW
    assert torch.equal(out.samples[1].tokens, torch.arange(3) * 2)
    assert out.extra == {"seen": {1, 2, 3}, "lr": 1e-6, "color": Color.BLUE}
    assert ray.get(lengths.remote(out), timeout=60) == [2, 3]
    q = queue.Queue()
    q.put(batch.samples[0])
    got = q.get(timeout=30)
    assert type(got) is Sample and got.prompt == "hi" and torch.equal(got.tokens, torch.arange(3))
    q.shutdown()


def test_classes_travel_as_arguments_and_results(ray: Any) -> None:
    # a worker class, or a sampler class inside an OmegaConf config (allow_objects), handed to
    # an actor; a class of the test (by value) comes back as itself
    omegaconf = pytest.importorskip("omegaconf")
    from tests.unit.codec_classes import Color, NotData

    class Local:
        scale = 3

    config = omegaconf.OmegaConf.create({"sampler": NotData}, flags={"allow_objects": True})

    @ray.remote(num_cpus=0)
    class Builder:
        def __init__(self, config: Any, kind: type) -> None:
            self.sampler = config.sampler
            self.kind = kind

        def make(self) -> Any:
            return self.sampler, self.kind, self.kind.scale, [int, Color]

    sampler, kind, scale, builtins = ray.get(
        Builder.remote(config, Local).make.remote(), timeout=60
    )
    assert sampler is NotData and kind is Local and scale == 3 and builtins == [int, Color]


def test_current_actor_is_the_actors_own_handle(ray: Any) -> None:
    # get_runtime_context().current_actor: an actor hands its own handle to another, which
    # calls back on it; a driver and a task have none (RuntimeError, as in Ray)
    @ray.remote(num_cpus=0)
    class Caller:
        def call_back(self, other: Any) -> int:
            return int(ray.get(other.ping.remote(), timeout=60)) + 1

        def call_nested(self, others: dict[str, Any]) -> int:
            return int(ray.get(others["me"][0].ping.remote(), timeout=60)) + 2

    @ray.remote(num_cpus=0)
    class Owner:
        def ping(self) -> int:
            return 41

        async def introduce(self, caller: Any) -> int:
            me = ray.get_runtime_context().current_actor
            return int(await caller.call_back.remote(me)) + int(
                await caller.call_nested.remote({"me": [me]})  # a handle deep in a value
            )

        def same(self) -> bool:
            ctx = ray.get_runtime_context()
            return bool(ctx.current_actor._actor_id.hex() == ctx.get_actor_id())

    @ray.remote(num_cpus=0)
    def in_task() -> str:
        try:
            ray.get_runtime_context().current_actor  # noqa: B018
        except RuntimeError as exc:
            return str(exc)
        return "no error"

    owner, caller = Owner.remote(), Caller.remote()
    assert ray.get(owner.introduce.remote(caller), timeout=60) == 42 + 43
    assert ray.get(owner.same.remote(), timeout=60) is True
    assert "only available in an actor" in ray.get(in_task.remote(), timeout=60)
    with pytest.raises(RuntimeError):
        ray.get_runtime_context().current_actor  # noqa: B018


def _pid_running(pid: int) -> bool:
    import psutil

    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def test_an_actor_ends_once_its_last_handle_is_gone(ray: Any) -> None:
    # Ray's actor lifetimes (test_actor_lifetime.py, test_reference_counting.py): a
    # non-detached actor is terminated when its handles go out of scope, after the calls
    # already submitted; one whose handle another actor holds keeps serving that actor
    @ray.remote(num_cpus=1)
    class Worker:
        def pid(self) -> int:
            return os.getpid()

        def slow(self, seconds: float) -> str:
            time.sleep(seconds)
            return "done"

        def echo(self, value: Any) -> Any:
            return value

    @ray.remote(num_cpus=0)
    def later(value: str, seconds: float) -> str:
        time.sleep(seconds)
        return value

    @ray.remote(num_cpus=0)
    class Holder:
        def __init__(self) -> None:
            self.kept: Any = None

        def keep(self, handle: Any) -> bool:
            self.kept = handle
            return True

        def ask(self) -> int:
            return int(ray.get(self.kept.pid.remote()))

    total = ray.cluster_resources()["CPU"]
    worker = Worker.remote()
    pid = ray.get(worker.pid.remote())
    ref = worker.slow.remote(0.5)
    del worker
    gc.collect()
    assert ray.get(ref, timeout=30) == "done"  # the call sent before still ran
    worker = Worker.remote()
    ref = worker.echo.remote(later.remote("awaited", 0.5))  # sent once its argument is ready
    del worker
    gc.collect()
    assert ray.get(ref, timeout=30) == "awaited"  # the end waited for it
    wait_until_sync(lambda: not _pid_running(pid), 30, "the actor to end with its handle")

    def use_once() -> int:
        return int(ray.get(Worker.remote().pid.remote()))

    pid = use_once()
    gc.collect()
    wait_until_sync(lambda: not _pid_running(pid), 30, "an actor started in a function to end")
    wait_until_sync(
        lambda: ray.available_resources().get("CPU") == total, 30, "both CPUs to come back"
    )

    @ray.remote(num_gpus=2, num_cpus=0)
    class Evaluator:
        def score(self, epoch: int) -> int:
            return epoch * 2

    # one per epoch, its handle dropped at once: each needs every GPU, so each start waits
    # for the one before to end (Ray: a pending actor; here a start retried once it ended)
    assert [ray.get(Evaluator.remote().score.remote(e), timeout=60) for e in range(3)] == [
        0,
        2,
        4,
    ]

    holder = Holder.remote()
    kept = Worker.options(num_cpus=0).remote()
    kept_pid = ray.get(kept.pid.remote())
    assert ray.get(holder.keep.remote(kept))
    del kept
    gc.collect()
    time.sleep(1.0)
    assert ray.get(holder.ask.remote(), timeout=30) == kept_pid  # the holder's handle counts
    ray.kill(holder)


def test_py_executable_runs_workers_under_another_venv(ray: Any, tmp_path: Any) -> None:
    # NeMo-RL: .options(runtime_env={"py_executable": <python>}) on actors and tasks
    python = make_venv(str(tmp_path / "venv"))
    venv = str(tmp_path / "venv")
    env = {"py_executable": python}

    @ray.remote(num_cpus=0)
    class Where:
        def prefix(self) -> str:
            import sys

            return sys.prefix

    @ray.remote(num_cpus=0)
    def prefix() -> str:
        import sys

        return sys.prefix

    a = Where.options(runtime_env=env).remote()
    assert ray.get(a.prefix.remote(), timeout=120) == venv
    assert ray.get(prefix.options(runtime_env=env).remote(), timeout=120) == venv
    assert ray.get(prefix.options(runtime_env={"py_executable": ""}).remote()) != venv
    ray.kill(a)


def test_a_detached_actor_is_kept_without_handles(ray: Any) -> None:
    # Ray's habit: a detached actor lives on when its handles are gone (until killed)
    @ray.remote(num_cpus=0)
    class Keeper:
        def pid(self) -> int:
            return os.getpid()

    anon = Keeper.options(lifetime="detached").remote()
    named = Keeper.options(name="keeper-d", lifetime="detached").remote()
    pids = [ray.get(anon.pid.remote()), ray.get(named.pid.remote())]
    del anon, named
    gc.collect()
    time.sleep(1.5)  # (a non-detached actor would be ending by now: see the test above)
    assert all(_pid_running(p) for p in pids)
    again = ray.get_actor("keeper-d")
    assert ray.get(again.pid.remote()) == pids[1]
    ray.kill(again)
    os.kill(pids[0], 9)  # nobody can name it
    wait_until_sync(lambda: not any(_pid_running(p) for p in pids), 30, "the keepers to end")


WORKING_DIR_DRIVER = """
import json, os, sys
if sys.argv[1] == "ray":
    import ray
else:
    from rayless import ray

code, lib = sys.argv[2], sys.argv[3]
ray.init(
    num_cpus=2,
    runtime_env={"working_dir": code, "excludes": ["huge.bin"], "py_modules": [lib]},
)

@ray.remote
class Reader:
    def read(self):
        import shipped_helper
        import shipped_lib

        rows = open("data/rows.txt").read().split()
        return shipped_helper.VALUE, rows, os.path.exists("run.log"), shipped_lib.twice(21)

    def files(self):
        return sorted(os.listdir("data"))

@ray.remote
def where():
    import shipped_helper

    return os.getcwd() != code, shipped_helper.VALUE

r = Reader.remote()
print(json.dumps([ray.get(r.read.remote()), ray.get(r.files.remote()), ray.get(where.remote())]))
ray.shutdown()
"""


def test_working_dir_and_py_modules_ship_code_to_workers(ray: Any, tmp_path: Any) -> None:
    # a job's runtime_env: {"working_dir": ".", "excludes": [...], "py_modules": [...]}
    import json
    import subprocess
    import sys

    from tests.environ import without_rayless

    code = tmp_path / "project"
    (code / "data").mkdir(parents=True)
    (code / "shipped_helper.py").write_text("VALUE = 'from the working_dir'\n")
    (code / "data" / "rows.txt").write_text("a\nb\n")
    (code / "data" / "huge.bin").write_bytes(b"0" * 1000)
    (code / ".gitignore").write_text("*.log\n")
    (code / "run.log").write_text("not shipped")
    lib = tmp_path / "libs" / "shipped_lib"
    lib.mkdir(parents=True)
    (lib / "__init__.py").write_text("def twice(x):\n    return 2 * x\n")
    driver = tmp_path / "driver.py"
    driver.write_text(WORKING_DIR_DRIVER)
    which = "ray" if ray.__name__ == "ray" else "rayless"
    out = subprocess.run(
        [sys.executable, str(driver), which, str(code), str(lib)],
        cwd=str(tmp_path),
        env=without_rayless(),
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    got = json.loads(out.stdout.strip().splitlines()[-1])
    assert got == [
        ["from the working_dir", ["a", "b"], False, 42],
        ["rows.txt"],
        [True, "from the working_dir"],
    ]


def _job_address(ray: Any) -> str | None:
    """Where a JobSubmissionClient finds this session's cluster: Ray's dashboard; rayless'
    session itself (None)."""
    if ray.__name__ != "ray":
        return None
    url = ray._private.worker.global_worker.node.address_info.get("webui_url")
    if not url:
        pytest.skip("this Ray runs without its dashboard (pip install 'ray[default]')")
    return f"http://{url}"


def test_job_submission_runs_fails_stops_and_deletes_jobs(ray: Any, tmp_path: Any) -> None:
    # ray/dashboard/modules/job/tests/test_sdk.py's and test_job_manager.py's scenarios:
    # a job's working_dir and env_vars, a failing entrypoint's record, stop, list, delete
    import asyncio
    import importlib
    import shlex
    import sys
    import uuid

    js = importlib.import_module(f"{ray.__name__}.job_submission")
    client = js.JobSubmissionClient(_job_address(ray))

    def agent_ready() -> bool:  # Ray's job agent may not serve yet on a loaded machine
        try:
            client.submit_job(entrypoint="true", submission_id=f"probe-{uuid.uuid4().hex}")
        except RuntimeError as exc:
            if "No available agent" in str(exc):
                return False
            raise
        return True

    if ray.__name__ == "ray":
        wait_until_sync(agent_ready, 120, "Ray's job agent")

    def ended(sid: str) -> Any:
        return wait_until_sync(
            lambda: client.get_job_info(sid) if client.get_job_status(sid).is_terminal() else None,
            120,
            f"job {sid} to end",
        )

    (tmp_path / "job_helper.py").write_text("VALUE = 'shipped'\n")
    py = shlex.quote(sys.executable)
    code = "import job_helper, os; print('helper', job_helper.VALUE, os.environ['FROM_JOB'])"
    ok = client.submit_job(
        entrypoint=f'{py} -c "{code}"',
        runtime_env={"working_dir": str(tmp_path), "env_vars": {"FROM_JOB": "job"}},
        metadata={"k": "v"},
    )
    info = ended(ok)
    assert (info.status, info.driver_exit_code, info.submission_id) == (
        js.JobStatus.SUCCEEDED,
        0,
        ok,
    )
    assert info.message == "Job finished successfully." and info.metadata["k"] == "v"
    assert info.type == js.JobType.SUBMISSION and info.end_time >= info.start_time > 0
    assert "helper shipped job" in client.get_job_logs(ok)

    bad = client.submit_job(entrypoint="echo to-the-log; exit 3")
    info = ended(bad)
    assert (info.status, info.driver_exit_code, info.error_type) == (
        js.JobStatus.FAILED,
        3,
        "JOB_ENTRYPOINT_COMMAND_ERROR",
    )
    assert info.message.startswith(
        "Job entrypoint command failed with exit code 3, last available logs (truncated to "
        "20,000 chars):\n"
    )
    assert "to-the-log" in info.message

    async def tail(sid: str) -> str:
        return "".join([text async for text in client.tail_job_logs(sid)])

    assert "to-the-log" in asyncio.run(tail(bad))

    long = f"long-{uuid.uuid4().hex[:8]}"
    assert client.submit_job(entrypoint="sleep 300", submission_id=long) == long
    wait_until_sync(
        lambda: client.get_job_status(long) == js.JobStatus.RUNNING, 120, "the job to run"
    )
    with pytest.raises(RuntimeError, match="already exists"):
        client.submit_job(entrypoint="true", submission_id=long)
    with pytest.raises(RuntimeError, match="non-terminal"):
        client.delete_job(long)
    assert client.stop_job(long) is True
    assert ended(long).status == js.JobStatus.STOPPED
    assert client.stop_job(long) is False
    assert {ok, bad, long} <= {job.submission_id for job in client.list_jobs()}
    assert client.delete_job(ok) is True
    with pytest.raises(RuntimeError, match="does not exist"):
        client.get_job_status(ok)
    for job in client.list_jobs():  # Ray's also lists its drivers (no submission id)
        if job.submission_id is not None:
            ended(job.submission_id)
            client.delete_job(job.submission_id)


def test_version_and_named_placement_group_lookup(ray: Any) -> None:
    # scripts print or compare ray.__version__; verl-style code finds its group by name
    import uuid

    assert ray.__version__.split(".")[0] == "2"
    name = f"pg-{uuid.uuid4().hex[:8]}"
    pg = ray.util.placement_group([{"CPU": 1}], name=name)
    ray.get(pg.ready())
    assert ray.util.get_placement_group(name).id.hex() == pg.id.hex()
    with pytest.raises(ValueError, match="Failed to look up placement group with name: nope"):
        ray.util.get_placement_group("nope")
    with pytest.raises(ValueError, match="non-empty"):
        ray.util.get_placement_group("")
    ray.util.remove_placement_group(pg)
