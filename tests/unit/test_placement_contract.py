"""The reference's public contract (rLightning): YAML shape, exception types, requirement sums.

Examples are the reference documents' own (their docstrings), ported; the property tests check
that plan -> YAML -> plan is the identity, on heterogeneous clusters and for manual pools with
node_ids.
"""

from __future__ import annotations

import random
from typing import Any

import pytest
import yaml
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

import rayless.placement as placement
from rayless.placement import (
    AllocationError,
    ComponentScheduling,
    EpisodeIndexError,
    EpisodeTable,
    InsufficientResourcesError,
    ManualPoolError,
    NodeAffinityError,
    NodeCapacityError,
    NodeResource,
    PlacementError,
    ResourcePool,
    ResourcePoolPlanner,
    Scheduling,
)
from rayless.transport.errors import wire_name


def cluster(*gpus: int, ids: list[str] | None = None, cpus: int = 64) -> dict[str, Any]:
    names = ids or [f"n{i}" for i in range(len(gpus))]
    table = {
        n: {"ip": f"10.0.0.{i}", "CPU": cpus, "GPU": g}
        for i, (n, g) in enumerate(zip(names, gpus, strict=True))
    }
    return {"n_nodes": len(gpus), "node_id_to_resources": table}


def layout(pools: dict[str, ResourcePool]) -> dict[str, Any]:
    return {
        name: [(n.node_id, n.total_gpus, n.gpu_ids, n.allocations) for n in p.nodes]
        for name, p in pools.items()
    }


# -- YAML: the reference's docstring examples ------------------------------------------------------

REFERENCE_EXPORT = [  # ResourcePoolPlanner.to_yaml_config's docstring
    {"name": "train_pool", "num_node": 1, "num_gpus": 8, "train": "0-7"},
    {"name": "rollout_pool", "num_node": 2, "num_gpus": 8, "eval": "0-7, 8-15", "env": "0-7, 8-15"},
]


def docstring_planner() -> ResourcePoolPlanner:
    cs = ComponentScheduling(
        train_worker=Scheduling(8, 1, 1),
        eval_worker=Scheduling(16, 1, 1),
        env_worker=[Scheduling(16, 1, 1)],
    )
    return ResourcePoolPlanner(cs, cluster(8, 8, 8))


def test_reference_docstring_export_shape() -> None:
    p = docstring_planner()
    p.plan_resource_pools("disaggregate", "device-colocate")
    assert p.to_yaml_config() == REFERENCE_EXPORT
    assert p.get_resource_pools("train_pool").to_yaml_dict() == REFERENCE_EXPORT[0]


def test_reference_export_loads_to_the_same_plan() -> None:
    planned = docstring_planner()
    planned.plan_resource_pools("disaggregate", "device-colocate")
    loaded = docstring_planner()
    loaded.load_manual_resource_pools(yaml.safe_load(yaml.safe_dump(REFERENCE_EXPORT)))
    assert layout(loaded.get_resource_pools()) == layout(planned.get_resource_pools())
    assert loaded.to_yaml_config() == REFERENCE_EXPORT


def test_num_gpus_is_a_list_only_for_heterogeneous_pools() -> None:
    cs = ComponentScheduling(train_worker=Scheduling(12, 1, 1), eval_worker=Scheduling(4, 1, 1))
    p = ResourcePoolPlanner(cs, cluster(8, 4, 4))
    p.plan_resource_pools()
    out = p.to_yaml_config()
    assert out[0] == {"name": "train_pool", "num_node": 2, "num_gpus": [8, 4], "train": "0-7, 8-11"}
    assert out[1] == {"name": "rollout_pool", "num_node": 1, "num_gpus": 4, "eval": "0-3"}
    q = ResourcePoolPlanner(cs, cluster(8, 4, 4))
    q.load_manual_resource_pools(out)
    assert layout(q.get_resource_pools()) == layout(p.get_resource_pools())


def test_node_ids_only_when_loaded_with_them_or_needed() -> None:
    cfg = [
        {"name": "p", "num_node": 2, "node_ids": ["n1", "n0"], "num_gpus": [8, 8], "train": "0-9"}
    ]
    p = ResourcePoolPlanner(ComponentScheduling(train_worker=Scheduling(10, 1, 1)), cluster(8, 8))
    p.load_manual_resource_pools(cfg)
    # loaded with node_ids: kept, num_gpus a list (ranges are written per node)
    assert p.to_yaml_config() == [{**cfg[0], "train": "0-7, 8-9"}]
    assert p.to_yaml_config(pin_nodes=False) == [
        {"name": "p", "num_node": 2, "num_gpus": 8, "train": "0-7, 8-9"}
    ]
    # a node shared by train and rollout (disaggregate) cannot be named without node_ids
    cs = ComponentScheduling(train_worker=Scheduling(6, 1, 1), eval_worker=Scheduling(4, 1, 1))
    q = ResourcePoolPlanner(cs, cluster(8, 8))
    q.plan_resource_pools()
    out = q.to_yaml_config()
    assert "node_ids" not in out[0]
    assert out[1]["node_ids"] == ["n0", "n1"] and out[1]["num_gpus"] == [8, 8]
    r = ResourcePoolPlanner(cs, cluster(8, 8))
    r.load_manual_resource_pools(out)
    assert layout(r.get_resource_pools()) == layout(q.get_resource_pools())


