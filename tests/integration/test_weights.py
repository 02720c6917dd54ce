"""Weight sync between real processes: versions, concurrency, dtypes, mismatches, kill -9."""

from __future__ import annotations

import asyncio
import os
import signal

import psutil
import pytest
import torch

from rayless.actors import ActorDiedError, Cluster
from rayless.transport import segments, shm
from rayless.transport.protocol import host_id
from rayless.weights import (
    PublisherLostError,
    WeightMismatchError,
    WeightSync,
    WeightTimeoutError,
    WeightVersionError,
)
from tests.chaos.scenarios import until
from tests.integration.weights_classes import DistMember, Publisher, Subscriber, state

pytestmark = [
    pytest.mark.integration,
    pytest.mark.timeout(180),
    pytest.mark.local_cluster(nodes=2, gpus_per_node=0),
]


def _segments_of(pid: int) -> list[str]:
    return [n for n in os.listdir(shm.SHM_DIR) if n.startswith(f"rayless-{pid}-")]


def _weight_segments() -> set[str]:
    """The weight-sync segments in /dev/shm made by this process or its descendants (other
    rayless segments have no such header; other test processes' are not ours to count)."""
    ours = {os.getpid(), *(p.pid for p in psutil.Process().children(recursive=True))}
    found = set()
    for name in os.listdir(shm.SHM_DIR):
        parts = name.split("-")
        if len(parts) < 3 or parts[0] != "rayless" or not parts[1].isdigit():
            continue
        if int(parts[1]) not in ours:
            continue
        try:
            with open(os.path.join(shm.SHM_DIR, name), "rb") as f:
                if f.read(8) == b"RLSEG001":
                    found.add(name)
        except OSError:
            pass
    return found


async def _subscribers(cluster: Cluster, name: str, dtypes: list[str]) -> list:
    nodes = [n["node_id"] for n in await cluster.nodes()]
    return [
        await cluster.spawn(Subscriber, name, d, node=nodes[i % len(nodes)], cpus=0)
        for i, d in enumerate(dtypes)
    ]


async def test_versions_and_dtype_conversion_bf16_to_fp16_and_fp32(local_cluster: Cluster) -> None:
    async with WeightSync.create(local_cluster, name="ws-versions") as ws:
        subs = await _subscribers(local_cluster, "ws-versions", ["float32", "float16"])
        assert await ws.latest_version() == -1
        await ws.publish(state(1, torch.bfloat16), version=1)
        for sub in subs:
            assert await sub.pull(1) == (1, [1.0])
        assert [await s.dtype() for s in subs] == ["torch.float32", "torch.float16"]
        with pytest.raises(WeightVersionError):
            await ws.publish(state(1), version=1)  # versions are monotonic
        await ws.publish(state(5), version=5)
        assert await ws.latest_version() == 5
        assert await subs[0].pull(2) == (5, [5.0])
        assert await subs[1].pull_sync(5) == 5  # the sync face


async def test_concurrent_publishes_and_pulls_never_see_a_torn_version(
    local_cluster: Cluster,
) -> None:
    last = 40
    async with WeightSync.create(local_cluster, name="ws-race", max_slots=2) as ws:
        subs = await _subscribers(local_cluster, "ws-race", ["float32", "float32"])
        follows = [asyncio.ensure_future(s.follow(last)) for s in subs]
        for v in range(1, last + 1):
            await ws.publish(state(v), version=v)
        for seen in await asyncio.gather(*follows):
            assert seen[-1][0] == last
            for version, values in seen:
                assert values == [float(version)], seen  # every tensor from one version
            assert [v for v, _ in seen] == sorted({v for v, _ in seen})  # monotonic


async def test_a_slow_subscriber_skips_to_the_newest_version(local_cluster: Cluster) -> None:
    async with WeightSync.create(local_cluster, name="ws-slow") as ws:
        (sub,) = await _subscribers(local_cluster, "ws-slow", ["float32"])
        for v in range(1, 6):
            await ws.publish(state(v), version=v)
        assert await sub.pull(1) == (5, [5.0])


