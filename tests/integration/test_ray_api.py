"""``rayless.ray``: Ray's core API on one shared local cluster (2 nodes, 2 fake GPUs each).

Each test re-expresses a scenario of Ray's own tests (python/ray/tests, named in a comment)
or an RL framework's habit; the tests here kill nothing the others use.
"""

from __future__ import annotations

import asyncio
import gc
import os
import sys
import threading
import time
from collections.abc import Iterator
from typing import Any

import numpy as np
import psutil
import pytest

from rayless import ray
from rayless.ray.exceptions import (
    ActorDiedError,
    GetTimeoutError,
    RayActorError,
    RayTaskError,
    TaskCancelledError,
)
from rayless.ray.util import placement_group, remove_placement_group
from rayless.ray.util.scheduling_strategies import (
    NodeAffinitySchedulingStrategy,
    PlacementGroupSchedulingStrategy,
)
from tests.integration.ray_api_classes import (
    AppError,
    AsksItself,
    AsyncActor,
    Counter,
    Derived,
    Failing,
    Threaded,
    add,
    gpu_task,
    nested_refs,
    nested_sum,
    raises,
    returns_pending_refs,
    sleepy,
    task_context,
    three,
    times_out,
    use_handle,
)
from tests.venvs import make_venv
from tests.waiting import wait_until_sync

pytestmark = [pytest.mark.integration, pytest.mark.xdist_group("rayless_ray_api")]


@pytest.fixture(scope="module", autouse=True)
def session() -> Iterator[None]:
    ray.init(
        num_cpus=4,
        num_gpus=2,
        _num_nodes=2,
        runtime_env={"env_vars": {"RAYLESS_TEST_FLAG": "on"}},
    )
    yield
    ray.shutdown()


# -- lifecycle ----------------------------------------------------------------------------


def test_init_twice_raises_unless_ignored() -> None:
    # test_basic.py: ray.init twice ("Maybe you called ray.init twice by accident?")
    assert ray.is_initialized()
    with pytest.raises(RuntimeError, match="twice"):
        ray.init()
    ray.init(ignore_reinit_error=True)


# -- tasks (test_basic.py) ----------------------------------------------------------------


def test_remote_function_results_and_keywords() -> None:
    # test_basic.py::test_simple_serialization / function calls with keyword defaults
    assert ray.get(add.remote(1, 2)) == 3
    assert ray.get(add.remote(1)) == 1
    assert ray.get(add.remote("a", b="b")) == "ab"
    assert ray.get([add.remote(i, i) for i in range(20)]) == [2 * i for i in range(20)]


def test_remote_function_called_directly_raises() -> None:
    # test_basic.py::test_invalid_arguments ("Remote functions cannot be called directly")
    with pytest.raises(TypeError, match="cannot be called directly"):
        add(1, 2)


def test_put_get_values_and_arrays() -> None:
    # test_basic.py::test_put_get (plain values and a numpy array) and ray.put(ref) refused
    for value in [1, "s", [1, 2], {"a": (1, 2)}, None, b"bytes", 1.5]:
        assert ray.get(ray.put(value)) == value
    array = np.arange(1 << 16, dtype=np.float32)
    got = ray.get(ray.put(array))  # a copy made at the put
    assert got is not array and np.array_equal(got, array)
    lock = threading.Lock()  # a value rayless cannot send is kept as it is
    assert ray.get(ray.put(lock)) is lock
    with pytest.raises(TypeError):
        ray.put(ray.put(1))


def test_an_argument_that_cannot_travel_is_named_in_the_callers_terms() -> None:
    """A task's refused argument is its own (``argument 0 [0]`` of ``add``), not the task
    worker's ``run(key, code, args, kwargs)`` that carries it (it said ``argument 2 [0] ...
    (calling run)``); a pending ref deeper than one level in a value says how to send it."""
    pending = sleepy.remote(3)
    with pytest.raises(
        TypeError, match=r"^argument 0 \[0\]\[0\]: an ObjectRef inside a value travels once"
    ) as info:
        ray.get(add.remote([[pending]]))
    assert info.value.args[0].endswith("(calling add)")
    with pytest.raises(TypeError, match=r"^keyword argument 'b' \['k'\]\[0\]: an ObjectRef"):
        ray.get(add.remote(1, b={"k": [pending]}))
    counter = Counter.remote()
    with pytest.raises(TypeError, match=r"^argument 0 \[1\]\[0\]: an ObjectRef inside"):
        ray.get(counter.incr.remote([1, (pending,)]))
    x = ray.put(1)
    assert ray.get(add.remote(x, b=2)) == 3  # the pool's worker is still there
    assert ray.get(nested_refs.remote([x, add.remote(1, 1)], {"k": [x]})) == [1, 2, 1]
    assert ray.get(ray.get(returns_pending_refs.remote())) == [0.5, 7]


