"""Scheduling, the resource-pool planner, manual YAML pools and YAML export."""

from __future__ import annotations

from typing import Any

import pytest
import yaml

from rayless.placement import (
    ComponentScheduling,
    InsufficientResourcesError,
    NodeResource,
    ResourcePool,
    ResourcePoolPlanner,
    Scheduling,
    parse_index_str,
)
from rayless.placement.errors import PlacementError


def cluster(*gpus: int, cpus: int = 64) -> dict[str, Any]:
    table = {f"n{i}": {"ip": f"10.0.0.{i}", "CPU": cpus, "GPU": g} for i, g in enumerate(gpus)}
    return {"n_nodes": len(gpus), "node_id_to_resources": table}


def sched(
    train: int = 8, eval_: int = 4, env: int = 8, env_gpus: float = 0.5
) -> ComponentScheduling:
    return ComponentScheduling(
        env_worker=[Scheduling(env, 1, env_gpus)],
        train_worker=Scheduling(train, 1, 1),
        eval_worker=Scheduling(eval_, 1, 1),
        buffer_worker=Scheduling("auto", 1, 0),
    )


# -- scheduling ---------------------------------------------------------------------------------


def test_requirements_are_the_reference_sums_and_packing_is_planner_side() -> None:
    assert Scheduling(3, 2, 0.6).gpus_needed() == 3  # one 0.6 worker per GPU
    assert Scheduling(3, 2, 0.5).gpus_needed() == 2
    assert Scheduling(3, 2, 0.5).total_gpus() == 1.5  # the reference's raw figure
    assert Scheduling(3, 2, 2).gpus_needed() == 6
    assert Scheduling(4, 0, 0).gpus_needed() == 0
    cs = ComponentScheduling(
        env_worker=[Scheduling(3, 1, 0.5), Scheduling(1, 2, 0.25)],
        train_worker=Scheduling(4, 1, 1),
        buffer_worker=Scheduling(2, 3, 0),
    )
    assert cs.get_component_requirements("env") == (1.75, 5)  # 3 x 0.5 + 1 x 0.25, as given
    assert cs.component_gpus_needed("env") == 3  # 2 GPUs for 3 x 0.5, one for the 0.25
    assert cs.get_component_requirements("eval") == (0, 0)
    assert cs.train_pool_requirements() == (4, 10)
    assert cs.train_pool_gpus_needed() == 4
    quarter = ComponentScheduling(eval_worker=Scheduling(3, 1, 0.25))
    assert quarter.get_component_requirements("eval") == (0.75, 3)  # the example
    assert quarter.component_gpus_needed("eval") == 1
    with pytest.raises(ValueError, match="Invalid component type"):
        cs.get_component_requirements("critic")


@pytest.mark.parametrize(
    "args",
    [(-1, 1, 1), (1.5, 1, 1), (True, 1, 1), ("many", 1, 1), (1, -1, 1), (1, 1, 1.5), (1, 1, -0.1)],
)
def test_scheduling_rejects_bad_values(args: tuple[Any, Any, Any]) -> None:
    with pytest.raises(ValueError):
        Scheduling(*args)


def test_auto_only_for_buffer_and_buffer_helpers() -> None:
    with pytest.raises(ValueError, match="only supported for buffer"):
        ComponentScheduling(train_worker=Scheduling("auto", 1, 1))
    cs = sched(train=12)
    cs.infer_auto_buffer_worker_num(cluster(8, 8))
    assert cs.buffer_worker is not None and cs.buffer_worker.worker_num == 2
    cs.adjust_buffer_worker_num(3)
    assert cs.buffer_worker.worker_num == 3
    assert Scheduling(2, 1, 0, node_list="a, b").nodes == ("a", "b")


# -- planner ------------------------------------------------------------------------------------


def test_disaggregate_plan_and_shared_node() -> None:
    p = ResourcePoolPlanner(sched(train=6, eval_=4, env=8), cluster(8, 8))
    pools = p.plan_resource_pools("disaggregate")
    assert list(pools) == ["train_pool", "rollout_pool"]
    train, rollout = pools["train_pool"], pools["rollout_pool"]
    assert train.get_component_indices("train") == "0-5"
    assert train.component_types == ["train", "buffer"]
    # n0 holds train 0-5 and eval 6-7: it is in both pools, each with its own ranges
    assert rollout.node_ids == ["n0", "n1"]
    assert rollout.get_component_indices("eval") == "6-7, 8-9"
    assert rollout.get_component_indices("env") == "10-13"
    assert p.get_pool_for_component("env") is rollout
    assert p.get_component_node_count("eval") == 2
    assert p.get_component_node_count("buffer") == 1
    assert train.component_allocations["train"].worker_count == 6


