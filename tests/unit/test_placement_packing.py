"""Packing plans into worker slots, with hypothesis properties over random clusters."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from rayless.placement import (
    ComponentScheduling,
    GpuInfo,
    NodeInfo,
    ResourcePoolPlanner,
    Scheduling,
    WorkerSlot,
    check_overcommit,
    cluster_info_from_nodes,
    sharing_pairs,
)
from rayless.placement.errors import PlacementError


def cluster(*gpus: int, cpus: int = 64) -> dict[str, Any]:
    table = {f"n{i}": {"ip": f"10.0.0.{i}", "CPU": cpus, "GPU": g} for i, g in enumerate(gpus)}
    return {"n_nodes": len(gpus), "node_id_to_resources": table}


def test_slot_fields_and_cuda_visible_devices() -> None:
    s = WorkerSlot("train", 3, "n0", (2, 5), 1.0, 2.0)
    assert s.cuda_visible_devices == "2,5"
    assert WorkerSlot("env", 0, "n0", (), 0.0, 1.0).cuda_visible_devices == ""
    assert s.to_dict()["gpu_indices"] == [2, 5]


def test_disaggregate_packing_and_distribution() -> None:
    cs = ComponentScheduling(
        env_worker=[Scheduling(4, 1, 0.5), Scheduling(2, 1, 0)],
        train_worker=Scheduling(4, 2, 2),
        eval_worker=Scheduling(2, 1, 1),
        buffer_worker=Scheduling("auto", 1, 0),
    )
    p = ResourcePoolPlanner(cs, cluster(8, 4))
    p.plan_resource_pools()
    pk = p.pack()
    train = pk.for_component("train")
    assert [(s.node_id, s.gpu_indices) for s in train] == [
        ("n0", (0, 1)),
        ("n0", (2, 3)),
        ("n0", (4, 5)),
        ("n0", (6, 7)),
    ]
    env = pk.for_component("env")
    assert [s.worker_id for s in env] == list(range(6))
    assert [(s.gpu_indices, s.gpu_fraction, s.group) for s in env[:4]] == [
        ((2,), 0.5, 0),
        ((2,), 0.5, 0),
        ((3,), 0.5, 0),
        ((3,), 0.5, 0),
    ]
    assert [(s.node_id, s.gpu_indices, s.group) for s in env[4:]] == [("n1", (), 1)] * 2
    dist = p.get_component_distribution()
    assert dist["n0"]["buffer"] == {"count": 1, "ids": [0]}
    assert dist["n1"]["eval"] == {"count": 2, "ids": [0, 1]}
    assert dist["n1"]["env"]["ids"] == [0, 1, 2, 3, 4, 5]


def test_skipped_bundles_do_not_shift_workers() -> None:
    cs = ComponentScheduling(train_worker=Scheduling(6, 1, 1))
    p = ResourcePoolPlanner(cs, cluster(8, 8))
    p.load_manual_resource_pools(
        [{"name": "train_pool", "num_node": 2, "num_gpus": 8, "train": "0-1, 4-5, 8-9"}]
    )
    got = [
        (s.worker_id, s.node_id, s.gpu_indices) for s in p.pack().slots if s.component == "train"
    ]
    assert got == [
        (0, "n0", (0,)),
        (1, "n0", (1,)),
        (2, "n0", (4,)),
        (3, "n0", (5,)),
        (4, "n1", (0,)),
        (5, "n1", (1,)),
    ]


def test_physical_gpu_indices_from_discovery() -> None:
    gpus = tuple(GpuInfo(i, f"GPU-{i}", "x", 1, "") for i in (2, 3, 6))
    info = NodeInfo("a", "h", "10.0.0.1", 8, 1, gpus)
    cs = ComponentScheduling(train_worker=Scheduling(1, 1, 1), eval_worker=Scheduling(1, 1, 2))
    p = ResourcePoolPlanner(cs, cluster_info_from_nodes([info]))
    p.plan_resource_pools()
    assert [s.cuda_visible_devices for s in p.pack().slots] == ["2", "3,6"]


def test_does_not_fit_raises_placement_error() -> None:
    cs = ComponentScheduling(train_worker=Scheduling(4, 1, 1))
    p = ResourcePoolPlanner(cs, cluster(8, 8))
    p.load_manual_resource_pools([{"name": "t", "num_node": 1, "num_gpus": 8, "train": "0-2"}])
    with pytest.raises(PlacementError, match="train: worker 3"):
        p.pack()
    cs = ComponentScheduling(train_worker=Scheduling(2, 1, 2))
    p = ResourcePoolPlanner(cs, cluster(8, 8))
    p.load_manual_resource_pools([{"name": "t", "num_node": 2, "num_gpus": 8, "train": "7-9"}])
    with pytest.raises(PlacementError, match="one node"):
        p.pack()  # 7 | 8,9: the first worker cannot span nodes
    cs = ComponentScheduling(train_worker=Scheduling(2, 48, 1))
    p = ResourcePoolPlanner(cs, cluster(8, 8))
    p.load_manual_resource_pools([{"name": "t", "num_node": 1, "num_gpus": 8, "train": "0-1"}])
    with pytest.raises(PlacementError, match="short of 32 CPUs"):
        p.pack()
    with pytest.raises(PlacementError, match="plan_resource_pools"):
        ResourcePoolPlanner(cs, cluster(8)).pack()


def test_cpu_only_spread_and_node_list() -> None:
    cs = ComponentScheduling(
        env_worker=[Scheduling(5, 4, 0), Scheduling(2, 1, 0, node_list=["n2"])],
        eval_worker=Scheduling(3, 1, 1),
    )
    p = ResourcePoolPlanner(cs, cluster(1, 1, 1, cpus=9))
    p.plan_resource_pools()
    env = p.pack().for_component("env")
    assert [s.node_id for s in env] == ["n0", "n0", "n1", "n1", "n2", "n2", "n2"]


def test_check_overcommit() -> None:
    a = WorkerSlot("train", 0, "n", (0,), 1.0, 0)
    b = WorkerSlot("env", 0, "n", (0,), 0.5, 0)
    check_overcommit([a, b], sharing_pairs("colocate"))
    with pytest.raises(PlacementError, match="share GPU 0"):
        check_overcommit([a, b], sharing_pairs("disaggregate"))
    with pytest.raises(PlacementError, match=r"holds 1\.5"):
        check_overcommit([b, b, b], None)


# -- properties ---------------------------------------------------------------------------------

FRACTIONS = st.sampled_from([0, 0.25, 0.3, 0.5, 1, 1, 2])


@st.composite
def problems(draw: st.DrawFn) -> tuple[dict[str, Any], ComponentScheduling, str, str]:
    gpus = draw(st.lists(st.integers(0, 8), min_size=1, max_size=5))
    cpus = draw(st.integers(0, 64))
    envs = [
        Scheduling(draw(st.integers(0, 12)), draw(st.sampled_from([0, 1, 2])), draw(FRACTIONS))
        for _ in range(draw(st.integers(0, 2)))
    ]
    cs = ComponentScheduling(
        env_worker=envs,
        train_worker=Scheduling(draw(st.integers(0, 12)), draw(st.integers(0, 2)), draw(FRACTIONS)),
        eval_worker=Scheduling(draw(st.integers(0, 12)), 1, draw(FRACTIONS)),
        buffer_worker=Scheduling("auto", 1, draw(st.sampled_from([0, 0.5]))),
    )
    strategy = draw(st.sampled_from(["disaggregate", "colocate"]))
    env_strategy = draw(st.sampled_from(["default", "device-colocate"]))
    return cluster(*gpus, cpus=cpus), cs, strategy, env_strategy


def plan_and_pack(problem: tuple[dict[str, Any], ComponentScheduling, str, str]) -> Any:
    info, cs, strategy, env_strategy = problem
    p = ResourcePoolPlanner(cs, info)
    p.plan_resource_pools(strategy, env_strategy)
    return p, p.pack()


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(problems())
def test_every_worker_placed_or_placement_error(
    problem: tuple[dict[str, Any], ComponentScheduling, str, str],
) -> None:
    info, cs, strategy, env_strategy = problem
    try:
        p, pk = plan_and_pack(problem)
    except PlacementError:
        return
    for comp in ("train", "eval", "env"):
        slots = pk.for_component(comp)
        assert [s.worker_id for s in slots] == list(range(cs.worker_count(comp)))
    train_nodes = {s.node_id for s in pk.for_component("train")}
    assert len(pk.for_component("buffer")) == len(train_nodes)
    # no GPU over-committed beyond what the strategy allows; GPUs and CPUs exist
    check_overcommit(pk.slots, sharing_pairs(strategy, env_strategy))
    table = info["node_id_to_resources"]
    for s in pk.slots:
        assert all(0 <= g < table[s.node_id]["GPU"] for g in s.gpu_indices)
        assert 0 < s.gpu_fraction <= 1 if s.gpu_indices else s.gpu_fraction == 0
        assert len(s.gpu_indices) <= 1 or s.gpu_fraction == 1
    for node, res in table.items():
        assert sum(s.cpus for s in pk.slots if s.node_id == node) <= res["CPU"] + 1e-6
    # deterministic, and the YAML export re-imports to the same plan and slots
    assert plan_and_pack(problem)[1] == pk
    q = ResourcePoolPlanner(cs, info)
    q.load_manual_resource_pools(p.to_yaml_config())
    assert {n: x.to_dict() for n, x in q.get_resource_pools().items()} == {
        n: x.to_dict() for n, x in p.get_resource_pools().items()
    }
    assert q.pack() == pk


@settings(max_examples=60, deadline=None)
@given(problems())
def test_enough_room_means_success(
    problem: tuple[dict[str, Any], ComponentScheduling, str, str],
) -> None:
    """With ample GPUs and CPUs on big nodes, nothing may fail (PlacementError is not a dodge)."""
    _, cs, strategy, env_strategy = problem
    train, buffer = cs.train_worker, cs.buffer_worker
    assume(not (train and buffer and train.num_gpus == 0 and buffer.num_gpus > 0))
    plan_and_pack((cluster(64, 64, 64, 64, cpus=512), cs, strategy, env_strategy))