def test_an_actor_waiting_for_its_own_call_on_its_only_thread_is_told_at_once() -> None:
    # Ray waits for good here; rayless names the deadlock (with no timeout) instead
    actor = AsksItself.remote()
    with pytest.raises(RuntimeError, match="own call 'double' would wait for good"):
        ray.get(actor.blocking.remote(), timeout=60)
    with pytest.raises(GetTimeoutError):  # a timeout given: Ray's behaviour
        ray.get(actor.with_timeout.remote(), timeout=60)
    assert ray.get(actor.done_first.remote(), timeout=60) == 0
    assert ray.get(actor.awaits.remote(), timeout=60) == 10  # the loop is free: it runs
    threaded = AsksItself.options(max_concurrency=2).remote()
    assert ray.get(threaded.blocking.remote(), timeout=60) == 4
    in_init = AsksItself.remote(in_init=True)
    with pytest.raises(RayActorError, match="own call 'double' would wait for good"):
        ray.get(in_init.double.remote(1), timeout=60)
    for a in (actor, threaded, in_init):
        ray.kill(a)


def test_refs_as_arguments_resolve() -> None:
    # test_basic.py::test_passing_arguments_by_value_out_of_the_box / chained tasks
    x = add.remote(1, 2)
    y = add.remote(x, x)
    assert ray.get(add.remote(y, b=x)) == 9


def test_num_returns() -> None:
    # test_basic.py::test_multiple_return_values (num_returns on the decorator and options)
    a, b, c = three.remote(1)
    assert ray.get([a, b, c]) == [1, 2, 3]
    refs = add.options(num_returns=2).remote((1,), (2,))
    assert ray.get(refs) == [1, 2]


def test_nested_tasks() -> None:
    # test_basic.py::test_submit_api / nested remote calls from a task
    assert ray.get(nested_sum.remote(4)) == 10


def test_get_timeout_raises_get_timeout_error() -> None:
    # test_basic.py::test_get_with_timeout
    ref = sleepy.remote(1.5)
    start = time.monotonic()
    with pytest.raises(GetTimeoutError):
        ray.get(ref, timeout=0.2)
    assert time.monotonic() - start < 1.0
    with pytest.raises(TimeoutError):  # also a TimeoutError, as Ray's
        ray.get(ref, timeout=0)
    assert ray.get(ref, timeout=30) == 1.5


def test_get_of_a_non_ref_raises() -> None:
    # test_basic.py: ray.get(1) → ValueError
    with pytest.raises(ValueError):
        ray.get(1)


def test_task_error_is_ray_task_error_and_the_user_class() -> None:
    # test_failure.py::test_failed_task (RayTaskError, as_instanceof_cause)
    with pytest.raises(AppError) as info:
        ray.get(raises.remote("bad input"))
    err = info.value
    assert isinstance(err, RayTaskError)
    assert isinstance(err.as_instanceof_cause(), AppError)
    assert err.code == 42 and "bad input" in str(err)
    with pytest.raises(TimeoutError) as timed:  # a task's own TimeoutError stays itself
        ray.get(times_out.remote(), timeout=60)
    assert isinstance(timed.value, RayTaskError)
    assert not isinstance(timed.value, GetTimeoutError)


def test_many_tasks_reuse_a_few_workers() -> None:
    # the pool: 200 tasks run on at most num_cpus workers, reused
    from tests.integration.ray_api_classes import pid_of_worker

    pids = set(ray.get([pid_of_worker.remote() for _ in range(200)]))
    assert 1 <= len(pids) <= 4


def test_gpu_tasks_get_a_gpu_each_and_give_it_back() -> None:
    # test_basic.py::test_gpu_ids / test_scheduling: num_gpus=1 tasks see their GPU; idle
    # task workers keep no GPU from actors
    before = ray.available_resources().get("GPU", 0)
    seen = ray.get([gpu_task.remote(0.3) for _ in range(2)], timeout=120)
    assert all(s.isdigit() for s in seen)
    assert ray.available_resources().get("GPU", 0) == before
    actors = [Counter.options(num_gpus=1).remote() for _ in range(int(before))]
    assert all(ray.get([a.context.remote() for a in actors])) and before >= 2
    for a in actors:
        ray.kill(a)


# -- actors (test_actor.py, test_asyncio.py, test_threaded_actor.py) ----------------------


def test_actor_keeps_state_across_calls() -> None:
    # test_actor.py::test_actor_counter / keyword arguments of the constructor
    c = Counter.remote(10, step=5)
    assert ray.get(c.incr.remote()) == 15
    assert ray.get([c.incr.remote(1) for _ in range(5)]) == [16, 17, 18, 19, 20]
    assert ray.get(c.get.remote()) == 20


def test_actor_class_cannot_be_instantiated_directly() -> None:
    # test_actor.py::test_actor_class_methods ("Actors cannot be instantiated directly")
    with pytest.raises(TypeError, match="cannot be instantiated directly"):
        Counter()
    c = Counter.remote()
    with pytest.raises(TypeError, match="cannot be called directly"):
        c.incr()
    with pytest.raises(AttributeError, match="no method"):
        c.nope  # noqa: B018


def test_actor_inheritance_tasks_and_actors_from_an_actor() -> None:
    # test_actor.py::test_actor_inheritance (a remote class inheriting from a plain one;
    # inheriting from an actor class is refused), test_actor.py::test_remote_function_within_actor,
    # test_actor.py::test_define_actor_within_actor
    d = Derived.remote()
    assert ray.get([d.base_method.remote(), d.own.remote()]) == ["from the base", "own"]
    assert ray.get(d.run_tasks.remote(3)) == 6
    assert ray.get(d.make_counter.remote(41)) == 42
    with pytest.raises(TypeError, match="Inheriting from actor classes"):

        class Bad(Counter):  # type: ignore[misc,valid-type]
            pass


