"""The actor API on a real local cluster: spawn, calls, errors, handles, resources, logs."""

from __future__ import annotations

import asyncio
import os
import signal
import sys

import pytest
import torch

import rayless.actors as actors
from rayless.actors import ActorDiedError, Cluster, PlacementError, RemoteError
from rayless.actors.api.runtime import get_runtime
from rayless.actors.launch.local import LocalProcesses
from rayless.actors.protocol.messages import (
    AgentStatus,
    Bootstrap,
    Kill,
    LookupActor,
    Spawn,
    SpawnSpec,
)
from rayless.errors import ActorNotFoundError, ConnectError, NameTakenError, ProtocolError
from rayless.transport.client import Client
from rayless.transport.errors import ClosedError
from rayless.transport.shm import pid_alive
from tests.integration.actor_classes import (
    BadSetup,
    Concurrency,
    Counter,
    Printer,
    Relay,
    Shapeshifter,
)
from tests.waiting import wait_until

pytestmark = pytest.mark.integration


async def test_spawn_and_call_sync_and_async_methods(local_cluster: Cluster) -> None:
    counter = await local_cluster.spawn(Counter, 5, step=2)
    assert await counter.add() == 7
    assert await counter.add(3) == 10
    assert await counter.aadd(5) == 15
    assert await counter.get_setups() == 1
    assert await counter.pid() != os.getpid()


async def test_submit_wait_and_gather(local_cluster: Cluster) -> None:
    counter = await local_cluster.spawn(Counter)
    futures = [counter.aadd.submit(1) for _ in range(50)]
    assert sorted(await actors.gather(*futures)) == list(range(1, 51))
    slow, fast = counter.sleep.remote(5), counter.sleep.remote(0)
    done, pending = await actors.wait([slow, fast], num_returns=1, timeout=10)
    assert done == [fast] and pending == [slow]
    slow.cancel()
    with pytest.raises(ValueError, match="num_returns"):
        await actors.wait([fast], num_returns=2)


async def test_wait_returns_at_most_num_returns_in_the_order_given(
    local_cluster: Cluster,
) -> None:
    """As ``ray.wait``: ready holds exactly ``num_returns`` when that many are done (it held
    every finished future: 4 of 4 for ``num_returns=1``)."""
    counter = await local_cluster.spawn(Counter)
    futs = [counter.aadd.submit(1) for _ in range(4)]
    await actors.gather(futs)
    assert await actors.wait(futs, num_returns=1) == ([futs[0]], futs[1:])
    assert await actors.wait(futs, num_returns=3, timeout=10) == (futs[:3], futs[3:])
    slow = counter.sleep.remote(30)
    mixed = [slow, *futs[2:]]
    assert await actors.wait(mixed, num_returns=1, timeout=10) == ([futs[2]], [slow, futs[3]])
    ready, rest = await actors.wait(mixed, num_returns=3, timeout=0.2)  # at the timeout
    assert ready == futs[2:] and rest == [slow]
    slow.cancel()


async def test_tensors_travel_both_ways(local_cluster: Cluster) -> None:
    counter = await local_cluster.spawn(Counter)
    big = torch.ones(4 * 2**20)
    assert await counter.tensor_sum(big) == float(big.numel())
    out = await counter.make_tensor(1000)
    assert torch.equal(out, torch.arange(1000, dtype=torch.float32))


async def test_remote_exceptions_keep_type_message_traceback_and_actor(
    local_cluster: Cluster,
) -> None:
    counter = await local_cluster.spawn(Counter, name="thrower")
    with pytest.raises(ValueError, match="bad input") as info:
        await counter.fail("bad input")
    err = info.value
    assert isinstance(err, RemoteError)
    assert err.remote_type == "builtins.ValueError"
    assert err.actor == "thrower"
    assert "raise ValueError(message)" in err.remote_traceback
    with pytest.raises(KeyError):
        await counter.fail_key()
    assert await counter.add(1) == 1  # the actor survived


async def test_only_public_methods_are_callable(local_cluster: Cluster) -> None:
    counter = await local_cluster.spawn(Counter)
    with pytest.raises(AttributeError, match="no public method '_private'"):
        await counter._private()
    with pytest.raises(AttributeError, match="no public method 'nope'"):
        await counter.nope()
    with pytest.raises(AttributeError, match="no public method 'setup'"):
        await counter.setup()


async def test_constructor_or_setup_failure_fails_spawn(local_cluster: Cluster) -> None:
    with pytest.raises(RuntimeError, match="setup exploded"):
        await local_cluster.spawn(BadSetup)
    with pytest.raises(TypeError, match="unexpected keyword"):
        await local_cluster.spawn(Counter, bogus=1)
    nodes = await local_cluster.nodes()
    assert all(g["free"] == 1.0 for n in nodes for g in n["gpus"])


