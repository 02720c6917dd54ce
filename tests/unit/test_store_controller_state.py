"""ControllerState: allocation, production/consumption status, samplers, clears, unit loss."""

from __future__ import annotations

from typing import Any

import pytest

from rayless.store.controller.state import ControllerState
from rayless.store.data.meta import BatchMeta
from rayless.store.data.schema import DataUpdate
from rayless.store.errors import (
    ForeignMetaError,
    SchemaError,
    StaleMetaError,
    StoreError,
    StoreInputError,
    UnitLostError,
    UnknownFieldError,
    UnknownPartitionError,
)
from tests.unit.controller_state_helpers import (
    F32,
    I64,
    RAG,
    TXT,
    put,
    snapshot,
    state_with_units,
    write,
)


def test_units_register_and_reregister() -> None:
    c = ControllerState()
    a = c.register_unit("a", node_id="n0", device="cuda:0", capacity_bytes=100)
    b = c.register_unit("b")
    assert (a.shard, b.shard) == (0, 1)
    assert c.register_unit("a", node_id="n9").shard == 0
    assert [u.unit_id for u in c.units()] == ["a", "b"]
    assert c.units()[0].node_id == "n9"
    for bad in ({"unit_id": ""}, {"unit_id": "c", "capacity_bytes": -1}, {"unit_id": 3}):
        before = snapshot(c)
        with pytest.raises(StoreInputError):
            c.register_unit(**bad)  # type: ignore[arg-type]
        assert snapshot(c) == before


def test_allocate_needs_a_live_unit() -> None:
    with pytest.raises(StoreError, match="no live storage unit"):
        ControllerState().allocate("p", 1)
    assert ControllerState().allocate("p", 0).size == 0


def test_allocate_assigns_indexes_and_shards_round_robin() -> None:
    c = state_with_units(3)
    meta = c.allocate("train", 7, custom_meta=[{"i": i} for i in range(7)])
    assert meta.global_indexes == tuple(range(7))
    assert meta.shards == (0, 1, 2, 0, 1, 2, 0)
    assert meta.partition_id == "train" and meta.store_id == "store-1"
    assert meta.custom_meta[3] == {"i": 3}
    assert c.partitions() == ["train"]
    assert [c.shard_of(i) for i in range(7)] == list(meta.shards)
    # indexes are global across partitions
    assert c.allocate("val", 2).global_indexes == (7, 8)


def test_allocate_bad_input_leaves_state_unchanged() -> None:
    c = state_with_units()
    put(c, "train", 2)
    before = snapshot(c)
    bad_calls: list[dict[str, Any]] = [
        {"partition": "", "n": 1},
        {"partition": "p", "n": -1},
        {"partition": "p", "n": 1.5},
        {"partition": "p", "n": 2, "env_ids": ["a"]},
        {"partition": "p", "n": 2, "group_ids": ["a"]},
        {"partition": "p", "n": 1, "custom_meta": [{"a": object()}]},
        {"partition": "p", "n": 1, "custom_meta": ["x"]},
        {"partition": "p", "n": 1, "env_ids": ["e"]},  # no env table
        {"partition": "train", "n": 1, "schemas": {"x": I64}},  # dtype change
        {"partition": "p", "n": 1, "group_ids": [["unhashable"]]},
    ]
    for kw in bad_calls:
        with pytest.raises((StoreInputError, TypeError)):
            c.allocate(**kw)
        assert snapshot(c) == before, kw


def test_env_shard_table() -> None:
    c = ControllerState(env_shards={"env-a": 1, "env-b": 0, "env-z": 7})
    for i in range(2):
        c.register_unit(f"u{i}")
    meta = c.allocate("p", 3, env_ids=["env-a", "env-a", "env-b"])
    assert meta.shards == (1, 1, 0)
    before = snapshot(c)
    with pytest.raises(StoreInputError, match="not in the env-shard table"):
        c.allocate("p", 1, env_ids=["env-c"])
    with pytest.raises(StoreInputError, match="unknown"):
        c.allocate("p", 1, env_ids=["env-z"])
    assert snapshot(c) == before
    c.set_env_shards(lambda env: len(env) % 2)
    assert c.allocate("p", 2, env_ids=["ab", "abc"]).shards == (0, 1)
    c.mark_unit_lost("u1")
    with pytest.raises(UnitLostError, match="u1"):
        c.allocate("p", 1, env_ids=["abc"])