def test_actor_method_error_is_ray_task_error() -> None:
    # test_actor_failures.py: an exception in a method; the actor keeps serving
    c = Counter.remote()
    with pytest.raises(RayTaskError) as info:
        ray.get(c.fail.remote("nope"))
    assert isinstance(info.value, AppError) and info.value.code == 7
    assert "in actor 'Counter-" in str(info.value) and "_ray_cls" not in str(info.value)
    assert ray.get(c.incr.remote()) == 1


def test_actor_constructor_failure_fails_calls_with_actor_died() -> None:
    # test_actor_failures.py::test_actor_init_fails (creation task error → ActorDiedError)
    f = Failing.remote()
    with pytest.raises(RayActorError, match="constructor failed"):
        ray.get(f.ping.remote())


def test_handles_pass_to_tasks_and_actors() -> None:
    # test_actor.py::test_pass_actor_handle / test_actor_handle_passing (and isinstance)
    c = Counter.remote()
    assert isinstance(c, ray.actor.ActorHandle)
    assert ray.get(use_handle.remote(c, 3)) == 3
    other = Counter.remote()
    assert ray.get(other.call_other.remote(c, 4)) == 7
    assert ray.get([use_handle.remote(c, 1) for _ in range(3)]) is not None


def test_method_num_returns() -> None:
    # test_actor.py::test_actor_method_num_returns (@ray.method(num_returns=2), .options)
    c = Counter.remote(3)
    a, b = c.pair.remote()
    assert ray.get([a, b]) == [3, -3]


def test_named_actor_get_actor_and_taken_name() -> None:
    # test_actor.py::test_named_actor / test_get_actor (taken name → ValueError)
    c = Counter.options(name="shared-counter").remote(1)
    same = ray.get_actor("shared-counter")
    assert ray.get(same.incr.remote()) == 2
    with pytest.raises(ValueError):
        Counter.options(name="shared-counter").remote()
    again = Counter.options(name="shared-counter", get_if_exists=True).remote()
    assert ray.get(again.get.remote()) == 2
    with pytest.raises(ValueError, match="Failed to look up actor"):
        ray.get_actor("no-such-actor")
    assert ray.get(c.get.remote()) == 2


def test_named_actors_live_in_namespaces() -> None:
    # test_namespace.py::test_namespace_basic (one name in two namespaces)
    a = Counter.options(name="ns-counter", namespace="alpha").remote(1)
    b = Counter.options(name="ns-counter", namespace="beta").remote(2)
    assert ray.get(ray.get_actor("ns-counter", namespace="alpha").get.remote()) == 1
    assert ray.get(ray.get_actor("ns-counter", namespace="beta").get.remote()) == 2
    with pytest.raises(ValueError):
        ray.get_actor("ns-counter")
    assert ray.get([a.get.remote(), b.get.remote()]) == [1, 2]


def test_async_actor_runs_calls_concurrently() -> None:
    # test_asyncio.py::test_asyncio_actor (a call waits for a later one)
    a = AsyncActor.remote()
    waiting = a.wait_for_go.remote()
    ready, _ = ray.wait([waiting], timeout=0.2)
    assert ready == []
    ray.get(a.go.remote())
    assert ray.get(waiting, timeout=30) == "went"


def test_await_ref_in_async_code() -> None:
    # test_asyncio.py::test_asyncio_get (await ObjectRef), in a driver's event loop and an
    # async actor method
    c = Counter.remote()

    async def main() -> list[int]:
        first = await c.incr.remote(2)
        both = await asyncio.gather(c.incr.remote(1), add.remote(2, 3))
        return [first, *both]

    assert asyncio.run(main()) == [2, 3, 5]
    a = AsyncActor.remote()
    assert ray.get(a.await_ref.remote(c)) == 8
    with pytest.raises(RuntimeError, match="await ref"):  # deliberate: Ray blocks the loop
        ray.get(a.blocking_get.remote(c))


def test_threaded_actor_runs_sync_methods_together() -> None:
    # test_threaded_actor.py::test_threaded_actor_basic (max_concurrency=2: two meet)
    t = Threaded.remote()
    assert sorted(ray.get([t.meet.remote(), t.meet.remote()], timeout=60)) == [0, 1]


# -- wait (test_wait.py) ------------------------------------------------------------------


def test_wait_shapes_and_errors() -> None:
    # test_wait.py::test_wait
    refs = [add.remote(i) for i in range(4)]
    ready, rest = ray.wait(refs)
    assert len(ready) == 1 and len(rest) == 3
    ready, rest = ray.wait(refs, num_returns=4)
    assert set(ready) == set(refs) and rest == []
    slow = [add.remote(0), sleepy.remote(5)]
    ready, rest = ray.wait(slow, timeout=0.5, num_returns=2)
    assert len(ready) == 1 and len(rest) == 1
    x = ray.put(1)
    with pytest.raises(ValueError):
        ray.wait([x, x])
    assert ray.wait([]) == ([], [])
    puts = [ray.put(i) for i in range(10)]
    found, left = ray.wait(puts, num_returns=2)
    assert found == puts[:2] and left == puts[2:]  # Ray's order: as given
    for bad in (x, 1, [1]):
        with pytest.raises(TypeError):
            ray.wait(bad)  # type: ignore[arg-type]