async def test_mismatches_name_the_tensor_and_timeouts_are_typed(local_cluster: Cluster) -> None:
    async with WeightSync.create(local_cluster, name="ws-mismatch") as ws:
        await ws.publish(state(1), version=1)
        wrong = state(0)
        wrong["layer.weight"] = torch.zeros(32, 64)
        with pytest.raises(WeightMismatchError, match=r"layer\.weight") as info:
            await ws.pull(wrong, 1, timeout=10)
        assert info.value.tensor == "layer.weight"
        assert float(wrong["layer.bias"][0]) == 0.0  # nothing was copied
        missing = state(0)
        del missing["steps"]
        with pytest.raises(WeightMismatchError, match="steps"):
            await ws.pull(missing, 1, timeout=10)
        with pytest.raises(WeightTimeoutError):
            await ws.pull(state(0), 2, timeout=0.5)


async def test_the_cross_host_path_feeds_one_relay_per_node(local_cluster: Cluster) -> None:
    before = _weight_segments()
    async with WeightSync.create(local_cluster, name="ws-relay", per_node=True) as ws:
        subs = await _subscribers(local_cluster, "ws-relay", ["float32", "float16"])
        for v in (1, 2):
            await ws.publish(state(v, torch.bfloat16), version=v)
            for sub in subs:
                assert await sub.pull(v) == (v, [float(v)])
        made = _weight_segments() - before
        assert len(made) >= 3  # the publisher's and two relays'
    # the relays unlink theirs in teardown when the sync is closed

    def left() -> set[str]:
        return {n for n in made if os.path.exists(os.path.join(shm.SHM_DIR, n))}

    assert await until(lambda: not left(), 20), left()


async def test_a_publisher_killed_with_sigkill_fails_pulls_and_leaves_no_segment(
    local_cluster: Cluster,
) -> None:
    async with WeightSync.create(local_cluster, name="ws-kill-pub"):
        pub = await local_cluster.spawn(Publisher, "ws-kill-pub", cpus=0)
        (sub,) = await _subscribers(local_cluster, "ws-kill-pub", ["float32"])
        await pub.publish(1)
        pid = await pub.pid()
        assert _segments_of(pid)
        assert await sub.pull(1) == (1, [1.0])
        waiting = asyncio.ensure_future(sub.pull(2, None))  # no timeout: must not hang
        os.kill(pid, signal.SIGKILL)
        with pytest.raises(PublisherLostError):
            await asyncio.wait_for(waiting, 60)
        with pytest.raises(PublisherLostError):
            await sub.pull(1)
        assert await until(lambda: not _segments_of(pid), 30), _segments_of(pid)
        pub2 = await local_cluster.spawn(Publisher, "ws-kill-pub", cpus=0)  # a new trainer
        await pub2.publish(2)
        assert await sub.pull(2) == (2, [2.0])


async def test_a_version_begun_by_a_publisher_that_died_is_published_again(
    local_cluster: Cluster,
) -> None:
    async with WeightSync.create(local_cluster, name="ws-begun") as ws:
        pub = await local_cluster.spawn(Publisher, "ws-begun", cpus=0)
        (sub,) = await _subscribers(local_cluster, "ws-begun", ["float32"])
        await pub.publish(1)
        waiting = asyncio.ensure_future(sub.pull(2, None))
        with pytest.raises(ActorDiedError):
            await pub.die_mid_publish(2)
        with pytest.raises(PublisherLostError):
            await asyncio.wait_for(waiting, 60)
        assert await ws.latest_version() == 1  # 2 was begun, never announced
        pub2 = await local_cluster.spawn(Publisher, "ws-begun", cpus=0)  # the restarted trainer
        assert await pub2.publish(2) == 2
        assert await sub.pull(2) == (2, [2.0])
        # a version begun by a publisher that still runs is not another's to take
        registry = ws._registry
        await registry.begin(7, os.getpid(), host_id(), "elsewhere")
        with pytest.raises(WeightVersionError, match=r"began version 7 .* still running"):
            await pub2.publish(7)
        assert await pub2.publish(8) == 8


