"""The pipeline config: shipped files load, bad values fail with clear messages."""

from __future__ import annotations

import copy
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from rayless.demo.config import (
    DEFAULT_CONFIG,
    PipelineConfig,
    config_from_dict,
    load_config,
    parse_index_string,
)
from rayless.placement import parse_index_str

CONFIGS = DEFAULT_CONFIG.parent


def _default() -> dict[str, Any]:
    data = yaml.safe_load(DEFAULT_CONFIG.read_text())
    assert isinstance(data, dict)
    return data


def test_shipped_configs_load() -> None:
    cfg = load_config()
    assert cfg.cluster.num_nodes == 2 and cfg.cluster.fake_gpus_per_node > 0
    assert cfg.run.device == "cpu"
    assert [w.worker_num for w in cfg.cluster.env_worker] == [2]
    for kind in ("eval_worker", "train_worker"):
        assert getattr(cfg.cluster, kind).worker_num == 2
    assert cfg.cluster.buffer_worker.worker_num == "auto"  # one per node holding train workers
    assert cfg.buffer.num_storages == 1 and cfg.buffer.node_affinity_train
    assert cfg.policy.router_type == "node_affinity"
    gpu = load_config(CONFIGS / "gpu_8.yaml")
    assert gpu.cluster.num_nodes == 1 and gpu.run.device == "cuda"
    assert gpu.cluster.fake_gpus_per_node == 0


def test_defaults_and_round_trip() -> None:
    assert config_from_dict({}) == PipelineConfig()
    cfg = load_config()
    assert config_from_dict(cfg.to_dict()) == cfg


def test_worker_groups_and_auto_buffer() -> None:
    data = _default()
    data["cluster"]["env_worker"] = [
        {"worker_num": 2, "num_gpus": 0.5, "node_list": "node-0"},
        {"worker_num": 1, "num_gpus": 0.5, "node_list": ["node-1"]},
    ]
    data["cluster"]["buffer_worker"]["worker_num"] = "auto"
    data["cluster"]["fake_gpus_per_node"] = 3
    cfg = config_from_dict(data)  # train 2 + eval 2 + env groups 1 + 1 = 6 GPUs
    assert [w.count for w in cfg.cluster.env_worker] == [2, 1]
    assert [w.gpus_needed() for w in cfg.cluster.env_worker] == [1, 1]
    assert cfg.cluster.buffer_worker.worker_num == "auto"
    data["cluster"]["fake_gpus_per_node"] = 2
    with pytest.raises(ValueError, match="need 6 GPUs"):
        config_from_dict(data)
    data["cluster"]["eval_worker"]["num_gpus"] = 0.4  # two share a GPU: 2 + 1 + 2 = 5
    with pytest.raises(ValueError, match="need 5 GPUs"):
        config_from_dict(data)
    data["cluster"]["fake_gpus_per_node"] = 3
    data["cluster"]["cpus_per_node"] = 1  # workers: 5 x 1 CPU + 2 x 0.25 (default 1.0 each)
    with pytest.raises(ValueError, match=r"need .* CPUs, but 2 nodes x 1 CPUs = 2"):
        config_from_dict(data)


def test_manual_resource_pool() -> None:
    data = _default()
    data["placement"]["mode"] = "manual"
    data["resource_pool"] = [
        {"name": "train_pool", "num_node": 1, "num_gpus": 2, "train": "0-1"},
        {
            "name": "rollout_pool",
            "num_node": 1,
            "num_gpus": [2],
            "node_ids": ["n1"],
            "eval": "0, 1",
            "env": 1,
        },
    ]
    cfg = config_from_dict(data)
    assert cfg.resource_pool is not None
    assert cfg.resource_pool[0].allocations == {"train": "0-1"}
    assert cfg.resource_pool[1].allocations == {"eval": "0, 1", "env": "1"}
    assert config_from_dict(cfg.to_dict()) == cfg
    assert parse_index_string("x", "0-3, 8-11") == [(0, 3), (8, 11)]


def test_demo_range_parser_is_the_planners() -> None:
    """One parser of GPU ranges: the demo config reads "7-4" as the planner does (4-7)."""
    assert parse_index_string("x", "7-4") == parse_index_str("7-4") == [(4, 7)]
    assert parse_index_string("x", "5, 0-1") == parse_index_str("5, 0-1")
    with pytest.raises(ValueError, match=r"^resource_pool\[0\]\.train: bad GPU index range"):
        parse_index_string("resource_pool[0].train", "0-x")


def _set(data: dict[str, Any], dotted: str, value: Any) -> None:
    *parents, last = dotted.split(".")
    for key in parents:
        data = data[key]
    if value is _DELETE:
        del data[last]
    else:
        data[last] = value


_DELETE = object()
POOL = {"name": "p", "num_node": 1, "num_gpus": 2, "train": "0-1"}