def test_wait_timing() -> None:
    # test_wait.py::test_wait_timing
    future = sleepy.remote(1)
    start = time.monotonic()
    ready, not_ready = ray.wait([future], timeout=0.2)
    assert 0.2 <= time.monotonic() - start < 0.8
    assert ready == [] and not_ready == [future]


def test_router_probe_of_busy_actors() -> None:
    # rLightning's routers: ray.wait(futures, num_returns=len(futures), timeout=0.01) tells
    # which actors are idle without waiting for the busy one
    busy, idle = Counter.remote(), Counter.remote()
    ray.get([busy.get.remote(), idle.get.remote()])
    futures = [busy.sleep.remote(2.0), idle.get.remote()]
    ray.get(futures[1])
    ready, pending = ray.wait(futures, num_returns=len(futures), timeout=0.01)
    assert ready == [futures[1]] and pending == [futures[0]]


# -- cancel (test_cancel.py) --------------------------------------------------------------


def test_cancel_queued_and_running_async_calls() -> None:
    # test_cancel.py::test_async_actor_cancel and a queued call dropped
    a = AsyncActor.remote()
    ref = a.forever.remote()
    # running in the actor before the cancel (a fixed 0.3 s pause was too short under load:
    # the call, still on its way, was dropped, and nothing in the actor was cancelled)
    wait_until_sync(
        lambda: ray.get(a.started_count.remote(), timeout=30) == 1, 60, "the call running"
    )
    ray.cancel(ref)
    with pytest.raises(TaskCancelledError):
        ray.get(ref, timeout=30)
    assert ray.get(a.cancelled_count.remote(), timeout=30) == 1
    with pytest.raises(ValueError, match="force"):
        ray.cancel(a.forever.remote(), force=True)


def test_cancel_a_task() -> None:
    # test_cancel.py::test_cancel_chain (a task cancelled before it ran)
    blockers = [sleepy.remote(1.0) for _ in range(4)]
    queued = add.remote(1, 2)
    ray.cancel(queued)
    with pytest.raises(TaskCancelledError):
        ray.get(queued, timeout=30)
    ray.get(blockers)


# -- placement groups (test_placement_group*.py) ------------------------------------------


def test_placement_group_pack_one_actor_per_bundle() -> None:
    # test_placement_group.py::test_placement_group_pack (actors land on their bundles)
    pg = placement_group([{"CPU": 1, "GPU": 1}, {"CPU": 1, "GPU": 1}], strategy="PACK")
    assert ray.get(pg.ready(), timeout=10) is not None and pg.wait(5)
    actors = [
        Counter.options(
            num_gpus=1,
            scheduling_strategy=PlacementGroupSchedulingStrategy(pg, i),
        ).remote()
        for i in range(2)
    ]
    seen = ray.get([a.context.remote() for a in actors])
    assert len({s["node_id"] for s in seen}) == 1  # packed onto one node
    assert sorted(s["cuda"] for s in seen) == ["0", "1"]
    remove_placement_group(pg)


def test_placement_group_fractional_gpu_actors_share_a_bundle() -> None:
    # OpenRLHF/verl: colocated actors, num_gpus=0.5 each in one GPU bundle per GPU
    pg = placement_group([{"GPU": 1, "CPU": 1}] * 2, strategy="STRICT_PACK")
    ray.get(pg.ready())
    seen, kept = [], []  # (an actor whose handle is dropped ends, and gives its share back)
    for bundle in range(2):
        for _ in range(2):
            a = Counter.options(
                num_gpus=0.5,
                scheduling_strategy=PlacementGroupSchedulingStrategy(
                    pg, placement_group_bundle_index=bundle
                ),
            ).remote()
            kept.append(a)
            seen.append(ray.get(a.context.remote()))
    assert [s["cuda"] for s in seen[:2]] == [seen[0]["cuda"]] * 2
    assert [s["cuda"] for s in seen[2:]] == [seen[2]["cuda"]] * 2
    assert seen[0]["cuda"] != seen[2]["cuda"]
    assert seen[0]["gpus"] == [int(seen[0]["cuda"])]
    assert seen[0]["accelerators"] == {"GPU": [seen[0]["cuda"]]}
    with pytest.raises(RayActorError, match="no room"):
        ray.get(
            Counter.options(
                num_gpus=0.5, scheduling_strategy=PlacementGroupSchedulingStrategy(pg, 0)
            )
            .remote()
            .get.remote()
        )
    remove_placement_group(pg)


def test_placement_group_spread_and_strict_spread() -> None:
    # test_placement_group.py::test_placement_group_spread / strict_spread
    pg = placement_group([{"CPU": 1}, {"CPU": 1}], strategy="STRICT_SPREAD")
    actors = [
        Counter.options(scheduling_strategy=PlacementGroupSchedulingStrategy(pg, i)).remote()
        for i in range(2)
    ]
    nodes = {s["node_id"] for s in ray.get([a.context.remote() for a in actors])}
    assert len(nodes) == 2
    remove_placement_group(pg)


