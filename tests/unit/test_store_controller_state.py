"""ControllerState: allocation, production/consumption status, samplers, clears, unit loss."""

from __future__ import annotations

import copy
from typing import Any

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from rayless.store.controller_state import ControllerState
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
from rayless.store.meta import BatchMeta
from rayless.store.schema import DataUpdate, FieldSchema

F32 = FieldSchema("dense", "float32", (2,), "cpu")
I64 = FieldSchema("dense", "int64", (), "cpu")
RAG = FieldSchema("jagged", "int64", (None,), "cpu")
TXT = FieldSchema("non_tensor")


def snapshot(c: ControllerState) -> dict[str, Any]:
    state = {k: v for k, v in vars(c).items() if k != "_samplers"}
    return copy.deepcopy(state)


def state_with_units(n: int = 2) -> ControllerState:
    c = ControllerState("store-1")
    for i in range(n):
        c.register_unit(f"u{i}", node_id=f"node{i}", capacity_bytes=1 << 20)
    return c


def write(
    c: ControllerState,
    meta: BatchMeta,
    schemas: dict[str, FieldSchema],
    shapes: dict[str, list[tuple[int, ...]]] | None = None,
) -> None:
    """What the units do after writing ``meta``'s samples: notify per shard."""
    for shard, positions in meta.by_shard().items():
        idx = [meta.global_indexes[p] for p in positions]
        sub_shapes = {f: [s[p] for p in positions] for f, s in (shapes or {}).items()}
        c.on_data_update(f"u{shard}", DataUpdate(meta.partition_id, idx, schemas, sub_shapes))


def put(c: ControllerState, partition: str, n: int, **kw: Any) -> BatchMeta:
    meta = c.allocate(partition, n, schemas={"x": F32}, **kw)
    write(c, meta, {"x": F32})
    return meta


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
    assert c.stats()["high_water"] == 8


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
    assert status["samples"] == 4 and status["fields"] == {"prompt": 4, "reward": 2}
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
    before = snapshot(c)
    with pytest.raises(StaleMetaError):
        c.clear(meta)  # clear validates all before removing any
    assert snapshot(c) == before


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
    assert plan.to_dict()["shards"] == {"0": {"train": [0, 2]}, "1": {"train": [1]}}
    c.release(plan.indexes)
    # the field's schema went with its last sample: a new dtype is fine now
    meta2 = c.allocate("train", 1, schemas={"x": I64})
    write(c, meta2, {"x": I64})
    assert c.production_status("train")["schemas"]["x"]["dtype"] == "int64"
    assert meta.size == 3


def test_clear_drops_consumption_and_schema_of_cleared_samples() -> None:
    c = state_with_units()
    meta = put(c, "train", 2)
    c.try_fetch("train", ["x"], 2, task="t")
    c.clear(meta)
    assert c.consumption_status("train", "t") == {"samples": 0, "consumed": 0}
    assert c.production_status("train")["schemas"] == {}


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


# -- issue 12: reliability at the edges ----------------------------------------------


def test_atomic_put_becomes_ready_only_once_every_unit_wrote() -> None:
    c = state_with_units()
    meta = c.allocate("p", 4, schemas={"x": F32}, atomic=True)
    u0 = [meta.global_indexes[p] for p in meta.by_shard()[0]]
    u1 = [meta.global_indexes[p] for p in meta.by_shard()[1]]
    assert c.on_data_update("u0", DataUpdate("p", u0, {"x": F32})) == []
    # one unit's half of the put is stored but not acknowledged: never visible
    assert c.ready_indexes("p", ["x"]) == [] and c.stats()["staged"] == 4
    nothing = c.try_fetch("p", ["x"], None)
    assert nothing is not None and nothing.size == 0
    assert c.on_data_update("u1", DataUpdate("p", u1, {"x": F32})) == list(meta.global_indexes)
    assert c.ready_indexes("p", ["x"]) == list(meta.global_indexes)
    assert c.stats()["staged"] == 0