async def test_handles_travel_between_actors(local_cluster: Cluster) -> None:
    counter = await local_cluster.spawn(Counter)
    relay = await local_cluster.spawn(Relay, counter)
    assert await relay.forward(2) == 2
    assert await relay.forward_sync(3) == 5  # a sync method calling through the home loop
    other = await local_cluster.spawn(Counter, 100)
    assert await relay.via(other, 1) == 101
    returned = await relay.me(other)
    assert returned == other and await returned.add(1) == 102


async def test_names_are_unique_and_looked_up(local_cluster: Cluster) -> None:
    counter = await local_cluster.spawn(Counter, 7, name="the-counter")
    again = await local_cluster.get_actor("the-counter")
    assert again == counter and await again.add(0) == 7
    with pytest.raises(NameTakenError, match="already exists") as taken:
        await local_cluster.spawn(Counter, name="the-counter")
    assert isinstance(taken.value, ValueError)  # as in Ray
    with pytest.raises(ActorNotFoundError, match="no live actor") as missing:
        await local_cluster.get_actor("nobody")
    assert type(missing.value) is ActorNotFoundError and isinstance(missing.value, ValueError)


async def test_head_and_agent_errors_arrive_typed(local_cluster: Cluster) -> None:
    runtime = await get_runtime()
    with pytest.raises(ActorNotFoundError, match="unknown actor"):
        await runtime.head_request(LookupActor("no-such-id"))
    # a message of the control plane that the head does not answer
    with pytest.raises(ProtocolError, match=r"unknown head request ctl\.Bootstrap"):
        await runtime.head_request(Bootstrap("x"))
    # not a message at all (the untyped form of before), and a message with a field of the
    # wrong type (refused as it is decoded, before any handler runs)
    with pytest.raises(ProtocolError, match="malformed head request"):
        await runtime.head_request(("actor_info", "no-such-id"))  # type: ignore[arg-type]
    with pytest.raises(ProtocolError, match=r"malformed ctl\.LookupActor message: actor_id"):
        await runtime.head_request(LookupActor(7))  # type: ignore[arg-type]
    assert await runtime.head_request(Kill("no-such-id")) is False  # the head still serves
    counter = await local_cluster.spawn(Counter)
    address = (await counter.env("RAYLESS_AGENT_ADDRESS"))["RAYLESS_AGENT_ADDRESS"]
    assert address
    async with Client(address, token=local_cluster.token, name="test") as agent:
        with pytest.raises(ActorNotFoundError, match="unknown actor"):
            await agent.request(Bootstrap("no-such-id"), timeout=10)
        with pytest.raises(ProtocolError, match="malformed agent request"):
            await agent.request("not a tuple", timeout=10)
        with pytest.raises(ProtocolError, match=r"unknown agent request ctl\.Spawn"):
            await agent.request(Spawn(SpawnSpec(("m", "C", None), "C", (), "x")), timeout=10)
        status = await agent.request(AgentStatus(), timeout=10)
        assert {a["name"]: a["state"] for a in status["actors"]}[counter.name] == "alive"


