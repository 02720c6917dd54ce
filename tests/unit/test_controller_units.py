"""Units alone (over a Catalog filled by hand): registration, and the samples lost with a unit."""

from __future__ import annotations

import pytest

from rayless.store.controller.catalog import Catalog
from rayless.store.controller.units import Units
from rayless.store.errors import StoreInputError, UnitLostError
from tests.unit.controller_state_helpers import fill


def _units(n: int = 2) -> tuple[Catalog, Units]:
    cat = Catalog("s")
    units = Units(cat)
    for i in range(n):
        units.register(f"u{i}", node_id=f"n{i}")
    return cat, units


def test_units_are_numbered_by_registration_and_keep_their_shard_when_back() -> None:
    _, units = _units(2)
    assert [u.shard for u in units.all()] == [0, 1] and len(units) == 2
    units.mark_lost("u0")
    assert units.alive_shards() == [1]
    again = units.register("u0", node_id="n9", capacity_bytes=10)
    assert again.shard == 0 and again.alive and again.node_id == "n9"
    assert units.alive_shards() == [0, 1] and units[0] is again
    with pytest.raises(StoreInputError, match="unknown storage unit"):
        units.get("u7")
    with pytest.raises(StoreInputError, match="capacity_bytes"):
        units.register("u2", capacity_bytes=-1)
    assert len(units) == 2


def test_a_lost_unit_takes_its_samples_ready_state_and_tells_later_checks() -> None:
    cat, units = _units(2)
    meta = fill(cat, "p", [0, 1, 2, 3], shards=[0, 1, 0, 1], ready=("x",))
    assert units.loss_count("p") == 0 and units.lost_positions(meta) == {}
    assert units.mark_lost("u1") == {"p": [1, 3]}
    part = cat.part("p")
    assert part.ready_count["x"] == 2 and part.lost == 2
    assert units.loss_count("p") == 1
    assert units.lost_since("p", 0) == "u1" and units.lost_since("p", 1) is None
    assert units.lost_meta("p").global_indexes == (1, 3)
    assert units.lost_positions(meta) == {1: "u1", 3: "u1"}
    with pytest.raises(UnitLostError, match="u1"):
        units.check_readable(meta)
    units.check_readable(meta.select([0, 2]))
