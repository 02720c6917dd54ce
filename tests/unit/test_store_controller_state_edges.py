"""ControllerState at the edges: atomic and column-wise puts, torn puts, unit loss while
fetches wait, forged metas, aborts."""

from __future__ import annotations

import pytest

from rayless.store.data.meta import BatchMeta
from rayless.store.data.schema import DataUpdate
from rayless.store.errors import SchemaError, StoreInputError, UnknownFieldError
from tests.unit.controller_state_helpers import (
    F32,
    I64,
    RAG,
    put,
    snapshot,
    state_with_units,
    write,
)


def test_atomic_put_becomes_ready_only_once_every_unit_wrote() -> None:
    c = state_with_units()
    meta = c.allocate("p", 4, schemas={"x": F32}, atomic=True)
    u0 = [meta.global_indexes[p] for p in meta.by_shard()[0]]
    u1 = [meta.global_indexes[p] for p in meta.by_shard()[1]]
    assert c.on_data_update("u0", DataUpdate("p", u0, {"x": F32})) == []
    # one unit's half of the put is stored but not acknowledged: never visible
    assert c.ready_indexes("p", ["x"]) == [] and c.stats().staged == 4
    nothing = c.try_fetch("p", ["x"], None)
    assert nothing is not None and nothing.size == 0
    assert c.on_data_update("u1", DataUpdate("p", u1, {"x": F32})) == list(meta.global_indexes)
    assert c.ready_indexes("p", ["x"]) == list(meta.global_indexes)
    assert c.stats().staged == 0


def test_a_torn_atomic_put_is_never_ready_and_clears_away() -> None:
    c = state_with_units()
    meta = c.allocate("p", 4, schemas={"x": F32}, atomic=True)
    u0 = [meta.global_indexes[p] for p in meta.by_shard()[0]]
    c.on_data_update("u0", DataUpdate("p", u0, {"x": F32}))  # the producer dies here
    plan = c.clear(meta)  # what the reclaimer does
    assert sorted(plan.indexes) == sorted(meta.global_indexes)
    assert c.stats().staged == 0 and c.ready_indexes("p", ["x"]) == []
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
    assert c.production_status("p").lost == 2
    lost = c.lost_meta("p")
    assert lost.global_indexes == (1, 3) and lost.field_names == []
    new = put(c, "p", 3)
    got = c.try_fetch("p", ["x"], 5, task="t")
    assert got is not None and set(got.global_indexes) == {0, 2, *new.global_indexes}
    c.clear(lost)
    assert c.production_status("p").lost == 0 and c.lost_meta("p").size == 0


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
    assert status.fields == {"x": 4, "y": 1} and "z" not in status.schemas
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


def test_an_atomic_put_completed_after_one_of_its_units_died_keeps_those_samples_lost() -> None:
    # unit 1 wrote its half and its update is held; unit 1 dies; unit 0's half completes the
    # put. The put committed (its client is told so), so unit 1's samples are acknowledged:
    # they must be reported lost, never ready on a dead unit (a stress run once ended with
    # acknowledged samples that were neither read nor reported lost).
    c = state_with_units()
    meta = c.allocate("p", 4, schemas={"x": F32}, atomic=True)
    u0 = [meta.global_indexes[p] for p in meta.by_shard()[0]]
    u1 = [meta.global_indexes[p] for p in meta.by_shard()[1]]
    assert c.on_data_update("u1", DataUpdate("p", u1, {"x": F32})) == []
    c.mark_unit_lost("u1")
    ready = c.on_data_update("u0", DataUpdate("p", u0, {"x": F32}))
    assert sorted(ready) == sorted(u0)  # only the live unit's samples became ready
    assert c.committed(meta)
    assert c.ready_indexes("p", ["x"]) == u0
    assert sorted(c.lost_meta("p").global_indexes) == sorted(u1)
    assert c.lost_positions(meta) == {p: "u1" for p in meta.by_shard()[1]}
    got = c.try_fetch("p", ["x"], None, task="t")
    assert got is not None and sorted(got.global_indexes) == sorted(u0)
    assert c.stats().staged == 0