def test_a_torn_atomic_put_is_never_ready_and_clears_away() -> None:
    c = state_with_units()
    meta = c.allocate("p", 4, schemas={"x": F32}, atomic=True)
    u0 = [meta.global_indexes[p] for p in meta.by_shard()[0]]
    c.on_data_update("u0", DataUpdate("p", u0, {"x": F32}))  # the producer dies here
    plan = c.clear(meta)  # what the reclaimer does
    assert sorted(plan.indexes) == sorted(meta.global_indexes)
    assert c.stats()["staged"] == 0 and c.ready_indexes("p", ["x"]) == []
    # an atomic put whose last write conflicts with a committed schema is refused whole
    other = c.allocate("q", 2, schemas={"y": F32}, atomic=True)
    first = c.allocate("q", 2, schemas={"y": I64}, atomic=True)
    c.on_data_update("u0", DataUpdate("q", [other.global_indexes[0]], {"y": F32}))
    write(c, first, {"y": I64})
    before = snapshot(c)
    with pytest.raises(SchemaError):
        c.on_data_update("u1", DataUpdate("q", [other.global_indexes[1]], {"y": F32}))
    assert snapshot(c) == before
    with pytest.raises(StoreInputError, match="different puts"):
        mixed = [other.global_indexes[1], first.global_indexes[1]]
        c.on_data_update("u1", DataUpdate("q", mixed, {"y": I64}))


def test_unit_loss_fails_only_fetches_that_waited_through_it() -> None:
    c = state_with_units()
    put(c, "p", 4)
    start = c.loss_count("p")
    assert c.lost_since("p", start) is None and c.loss_count("nope") == 0
    c.mark_unit_lost("u1")
    assert c.lost_since("p", start) == "u1"  # a fetch waiting through the loss
    later = c.loss_count("p")
    assert c.lost_since("p", later) is None  # a later fetch waits for new data instead
    assert c.production_status("p")["lost"] == 2
    lost = c.lost_meta("p")
    assert lost.global_indexes == (1, 3) and lost.field_names == []
    new = put(c, "p", 3)
    got = c.try_fetch("p", ["x"], 5, task="t")
    assert got is not None and set(got.global_indexes) == {0, 2, *new.global_indexes}
    c.clear(lost)
    assert c.production_status("p")["lost"] == 0 and c.lost_meta("p").size == 0


def test_lost_positions_name_the_lost_part_of_a_meta() -> None:
    c = state_with_units()
    meta = put(c, "p", 4)
    assert c.lost_positions(meta) == {}
    c.mark_unit_lost("u1")
    assert c.lost_positions(meta) == {1: "u1", 3: "u1"}
    with pytest.raises(UnknownFieldError):  # live samples still need their fields
        c.lost_positions(meta.with_fields({"y": I64}))
    c.try_fetch("p", ["x"], 2, task="t")
    c.reset_consumption("t", meta=meta.select([0]))
    again = c.try_fetch("p", ["x"], None, task="t")
    assert again is not None and again.global_indexes == (0,)
    with pytest.raises(StoreInputError):
        c.reset_consumption("t", "q", meta=meta)


def test_a_forged_shard_in_a_meta_is_a_typed_error() -> None:
    c = state_with_units()
    meta = put(c, "p", 2)
    forged = BatchMeta("store-1", meta.global_indexes, meta.partition_ids, (7, 0), (1, 1))
    before = snapshot(c)
    for call in (c.check_meta, c.check_readable, c.clear, lambda m: c.check_put(m, {"x": F32})):
        with pytest.raises(StoreInputError, match="forged"):
            call(forged)
    assert snapshot(c) == before


def test_a_failed_column_wise_put_is_undone() -> None:
    c = state_with_units()
    meta = put(c, "p", 4)
    write(c, meta.select([0]), {"y": I64})
    fresh = c.check_put(meta, {"x": F32, "y": I64, "z": RAG})
    assert fresh == {"p": {"y": [1, 2, 3], "z": [0, 1, 2, 3]}}
    write(c, meta.select([0, 2]), {"y": I64, "z": RAG}, {"z": [(1,), (2,)]})  # unit 0 wrote
    rows = c.drop_fields(meta, fresh)  # unit 1 failed
    assert rows == {0: {"p": {"y": [2], "z": [0, 2]}}, 1: {"p": {"y": [1, 3], "z": [1, 3]}}}
    status = c.production_status("p")
    assert status["fields"] == {"x": 4, "y": 1} and "z" not in status["schemas"]
    with pytest.raises(StoreInputError):
        c.drop_fields(meta.select([0]), {"p": {"y": [3]}})


