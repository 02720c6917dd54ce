"""Delta publishing and verified pulls between real processes: subscribers at different
versions, restarted and new ones, on the same-host and the relay path, always exact; a byte
flipped in shared memory fails a verified pull naming the tensor, with nothing applied."""

from __future__ import annotations

import pytest
import torch

from rayless.actors import Cluster
from rayless.weights import WeightChecksumError, WeightSync, WeightSyncError
from tests.integration.weights_classes import DeltaSubscriber, last_change, moe_state

pytestmark = [
    pytest.mark.integration,
    pytest.mark.timeout(180),
    pytest.mark.local_cluster(nodes=2, gpus_per_node=0),
]


def _changed(since: int, version: int) -> list[str]:
    return sorted(
        f"expert{i}.weight" for i in range(20) if last_change(i, version) != last_change(i, since)
    )


@pytest.mark.parametrize("per_node", [False, True], ids=["same-host", "relay"])
async def test_delta_versions_are_exact_under_skew_and_restarts(
    local_cluster: Cluster, per_node: bool
) -> None:
    name = f"ws-delta-{per_node}"
    async with WeightSync.create(local_cluster, name=name, per_node=per_node, checksums=True) as ws:
        nodes = [n.node_id for n in await local_cluster.node_views()]
        every, skips, loader = [
            await local_cluster.spawn(DeltaSubscriber, name, node=nodes[i % 2], cpus=0)
            for i in range(3)
        ]
        for v in range(1, 13):
            await ws.publish(moe_state(v), version=v, delta=True)
            assert await every.pull(v) == (v, True)  # one version behind: a 10% delta
            if v in (3, 10):  # 3: from version 0 (none held), 10: a delta from 3 (in the window)
                assert await skips.pull(v) == (v, True)
        got, names, exact = await loader.load(1)
        assert (got, len(names), exact) == (12, 20, True)  # a first pull: everything
        await ws.publish(moe_state(13), version=13, delta=True)
        got, names, exact = await loader.load(13)
        assert (got, names, exact) == (13, _changed(12, 13), True) and len(names) == 2
        await loader.reconnect()  # a restarted worker's client holds nothing: all again
        await ws.publish(moe_state(14), version=14, delta=True)
        got, names, exact = await loader.load(14)
        assert (got, len(names), exact) == (14, 20, True)
        late = await local_cluster.spawn(DeltaSubscriber, name, node=nodes[1], cpus=0)
        assert await late.pull(14) == (14, True)  # a new subscriber: the full version
        for v in (15, 16):  # a full publish between deltas, then a delta again
            await ws.publish(moe_state(v), version=v, delta=v == 16)
            for sub in (every, skips, late):
                assert await sub.pull(v) == (v, True)
        await local_cluster.kill(skips)  # killed and started again: its tensors are zeros
        skips = await local_cluster.spawn(DeltaSubscriber, name, node=nodes[0], cpus=0)
        await ws.publish(moe_state(17), version=17, delta=True)
        assert await skips.pull(17) == (17, True)


async def test_a_flipped_byte_fails_a_verified_pull_and_applies_nothing(
    local_cluster: Cluster,
) -> None:
    async with WeightSync.create(local_cluster, name="ws-verify", checksums=True) as ws:
        sub = await local_cluster.spawn(DeltaSubscriber, "ws-verify", cpus=0)
        await ws.publish(moe_state(1), version=1)
        assert await sub.pull(1) == (1, True)
        await ws.publish(moe_state(10), version=10)
        wide = {k: v.double() for k, v in moe_state(10).items()}  # checked in float32
        assert await ws.check_weights(wide, 10, timeout=5) == 10
        wide["expert5.weight"][0, 0] += 1
        with pytest.raises(WeightChecksumError) as held:
            await ws.check_weights(wide, 10, timeout=5)
        assert held.value.tensor == "expert5.weight"
        seg = ws._slots.pool().newest
        assert seg is not None
        published = await ws._registry.wait(ws.location, 10, 5)
        row = next(r for r in published.parts[0].layout if r[0] == "expert3.weight")
        seg.payload[row[4] + 17] ^= 0x01  # one bit of expert3 (bucket 0 starts at 0)
        with pytest.raises(WeightChecksumError) as e:
            await sub.pull(10)
        assert (e.value.tensor, e.value.version) == ("expert3.weight", 10)
        assert await sub.holds(1)  # nothing was applied
        assert await sub.pull(1, verify=False) == (10, False)  # unverified: the torn copy


async def test_checksums_are_the_publishers_choice_and_a_verified_pull_says_they_are_missing(
    local_cluster: Cluster,
) -> None:
    # Off by default (a third of a sync on two cores): a verified pull of such a version
    # raises WeightSyncError saying so, copies nothing; an unverified one works.
    async with WeightSync.create(local_cluster, name="ws-nosums") as ws:
        assert ws.checksums is False
        await ws.publish(moe_state(1), version=1)
        targets = {k: torch.zeros_like(v) for k, v in moe_state(1).items()}
        with pytest.raises(WeightSyncError, match="without checksums"):
            await ws.pull(targets, 1, timeout=10, verify=True)
        assert all(not t.any() for t in targets.values())
        assert await ws.pull(targets, 1, timeout=10) == 1
        assert all(torch.equal(targets[k], v) for k, v in moe_state(1).items())
