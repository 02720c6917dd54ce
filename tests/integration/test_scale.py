"""The scale harness's 100-node step, and the head's per-event work at size.

The first test is the CI run of ``scripts/bench_scale.py``'s 100-node step: a real head
process, 100 simulated nodes (``rayless.actors.testing_scale``) in two processes, actors on
them; it checks correctness only (every actor answers, a silent node is declared dead and
its callers fail with ActorDiedError), never timing. The others run a head in this process,
so they can watch what its handlers touch: an actor's death, a kill and the end of a session
must not walk every actor of the cluster, nor an event every connection.
"""

from __future__ import annotations

import asyncio
import os
import tempfile
from collections.abc import AsyncIterator
from typing import Any

import pytest

from rayless import actors
from rayless.actors.api.runtime import get_runtime
from rayless.actors.control.head import Head
from rayless.actors.control.head_state import ActorRecord
from rayless.actors.errors import ActorDiedError, ActorNotFoundError
from rayless.actors.protocol.messages import ListActors, Summarize
from rayless.actors.testing_scale import Pinger, SimAgent, SimCluster, close_agents, start_agents
from rayless.transport.errors import ProtocolError
from rayless.transport.protocol import Kind, open_envelope
from rayless.transport.server import Server
from tests.waiting import wait_until

pytestmark = [pytest.mark.slow, pytest.mark.integration]


@pytest.mark.timeout(300)
async def test_the_100_node_step_reaches_every_actor_and_fails_a_lost_nodes_callers() -> None:
    sim = SimCluster(100, gpus=8, node_timeout=5.0, per_process=50)
    try:
        await asyncio.to_thread(sim.start_head)
        await asyncio.to_thread(sim.start_nodes)
        async with actors.connect(sim.address, token=sim.token) as cluster:
            nodes = await cluster.nodes()
            assert len(nodes) == 100 and all(n["alive"] and n["gpus_total"] == 8 for n in nodes)
            gate = asyncio.Semaphore(64)

            async def spawn(i: int) -> Any:
                async with gate:
                    return await cluster.spawn(Pinger, f"t{i}", name=f"p-{i}", gpus=0.5)

            handles = await asyncio.gather(*(spawn(i) for i in range(300)))
            assert len({h.node_id for h in handles}) == 100  # spread over every node
            answers = await asyncio.gather(*(h.ping(i) for i, h in enumerate(handles)))
            assert answers == list(range(300))
            found = await cluster.get_actor("p-123")
            assert found.actor_id == handles[123].actor_id and await found.ping("x") == "x"

            victim = handles[0].node_id
            on_it = [h for h in handles if h.node_id == victim]
            await asyncio.to_thread(sim.freeze, victim)
            results = await asyncio.wait_for(
                asyncio.gather(*(h.hold(3600.0) for h in on_it), return_exceptions=True), 60
            )
            assert all(isinstance(r, ActorDiedError) for r in results), results
            listed = {n["node_id"]: n for n in await cluster.nodes()}
            assert not listed[victim]["alive"] and listed[victim]["actors"] == []
            with pytest.raises(ActorNotFoundError):
                await cluster.get_actor(on_it[0].name)
            others = [h for h in handles if h.node_id != victim]
            assert await asyncio.gather(*(h.ping(1) for h in others[:50])) == [1] * 50
        procs = [p for _, p in sim.sims] + ([sim.head] if sim.head is not None else [])
        tmpdir = sim.tmpdir
    finally:
        await asyncio.to_thread(sim.stop)
    # nothing left behind: every process exited, the agents' directory is gone
    assert all(p.poll() is not None for p in procs) and not os.path.exists(tmpdir)


@pytest.mark.timeout(400)
def test_a_head_holds_more_agents_than_zeromqs_default_socket_count() -> None:
    # Over ZeroMQ (RAYLESS_UNIX=0: as between hosts) the head holds a socket per agent; the
    # default context allows 1,023, and the 1,024th node could not join.
    # a long node_timeout: this test is about joining, never about a loaded machine's beats
    sim = SimCluster(1100, gpus=0, node_timeout=30.0, per_process=550, env={"RAYLESS_UNIX": "0"})
    with sim:
        sim.start_head()
        sim.start_nodes(timeout=300)

        async def listed() -> int:
            async with actors.connect(sim.address, token=sim.token) as cluster:
                return sum(1 for n in await cluster.nodes() if n["alive"])

        assert asyncio.run(listed()) == 1100


class _NoScan(dict[str, Any]):
    """The head's actor table, refusing to be walked whole (``get`` and item access work)."""

    def values(self) -> Any:
        raise AssertionError("the head walked every actor")

    def items(self) -> Any:
        raise AssertionError("the head walked every actor")


@pytest.fixture(params=[5.0])
async def head_with_agents(
    request: pytest.FixtureRequest,
) -> AsyncIterator[tuple[Head, list[SimAgent]]]:
    timeout = float(request.param)
    async with Head("s" * 32, node_timeout=timeout) as head:
        with tempfile.TemporaryDirectory() as log_dir:
            agents = await start_agents(
                head.address,
                "s" * 32,
                [f"n-{i}" for i in range(8)],
                gpus=4,
                head_timeout=timeout,
                log_dir=log_dir,
            )
            try:
                yield head, agents
            finally:
                await close_agents(agents)