def test_freed_indexes_are_reused_only_after_release() -> None:
    c = state_with_units()
    m = put(c, "train", 6)
    plan = c.clear(m.select([1, 4]))
    assert plan.shards == {1: {"train": [1]}, 0: {"train": [4]}}
    assert sorted(plan.indexes) == [1, 4]
    assert c.allocate("train", 1).global_indexes == (6,)  # 1 and 4 wait for release
    c.release(plan.indexes)
    assert c.allocate("train", 3).global_indexes == (1, 4, 7)
    with pytest.raises(StoreInputError):
        c.release([1])  # allocated again, not waiting
    assert c.stats().high_water == 8


def test_production_status_and_column_wise_readiness() -> None:
    c = state_with_units()
    meta = c.allocate("train", 4, schemas={"prompt": RAG})
    assert c.try_fetch("train", ["prompt"], 1, mode="peek") is None
    write(c, meta, {"prompt": RAG}, {"prompt": [(3,), (1,), (2,), (5,)]})
    assert c.ready_indexes("train", ["prompt"]) == [0, 1, 2, 3]
    assert c.ready_indexes("train", ["prompt", "reward"]) == []
    # a column-wise stage adds rewards to two samples
    sub = meta.select([2, 0])
    c.check_put(sub, {"reward": I64})
    write(c, sub, {"reward": I64})
    assert c.ready_indexes("train", ["prompt", "reward"]) == [0, 2]
    status = c.production_status("train")
    assert status.samples == 4 and status.fields == {"prompt": 4, "reward": 2}
    got = c.try_fetch("train", ["prompt", "reward"], 2, task="train")
    assert got is not None and got.global_indexes == (0, 2)
    assert got.field_names == ["prompt", "reward"]
    assert got.sample_shapes == {"prompt": ((3,), (2,))}
    assert c.consumption_status("train", "train") == {"samples": 4, "consumed": 2}
    with pytest.raises(UnknownPartitionError):
        c.production_status("nope")


def test_fetch_consumes_per_task_and_peek_does_not() -> None:
    c = state_with_units()
    put(c, "train", 4)
    peek = c.try_fetch("train", ["x"], 4, task="a", mode="peek")
    assert peek is not None and peek.size == 4
    first = c.try_fetch("train", ["x"], 3, task="a")
    assert first is not None and first.global_indexes == (0, 1, 2)
    assert c.try_fetch("train", ["x"], 2, task="a") is None  # only 1 left for task a
    other = c.try_fetch("train", ["x"], 4, task="b")  # task b is independent
    assert other is not None and other.size == 4
    rest = c.try_fetch("train", ["x"], None, task="a")
    assert rest is not None and rest.global_indexes == (3,)
    empty = c.try_fetch("train", ["x"], None, task="a")
    assert empty is not None and empty.size == 0
    c.reset_consumption("a")
    again = c.try_fetch("train", ["x"], 4, task="a")
    assert again is not None and again.size == 4
    c.reset_consumption("b", "train")
    with pytest.raises(UnknownPartitionError):
        c.reset_consumption("b", "nope")


def test_fetch_of_missing_partition_or_field_waits() -> None:
    c = state_with_units()
    assert c.try_fetch("later", ["x"], 1) is None
    all_now = c.try_fetch("later", ["x"], None)
    assert all_now is not None and all_now.size == 0
    put(c, "later", 1)
    assert c.try_fetch("later", ["y"], 1) is None
    assert c.try_fetch("later", ["x"], 1) is not None


def test_try_fetch_argument_errors_leave_state_unchanged() -> None:
    c = state_with_units()
    put(c, "train", 4)
    before = snapshot(c)
    for kw in (
        {"fields": [], "batch_size": 1},
        {"fields": "x", "batch_size": 1},
        {"fields": ["x"], "batch_size": 0},
        {"fields": ["x"], "batch_size": 2, "mode": "steal"},
        {"fields": ["x"], "batch_size": 2, "task": ""},
        {"fields": ["x"], "batch_size": 2, "sampler": "nope"},
        {"fields": ["x"], "batch_size": 3, "sampler": {"name": "grouped", "n": 2}},
    ):
        with pytest.raises(StoreInputError):
            c.try_fetch("train", **kw)  # type: ignore[arg-type]
        assert snapshot(c) == before, kw