def test_unpinned_pool_on_heterogeneous_cluster_must_name_its_nodes() -> None:
    def load(cfg: dict[str, Any], *gpus: int) -> dict[str, ResourcePool]:
        planner = ResourcePoolPlanner(ComponentScheduling(), cluster(*gpus))
        return planner.load_manual_resource_pools([cfg])

    for bad in (
        {"name": "p", "num_node": 1, "train": "0"},  # no num_gpus: the reference's refusal
        {"name": "p", "num_node": 1, "num_gpus": 2, "train": "0"},  # no node has 2 GPUs
        {"name": "p", "num_node": 2, "num_gpus": 4, "train": "0"},  # only one node has 4
    ):
        with pytest.raises(ManualPoolError, match="heterogeneous"):
            load(bad, 8, 4)
        with pytest.raises(ValueError):
            load(bad, 8, 4)
    assert load({"name": "p", "num_node": 1, "num_gpus": 4, "train": "0"}, 8, 4)["p"].node_ids == [
        "n1"
    ]
    pool = load({"name": "p", "num_node": 2, "num_gpus": [4, 8], "train": "0-11"}, 8, 4)["p"]
    assert pool.node_ids == ["n1", "n0"]
    # homogeneous: the reference's rule, first unused nodes by node id
    assert load({"name": "p", "num_node": 1, "train": "0"}, 8, 8)["p"].node_ids == ["n0"]


# -- property tests: plan -> YAML -> plan is the identity ---------------------------------------

NODE_NAMES = ["node-b", "node-a", "gpu07", "gpu10", "n2", "z", "node-10", "node-9"]


@st.composite
def clusters(draw: st.DrawFn) -> dict[str, Any]:
    n = draw(st.integers(1, 5))
    ids = draw(st.permutations(NODE_NAMES))[:n]
    gpus = draw(st.lists(st.sampled_from([0, 2, 4, 8]), min_size=n, max_size=n))
    return cluster(*gpus, ids=ids)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.filter_too_much])
@given(
    clusters(),
    st.integers(0, 12),
    st.integers(0, 8),
    st.integers(0, 10),
    st.sampled_from([0.0, 0.25, 0.5, 1.0, 2.0]),
    st.sampled_from(["disaggregate", "colocate"]),
    st.sampled_from(["default", "device-colocate"]),
)
def test_plan_yaml_plan_is_identity(
    info: dict[str, Any],
    train: int,
    eval_: int,
    env: int,
    env_gpus: float,
    strategy: str,
    env_strategy: str,
) -> None:
    cs = ComponentScheduling(
        train_worker=Scheduling(train, 1, 1),
        eval_worker=Scheduling(eval_, 1, 1),
        env_worker=[Scheduling(env, 1, env_gpus)],
        buffer_worker=Scheduling("auto", 1, 0),
    )
    p = ResourcePoolPlanner(cs, info)
    try:
        p.plan_resource_pools(strategy, env_strategy)
    except (PlacementError, ValueError):
        assume(False)
    exported = p.to_yaml_config()
    text = yaml.safe_dump({"resource_pool": exported})
    q = ResourcePoolPlanner(cs, info)
    q.load_manual_resource_pools(yaml.safe_load(text)["resource_pool"])
    assert layout(q.get_resource_pools()) == layout(p.get_resource_pools())
    assert q.to_yaml_config() == exported
    for form in exported:
        per_node = form["num_gpus"]
        if "node_ids" not in form and isinstance(per_node, list):
            assert len(set(per_node)) > 1  # a list only for a heterogeneous pool


@st.composite
def manual_configs(draw: st.DrawFn) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    info = draw(clusters())
    table = info["node_id_to_resources"]
    ids = list(table)
    pools = []
    for k in range(draw(st.integers(1, 3))):
        members = draw(st.lists(st.sampled_from(ids), min_size=1, max_size=len(ids), unique=True))
        per_node = [draw(st.integers(0, table[m]["GPU"])) for m in members]
        cfg: dict[str, Any] = {
            "name": f"pool{k}",
            "num_node": len(members),
            "node_ids": members,
            "num_gpus": per_node,
        }
        total = sum(per_node)
        rnd = random.Random(draw(st.integers(0, 2**16)))
        for comp in ("train", "eval", "env"):
            if total and rnd.random() < 0.7:
                picked = sorted(rnd.sample(range(total), rnd.randint(1, total)))
                cfg[comp] = ", ".join(str(i) for i in picked)
        pools.append(cfg)
    return info, pools