def test_abort_drops_the_partition_the_put_created() -> None:
    c = state_with_units()
    meta = c.allocate("new", 2, schemas={"x": F32}, atomic=True)
    c.abort(meta)
    assert c.partitions() == []
    kept = put(c, "old", 1)
    failed = c.allocate("old", 2, schemas={"x": F32}, atomic=True)
    c.abort(failed)
    assert c.partitions() == ["old"]
    c.clear(kept)
    assert c.partitions() == ["old"]  # a user's clear keeps the (empty) partition


# -- properties ------------------------------------------------------------------------


class ControllerMachine(RuleBasedStateMachine):
    """Random allocate/update/fetch/clear/release sequences against a simple model.

    Atomic allocations (a put) show no field of any of their samples until every sample was
    written once; then all the fields written meanwhile show at once. Column-wise puts show
    the field they add on none of their samples until every sample's unit reported; an
    aborted one never shows, and refuses later reports.
    """

    FIELDS = ("a", "b")
    TASKS = ("t1", "t2")

    def __init__(self) -> None:
        super().__init__()
        self.c = ControllerState("prop")
        for i in range(3):
            self.c.register_unit(f"u{i}")
        self.live: dict[int, str] = {}  # index -> partition
        self.written: dict[int, set[str]] = {}
        self.consumed: dict[str, set[int]] = {t: set() for t in self.TASKS}
        self.pending: list[int] = []
        self.ever: set[int] = set()
        self.staged: dict[int, int] = {}  # index -> its atomic put's serial
        self.waiting: dict[int, set[int]] = {}  # serial -> indexes not written yet
        self.held: dict[int, set[str]] = {}  # staged index -> fields written, not shown yet
        self.gen: dict[int, int] = {}  # live index -> its allocation's generation
        # column-wise put id -> (partition, field, {index: generation}, indexes not reported)
        self.col: dict[int, tuple[str, str, dict[int, int], set[int]]] = {}
        self.aborted: list[tuple[int, str, str, int, int]] = []  # put id, part, field, i, gen

    @rule(partition=st.sampled_from(["p", "q"]), n=st.integers(1, 5))
    def allocate_atomic(self, partition: str, n: int) -> None:
        meta = self.c.allocate(partition, n, schemas={"a": I64}, atomic=True)
        for i in meta.global_indexes:
            assert i not in self.live, "an index was handed out twice"
            self.live[i] = partition
            self.written[i] = set()
            self.ever.add(i)
            self.staged[i] = meta.generations[0]
            self.held[i] = set()
            self.gen[i] = meta.generations[0]
        self.waiting[meta.generations[0]] = set(meta.global_indexes)

    @rule(partition=st.sampled_from(["p", "q"]), n=st.integers(0, 5))
    def allocate(self, partition: str, n: int) -> None:
        meta = self.c.allocate(partition, n)
        for i, g in zip(meta.global_indexes, meta.generations, strict=True):
            assert i not in self.live, "an index was handed out twice"
            self.live[i] = partition
            self.written[i] = set()
            self.ever.add(i)
            self.gen[i] = g

    def _in_column_put(self, i: int) -> bool:
        return any(i in members for _, _, members, _ in self.col.values())

    @precondition(lambda self: any(i not in self.staged for i in self.live))
    @rule(data=st.data(), field=st.sampled_from(FIELDS))
    def begin_column_put(self, data: st.DataObject, field: str) -> None:
        free = [i for i in sorted(self.live) if i not in self.staged and not self._in_column_put(i)]
        if not free:
            return
        partition = self.live[data.draw(st.sampled_from(free))]
        pool = [i for i in free if self.live[i] == partition]
        chosen = data.draw(st.lists(st.sampled_from(pool), min_size=1, unique=True))
        put_id, fresh = self.c.begin_column_put(self._meta(partition, chosen), {field: I64})
        assert set(fresh.get(partition, {}).get(field, [])) == {
            i for i in chosen if field not in self.written[i]
        }
        self.col[put_id] = (partition, field, {i: self.gen[i] for i in chosen}, set(chosen))

    @precondition(lambda self: self.col)
    @rule(data=st.data())
    def column_update(self, data: st.DataObject) -> None:
        put_id = data.draw(st.sampled_from(sorted(self.col)))
        partition, field, members, waiting = self.col[put_id]
        # a unit reports its own samples that are still the put's (a cleared one: never)
        sendable = [i for i in sorted(waiting) if self.gen.get(i) == members[i]]
        if not sendable:
            return
        shard = self.c.shard_of(data.draw(st.sampled_from(sendable)))
        idx = [i for i in sendable if self.c.shard_of(i) == shard]
        upd = DataUpdate(partition, idx, {field: I64}, put_id=put_id)
        ready = self.c.on_data_update(f"u{shard}", upd)
        waiting -= set(idx)
        if waiting:
            assert ready == []
            return
        del self.col[put_id]
        still = [i for i, g in members.items() if self.gen.get(i) == g]  # not cleared meanwhile
        assert sorted(ready) == sorted(still)
        for i in still:
            self.written[i].add(field)

    @precondition(lambda self: self.col)
    @rule(data=st.data())
    def abort_column_put(self, data: st.DataObject) -> None:
        put_id = data.draw(st.sampled_from(sorted(self.col)))
        partition, field, members, waiting = self.col.pop(put_id)
        rows = self.c.abort_column_put(put_id)
        named = {i for plan in rows.values() for i in plan.get(partition, {}).get(field, [])}
        assert named == {
            i for i, g in members.items() if self.gen.get(i) == g and field not in self.written[i]
        }
        for i in sorted(waiting):
            self.aborted.append((put_id, partition, field, i, members[i]))

    @precondition(lambda self: self.aborted)
    @rule(data=st.data())
    def late_report_of_an_aborted_put(self, data: st.DataObject) -> None:
        put_id, partition, field, i, gen = self.aborted.pop(
            data.draw(st.integers(0, len(self.aborted) - 1))
        )
        if self.gen.get(i) != gen:
            return  # the sample is gone: a report would be refused for that already
        with pytest.raises(StoreInputError):
            upd = DataUpdate(partition, [i], {field: I64}, put_id=put_id)
            self.c.on_data_update(f"u{self.c.shard_of(i)}", upd)

    @precondition(lambda self: self.live)
    @rule(data=st.data(), field=st.sampled_from(FIELDS))
    def update(self, data: st.DataObject, field: str) -> None:
        index = data.draw(st.sampled_from(sorted(self.live)))
        shard = self.c.shard_of(index)
        self.c.on_data_update(f"u{shard}", DataUpdate(self.live[index], [index], {field: I64}))
        serial = self.staged.get(index)
        if serial is None:
            self.written[index].add(field)
            return
        self.held[index].add(field)
        self.waiting[serial].discard(index)
        if not self.waiting[serial]:  # the put's last write: all of it shows
            del self.waiting[serial]
            for i in [i for i, s in self.staged.items() if s == serial]:
                self.written[i] |= self.held.pop(i)
                del self.staged[i]

    @rule(
        partition=st.sampled_from(["p", "q"]),
        fields=st.sampled_from([("a",), ("b",), ("a", "b")]),
        task=st.sampled_from(TASKS),
        size=st.integers(1, 4),
        mode=st.sampled_from(["fetch", "peek"]),
    )
    def fetch(
        self, partition: str, fields: tuple[str, ...], task: str, size: int, mode: str
    ) -> None:
        expect = [
            i
            for i, p in self.live.items()
            if p == partition and set(fields) <= self.written[i] and i not in self.consumed[task]
        ]
        got = self.c.try_fetch(partition, list(fields), size, task=task, mode=mode)
        if len(expect) < size:
            assert got is None
            return
        assert got is not None and len(got) == size
        for i in got.global_indexes:
            assert i in expect, "fetched a sample not ready, or already consumed by the task"
        if mode == "fetch":
            self.consumed[task].update(got.global_indexes)

    @precondition(lambda self: self.live)
    @rule(data=st.data())
    def clear(self, data: st.DataObject) -> None:
        partition = data.draw(st.sampled_from(sorted(set(self.live.values()))))
        idx = [i for i, p in self.live.items() if p == partition]
        chosen = data.draw(st.lists(st.sampled_from(idx), min_size=1, unique=True))
        plan = self.c.clear(self._meta(partition, chosen))
        assert sorted(plan.indexes) == sorted(chosen)
        for i in chosen:
            del self.live[i]
            del self.written[i]
            del self.gen[i]
            serial = self.staged.pop(i, None)
            if serial is not None:
                del self.held[i]
                self.waiting[serial].discard(i)
                if not any(s == serial for s in self.staged.values()):
                    del self.waiting[serial]
            for s in self.consumed.values():
                s.discard(i)
        self.pending.extend(chosen)

    def _meta(self, partition: str, indexes: list[int]) -> BatchMeta:
        return self.c.meta_of(partition, indexes, fields=None)

    @precondition(lambda self: self.pending)
    @rule()
    def release(self) -> None:
        self.c.release(self.pending)
        self.pending = []

    @rule(task=st.sampled_from(TASKS))
    def reset(self, task: str) -> None:
        self.c.reset_consumption(task)
        self.consumed[task] = set()

    @invariant()
    def ready_iff_all_fields_written(self) -> None:
        for partition in ("p", "q"):
            for fields in (["a"], ["b"], ["a", "b"]):
                model = sorted(
                    i
                    for i, p in self.live.items()
                    if p == partition and set(fields) <= self.written[i]
                )
                assert sorted(self.c.ready_indexes(partition, fields)) == model

    @invariant()
    def indexes_stay_compact(self) -> None:
        stats = self.c.stats()
        assert stats["allocated"] == len(self.live)
        assert stats["pending_release"] == len(self.pending)
        assert stats["high_water"] == len(self.ever)
        assert stats["staged"] == len(self.staged)
        assert stats["column_puts"] == len(self.col)