BAD: list[tuple[str, Any, str]] = [
    ("cluster.num_nodes", 0, r"cluster\.num_nodes: must be > 0"),
    ("cluster.num_nodes", "two", r"cluster\.num_nodes: expected an integer"),
    ("cluster.embedded", "yes", r"cluster\.embedded: expected true or false"),
    ("cluster.env_worker.worker_num", -1, r"env_worker\.worker_num: must be > 0"),
    ("cluster.eval_worker.num_gpus", 1.5, r"whole number or a fraction"),
    ("cluster.train_worker.gpus", 1, r"unknown key 'gpus'"),
    ("cluster.train_worker.worker_num", "auto", r"'auto' only for buffer_worker"),
    ("cluster.buffer_worker.num_gpus", 2, r"buffer_worker\.num_gpus: must be <= 1"),
    ("cluster.env_worker", [], r"env_worker: needs at least one group"),
    ("cluster.eval_worker.num_gpus", 3, r"need 8 GPUs .* = 4"),
    ("placement.strategy", "spread", r"placement\.strategy: must be one of"),
    ("placement.env_strategy", "colocate", r"env_strategy: must be one of"),
    ("placement.mode", "manual", r"no resource_pool"),
    ("resource_pool", [POOL], r"placement\.mode is 'auto'"),
    ("policy.rollout_mode", "streaming", r"rollout_mode: must be one of sync, async"),
    ("policy.router_type", "random", r"router_type: must be one of simple, node_affinity"),
    ("buffer.num_storages", 3, r"multiple of buffer\.num_storages"),
    ("algo.lr", -0.1, r"algo\.lr: must be > 0"),
    ("algo.gamma", 1.5, r"algo\.gamma: must be in \[0, 1\]"),
    ("algo.hidden_sizes", [], r"hidden_sizes: needs at least one layer"),
    ("algo.hidden_sizes", [64, "x"], r"hidden_sizes\[1\]: expected an integer"),
    ("algo.num_minibatches", 100000, r"exceeds the transitions per train worker"),
    ("algo.max_staleness", -1, r"max_staleness: must be >= 0"),
    ("algo.learning_rate", 0.1, r"algo: unknown key 'learning_rate'"),
    ("run.device", "tpu", r"run\.device: must be 'cpu' or 'cuda'"),
    ("run", [1], r"run: expected a mapping"),
    ("extra", {}, r"config: unknown key 'extra'"),
]


@pytest.mark.parametrize(("key", "value", "message"), BAD, ids=[b[0] for b in BAD])
def test_validation_errors(key: str, value: Any, message: str) -> None:
    data = copy.deepcopy(_default())
    _set(data, key, value)
    with pytest.raises(ValueError, match=message):
        config_from_dict(data)


def test_storages_must_be_a_multiple_of_buffer_workers() -> None:
    data = copy.deepcopy(_default())
    _set(data, "cluster.buffer_worker.worker_num", 2)
    _set(data, "buffer.num_storages", 1)
    with pytest.raises(ValueError, match=r"multiple of cluster\.buffer_worker\.worker_num"):
        config_from_dict(data)


BAD_POOLS: list[tuple[dict[str, Any], str]] = [
    ({**POOL, "gpus": 1}, r"unknown key 'gpus'"),
    ({k: v for k, v in POOL.items() if k != "num_node"}, r"missing required key 'num_node'"),
    ({**POOL, "train": "0-2"}, r"GPU index 2 out of range for a pool of 2"),
    ({**POOL, "train": "1-x"}, r"bad GPU index range"),
    ({**POOL, "node_ids": ["a"]}, r"per-node list when node_ids"),
    ({**POOL, "num_gpus": [2, 2]}, r"expected 1 entries"),
    ({**POOL, "num_node": 3}, r"exceeds cluster\.num_nodes"),
    ({"name": "p", "num_node": 1, "num_gpus": 2}, r"allocates no component"),
]


@pytest.mark.parametrize(("pool", "message"), BAD_POOLS)
def test_resource_pool_errors(pool: dict[str, Any], message: str) -> None:
    data = _default()
    data["placement"]["mode"] = "manual"
    data["resource_pool"] = [pool]
    with pytest.raises(ValueError, match=message):
        config_from_dict(data)
    data["resource_pool"] = [POOL, POOL]
    with pytest.raises(ValueError, match="duplicate pool name"):
        config_from_dict(data)


def test_load_errors_name_the_file(tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("algo: {lr: [\n")
    with pytest.raises(ValueError, match="not valid YAML"):
        load_config(bad)
    bad.write_text("algo: {epochs: 0}\n")
    with pytest.raises(ValueError, match=r"bad\.yaml: algo\.epochs: must be > 0"):
        load_config(bad)
    with pytest.raises(ValueError, match="cannot read config"):
        load_config(tmp_path / "missing.yaml")
    bad.write_text("- 1\n")
    with pytest.raises(ValueError, match="mapping at the top level"):
        load_config(bad)


def test_a_bad_config_is_reported_before_torch_is_imported(tmp_path: Path) -> None:
    # importing torch and tensordict took 26 s of a loaded 2-core machine before the error
    from rayless.demo.grpo_config import load_grpo_config

    shipped = load_grpo_config().to_dict()
    shipped["algo"]["group_size"] = 1
    bad = tmp_path / "bad.yaml"
    bad.write_text(yaml.safe_dump(shipped))
    code = (
        "import sys\n"
        "from rayless.demo.main import main\n"
        f"rc = main(['--config', {str(bad)!r}])\n"
        "print(rc, sorted(m for m in ('torch', 'tensordict') if m in sys.modules))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert "algo.group_size" in out.stderr, out.stderr
    assert out.stdout.split() == ["1", "[]"], out.stdout