@settings(max_examples=150, deadline=None)
@given(manual_configs())
def test_manual_pools_with_node_ids_round_trip(
    case: tuple[dict[str, Any], list[dict[str, Any]]],
) -> None:
    info, cfg = case
    p = ResourcePoolPlanner(ComponentScheduling(), info)
    p.load_manual_resource_pools(cfg)
    exported = p.to_yaml_config()
    assert all(form["node_ids"] == c["node_ids"] for form, c in zip(exported, cfg, strict=True))
    q = ResourcePoolPlanner(ComponentScheduling(), info)
    q.load_manual_resource_pools(yaml.safe_load(yaml.safe_dump(exported)))
    assert layout(q.get_resource_pools()) == layout(p.get_resource_pools())
    assert q.to_yaml_config() == exported


# -- exception types ------------------------------------------------------------------------------


def test_placement_error_and_children_are_exported_with_wire_names() -> None:
    assert placement.PlacementError is PlacementError
    for cls in (
        PlacementError,
        InsufficientResourcesError,
        AllocationError,
        NodeCapacityError,
        ManualPoolError,
        NodeAffinityError,
        EpisodeIndexError,
    ):
        assert wire_name(cls) == f"rayless.{cls.__name__}"
        assert cls.__name__ in placement.__all__


def test_episode_table_keeps_the_reference_exception_types() -> None:
    t = EpisodeTable(2, env_ids=["env-0"], num_train_workers=4)
    for call in (t.get_train_workers, t.get_envs_for_storage):
        with pytest.raises(IndexError, match="out of range"):  # the reference's IndexError
            call(2)
        with pytest.raises(EpisodeIndexError):
            call(-1)
    two_buffers = {"a": {"buffer": {"ids": [0, 1]}, "env": {"ids": [0]}}}
    with pytest.raises(ValueError, match="multiple buffer"):  # the reference's assert
        EpisodeTable(2, ["env-0"], component_distribution=two_buffers, node_affinity_env=True)
    no_train = {"a": {"buffer": {"ids": [0]}, "env": {"ids": [0]}}}
    with pytest.raises(RuntimeError, match="no train workers"):  # the reference's RuntimeError
        EpisodeTable(1, None, 1, no_train, node_affinity_train=True)
    unequal = {
        "a": {"buffer": {"ids": [0]}, "env": {"ids": [0, 1]}},
        "b": {"buffer": {"ids": [1]}, "env": {"ids": [2]}},
    }
    with pytest.raises(RuntimeError, match="expected 2"):
        EpisodeTable(2, ["env-0"], component_distribution=unequal, node_affinity_env=True)
    with pytest.raises(NodeAffinityError):
        EpisodeTable(2, ["env-0"], component_distribution=unequal, node_affinity_env=True)
    with pytest.raises(ValueError, match="component_distribution"):  # the reference's assert
        EpisodeTable(2, node_affinity_env=True)
    with pytest.raises(ValueError, match="divisible"):  # the reference's assert
        EpisodeTable(2, num_train_workers=3)


def test_episode_table_reference_docstring_behaviour() -> None:
    # round-robin with load balance for envs; contiguous even blocks for train workers
    t = EpisodeTable(3, env_ids=[f"env-{i}" for i in range(5)], num_train_workers=6)
    assert t.get_env_to_storage() == {"env-0": 0, "env-1": 1, "env-2": 2, "env-3": 0, "env-4": 1}
    assert t.get_storage_to_train_workers() == {0: [0, 1], 1: [2, 3], 2: [4, 5]}
    assert t.get_storage_idx_for_env("env-9") == 2


def test_allocation_errors_are_the_reference_runtime_errors() -> None:
    node = NodeResource("n0", "", 8, 4)
    with pytest.raises(RuntimeError, match="available"):
        node.allocate(5, ["train"])
    with pytest.raises(NodeCapacityError):
        node.allocate(5, ["train"])
    with pytest.raises(InsufficientResourcesError):
        node.allocate(5, ["train"])
    with pytest.raises(RuntimeError, match="length"):
        node.allocate([1, 2], ["train"])
    with pytest.raises(ValueError, match="Resource validation failed"):
        cs = ComponentScheduling(train_worker=Scheduling(9, 1, 1))
        ResourcePoolPlanner(cs, cluster(8)).plan_resource_pools()
