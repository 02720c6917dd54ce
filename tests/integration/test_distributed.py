"""torch.distributed groups: spawn_group sets the env:// variables; gloo all_reduce across nodes."""

from __future__ import annotations

import os

import pytest

import rayless.actors as actors
from rayless.actors import Actor, Cluster
from rayless.actors.api.group import block_assignment, torch_env

pytestmark = pytest.mark.integration

TORCH_VARS = ("MASTER_ADDR", "MASTER_PORT", "RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE")


class DistWorker(Actor):
    def env(self) -> dict[str, str | None]:
        names = (*TORCH_VARS, "RAYLESS_NODE_ID", "RAYLESS_GROUP_RANK", "RAYLESS_GROUP_SIZE")
        names += ("CUDA_VISIBLE_DEVICES",)
        return {k: os.environ.get(k) for k in names}

    def all_reduce(self) -> list[float]:
        import torch
        import torch.distributed as dist

        dist.init_process_group("gloo", timeout=__import__("datetime").timedelta(seconds=60))
        try:
            t = torch.tensor([float(dist.get_rank() + 1), 1.0])
            dist.all_reduce(t)
            return t.tolist()
        finally:
            dist.destroy_process_group()


def test_block_assignment_and_torch_env() -> None:
    assert block_assignment(4, ["a", "b"]) == ["a", "a", "b", "b"]
    assert block_assignment(3, ["a", "b"]) == ["a", "a", "b"]
    assert block_assignment(2, ["a", "b", "c"]) == ["a", "b"]
    envs = torch_env(["a", "a", "b"], "10.0.0.1", 1234)
    assert [e["LOCAL_RANK"] for e in envs] == ["0", "1", "0"]
    assert [e["LOCAL_WORLD_SIZE"] for e in envs] == ["2", "2", "1"]
    assert [e["GROUP_RANK"] for e in envs] == ["0", "0", "1"]
    assert {e["WORLD_SIZE"] for e in envs} == {"3"}


@pytest.mark.local_cluster(nodes=2, gpus_per_node=0)
async def test_group_env_spreads_ranks_over_nodes(local_cluster: Cluster) -> None:
    group = await local_cluster.spawn_group(DistWorker, 4, torch_distributed=True)
    envs = [await h.env() for h in group]
    nodes = sorted(n["node_id"] for n in await local_cluster.nodes())
    assert [e["RAYLESS_NODE_ID"] for e in envs] == [nodes[0], nodes[0], nodes[1], nodes[1]]
    assert [e["RANK"] for e in envs] == ["0", "1", "2", "3"]
    assert [e["LOCAL_RANK"] for e in envs] == ["0", "1", "0", "1"]
    assert {e["LOCAL_WORLD_SIZE"] for e in envs} == {"2"}
    assert {e["WORLD_SIZE"] for e in envs} == {"4"}
    assert {e["MASTER_ADDR"] for e in envs} == {"127.0.0.1"}
    ports = {e["MASTER_PORT"] for e in envs}
    assert len(ports) == 1 and 0 < int(ports.pop()) < 65536
    assert [e["RAYLESS_GROUP_RANK"] for e in envs] == ["0", "1", "2", "3"]
    # without torch_distributed: group ranks only; node= pins every member
    plain = await local_cluster.spawn_group(DistWorker, 2, node=nodes[1])
    penvs = [await h.env() for h in plain]
    assert [e["RAYLESS_NODE_ID"] for e in penvs] == [nodes[1], nodes[1]]
    assert all(e["RANK"] is None and e["RAYLESS_GROUP_SIZE"] == "2" for e in penvs)


@pytest.mark.local_cluster(nodes=2, gpus_per_node=0)
async def test_gloo_all_reduce_across_two_nodes(local_cluster: Cluster) -> None:
    group = await local_cluster.spawn_group(DistWorker, 2, torch_distributed=True)
    assert len({(await h.env())["RAYLESS_NODE_ID"] for h in group}) == 2
    results = await actors.gather(*(h.all_reduce.submit() for h in group))
    assert results == [[3.0, 2.0], [3.0, 2.0]]


@pytest.mark.local_cluster(nodes=2, gpus_per_node=0)
async def test_group_argument_errors(local_cluster: Cluster) -> None:
    with pytest.raises(ValueError, match="n must be"):
        await local_cluster.spawn_group(DistWorker, 0)
    with pytest.raises(ValueError, match="at most one"):
        await local_cluster.spawn_group(DistWorker, 2, node="a", nodes=["a"])
    with pytest.raises(actors.PlacementError):
        await local_cluster.spawn_group(DistWorker, 2, nodes=["no-such-node", "x"])


@pytest.mark.local_cluster(nodes=2, gpus_per_node=2)
async def test_plan_based_group_follows_the_slots(local_cluster: Cluster) -> None:
    from rayless.placement import WorkerSlot

    nodes = sorted(n["node_id"] for n in await local_cluster.nodes())
    slots = [
        WorkerSlot("actor", 1, nodes[0], (1,), 1.0, 0.5),
        WorkerSlot("actor", 0, nodes[1], (0,), 1.0, 0.5),
    ]
    with pytest.raises(ValueError, match="not n=3"):
        await local_cluster.spawn_group(DistWorker, 3, plan=slots, component="actor")
    group = await local_cluster.spawn_group(
        DistWorker, 2, plan=slots, component="actor", torch_distributed=True
    )
    envs = [await h.env() for h in group]
    # worker 0 is rank 0, on its slot's node: the master is there
    assert [e["RAYLESS_NODE_ID"] for e in envs] == [nodes[1], nodes[0]]
    assert [e["RANK"] for e in envs] == ["0", "1"]
    assert [e["LOCAL_RANK"] for e in envs] == ["0", "0"]
    assert [e["CUDA_VISIBLE_DEVICES"] for e in envs] == ["0", "1"]
