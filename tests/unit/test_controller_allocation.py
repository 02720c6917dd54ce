"""Allocation alone (with the Catalog, Units and StagedPuts it writes to): placement, index
reuse after release, atomic puts staged, group sizes, refusals that change nothing."""

from __future__ import annotations

import pytest

from rayless.store.controller.allocation import Allocation, check_group_size
from rayless.store.controller.catalog import Catalog
from rayless.store.controller.staging import StagedPuts
from rayless.store.controller.units import Units
from rayless.store.errors import StoreError, StoreInputError, UnitLostError
from tests.unit.controller_state_helpers import F32


def _allocation(n_units: int = 2) -> tuple[Catalog, Units, StagedPuts, Allocation]:
    cat = Catalog("s")
    units = Units(cat)
    for i in range(n_units):
        units.register(f"u{i}")
    staged = StagedPuts()
    return cat, units, staged, Allocation(cat, units, staged)


def test_samples_go_round_robin_over_live_units_or_by_env_or_placement() -> None:
    cat, units, _, alloc = _allocation(3)
    meta = alloc.allocate("p", 6)
    assert meta.global_indexes == tuple(range(6)) and meta.shards == (0, 1, 2, 0, 1, 2)
    units.mark_lost("u1")
    assert alloc.allocate("p", 2).shards == (0, 2)  # alive[index % 2] for 6, 7
    alloc.set_env_shards({"e": 2})
    assert alloc.allocate("p", 1, env_ids=["e"]).shards == (2,)
    assert alloc.allocate("p", 2, placement=[2, 0]).shards == (2, 0)
    with pytest.raises(StoreInputError, match="placement"):
        alloc.allocate("p", 1, placement=[1])  # u1 is lost
    alloc.set_env_shards({"e": 1})
    with pytest.raises(UnitLostError):
        alloc.allocate("p", 1, env_ids=["e"])
    assert cat.part("p").live == 11


def test_released_indexes_are_reused_smallest_first_and_only_after_release() -> None:
    _, _, _, alloc = _allocation()
    alloc.allocate("p", 4)
    alloc.retire([2, 0])
    assert alloc.stats() == {"allocated": 2, "free": 0, "pending_release": 2, "high_water": 4}
    assert alloc.allocate("p", 1).global_indexes == (4,)  # not released yet
    alloc.release([0, 2])
    assert alloc.allocate("p", 3).global_indexes == (0, 2, 5)
    with pytest.raises(StoreInputError, match="not waiting for release"):
        alloc.release([1])


def test_an_atomic_allocation_is_staged_and_a_refused_one_changes_nothing() -> None:
    cat, _, staged, alloc = _allocation()
    meta = alloc.allocate("p", 3, schemas={"x": F32}, atomic=True, keys=["a", "b", "c"])
    assert staged.count(meta.generations[0]) == 3
    before = alloc.stats()
    with pytest.raises(StoreInputError, match="keys"):
        alloc.allocate("p", 1, keys=["a"])
    with pytest.raises(StoreInputError, match="custom_meta"):
        alloc.allocate("q", 2, custom_meta=[{}])
    assert alloc.stats() == before and cat.partitions.keys() == {"p"}
    assert alloc.allocate("p", 1).generations == (meta.generations[0] + 1,)


def test_without_live_units_nothing_is_allocated() -> None:
    _, units, _, alloc = _allocation(1)
    units.mark_lost("u0")
    with pytest.raises(UnitLostError, match="u0"):
        alloc.allocate("p", 1)
    empty = Allocation(Catalog("s"), Units(Catalog("s")), StagedPuts())
    with pytest.raises(StoreError, match="no live storage unit"):
        empty.allocate("p", 1)


def test_group_sizes_are_checked_against_the_partition() -> None:
    cat, _, _, alloc = _allocation()
    assert check_group_size(None, 4, None, 2) == 2
    with pytest.raises(StoreInputError, match="whole groups"):
        check_group_size(None, 3, None, 2)
    alloc.allocate("p", 2, group_ids=["g", "g"], group_size=2)
    part = cat.part("p")
    assert part.group_size == 2
    with pytest.raises(StoreInputError, match="would hold 3"):
        check_group_size(part, 1, ["g"], None)
    with pytest.raises(StoreInputError, match="groups hold 2"):
        check_group_size(part, 3, None, 3)