def test_infeasible_placement_group_fails_fast_with_the_reason() -> None:
    # test_placement_group.py::test_placement_group_infeasible (Ray: pending forever)
    start = time.monotonic()
    with pytest.raises(Exception, match="can never be placed"):
        placement_group([{"GPU": 1}] * 3, strategy="STRICT_PACK")
    with pytest.raises(Exception, match="can never be placed"):
        placement_group([{"CPU": 1}] * 3, strategy="STRICT_SPREAD")
    assert time.monotonic() - start < 5
    with pytest.raises(ValueError, match="strategy"):
        placement_group([{"CPU": 1}], strategy="NOPE")


def test_remove_placement_group_kills_its_actors() -> None:
    # test_placement_group.py::test_remove_placement_group
    pg = placement_group([{"CPU": 1}])
    a = Counter.options(scheduling_strategy=PlacementGroupSchedulingStrategy(pg, 0)).remote()
    assert ray.get(a.incr.remote()) == 1
    remove_placement_group(pg)
    with pytest.raises(RayActorError):
        ray.get(a.incr.remote(), timeout=30)
    with pytest.raises(ValueError, match="removed"):
        Counter.options(scheduling_strategy=PlacementGroupSchedulingStrategy(pg, 0)).remote()


def test_tasks_in_a_placement_group_bundle() -> None:
    # test_placement_group.py::test_placement_group_task (a task scheduled into a bundle)
    pg = placement_group([{"CPU": 1}, {"CPU": 1}], strategy="STRICT_SPREAD")
    strategy = PlacementGroupSchedulingStrategy(pg, 1)
    got = ray.get(task_context.options(scheduling_strategy=strategy).remote())
    assert got["node_id"] == pg.bundles[1].node_id
    remove_placement_group(pg)


# -- scheduling strategies (test_scheduling*.py) ------------------------------------------


def test_node_affinity_pins_actors_and_tasks() -> None:
    # test_scheduling_2.py::test_node_affinity_scheduling_strategy (hard and soft)
    node_ids = [n["NodeID"] for n in ray.nodes()]
    assert len(node_ids) == 2
    for node in node_ids:
        strategy = NodeAffinitySchedulingStrategy(node, soft=False)
        a = Counter.options(scheduling_strategy=strategy).remote()
        assert ray.get(a.context.remote())["node_id"] == node
        assert (
            ray.get(task_context.options(scheduling_strategy=strategy).remote())["node_id"] == node
        )
    soft = NodeAffinitySchedulingStrategy("no-such-node", soft=True)
    assert ray.get(task_context.options(scheduling_strategy=soft).remote())["node_id"]
    with pytest.raises(Exception, match="not alive"):
        hard = NodeAffinitySchedulingStrategy("no-such-node", soft=False)
        ray.get(Counter.options(scheduling_strategy=hard).remote().get.remote())


def test_spread_strategy_uses_both_nodes() -> None:
    # test_scheduling.py::test_spread_scheduling_strategy
    actors = [Counter.options(scheduling_strategy="SPREAD").remote() for _ in range(4)]
    assert len({ray.get(a.context.remote())["node_id"] for a in actors}) == 2


# -- introspection (test_runtime_context.py, test_basic.py) -------------------------------


def test_runtime_context_in_driver_actor_and_task() -> None:
    # test_runtime_context.py::test_get_context_dict / test_actor_get_runtime_context;
    # TransferQueue's storage manager reads get_runtime_context() the same way
    ctx = ray.get_runtime_context()
    assert ctx.get_actor_id() is None
    c = Counter.remote()
    in_actor = ray.get(c.context.remote())
    in_task = ray.get(task_context.remote())
    assert in_actor["actor_id"] and in_task["actor_id"] is None
    assert in_actor["job_id"] == in_task["job_id"] == ctx.get_job_id()
    assert in_actor["node_id"] in {n["NodeID"] for n in ray.nodes()}
    assert in_actor["namespace"] == ctx.namespace
    assert in_actor["gpus"] == [] and in_actor["accelerators"] == {"GPU": []}


