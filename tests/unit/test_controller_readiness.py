"""Readiness alone (with the Catalog, Units, StagedPuts and ColumnPuts it uses; samples made
by Allocation): data updates, atomic and column-wise puts, put checks and their undo."""

from __future__ import annotations

import dataclasses

import pytest

from rayless.store.controller.allocation import Allocation
from rayless.store.controller.catalog import Catalog
from rayless.store.controller.column_puts import ColumnPuts
from rayless.store.controller.readiness import Readiness
from rayless.store.controller.staging import StagedPuts
from rayless.store.controller.units import Units
from rayless.store.data.updates import DataUpdate
from rayless.store.errors import SchemaError, StaleMetaError, StoreInputError, UnitLostError
from tests.unit.controller_state_helpers import F32, I64, RAG


def _readiness() -> tuple[Catalog, Units, Allocation, Readiness]:
    cat = Catalog("s")
    units = Units(cat)
    units.register("u0")
    units.register("u1")
    staged = StagedPuts()
    return cat, units, Allocation(cat, units, staged), Readiness(cat, units, staged, ColumnPuts())


def test_a_data_update_makes_its_fields_ready_with_their_shapes() -> None:
    cat, _, alloc, ready = _readiness()
    meta = alloc.allocate("p", 2)  # shards 0, 1
    assert ready.on_data_update("u0", DataUpdate("p", [0], {"r": RAG}, {"r": [(3,)]})) == [0]
    part = cat.part("p")
    assert part.ready_count == {"r": 1} and part.shapes["r"] == {0: (3,)}
    with pytest.raises(StoreInputError, match="not allocated on unit"):
        ready.on_data_update("u0", DataUpdate("p", [1], {"r": RAG}))
    with pytest.raises(SchemaError):
        ready.on_data_update("u1", DataUpdate("p", [1], {"r": I64}))
    with pytest.raises(StaleMetaError):
        ready.on_data_update("u1", DataUpdate("p", [1], {"r": RAG}, generation=99))
    assert not ready.committed(dataclasses.replace(meta, generations=(9, 9)))
    assert ready.committed(meta)


def test_an_atomic_put_is_ready_only_at_its_last_write() -> None:
    _, units, alloc, ready = _readiness()
    meta = alloc.allocate("p", 4, schemas={"x": F32}, atomic=True)
    settled: list[int] = []
    assert ready.on_data_update("u0", DataUpdate("p", [0, 2], {"x": F32})) == []
    assert not ready.committed(meta)
    assert ready.on_data_update("u1", DataUpdate("p", [1, 3], {"x": F32}), settled) == [0, 1, 2, 3]
    assert sorted(settled) == [0, 1, 2, 3] and ready.committed(meta)
    units.mark_lost("u1")
    with pytest.raises(UnitLostError):
        ready.on_data_update("u1", DataUpdate("p", [1], {"x": F32}))


def test_a_put_onto_existing_samples_is_checked_and_undone() -> None:
    cat, units, alloc, ready = _readiness()
    meta = alloc.allocate("p", 2)
    ready.on_data_update("u0", DataUpdate("p", [0], {"x": F32}))
    fresh = ready.check_put(meta, {"x": F32, "y": I64})
    assert fresh == {"p": {"x": [1], "y": [0, 1]}}
    with pytest.raises(SchemaError):
        ready.check_put(meta, {"x": I64})
    cat.part("p").set_ready("y", cat.where.pos[[0, 1]])
    cat.part("p").schemas["y"] = I64
    rows = ready.drop_fields(meta, {"p": {"y": [0, 1]}})
    assert rows == {0: {"p": {"y": [0]}}, 1: {"p": {"y": [1]}}}
    assert "y" not in cat.part("p").schemas
    units.mark_lost("u1")
    with pytest.raises(UnitLostError):
        ready.check_put(meta, {"x": F32})


def test_a_column_wise_put_is_ready_once_every_unit_wrote_or_is_aborted() -> None:
    cat, _, alloc, ready = _readiness()
    meta = alloc.allocate("p", 2)
    put_id, fresh = ready.begin_column_put(meta, {"x": F32})
    assert fresh == {"p": {"x": [0, 1]}}
    assert ready.on_data_update("u0", DataUpdate("p", [0], {"x": F32}, put_id=put_id)) == []
    assert ready.on_data_update("u1", DataUpdate("p", [1], {"x": F32}, put_id=put_id)) == [0, 1]
    assert cat.part("p").ready_count == {"x": 2}
    other, _ = ready.begin_column_put(meta, {"y": I64})
    # the rows it would add, for the units to delete (whatever they wrote of it)
    assert ready.abort_column_put(other) == {0: {"p": {"y": [0]}}, 1: {"p": {"y": [1]}}}
    assert ready.abort_column_put(12345) == {}
    with pytest.raises(StoreInputError, match="aborted or is unknown"):
        ready.on_data_update("u0", DataUpdate("p", [0], {"y": I64}, put_id=other))