def test_grouped_sampler_keeps_groups_together() -> None:
    c = state_with_units(3)
    meta = c.allocate("grpo", 8, schemas={"x": F32})  # 2 prompts x 4 responses
    # only 3 responses of prompt 0 and all of prompt 1 are written
    write(c, meta.select([0, 1, 2, 4, 5, 6, 7]), {"x": F32})
    spec = {"name": "grouped", "n": 4}
    got = c.try_fetch("grpo", ["x"], 4, sampler=spec)
    assert got is not None and got.global_indexes == (4, 5, 6, 7)
    assert c.try_fetch("grpo", ["x"], 4, sampler=spec) is None
    write(c, meta.select([3]), {"x": F32})
    got = c.try_fetch("grpo", ["x"], 4, sampler=spec)
    assert got is not None and got.global_indexes == (0, 1, 2, 3)


def test_grouped_sampler_with_explicit_group_ids() -> None:
    c = state_with_units()
    meta = c.allocate("grpo", 6, group_ids=["a", "b", "a", "c", "b", "c"], schemas={"x": F32})
    write(c, meta.select([0, 1, 2, 3, 4]), {"x": F32})
    got = c.try_fetch("grpo", ["x"], 4, sampler={"name": "grouped", "n": 2})
    assert got is not None and got.global_indexes == (0, 2, 1, 4)
    assert c.try_fetch("grpo", ["x"], 2, sampler={"name": "grouped", "n": 2}) is None


def test_random_sampler_spec_advances_per_task() -> None:
    c = state_with_units()
    put(c, "train", 40)
    spec = {"name": "random", "seed": 0}
    a = c.try_fetch("train", ["x"], 5, task="t", sampler=spec, mode="peek")
    b = c.try_fetch("train", ["x"], 5, task="t", sampler=spec, mode="peek")
    assert a is not None and b is not None and a.global_indexes != b.global_indexes
    c2 = state_with_units()
    put(c2, "train", 40)
    a2 = c2.try_fetch("train", ["x"], 5, task="t", sampler=spec, mode="peek")
    assert a2 is not None and a2.global_indexes == a.global_indexes


def test_on_data_update_validation_leaves_state_unchanged() -> None:
    c = state_with_units()
    meta = put(c, "train", 4)
    c.allocate("other", 1)
    before = snapshot(c)
    bad: list[tuple[str, Any, type[Exception]]] = [
        ("ghost", DataUpdate("train", [0], {"x": F32}), StoreInputError),
        ("u0", DataUpdate("nope", [0], {"x": F32}), UnknownPartitionError),
        ("u0", DataUpdate("train", [1], {"x": F32}), StoreInputError),  # 1 lives on u1
        ("u0", DataUpdate("train", [0, 0], {"x": F32}), StoreInputError),
        ("u0", DataUpdate("train", [99], {"x": F32}), StoreInputError),
        ("u0", DataUpdate("train", [4], {"x": F32}), StoreInputError),  # 4 is in "other"
        ("u0", DataUpdate("train", [0], {"x": I64}), SchemaError),
        ("u0", DataUpdate("train", [0, 2], {"y": I64, "x": I64}), SchemaError),
        ("u0", DataUpdate("train", [0], {"r": RAG}, {"r": [(1,), (2,)]}), StoreInputError),
        ("u0", DataUpdate("train", [0], {"r": RAG}, {"q": [(1,)]}), StoreInputError),
        ("u0", {"partition": "train"}, StoreInputError),
    ]
    for unit, update, exc in bad:
        with pytest.raises(exc):
            c.on_data_update(unit, update)
        assert snapshot(c) == before, update
    assert meta.size == 4


def test_check_meta_foreign_and_stale() -> None:
    c = state_with_units()
    meta = put(c, "train", 3)
    other = ControllerState("store-2")
    other.register_unit("u0")
    with pytest.raises(ForeignMetaError):
        c.check_meta(other.allocate("train", 1))
    with pytest.raises(StoreInputError):
        c.check_meta("meta")  # type: ignore[arg-type]
    plan = c.clear(meta.select([0]))
    with pytest.raises(StaleMetaError):
        c.check_meta(meta)
    c.release(plan.indexes)
    reused = c.allocate("train", 1)
    assert reused.global_indexes == (0,)
    with pytest.raises(StaleMetaError):  # index 0 is a new sample now
        c.check_meta(meta.select([0]))
    cleared = c.clear(meta)  # what is gone already is skipped, the new sample at 0 stays
    assert sorted(cleared.indexes) == [1, 2]
    c.check_meta(reused)
    assert c.clear(meta).indexes == []  # clearing cleared samples again: a no-op (as TQ)
    with pytest.raises(ForeignMetaError):
        c.clear(other.allocate("train", 1))