def test_noset_visible_devices_shows_the_nodes_gpus_and_still_names_the_actors_own() -> None:
    """Ray's ``RAY_EXPERIMENTAL_NOSET_CUDA_VISIBLE_DEVICES`` (verl's, OpenRLHF's and SGLang's
    rollouts set it in ``runtime_env``): CUDA_VISIBLE_DEVICES is left as the node has it, and
    ``get_gpu_ids()`` / ``get_accelerator_ids()`` still name the actor's own GPU, which it
    selects itself (``torch.cuda.set_device(ray.get_gpu_ids()[0])``). It was ignored: the
    actor got CUDA_VISIBLE_DEVICES=<its GPU>, so its set_device(<that index>) failed."""
    noset = {"env_vars": {"RAY_EXPERIMENTAL_NOSET_CUDA_VISIBLE_DEVICES": "1"}}
    plain = Counter.options(num_gpus=1).remote()
    free = Counter.options(num_gpus=1, runtime_env=noset).remote()
    a, b = ray.get(plain.context.remote()), ray.get(free.context.remote())
    assert len(a["gpus"]) == 1 and a["cuda"] == str(a["gpus"][0])
    assert len(b["gpus"]) == 1 and b["accelerators"] == {"GPU": [str(b["gpus"][0])]}
    assert b["cuda"] != str(b["gpus"][0])  # the node's (none set here, fake GPUs)
    off = {"env_vars": {"RAY_EXPERIMENTAL_NOSET_CUDA_VISIBLE_DEVICES": ""}}  # Ray: unset
    in_task = ray.get(task_context.options(num_gpus=1, runtime_env=off).remote())
    assert len(in_task["gpus"]) == 1 and in_task["cuda"] == str(in_task["gpus"][0])
    in_task = ray.get(task_context.options(num_gpus=1, runtime_env=noset).remote())
    assert len(in_task["gpus"]) == 1 and in_task["cuda"] != str(in_task["gpus"][0])


def test_nodes_and_resources_use_ray_key_names() -> None:
    # test_basic.py::test_cluster_resources / test_available_resources
    nodes = ray.nodes()
    assert all(n["Alive"] and "node:127.0.0.1" in n["Resources"] for n in nodes)
    total = ray.cluster_resources()
    assert total["GPU"] == 4 and total["CPU"] >= 2 and total["memory"] > 0
    free = ray.available_resources()
    assert set(free) <= set(total) and free.get("GPU", 0) <= 4


def test_runtime_env_env_vars_reach_actors_and_tasks() -> None:
    # test_runtime_env_env_vars.py: session-wide and per-actor env_vars
    assert ray.get(task_context.remote())["env"] == "on"
    c = Counter.options(runtime_env={"env_vars": {"RAYLESS_TEST_FLAG": "mine"}}).remote()
    assert ray.get(c.context.remote())["env"] == "mine"
    with pytest.raises(ValueError, match="pip"):
        Counter.options(runtime_env={"pip": ["x"]}).remote()


def test_a_runtime_env_object_is_a_runtime_env_dict() -> None:
    # AReaL's scheduler: runtime_env=RuntimeEnv(env_vars=env) (ray.runtime_env was missing)
    from rayless.ray.runtime_env import RuntimeEnv

    env = ray.runtime_env.RuntimeEnv(env_vars={"RAYLESS_TEST_FLAG": "typed"})
    assert (
        env == {"env_vars": {"RAYLESS_TEST_FLAG": "typed"}} and env.env_vars()["RAYLESS_TEST_FLAG"]
    )
    c = Counter.options(runtime_env=env).remote()
    assert ray.get(c.context.remote())["env"] == "typed"
    assert ray.get(task_context.options(runtime_env=env).remote())["env"] == "typed"
    with pytest.raises(TypeError, match="Dict\\[str, str\\]"):
        RuntimeEnv(env_vars={"N": 1})  # type: ignore[dict-item]
    with pytest.raises(ValueError, match="pip"):
        Counter.options(runtime_env=RuntimeEnv(pip=["x"])).remote()


def test_unsupported_options_raise_clearly() -> None:
    # deliberate differences: named, not ignored
    c = Counter.remote()
    with pytest.raises(ValueError, match="has no concurrency group 'io'"):
        ray.get(c.incr.options(concurrency_group="io").remote(), timeout=60)  # none defined
    with pytest.raises(ValueError, match="non-empty string"):
        c.incr.options(concurrency_group="")
    with pytest.raises(ValueError, match="detached"):
        placement_group([{"CPU": 1}], lifetime="detached")  # planned in the driver
    with pytest.raises(ValueError, match="custom resources"):
        add.options(resources={"TPU": 1}).remote(1)


def test_a_dropped_generator_task_stops_and_gives_its_worker_back() -> None:
    # rayless only: Ray runs a dropped generator task on to its end (an endless one holds its
    # worker for good); rayless stops it and frees the worker. More half-read generators
    # than the session's 4 CPUs, each dropped: later tasks still run.
    from tests.integration.ray_api_classes import endless

    for _ in range(6):
        gen = endless.remote()
        assert ray.get(next(gen)) == 0
        del gen
    for _ in range(6):  # never read: dropped as soon as its task started
        gen = endless.remote()
        ray.wait([add.remote(0)], timeout=60)  # (time for the start)
        del gen
    assert ray.get([add.remote(i, 1) for i in range(8)], timeout=60) == list(range(1, 9))
    gen = endless.remote()
    assert [ray.get(next(gen)) for _ in range(3)] == [0, 1, 2]
    gen.close()
    assert gen.is_finished()
    with pytest.raises(StopIteration):
        next(gen)


def test_a_get_actor_handle_streams_a_generator_method() -> None:
    # the method records a handle of ray.get_actor carries say which methods are generators
    from tests.integration.ray_api_classes import Streamer

    Streamer.options(name="streamer").remote()
    handle = ray.get_actor("streamer")
    gen = handle.items.remote(3)
    assert isinstance(gen, ray.ObjectRefGenerator)
    assert [ray.get(ref) for ref in gen] == [0, 1, 2]
    ray.kill(handle)


