"""Clearing alone (with the Catalog, StagedPuts and Allocation it updates): plans by shard,
two-phase reuse, clearing twice, refusals, staged samples, abandoned partitions."""

from __future__ import annotations

import dataclasses

import pytest

from rayless.store.controller.allocation import Allocation
from rayless.store.controller.catalog import Catalog
from rayless.store.controller.clearing import Clearing
from rayless.store.controller.staging import StagedPuts
from rayless.store.controller.units import Units
from rayless.store.errors import ForeignMetaError, StoreInputError
from tests.unit.controller_state_helpers import F32


def _clearing() -> tuple[Catalog, StagedPuts, Allocation, Clearing]:
    cat = Catalog("s")
    units = Units(cat)
    units.register("u0")
    units.register("u1")
    staged = StagedPuts()
    alloc = Allocation(cat, units, staged)
    return cat, staged, alloc, Clearing(cat, staged, alloc)


def test_a_clear_plans_the_rows_per_shard_and_frees_the_indexes_on_release() -> None:
    cat, _, alloc, clearing = _clearing()
    meta = alloc.allocate("p", 4, keys=["a", "b", "c", "d"])
    plan = clearing.clear(meta.select([0, 1, 3]))
    assert plan.shards == {0: {"p": [0]}, 1: {"p": [1, 3]}} and plan.indexes == [0, 1, 3]
    part = cat.part("p")
    assert part.live == 1 and set(part.keys) == {"c"}
    assert clearing.clear(meta.select([0])).indexes == []  # cleared already: a no-op
    assert alloc.stats()["pending_release"] == 3
    alloc.release(plan.indexes)
    assert alloc.allocate("p", 2).global_indexes == (0, 1)


def test_a_foreign_or_forged_meta_removes_nothing() -> None:
    cat, _, alloc, clearing = _clearing()
    meta = alloc.allocate("p", 2)
    with pytest.raises(ForeignMetaError):
        clearing.clear(dataclasses.replace(meta, store_id="x"))
    with pytest.raises(StoreInputError, match="forged"):
        clearing.clear(dataclasses.replace(meta, shards=(1, 1)))
    assert cat.part("p").live == 2


def test_clearing_staged_samples_shrinks_their_put_and_an_emptied_new_partition_is_abandoned() -> (
    None
):
    cat, staged, alloc, clearing = _clearing()
    meta = alloc.allocate("p", 3, schemas={"x": F32}, atomic=True)
    serial = meta.generations[0]
    clearing.clear(meta.select([0]))
    assert staged.count(serial) == 2
    assert clearing.abandoned(meta) == []
    clearing.clear(meta.select([1, 2]))
    assert staged.get(serial) is None and clearing.abandoned(meta) == ["p"]
    other = alloc.allocate("q", 1)
    plan = clearing.clear_all("q")
    assert plan.indexes == list(other.global_indexes) and cat.part("q").live == 0