ControllerMachine.TestCase.settings = settings(
    max_examples=40, stateful_step_count=30, deadline=None
)
TestControllerMachine = ControllerMachine.TestCase


def test_a_column_wise_put_becomes_ready_only_once_all_its_units_wrote() -> None:
    c = state_with_units(2)
    meta = put(c, "p", 4)  # samples on both shards
    put_id, fresh = c.begin_column_put(meta, {"y": I64})
    assert fresh == {"p": {"y": list(meta.global_indexes)}}
    by_shard = meta.by_shard()
    first = [meta.global_indexes[p] for p in by_shard[0]]
    second = [meta.global_indexes[p] for p in by_shard[1]]
    assert c.on_data_update("u0", DataUpdate("p", first, {"y": I64}, put_id=put_id)) == []
    assert c.ready_indexes("p", ["x", "y"]) == []  # half a put never shows
    ready = c.on_data_update("u1", DataUpdate("p", second, {"y": I64}, put_id=put_id))
    assert sorted(ready) == sorted(meta.global_indexes)
    assert sorted(c.ready_indexes("p", ["x", "y"])) == sorted(meta.global_indexes)
    assert len(c.column_puts) == 0


def test_an_aborted_column_wise_put_refuses_late_writes_and_names_its_rows() -> None:
    c = state_with_units(2)
    meta = put(c, "p", 4)
    before = c.production_status("p")
    put_id, _ = c.begin_column_put(meta, {"y": I64})
    first = [meta.global_indexes[p] for p in meta.by_shard()[0]]
    second = [meta.global_indexes[p] for p in meta.by_shard()[1]]
    c.on_data_update("u0", DataUpdate("p", first, {"y": I64}, put_id=put_id))
    rows = c.abort_column_put(put_id)
    assert rows == {0: {"p": {"y": first}}, 1: {"p": {"y": second}}}
    with pytest.raises(StoreInputError, match="aborted"):
        c.on_data_update("u1", DataUpdate("p", second, {"y": I64}, put_id=put_id))
    assert c.production_status("p") == before and c.ready_indexes("p", ["y"]) == []
    assert c.abort_column_put(put_id) == {}  # idempotent
    # an update naming samples outside the put is refused
    other = put(c, "p", 2)
    put_id, _ = c.begin_column_put(meta, {"y": I64})
    with pytest.raises(StoreInputError, match="outside"):
        c.on_data_update(
            f"u{other.shards[0]}",
            DataUpdate("p", [other.global_indexes[0]], {"y": I64}, put_id=put_id),
        )


def test_a_column_wise_put_skips_samples_cleared_while_it_ran() -> None:
    c = state_with_units(1)
    meta = put(c, "p", 3)
    put_id, _ = c.begin_column_put(meta, {"y": I64})
    c.clear(meta.select([0]))
    c.release([meta.global_indexes[0]])
    again = put(c, "p", 1)  # reuses the cleared index, a new generation
    assert again.global_indexes[0] == meta.global_indexes[0]
    kept = list(meta.global_indexes[1:])
    # the unit wrote all three rows; the reused index now names another sample: not made ready
    ready = c.on_data_update(
        "u0", DataUpdate("p", list(meta.global_indexes), {"y": I64}, put_id=put_id)
    )
    assert sorted(ready) == sorted(kept) and len(c.column_puts) == 0
    assert sorted(c.ready_indexes("p", ["y"])) == sorted(kept)