def test_a_collective_group_missing_a_member_fails_within_its_timeout() -> None:
    # every wait has a deadline: a group whose rank 1 never joins fails rank 0's init (and a
    # lone rank 1's) with RuntimeError after gloo_timeout, never a hang
    from rayless.ray.util import collective as col

    @ray.remote(num_cpus=0)
    class Lonely:
        def join(self, rank: int, name: str) -> str:
            start = time.monotonic()
            try:
                col.init_collective_group(
                    2, rank, backend="gloo", group_name=name, gloo_timeout=2000
                )
            except RuntimeError as exc:
                return f"RuntimeError after {time.monotonic() - start:.0f}s: {exc}"
            return "joined"

    for rank in (0, 1):
        got = ray.get(Lonely.remote().join.remote(rank, f"lonely-{rank}"), timeout=120)
        assert got.startswith("RuntimeError after") and "could not be formed" in got, got


def test_a_ray_classs_setup_and_teardown_are_its_own_methods() -> None:
    # a Ray trainer's setup(config) / teardown(): called remotely, never run by rayless itself
    # (Cluster.spawn's lifecycle hooks are rayless' own; Ray has none)
    @ray.remote(num_cpus=0)
    class Trainer:
        def __init__(self) -> None:
            self.calls: list[str] = []

        def setup(self, config: dict[str, int]) -> int:
            self.calls.append("setup")
            return config["lr"]

        def teardown(self) -> None:
            self.calls.append("teardown")

        def seen(self) -> list[str]:
            return self.calls

    t = Trainer.remote()
    assert ray.get(t.seen.remote()) == []  # not run at spawn
    assert ray.get(t.setup.remote({"lr": 3})) == 3
    ray.get(t.teardown.remote())
    assert ray.get(t.seen.remote()) == ["setup", "teardown"]


