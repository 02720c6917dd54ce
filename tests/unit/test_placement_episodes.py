"""The episode table: env → storage shard, storage → train workers, node affinity."""

from __future__ import annotations

from typing import Any

import pytest

from rayless.placement import EpisodeTable
from rayless.placement.errors import PlacementError

DIST: dict[str, Any] = {
    "a": {"buffer": {"ids": [0]}, "train": {"ids": [0, 1]}, "env": {"ids": [0, 1]}},
    "b": {"buffer": {"ids": [1]}, "train": {"ids": [2, 3]}, "env": {"ids": [2, 3]}},
}


def test_least_loaded_ties_round_robin_and_contiguous_train() -> None:
    t = EpisodeTable(3, [f"env-{i}" for i in range(5)], num_train_workers=6)
    assert t.get_env_to_storage() == {"env-0": 0, "env-1": 1, "env-2": 2, "env-3": 0, "env-4": 1}
    assert t.get_storage_idx_for_env("new") == 2
    assert t.get_storage_idx_for_env("env-0") == 0
    assert t.get_envs_for_storage(2) == ["env-2", "new"]
    assert t.get_storage_to_train_workers() == {0: [0, 1], 1: [2, 3], 2: [4, 5]}
    t.get_storage_to_train_workers()[0].append(99)
    assert t.get_train_workers(0) == [0, 1]  # copies


@pytest.mark.parametrize(
    ("kwargs", "err"),
    [
        ({"num_storages": 0}, ValueError),
        ({"num_storages": 2, "num_train_workers": 3}, ValueError),
        ({"num_storages": 2, "num_train_workers": 0}, ValueError),
        ({"num_storages": 2, "node_affinity_env": True}, ValueError),
    ],
)
def test_argument_errors(kwargs: dict[str, Any], err: type[Exception]) -> None:
    with pytest.raises(err):
        EpisodeTable(**kwargs)


def test_storage_index_out_of_range() -> None:
    t = EpisodeTable(2)
    with pytest.raises(PlacementError, match="out of range"):
        t.get_train_workers(2)
    with pytest.raises(PlacementError):
        t.get_envs_for_storage(-1)
    assert t.get_train_workers(1) == []


def test_node_affinity() -> None:
    t = EpisodeTable(
        2,
        ["cart-3", "cart-0", "cart-2"],
        num_train_workers=4,
        component_distribution=DIST,
        node_affinity_env=True,
        node_affinity_train=True,
    )
    assert t.get_env_to_storage() == {"cart-3": 1, "cart-0": 0, "cart-2": 1}
    assert t.get_storage_idx_for_env("late-1") == 0  # later envs keep affinity
    assert t.get_storage_to_train_workers() == {0: [0, 1], 1: [2, 3]}
    with pytest.raises(PlacementError, match="no worker index"):
        t.get_storage_idx_for_env("cartpole")
    with pytest.raises(PlacementError, match="env worker 9"):
        t.get_storage_idx_for_env("env-9")


@pytest.mark.parametrize(
    ("dist", "match"),
    [
        ({"a": {"buffer": {"ids": [0, 1]}, "env": {"ids": [0]}}}, "multiple buffer"),
        ({"a": {"buffer": {"ids": [5]}, "env": {"ids": [0]}}}, "out of range"),
        ({"a": {"buffer": {"ids": [0]}}, "b": {"env": {"ids": [0]}}}, "no env workers"),
        (
            {
                "a": {"buffer": {"ids": [0]}, "env": {"ids": [0]}},
                "b": {"buffer": {"ids": [1]}, "env": {"ids": [1, 2]}},
            },
            "expected 1",
        ),
        ({"a": {"env": {"ids": [0]}}}, "buffer"),
    ],
)
def test_affinity_validation(dist: dict[str, Any], match: str) -> None:
    with pytest.raises(PlacementError, match=match):
        EpisodeTable(2, ["env-0"], component_distribution=dist, node_affinity_env=True)


def test_train_affinity_count_must_match() -> None:
    with pytest.raises(PlacementError, match="num_train_workers=6"):
        EpisodeTable(2, num_train_workers=6, component_distribution=DIST, node_affinity_train=True)
