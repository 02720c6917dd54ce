"""Cancelling calls and timeouts on a real local cluster, as a Ray user expects them.

Each test is one defect a Ray user hit, with what Ray does: cancelling a call leaves the
futures passed to it alone; a method's own TimeoutError arrives as itself, not as the caller's
timeout; a future nested in a list says that only top-level ones are awaited.
"""

from __future__ import annotations

import asyncio

import pytest

import rayless.actors as actors
from rayless.actors import Cluster
from rayless.actors.launch.local import LocalProcesses
from rayless.errors import RemoteError, Timeout
from tests.integration.habits_classes import Adder, Joiner, Reward, Shadowing

pytestmark = pytest.mark.integration


async def test_cancelling_a_call_leaves_the_future_passed_to_it_alone(
    local_cluster: Cluster,
) -> None:
    a = await local_cluster.spawn(Reward)
    b = await local_cluster.spawn(Reward)
    up = a.slow_gen(5, 1.0)
    d1 = b.total(up)
    d2 = b.total(up, scale=10)
    await asyncio.sleep(0.1)  # both wait for ``up`` now
    d1.cancel()
    assert await asyncio.wait_for(up, 30) == [0, 1, 2, 3, 4]  # Ray: ray.get(up) == [0..4]
    assert await asyncio.wait_for(d2, 30) == 100
    with pytest.raises(asyncio.CancelledError):
        await d1


async def test_a_methods_own_timeout_error_arrives_as_itself(local_cluster: Cluster) -> None:
    h = await local_cluster.spawn(Reward)
    for call in (h.ask_server, h.ask_server_sync):
        with pytest.raises(TimeoutError, match="HTTP reward server did not answer 1") as err:
            await actors.gather(call("1"), call("2"))
        assert isinstance(err.value, RemoteError) and not isinstance(err.value, Timeout)
        assert "None" not in str(err.value)
        with pytest.raises(TimeoutError, match="did not answer 3") as err:
            await actors.gather([call("3")], timeout=30)  # a timeout that did not pass
        assert not isinstance(err.value, Timeout)


def test_a_methods_own_timeout_error_arrives_as_itself_in_the_sync_face(
    local_cluster_processes: LocalProcesses,
) -> None:
    procs = local_cluster_processes
    with actors.Cluster.connect_sync(procs.address, token=procs.token) as cluster:
        h = cluster.spawn(Reward)
        with pytest.raises(TimeoutError, match="did not answer 1") as err:
            h.ask_server.call("1")
        assert not isinstance(err.value, Timeout) and "None" not in str(err.value)
        with pytest.raises(TimeoutError, match="did not answer 2") as err:
            cluster.get([h.ask_server.remote("2"), h.slow_gen.remote(2, 0.0)])
        assert not isinstance(err.value, Timeout) and "None" not in str(err.value)
        with pytest.raises(TimeoutError, match="did not answer 3"):
            cluster.get(h.ask_server_sync.remote("3"), timeout=30)


async def test_a_future_nested_in_an_argument_says_only_top_level_ones_are_awaited(
    local_cluster: Cluster,
) -> None:
    h = await local_cluster.spawn(Reward)
    up = h.slow_gen(3, 0.0)
    with pytest.raises(
        TypeError, match=r"argument 0 \['x'\]: cannot encode (Future|Task) \(a future"
    ):
        await h.total({"x": up})
    assert await h.total(up) == 3  # top level: awaited, as Ray resolves an ObjectRef


async def test_a_class_whose_method_the_handle_would_shadow_is_refused(
    local_cluster: Cluster,
) -> None:
    with pytest.raises(TypeError, match=r"defines 'address', a name of the actor handle"):
        await local_cluster.spawn(Shadowing)


async def test_spawn_refuses_an_empty_name_and_names_a_bad_argument_as_the_caller_wrote_it(
    local_cluster: Cluster,
) -> None:
    for bad in ("", "  "):
        with pytest.raises(ValueError, match="non-empty string"):  # Ray: ValueError
            await local_cluster.spawn(Reward, name=bad)
    with pytest.raises(TypeError, match=r"^argument 0 \['a'\]: cannot encode range \(calling Add"):
        await local_cluster.spawn(Adder, {"a": range(1)})


async def test_an_actor_can_join_its_cluster_again_after_closing_a_joined_handle(
    local_cluster: Cluster,
) -> None:
    h = await local_cluster.spawn(Joiner)
    assert await h.join_twice() >= 1  # a joined handle owns no session and leaves it alone
    assert await h.join_twice() >= 1