async def test_deaths_kills_and_session_ends_do_not_walk_every_actor(
    head_with_agents: tuple[Head, list[SimAgent]], monkeypatch: pytest.MonkeyPatch
) -> None:
    head, _ = head_with_agents
    async with actors.connect(head.address, token="s" * 32) as cluster:
        handles = await asyncio.gather(*(cluster.spawn(Pinger, gpus=0.25) for _ in range(40)))
        head.state.actors = _NoScan(head.state.actors)

        def walked(self: Server) -> Any:
            raise AssertionError("an event walked every connection of the head")

        monkeypatch.setattr(Server, "peers", property(walked))
        assert await cluster.kill(handles[0])  # a death: its owned actors, an event
        with pytest.raises(ActorDiedError):
            await handles[0].ping(1)
    # the end of the session killed the other 39 without a walk of the table
    await wait_until(
        lambda: all(head.state.actors[h.actor_id].state == "dead" for h in handles),
        timeout=30,
        what="every actor of the ended session dead",
    )


async def test_status_pages_the_actors_without_building_every_record(
    head_with_agents: tuple[Head, list[SimAgent]], monkeypatch: pytest.MonkeyPatch
) -> None:
    head, _ = head_with_agents
    async with actors.connect(head.address, token="s" * 32) as cluster:
        handles = await asyncio.gather(*(cluster.spawn(Pinger, gpus=0.25) for _ in range(40)))
        built: list[str] = []
        public = ActorRecord.public

        def counted(self: ActorRecord) -> Any:
            built.append(self.actor_id)
            return public(self)

        monkeypatch.setattr(ActorRecord, "public", counted)
        head.state.actors = _NoScan(head.state.actors)
        nodes = await cluster.nodes(actors=False)
        assert sum(n["num_actors"] for n in nodes) == 40 and all("actors" not in n for n in nodes)
        assert built == []
        page = await cluster.list_actors(limit=5)
        assert (page.total, len(page.actors), len(built)) == (40, 5, 5)
        seen = [a.actor_id for a in page.actors]
        while len(seen) < page.total:  # the pages cover every actor once
            page = await cluster.list_actors(limit=7, offset=len(seen))
            assert page.actors, "an empty page before the end"
            seen += [a.actor_id for a in page.actors]
        assert sorted(seen) == sorted(h.actor_id for h in handles)
        with pytest.raises(ValueError):
            await cluster.list_actors(limit=-1)
        runtime = await get_runtime()
        with pytest.raises(ProtocolError, match="offset and limit"):  # a peer's bad page
            await runtime.head_request(ListActors(limit=2, offset=-3))
        summary = await cluster.summary(limit=3)  # what `rayless status` asks
        assert (summary.nodes, summary.nodes_alive, summary.actors) == (8, 8, 40)
        free = sum(n["gpus_free"] for n in nodes)
        assert (summary.gpus, summary.gpus_free, len(summary.node_page)) == (32, free, 3)
        assert len(summary.actor_page) == 3 and all(n.actors is None for n in summary.node_page)
        assert len(built) == 40 + 3  # the pages built each record once, the summary 3
        with pytest.raises(ProtocolError, match="limit"):
            await runtime.head_request(Summarize(limit=-1))
        assert len(await cluster.nodes()) == 8  # the head still serves


class _Refuses:
    """An actor whose constructor raises."""

    def __init__(self) -> None:
        raise ValueError("refused to start")

    async def ping(self) -> None:
        """Never reached."""


async def test_a_simulated_actor_that_cannot_start_fails_its_spawn_with_its_error(
    head_with_agents: tuple[Head, list[SimAgent]],
) -> None:
    # the simulated actor tells its agent Failed through the agent's own table, as a process
    head, agents = head_with_agents
    async with actors.connect(head.address, token="s" * 32) as cluster:
        with pytest.raises(ValueError, match="refused to start"):
            await asyncio.wait_for(cluster.spawn(_Refuses, name="refuses"), 60)
        assert await (await cluster.spawn(Pinger, gpus=0.25)).ping(7) == 7
    await wait_until(
        lambda: all(not a.procs and not a.sim.actors for a in agents),
        timeout=30,
        what="no actor left on any simulated node",
    )


@pytest.mark.parametrize("head_with_agents", [1.0], indirect=True)
async def test_an_idle_node_costs_the_head_one_message_per_heartbeat(
    head_with_agents: tuple[Head, list[SimAgent]],
) -> None:
    head, _ = head_with_agents
    seen = {"all": 0, "ping": 0, "hello": 0}
    real = head.server._on_message

    def counting(rid: bytes, fd: int, link: object, msg: Any, now: float) -> None:
        seen["all"] += 1
        kind = open_envelope(msg, 1)[0]
        if kind is Kind.PING:
            seen["ping"] += 1
        elif kind is Kind.HELLO:
            seen["hello"] += 1
        real(rid, fd, link, msg, now)

    head.server._on_message = counting  # type: ignore[method-assign]
    try:
        # 8 nodes beating every 0.2 s: 200 messages are a few seconds of idle
        await wait_until(lambda: seen["all"] >= 200, timeout=60, what="200 messages at the head")
    finally:
        head.server._on_message = real  # type: ignore[method-assign]
    # the beat's reply keeps each agent's session: its own pings would double the head's work
    assert seen["ping"] * 3 <= seen["all"], seen
    # and the replies are what each agent hears of the head: no session went silent and
    # rejoined (a one-way beat, never answered, would break it every head_timeout)
    assert seen["hello"] == 0, seen
