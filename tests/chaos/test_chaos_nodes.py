"""Chaos on the control plane: lose a node agent of a 3-node cluster, lose the head."""

from __future__ import annotations

import pytest

from rayless.actors import ActorDiedError, Cluster
from rayless.actors.launch.local import LocalProcesses
from tests.chaos.scenarios import head_loss, node_loss

pytestmark = [pytest.mark.integration, pytest.mark.chaos]

NODE_TIMEOUT = 1.0


@pytest.mark.local_cluster(nodes=3, gpus_per_node=0, node_timeout=NODE_TIMEOUT, isolated=True)
async def test_node_loss_fails_its_actors_and_the_other_nodes_keep_working(
    local_cluster: Cluster, local_cluster_processes: LocalProcesses
) -> None:
    report = await node_loss(local_cluster, local_cluster_processes, victim=2, per_node=2)
    assert isinstance(report.error, ActorDiedError), repr(report.error)
    assert report.error.node == "node-2"
    # declared dead within the heartbeat timeout (generous bound against hangs; the measured
    # figure is in docs/reliability.md)
    assert report.detected_s < NODE_TIMEOUT + 9, report.detected_s
    assert report.victim_pids_gone, "the lost node's actors outlived its agent"
    assert report.survivors_ok
    nodes = {n["node_id"]: n["alive"] for n in await local_cluster.nodes()}
    assert nodes == {"node-0": True, "node-1": True, "node-2": False}


@pytest.mark.slow
@pytest.mark.local_cluster(nodes=3, gpus_per_node=0, node_timeout=NODE_TIMEOUT, isolated=True)
async def test_head_loss_shuts_every_agent_and_actor_down_in_bounded_time(
    local_cluster: Cluster, local_cluster_processes: LocalProcesses
) -> None:
    took = await head_loss(local_cluster, local_cluster_processes, per_node=2)
    assert took >= 0, "agents or actors outlived the head"
    assert took < NODE_TIMEOUT + 20, took