def test_colocate_rereads_free_gpus_per_node() -> None:
    # The reference reused a stale free count on n0 (8 instead of 4) and raised mid-plan.
    p = ResourcePoolPlanner(sched(train=16, eval_=4, env=8, env_gpus=1), cluster(8, 8))
    pool = p.plan_resource_pools("colocate")["global_pool"]
    assert pool.get_component_indices("train") == "0-7, 8-15"
    assert pool.get_component_indices("eval") == "0-3"
    assert pool.get_component_indices("env") == "4-7, 8-11"


def test_device_colocate_shares_eval_and_env() -> None:
    p = ResourcePoolPlanner(sched(train=0, eval_=8, env=8, env_gpus=1), cluster(8))
    pool = p.plan_resource_pools("disaggregate", "device-colocate")["rollout_pool"]
    assert pool.get_component_indices("eval") == "0-7" == pool.get_component_indices("env")
    ok, msg = p.validate_scheduling("disaggregate", "default")
    assert not ok and msg == "Insufficient GPUs: required 16, available 8"


def test_insufficient_errors_are_placement_and_value_errors() -> None:
    p = ResourcePoolPlanner(sched(train=16), cluster(8))
    with pytest.raises(PlacementError, match="Insufficient GPUs"):
        p.plan_resource_pools()
    with pytest.raises(ValueError, match="Insufficient GPUs"):
        p.plan_resource_pools()
    p = ResourcePoolPlanner(sched(train=1, eval_=0, env=0), cluster(8, cpus=0))
    with pytest.raises(InsufficientResourcesError, match="Insufficient CPUs"):
        p.plan_resource_pools()
    for bad in [("spread", "default"), ("colocate", "device")]:
        with pytest.raises(ValueError, match="Unknown"):
            p.validate_scheduling(*bad)


def test_whole_workers_never_span_nodes() -> None:
    with pytest.raises(PlacementError, match="do not fit"):
        cs2 = ComponentScheduling(train_worker=Scheduling(2, 1, 3))
        ResourcePoolPlanner(cs2, cluster(4, 2, 2)).plan_resource_pools()
    cs = ComponentScheduling(train_worker=Scheduling(3, 1, 3))
    pool3 = ResourcePoolPlanner(cs, cluster(4, 4, 4)).plan_resource_pools()["train_pool"]
    assert pool3.get_component_indices("train") == "0-2, 4-6, 8-10"
    pool = ResourcePoolPlanner(cs, cluster(6, 4)).plan_resource_pools()["train_pool"]
    assert pool.get_component_indices("train") == "0-5, 6-8"


def test_planning_is_repeatable_and_does_not_mutate_nodes() -> None:
    p = ResourcePoolPlanner(sched(), cluster(8, 8))
    first = p.plan_resource_pools()["rollout_pool"].to_dict()
    assert p.plan_resource_pools()["rollout_pool"].to_dict() == first
    assert all(n.gpu_cursor == 0 and not n.allocations for n in p.get_node_resources().values())


def test_cluster_info_validation() -> None:
    for bad in [
        {},
        {"node_id_to_resources": {"a": {"GPU": -1}}},
        {"node_id_to_resources": {"a": 3}},
    ]:
        with pytest.raises(ValueError):
            ResourcePoolPlanner(sched(), bad).discover_cluster_resources()
    with pytest.raises(ValueError):
        ResourcePoolPlanner("nope", cluster(8))  # type: ignore[arg-type]


