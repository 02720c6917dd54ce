"""Planned placement → live actors: each worker runs on exactly its slot's node and GPUs."""

from __future__ import annotations

import pytest

from rayless.actors import Cluster, PlacementError
from rayless.actors.api.components import cluster_info, slots_of
from rayless.placement import ComponentScheduling, ResourcePoolPlanner, Scheduling
from tests.integration.actor_classes import Counter

pytestmark = pytest.mark.integration


@pytest.mark.local_cluster(nodes=2, gpus_per_node=4)
async def test_spawn_component_puts_each_worker_on_its_slot(local_cluster: Cluster) -> None:
    info = await cluster_info(local_cluster)
    assert info["n_nodes"] == 2
    scheduling = ComponentScheduling(
        env_worker=[Scheduling(worker_num=2, num_cpus=0.25, num_gpus=0.5)],
        train_worker=Scheduling(worker_num=2, num_cpus=0.25, num_gpus=2),
        eval_worker=Scheduling(worker_num=2, num_cpus=0.25, num_gpus=1),
        buffer_worker=Scheduling(worker_num="auto", num_cpus=0.25, num_gpus=0),
    )
    planner = ResourcePoolPlanner(scheduling, info)
    planner.plan_resource_pools("disaggregate")
    for component in ("train", "eval", "env"):
        slots = slots_of(planner, component)
        handles = await local_cluster.spawn_component(Counter, planner, component, 0)
        assert [h.name for h in handles] == [f"{component}-{s.worker_id}" for s in slots]
        for handle, slot in zip(handles, slots, strict=True):
            env = await handle.env("CUDA_VISIBLE_DEVICES", "RAYLESS_NODE_ID", "RAYLESS_WORKER_ID")
            assert env == {
                "CUDA_VISIBLE_DEVICES": slot.cuda_visible_devices,
                "RAYLESS_NODE_ID": slot.node_id,
                "RAYLESS_WORKER_ID": str(slot.worker_id),
            }
    nodes = await local_cluster.nodes()
    used = {n["node_id"]: 4 - n["gpus_free"] for n in nodes}
    assert sum(used.values()) == 4 + 2 + 1  # train 2x2, eval 2x1, env 2x0.5 on one GPU


@pytest.mark.local_cluster(nodes=2, gpus_per_node=4)
async def test_a_taken_slot_fails_the_whole_component(local_cluster: Cluster) -> None:
    info = await cluster_info(local_cluster)
    scheduling = ComponentScheduling(
        train_worker=Scheduling(worker_num=2, num_cpus=0.25, num_gpus=1),
        buffer_worker=Scheduling(worker_num="auto", num_cpus=0.25, num_gpus=0),
    )
    planner = ResourcePoolPlanner(scheduling, info)
    planner.plan_resource_pools("disaggregate")
    first = slots_of(planner, "train")[1]
    squatter = await local_cluster.spawn(
        Counter, node=first.node_id, gpus=1, gpu_indices=first.gpu_indices
    )
    with pytest.raises(PlacementError, match="not enough free GPUs"):
        await local_cluster.spawn_component(Counter, planner, "train")
    nodes = {n["node_id"]: n for n in await local_cluster.nodes()}
    assert sum(4 - n["gpus_free"] for n in nodes.values()) == 1  # only the squatter holds one
    await local_cluster.kill(squatter)
    with pytest.raises(PlacementError, match="no workers for component 'eval'"):
        await local_cluster.spawn_component(Counter, planner, "eval")