async def test_a_subscriber_killed_with_sigkill_blocks_nothing_and_close_cleans_up(
    local_cluster: Cluster,
) -> None:
    async with WeightSync.create(local_cluster, name="ws-kill-sub", max_slots=2) as ws:
        victim, other = await _subscribers(local_cluster, "ws-kill-sub", ["float32", "float32"])
        await ws.publish(state(1), version=1)
        assert await victim.pull(1) == (1, [1.0])
        os.kill(await victim.pid(), signal.SIGKILL)
        for v in range(2, 6):
            await ws.publish(state(v), version=v)
        assert await other.pull(5) == (5, [5.0])
        mine = segments.owned()
        assert mine and all(n in os.listdir(shm.SHM_DIR) for n in mine)
    assert not segments.owned()
    assert not [n for n in mine if n in os.listdir(shm.SHM_DIR)]
    assert not _segments_of(os.getpid())


async def test_buckets_broadcast_over_a_torch_distributed_group(local_cluster: Cluster) -> None:
    async with WeightSync.create(local_cluster, name="ws-dist", bucket_bytes=4096) as ws:
        members = await local_cluster.spawn_group(
            DistMember, 3, "ws-dist", torch_distributed=True, cpus=0
        )
        assert sorted(await asyncio.gather(*(m.init() for m in members))) == [0, 1, 2]
        pub, subs = members[0], members[1:]
        for v in (1, 2):
            results = await asyncio.gather(pub.publish(v), *(s.pull(v) for s in subs))
            assert results == [v, (v, [float(v)]), (v, [float(v)])]
        assert await ws.latest_version() == 2


async def test_a_publisher_that_closes_its_client_fails_pulls(local_cluster: Cluster) -> None:
    async with WeightSync.create(local_cluster, name="ws-retire"):
        pub = await local_cluster.spawn(Publisher, "ws-retire", cpus=0)
        (sub,) = await _subscribers(local_cluster, "ws-retire", ["float32"])
        await pub.publish(1)
        pid = await pub.pid()
        waiting = asyncio.ensure_future(sub.pull(2, None))
        await local_cluster.kill(pub)  # SIGTERM: its teardown closes the client
        with pytest.raises(PublisherLostError, match="closed its client"):
            await asyncio.wait_for(waiting, 60)
        assert await until(lambda: not _segments_of(pid), 20)


@pytest.mark.parametrize("per_node", [False, True])
async def test_every_rank_publishes_its_shard_and_pulls_see_whole_versions(
    local_cluster: Cluster, per_node: bool
) -> None:
    name = f"ws-shards-{int(per_node)}"
    nodes = [n["node_id"] for n in await local_cluster.nodes()]
    async with WeightSync.create(local_cluster, name=name, per_node=per_node) as ws:
        ranks = [
            await local_cluster.spawn(Publisher, name, node=nodes[i], cpus=0) for i in range(2)
        ]
        keys = [["layer.weight", "layer.bias"], ["head.weight", "steps"]]
        subs = await _subscribers(local_cluster, name, ["float32", "float16"])
        for v in (1, 2):
            pulls = [asyncio.ensure_future(s.pull(v)) for s in subs]  # wait for both shards
            await ranks[0].publish(v, keys[0], 0, 2)
            latest = await ws.latest_version()
            assert latest < v  # shard 1 has not published v yet
            await ranks[1].publish(v, keys[1], 1, 2)
            got = await asyncio.gather(*pulls)
            assert got == [(v, [float(v)])] * 2, got
        with pytest.raises(WeightVersionError):
            await ranks[0].publish(2, keys[0], 0, 2)  # this shard already published 2


async def test_the_blocking_face_publishes_shards(local_cluster: Cluster) -> None:
    """SyncWeightSync.publish takes publish's shard arguments (docs/weights.md)."""
    name = "ws-sync-shards"
    async with WeightSync.create(local_cluster, name=name) as ws:
        ranks = [await local_cluster.spawn(Publisher, name, cpus=0) for _ in range(2)]
        keys = [["layer.weight", "layer.bias"], ["head.weight", "steps"]]
        (sub,) = await _subscribers(local_cluster, name, ["float32"])
        pull = asyncio.ensure_future(sub.pull(1))
        assert await ranks[0].publish_sync(1, keys[0], 0, 2) == 1
        assert await ws.latest_version() < 1  # shard 1 has not published yet
        assert await ranks[1].publish_sync(1, keys[1], 1, 2) == 1
        assert await pull == (1, [1.0])