def test_check_readable() -> None:
    c = state_with_units()
    meta = put(c, "train", 4)
    full = c.meta_of("train", [0, 1, 2, 3])
    assert full.field_names == ["x"]
    c.check_readable(full)
    with pytest.raises(UnknownFieldError):
        c.check_readable(full.with_fields({"y": I64}))
    with pytest.raises(UnknownFieldError):
        c.meta_of("train", [0], ["y"])
    with pytest.raises(StoreInputError):
        c.meta_of("train", [0, 0])
    with pytest.raises(StoreInputError):
        c.meta_of("train", [42])
    assert meta.size == 4


def test_check_put_dtype_change_and_foreign() -> None:
    c = state_with_units()
    meta = put(c, "train", 2)
    with pytest.raises(SchemaError, match="dtype"):
        c.check_put(meta, {"x": I64})
    c.check_put(meta, {"x": F32, "y": TXT})
    with pytest.raises(ForeignMetaError):
        c.check_put(BatchMeta("elsewhere", (0,), ("train",), (0,), (1,)), {"x": F32})


def test_unit_loss_marks_samples_not_ready() -> None:
    c = state_with_units()
    meta = put(c, "train", 4)
    affected = c.mark_unit_lost("u1", "killed")
    assert affected == {"train": [1, 3]}
    assert c.ready_indexes("train", ["x"]) == [0, 2]
    with pytest.raises(UnitLostError, match="u1"):
        c.check_readable(meta)
    c.check_readable(meta.select([0, 2]))
    with pytest.raises(UnitLostError):
        c.check_put(meta, {"x": F32})
    # writes after the loss go to live units only
    assert c.allocate("train", 2).shards == (0, 0)
    with pytest.raises(UnitLostError):
        c.on_data_update("u1", DataUpdate("train", [1], {"x": F32}))
    # the unit comes back (restart): its samples stay lost until rewritten
    c.register_unit("u1")
    with pytest.raises(UnitLostError, match="u1"):
        c.check_readable(meta.select([1]))
    c.on_data_update("u1", DataUpdate("train", [1], {"x": F32}))
    c.check_readable(meta.select([1]))
    assert c.ready_indexes("train", ["x"]) == [0, 1, 2]


def test_clear_partition_and_schema_forgotten() -> None:
    c = state_with_units()
    meta = put(c, "train", 3)
    c.try_fetch("train", ["x"], 2, task="t", sampler={"name": "random", "seed": 1})
    with pytest.raises(UnknownPartitionError):
        c.clear_partition("nope")
    plan = c.clear_partition("train")
    assert sorted(plan.indexes) == [0, 1, 2]
    assert plan.shards == {0: {"train": [0, 2]}, 1: {"train": [1]}}
    assert c.partitions() == []
    c.release(plan.indexes)
    # the field's schema went with its last sample: a new dtype is fine now
    meta2 = c.allocate("train", 1, schemas={"x": I64})
    write(c, meta2, {"x": I64})
    assert c.production_status("train").schemas["x"].dtype == "int64"
    assert meta.size == 3


def test_clear_drops_consumption_and_schema_of_cleared_samples() -> None:
    c = state_with_units()
    meta = put(c, "train", 2)
    c.try_fetch("train", ["x"], 2, task="t")
    c.clear(meta)
    assert c.consumption_status("train", "t") == {"samples": 0, "consumed": 0}
    assert c.production_status("train").schemas == {}


def test_set_custom_meta() -> None:
    c = state_with_units()
    meta = put(c, "train", 2)
    c.set_custom_meta(meta, [{"score": 1.5}, {"score": None}])
    got = c.try_fetch("train", ["x"], 2)
    assert got is not None and got.custom_meta == ({"score": 1.5}, {"score": None})
    before = snapshot(c)
    with pytest.raises(StoreInputError):
        c.set_custom_meta(meta, [{"score": {1, 2}}, {}])
    assert snapshot(c) == before