async def test_connect_without_an_address_is_a_connect_error(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    for var in ("RAYLESS_ADDRESS", "RAYLESS_TOKEN", "RAYLESS_TOKEN_FILE"):
        monkeypatch.delenv(var, raising=False)
    with pytest.raises(ConnectError, match="needs an address"):
        await actors.connect(token="x" * 32)


async def test_gpus_and_placement(local_cluster: Cluster) -> None:
    env = ("CUDA_VISIBLE_DEVICES", "RAYLESS_NODE_ID", "RAYLESS_ACTOR_NAME", "MY_VAR")
    whole = await local_cluster.spawn(Counter, gpus=2, node="node-1", env={"MY_VAR": "x"})
    seen = await whole.env(*env)
    assert seen["CUDA_VISIBLE_DEVICES"] == "0,1" and seen["RAYLESS_NODE_ID"] == "node-1"
    assert seen["MY_VAR"] == "x" and seen["RAYLESS_ACTOR_NAME"] == whole.name
    halves = [await local_cluster.spawn(Counter, gpus=0.5, node="node-0") for _ in range(2)]
    devices = [(await h.env("CUDA_VISIBLE_DEVICES"))["CUDA_VISIBLE_DEVICES"] for h in halves]
    assert devices[0] == devices[1]  # packed onto one GPU
    with pytest.raises(PlacementError, match="no node can ever hold"):
        await local_cluster.spawn(Counter, gpus=3)
    with pytest.raises(PlacementError, match="not enough free GPUs"):
        await local_cluster.spawn(Counter, gpus=2, node="node-1")
    with pytest.raises(PlacementError, match="only possible below one GPU"):
        await local_cluster.spawn(Counter, gpus=1.5)
    with pytest.raises(ValueError):
        await local_cluster.spawn(Counter, gpus=-1)
    nodes = {n["node_id"]: n for n in await local_cluster.nodes()}
    assert nodes["node-1"]["gpus_free"] == 0
    assert {a["name"] for a in nodes["node-0"]["actors"]} == {h.name for h in halves}
    await local_cluster.kill(whole)
    nodes = {n["node_id"]: n for n in await local_cluster.nodes()}
    assert nodes["node-1"]["gpus_free"] == 2


async def test_sync_methods_run_one_at_a_time_async_ones_concurrently(
    local_cluster: Cluster,
) -> None:
    actor = await local_cluster.spawn(Concurrency)
    threads = await asyncio.gather(*[actor.sync_work(0.05) for _ in range(4)])
    assert await actor.get_peak() == 1 and len(set(threads)) == 1
    await actor.reset()
    await asyncio.gather(*[actor.async_work(0.2) for _ in range(8)])
    assert await actor.get_peak() == 8
    limited = await local_cluster.spawn(Concurrency, max_concurrency=2)
    await asyncio.gather(*[limited.async_work(0.1) for _ in range(6)])
    assert await limited.get_peak() == 2


async def test_sync_method_does_not_block_the_actor(local_cluster: Cluster) -> None:
    counter = await local_cluster.spawn(Counter)
    blocked = counter.block.submit(1.0)
    await asyncio.sleep(0.1)
    assert await asyncio.wait_for(counter.sleep(0), 0.8) == "slept"  # the loop still serves
    assert await blocked == "blocked"


async def test_kill_fails_later_calls(local_cluster: Cluster) -> None:
    counter = await local_cluster.spawn(Counter)
    pending = counter.sleep.submit(30)
    await asyncio.sleep(0.1)
    assert await local_cluster.kill(counter) is True
    with pytest.raises(ActorDiedError, match="killed by request"):
        await pending
    with pytest.raises(ActorDiedError):
        await counter.add(1)
    assert await local_cluster.kill(counter) is False


@pytest.mark.local_cluster(nodes=1, gpus_per_node=0, isolated=True)
async def test_a_call_that_finds_its_actor_just_dead_reports_the_death(
    local_cluster: Cluster, local_cluster_processes: LocalProcesses
) -> None:
    # The first call of a handle opens its connection as the actor dies (killed meanwhile,
    # under load): the head does not list the death yet. Before, the call failed at once with
    # "unreachable (...; the head still lists it as alive)"; it now waits for the death.
    counter = await local_cluster.spawn(Counter)
    runtime = await get_runtime()
    view = await runtime.head_request(LookupActor(counter.actor_id))
    agent = local_cluster_processes.agents[0]
    assert agent.pid is not None and view.pid is not None
    os.kill(agent.pid, signal.SIGSTOP)  # the death cannot reach the head meanwhile
    try:
        os.kill(view.pid, signal.SIGSTOP)  # the kernel accepts the connection; no handshake
        call = asyncio.ensure_future(counter.add(1))
        await asyncio.sleep(0.5)
        os.kill(view.pid, signal.SIGKILL)  # the connection is lost during the handshake
        await wait_until(lambda: not pid_alive(view.pid), timeout=30, what="the actor's end")
        await asyncio.sleep(1.0)  # (before: the call failed here)
    finally:
        os.kill(agent.pid, signal.SIGCONT)
    with pytest.raises(ActorDiedError) as died:
        await call
    assert "still lists it as alive" not in str(died.value)
    assert "SIGKILL" in str(died.value) or "signal 9" in str(died.value), str(died.value)


async def test_actor_output_reaches_the_driver_and_a_log_file(
    local_cluster: Cluster, capsys: pytest.CaptureFixture[str]
) -> None:
    printer = await local_cluster.spawn(Printer, name="talker")
    await printer.say("hello from the actor")
    err = ""

    def printed() -> bool:
        nonlocal err
        err += capsys.readouterr().err
        return "hello from the actor" in err

    await wait_until(
        printed, timeout=5, what="the actor's line on the driver's stderr", interval=0.1
    )
    assert "(talker pid=" in err and "hello from the actor" in err


async def test_unencodable_argument_names_its_path(local_cluster: Cluster) -> None:
    counter = await local_cluster.spawn(Counter)
    with pytest.raises(TypeError, match=r"cannot encode range"):
        await counter.add(range(2))
    with pytest.raises(TypeError, match=r"^keyword argument 'x': cannot encode range \(calling"):
        await local_cluster.spawn(Counter, x=range(1))  # in the caller's terms, not init[1]['x']


def test_classes_from_a_driver_script_main(tmp_path: object) -> None:
    """A class defined in the driver's __main__ is spawnable: it travels by value, and the
    actor never re-imports the driver's script (before: it ran it as __mp_main__)."""
    import subprocess
    from pathlib import Path

    script = Path(str(tmp_path)) / "driver.py"
    script.write_text(
        "import asyncio\n"
        "from rayless import actors\n"
        "class Greeter(actors.Actor):\n"
        "    def hello(self, who):\n"
        "        return f'hello {who} from {__name__}'\n"
        "async def main():\n"
        "    async with actors.Cluster.local(nodes=1) as cluster:\n"
        "        g = await cluster.spawn(Greeter)\n"
        "        print(await g.hello('driver'))\n"
        "if __name__ == '__main__':\n"
        "    asyncio.run(main())\n"
    )
    out = subprocess.run(
        [sys.executable, str(script)],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=str(tmp_path),
    )
    assert out.returncode == 0, out.stderr
    assert "hello driver from __main__" in out.stdout


async def test_torch_threads_follow_the_cpu_share(local_cluster: Cluster) -> None:
    from tests.integration.actor_classes import Threads

    default = await local_cluster.spawn(Threads)  # cpus=1
    assert (await default.on_loop(), await default.in_worker()) == (1, 1)
    two = await local_cluster.spawn(Threads, cpus=2)
    assert (await two.on_loop(), await two.in_worker()) == (2, 2)
    forced = await local_cluster.spawn(Threads, env={"OMP_NUM_THREADS": "2"})
    assert (await forced.on_loop(), await forced.in_worker()) == (2, 2)


async def test_handles_are_strict_with_the_methods_the_actor_reported(
    local_cluster: Cluster,
) -> None:
    counter = await local_cluster.spawn(Counter)
    with pytest.raises(AttributeError, match=r"\(Counter\) has no public method 'typo'.*aadd"):
        counter.typo  # noqa: B018
    assert {"add", "aadd", "sleep"} <= set(dir(counter)) and "setup" not in dir(counter)
    shifty = await local_cluster.spawn(Shapeshifter)  # the actor process's view of the class
    assert {n: i.is_async for n, i in (shifty.methods or {}).items()} == {
        "everywhere": False,
        "only_in_the_actor": False,
    }
    assert await shifty.only_in_the_actor() == "there"
    looked_up = await local_cluster.get_actor(shifty.name)
    assert looked_up.methods == shifty.methods
    relay = await local_cluster.spawn(Relay, counter)  # the list travels inside the handle
    seen = await relay.target_methods()
    assert {"add", "aadd"} <= set(seen) and "no public method 'typo'" in seen[-1]


async def test_call_on_an_actors_own_loop_raises_instead_of_deadlocking(
    local_cluster: Cluster,
) -> None:
    counter = await local_cluster.spawn(Counter)
    relay = await local_cluster.spawn(Relay, counter)
    with pytest.raises(RuntimeError, match="running event loop"):
        await relay.call_blocking(1)
    assert await relay.forward_sync(2) == 2  # from a sync method's thread it works


async def test_remote_from_a_plain_thread_returns_a_concurrent_future(
    local_cluster: Cluster,
) -> None:
    counter = await local_cluster.spawn(Counter)

    def threaded() -> list[int]:
        futures = [counter.aadd.remote(1) for _ in range(3)]
        return sorted(f.result(30) for f in futures)

    assert await asyncio.to_thread(threaded) == [1, 2, 3]


async def test_await_local_and_close_twice() -> None:
    cluster = await Cluster.local(nodes=1, zygote=False)
    try:
        counter = await cluster.spawn(Counter, 1)
        assert await counter.add(1) == 2
    finally:
        await cluster.aclose()
    await cluster.aclose()  # idempotent
    with pytest.raises(ClosedError):
        await cluster.nodes()
    with pytest.raises(ClosedError):
        await cluster.spawn(Counter)


def test_connect_awaited_and_as_a_context_manager(
    local_cluster_processes: LocalProcesses, tmp_path: object
) -> None:
    import subprocess
    from pathlib import Path

    script = Path(str(tmp_path)) / "joiner.py"
    script.write_text(
        "import asyncio\n"
        "from rayless import actors\n"
        "from tests.integration.actor_classes import Counter\n"
        "async def main():\n"
        "    async with actors.connect() as cluster:\n"
        "        c = await cluster.spawn(Counter, 1)\n"
        "        print(await c.add(1))\n"
        "    cluster = await actors.connect()\n"
        "    print(len(await cluster.nodes()))\n"
        "    await cluster.aclose()\n"
        "    await cluster.aclose()\n"
        "asyncio.run(main())\n"
    )
    env = {
        **os.environ,
        "RAYLESS_ADDRESS": local_cluster_processes.address,
        "RAYLESS_TOKEN": local_cluster_processes.token,
        "PYTHONPATH": os.getcwd(),
    }
    out = subprocess.run(
        [sys.executable, str(script)], env=env, capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["2", str(len(local_cluster_processes.agents))]