def test_get_if_exists_that_loses_the_race_to_create_gets_the_winner(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # test_actor.py::test_get_if_exists: Ray's get-or-create is atomic. Here a creator whose
    # lookup came before another's spawn registered the name, and whose own spawn came after,
    # got "name taken" (ValueError); the lookup's miss is simulated once
    from rayless.errors import ActorNotFoundError
    from rayless.ray import _worker

    @ray.remote(num_cpus=0)
    class Once:
        def pid(self) -> int:
            import os

            return os.getpid()

    first = Once.options(name="race-once").remote()
    s = _worker.session()
    cluster = _worker.run(s, s.cluster())
    real = cluster.get_actor
    misses = [1]

    async def late_lookup(name: str) -> object:
        if misses:
            misses.pop()
            raise ActorNotFoundError(f"no live actor named {name!r}")
        return await real(name)

    monkeypatch.setattr(cluster, "get_actor", late_lookup)
    second = Once.options(name="race-once", get_if_exists=True).remote()
    assert ray.get(second.pid.remote(), timeout=60) == ray.get(first.pid.remote(), timeout=60)


def _starts_in(pg: Any) -> bool:
    """Whether a one-GPU Counter starts in ``pg``'s bundle 0 now (False: no room there)."""
    strategy = PlacementGroupSchedulingStrategy(pg, 0)
    try:
        handle = Counter.options(num_gpus=1, scheduling_strategy=strategy).remote()
        ray.get(handle.get.remote(), timeout=30)
    except RayActorError:
        return False
    ray.kill(handle)
    return True


def test_a_dropped_actor_gives_its_bundle_back_and_a_named_or_sent_one_is_kept() -> None:
    pg = placement_group([{"GPU": 1, "CPU": 1}], strategy="STRICT_PACK")
    ray.get(pg.ready())
    first = Counter.options(
        num_gpus=1, scheduling_strategy=PlacementGroupSchedulingStrategy(pg, 0)
    ).remote()
    ray.get(first.get.remote())
    assert not _starts_in(pg)  # the bundle's GPU is taken
    del first
    gc.collect()
    wait_until_sync(lambda: _starts_in(pg), 30, "the dropped actor's bundle to come back")
    remove_placement_group(pg)

    Counter.options(name="kept-by-name", num_cpus=0).remote()  # its handle dropped at once
    gc.collect()
    time.sleep(0.5)
    named = ray.get_actor("kept-by-name")
    assert ray.get(named.incr.remote()) == 1  # found by name later: kept
    ray.kill(named)

    holder, sent = Counter.options(num_cpus=0).remote(), Counter.options(num_cpus=0).remote()
    assert ray.get(holder.call_other.remote(sent, 2)) == 2  # sent to another actor
    pid = ray.get(sent.pid.remote())
    del sent
    gc.collect()
    time.sleep(0.5)
    assert psutil.pid_exists(pid)  # another process may hold its handle: kept
    ray.kill(holder)


def _ended(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def test_collecting_a_dropped_handle_runs_no_python_code() -> None:
    """The end of a collected handle's actor is queued by C code (a deque's append) and
    started on the session's loop: Python code run inside the garbage collector can break an
    interpreter that is compiling (CPython 3.11's AST recursion-depth check)."""
    a = Counter.options(num_cpus=0).remote()
    pid = ray.get(a.pid.remote())
    calls: list[str] = []

    def profile(frame: Any, event: str, arg: Any) -> None:
        if event == "call":
            calls.append(f"{frame.f_code.co_filename}:{frame.f_code.co_name}")

    sys.setprofile(profile)
    try:
        del a  # the last reference: collected here, in this thread
    finally:
        sys.setprofile(None)
    assert calls == [], calls
    wait_until_sync(lambda: _ended(pid), 30, "the dropped handle's actor to end")


@pytest.fixture(scope="module")
def venvs(tmp_path_factory: pytest.TempPathFactory) -> tuple[str, str]:
    """A second venv that imports rayless, and a bare one that cannot."""
    root = tmp_path_factory.mktemp("venvs")
    return make_venv(str(root / "with")), make_venv(str(root / "bare"), bare=True)


@ray.remote
class Interpreter:
    """Which Python runs it, and what its own actors and tasks run under."""

    def prefix(self) -> str:
        return sys.prefix

    def childs_prefix(self) -> tuple[str, str]:
        child = Interpreter.remote()
        return ray.get(child.prefix.remote()), ray.get(interpreter_prefix.remote())


@ray.remote
def interpreter_prefix() -> str:
    return sys.prefix


def test_py_executable_runs_actors_and_tasks_under_another_python(
    venvs: tuple[str, str],
) -> None:
    # NeMo-RL: worker.options(runtime_env={"py_executable": <a venv's python>}).remote()
    python, _ = venvs
    venv = os.path.dirname(os.path.dirname(python))
    env = {"py_executable": python}
    a = Interpreter.options(runtime_env=env).remote()
    assert ray.get(a.prefix.remote()) == venv
    assert ray.get(interpreter_prefix.options(runtime_env=env).remote()) == venv
    # its own actors and tasks inherit it, as Ray's do
    assert ray.get(a.childs_prefix.remote()) == (venv, venv)
    # a command with arguments; the driver's own interpreter (forked, as without one)
    words = {"py_executable": f"{python} -X utf8"}
    assert ray.get(interpreter_prefix.options(runtime_env=words).remote()) == venv
    own = {"py_executable": sys.executable}
    assert ray.get(interpreter_prefix.options(runtime_env=own).remote()) == sys.prefix


def test_a_py_executable_that_cannot_run_rayless_fails_the_actor_saying_why(
    venvs: tuple[str, str], tmp_path: Any
) -> None:
    _, bare = venvs
    a = Interpreter.options(runtime_env={"py_executable": bare}).remote()
    with pytest.raises(ActorDiedError, match="must be able to import rayless") as info:
        ray.get(a.prefix.remote(), timeout=60)
    assert "No module named 'rayless" in str(info.value)
    missing = str(tmp_path / "no-such-python")
    b = Interpreter.options(runtime_env={"py_executable": missing}).remote()
    with pytest.raises(ActorDiedError, match="not an executable file on this node"):
        ray.get(b.prefix.remote(), timeout=60)
    with pytest.raises(ValueError, match="py_executable"):
        Interpreter.options(runtime_env={"py_executable": 3}).remote()


@ray.remote
class Shipped:
    """Reads the code and data its runtime_env shipped; its own actors and tasks too."""

    def read(self) -> tuple[str, str]:
        import api_shipped_helper

        return api_shipped_helper.VALUE, open("notes.txt").read()

    def childs(self) -> tuple[tuple[str, str], str]:
        child = Shipped.remote()
        return ray.get(child.read.remote()), ray.get(shipped_value.remote())


@ray.remote
def shipped_value() -> str:
    import api_shipped_helper

    return api_shipped_helper.VALUE


def test_an_actors_own_working_dir_reaches_it_and_its_children(tmp_path: Any) -> None:
    # rayless also takes local paths per actor and task (Ray: only in ray.init's runtime_env)
    (tmp_path / "code").mkdir()
    (tmp_path / "code" / "api_shipped_helper.py").write_text("VALUE = 'v1'\n")
    (tmp_path / "code" / "notes.txt").write_text("hello")
    env = {"working_dir": str(tmp_path / "code")}
    a = Shipped.options(runtime_env=env).remote()
    assert ray.get(a.read.remote(), timeout=60) == ("v1", "hello")
    assert ray.get(a.childs.remote(), timeout=60) == (("v1", "hello"), "v1")
    assert ray.get(shipped_value.options(runtime_env=env).remote(), timeout=60) == "v1"
    # py_modules beside it: a single file
    (tmp_path / "mods").mkdir()
    (tmp_path / "mods" / "api_shipped_helper.py").write_text("VALUE = 'from py_modules'\n")
    mods = {"py_modules": [str(tmp_path / "mods" / "api_shipped_helper.py")]}
    assert ray.get(shipped_value.options(runtime_env=mods).remote(), timeout=60) == (
        "from py_modules"
    )
    bad = Shipped.options(runtime_env={"working_dir": str(tmp_path / "missing")}).remote()
    with pytest.raises(ValueError, match="is not a directory"):
        ray.get(bad.read.remote(), timeout=60)
    with pytest.raises(ValueError, match="remote URIs"):
        ray.get(shipped_value.options(runtime_env={"py_modules": ["s3://b/m.zip"]}).remote())