def test_none_cluster_info_discovers_this_host(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RAYLESS_FAKE_GPUS", "4")
    monkeypatch.setenv("RAYLESS_NODE_ID", "me")
    p = ResourcePoolPlanner(ComponentScheduling(train_worker=Scheduling(4, 0, 1)))
    assert p.plan_resource_pools()["train_pool"].node_ids == ["me"]
    assert p.get_cluster_info()["node_id_to_resources"]["me"]["GPU"] == 4  # type: ignore[index]


def test_summary_and_yaml_round_trip_through_text() -> None:
    p = ResourcePoolPlanner(sched(train=6), cluster(8, 8))
    p.plan_resource_pools()
    s = p.summary()
    assert s["cluster"] == {"n_nodes": 2, "total_gpus": 16, "total_cpus": 128}
    assert set(s["pools"]) == {"train_pool", "rollout_pool"}
    text = yaml.safe_dump({"resource_pool": p.to_yaml_config()})
    q = ResourcePoolPlanner(sched(train=6), cluster(8, 8))
    q.load_manual_resource_pools(yaml.safe_load(text)["resource_pool"])
    assert q.summary()["pools"] == s["pools"]
    assert q.pack() == p.pack()
    unpinned = p.to_yaml_config(pin_nodes=False)
    assert "node_ids" not in unpinned[0] and unpinned[0]["num_gpus"] == 8


# -- manual pools -------------------------------------------------------------------------------


def test_index_strings() -> None:
    assert parse_index_str("0-7, 8-15") == [(0, 7), (8, 15)]
    assert parse_index_str(5) == [(5, 5)]
    assert parse_index_str("7-4") == [(4, 7)]
    assert parse_index_str(None) == [] == parse_index_str("")
    for bad in ["a-b", "1.5", "-1", "3-", True, 2.0, -2]:
        with pytest.raises(ValueError):
            parse_index_str(bad)


def manual(cfg: list[dict[str, Any]], *gpus: int) -> dict[str, ResourcePool]:
    return ResourcePoolPlanner(sched(), cluster(*gpus)).load_manual_resource_pools(cfg)


def test_manual_ranges_span_nodes() -> None:
    pools = manual(
        [
            {"name": "train_pool", "num_node": 2, "num_gpus": 8, "train": "4-11"},
            {"name": "rollout_pool", "num_node": 1, "num_gpus": 8, "eval": 3, "env": "7-5"},
        ],
        8,
        8,
        8,
    )
    t = pools["train_pool"]
    assert t.node_ids == ["n0", "n1"]
    assert t.nodes[0].allocations == {"train": [(4, 7)]}
    assert t.nodes[1].allocations == {"train": [(0, 3)]}
    r = pools["rollout_pool"]
    assert r.node_ids == ["n2"] and r.nodes[0].allocations == {"eval": [(3, 3)], "env": [(5, 7)]}


def test_manual_node_ids_and_per_node_gpus() -> None:
    pools = manual(
        [
            {
                "name": "p",
                "num_node": 2,
                "node_ids": ["n1", "n0"],
                "num_gpus": [4, 2],
                "train": "0-5",
            }
        ],
        8,
        8,
    )
    p = pools["p"]
    assert [n.total_gpus for n in p.nodes] == [4, 2]
    assert p.nodes[1].allocations == {"train": [(0, 1)]}
    assert p.to_yaml_dict()["num_gpus"] == [4, 2]


@pytest.mark.parametrize(
    ("cfg", "err", "match"),
    [
        (
            {"name": "p", "num_node": 3, "num_gpus": 8},
            InsufficientResourcesError,
            "Not enough nodes",
        ),
        ({"name": "p", "num_node": 1, "num_gpus": 8, "train": "0-8"}, PlacementError, "outside"),
        ({"name": "p", "num_node": 1, "node_ids": ["n0"], "num_gpus": 8}, ValueError, "list"),
        ({"name": "p", "num_node": 2, "node_ids": ["n0"], "num_gpus": [8]}, ValueError, "num_node"),
        (
            {"name": "p", "num_node": 1, "node_ids": ["zz"], "num_gpus": [8]},
            PlacementError,
            "unknown",
        ),
        ({"name": "p", "num_node": 1, "node_ids": ["n0"], "num_gpus": [9]}, PlacementError, "9"),
        ({"name": "p", "num_node": 1, "num_gpus": 8, "trian": "0-3"}, ValueError, "trian"),
        ({"name": "p", "num_node": 1, "num_gpus": 8, "env": "0-3, 2"}, ValueError, "twice"),
        ({"num_node": 1}, ValueError, "name"),
        ({"name": "p", "num_node": "1"}, ValueError, "num_node"),
    ],
)
def test_manual_pool_errors(cfg: dict[str, Any], err: type[Exception], match: str) -> None:
    with pytest.raises(err, match=match):
        manual([cfg], 8, 8)


def test_manual_heterogeneous_cluster_needs_node_ids() -> None:
    with pytest.raises(ValueError, match="heterogeneous"):
        manual([{"name": "p", "num_node": 1, "train": "0"}], 8, 4)
    assert (
        manual([{"name": "p", "num_node": 1, "num_gpus": 4, "train": "0-3"}], 8, 4)["p"].total_gpus
        == 4
    )


def test_duplicate_pool_names_and_used_nodes() -> None:
    with pytest.raises(ValueError, match="named"):
        manual([{"name": "p", "num_node": 1, "num_gpus": 8}] * 2, 8, 8)
    pools = manual(
        [{"name": "a", "num_node": 1, "num_gpus": 8}, {"name": "b", "num_node": 1, "num_gpus": 8}],
        8,
        8,
    )
    assert pools["a"].node_ids == ["n0"] and pools["b"].node_ids == ["n1"]


def test_node_resource_allocate() -> None:
    n = NodeResource("a", "ip", 8, 8)
    n.allocate([2, 3], ["train", "eval"])
    assert n.allocations == {"train": [(0, 1)], "eval": [(2, 4)]} and n.available_gpus == 3
    n.allocate(2, ["x", "y"], consume=False)
    assert n.allocations["x"] == n.allocations["y"] == [(5, 6)] and n.gpu_cursor == 5
    n.allocate(0, ["z"])
    assert "z" not in n.allocations
    with pytest.raises(InsufficientResourcesError):
        n.allocate(4, ["train"])
    with pytest.raises(ValueError):
        n.allocate([1], ["a", "b"])
    with pytest.raises(ValueError):
        n.allocate(-1)
    assert n.copy() == n and n.copy() is not n
