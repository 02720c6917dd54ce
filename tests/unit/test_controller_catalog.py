"""Catalog alone: lookups, meta checks and metas over partitions filled by hand."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from rayless.store.controller.catalog import Catalog
from rayless.store.errors import (
    ForeignMetaError,
    StaleMetaError,
    StoreInputError,
    UnknownFieldError,
    UnknownPartitionError,
)
from tests.unit.controller_state_helpers import F32, RAG, fill


def test_lookups_find_each_sample_by_its_global_index() -> None:
    cat = Catalog("s")
    fill(cat, "a", [0, 2, 4], shards=[0, 1, 0])
    fill(cat, "b", [1, 3])
    assert cat.shard_of(2) == 1 and cat.shard_of(3) == 0
    with pytest.raises(StoreInputError, match="not allocated"):
        cat.shard_of(5)
    found, pos = cat.positions(cat.part("a"), np.asarray([4, 1, 0]))
    assert found.tolist() == [True, False, True] and pos[[0, 2]].tolist() == [2, 0]
    with pytest.raises(StoreInputError, match=r"samples \[1\] are elsewhere"):
        cat.existing(cat.part("a"), [0, 1], "are elsewhere")
    with pytest.raises(UnknownPartitionError):
        cat.part("c")
    assert cat.state_bytes() > 0


def test_check_meta_refuses_foreign_stale_and_forged_metas() -> None:
    cat = Catalog("s")
    meta = fill(cat, "a", [0, 1], shards=[0, 1])
    cat.check_meta(meta)
    with pytest.raises(ForeignMetaError):
        cat.check_meta(dataclasses.replace(meta, store_id="other"))
    with pytest.raises(StoreInputError, match="forged"):
        cat.check_meta(dataclasses.replace(meta, shards=(1, 1)))
    with pytest.raises(StaleMetaError):
        cat.check_meta(dataclasses.replace(meta, generations=(1, 2)))
    cat.drop("a")
    with pytest.raises(StaleMetaError):
        cat.check_meta(meta)


def test_meta_of_names_the_ready_fields_custom_meta_and_nested_shapes() -> None:
    cat = Catalog("s")
    fill(cat, "a", [5, 6], ready=("x",))
    part = cat.part("a")
    part.schemas["r"] = RAG
    part.set_ready("r", np.asarray([0, 1]))
    part.shapes["r"] = {5: (3,), 6: (1,)}
    part.custom[1] = {"tag": 1}
    meta = cat.meta_of("a", [6, 5])
    assert meta.global_indexes == (6, 5) and set(meta.field_schemas) == {"x", "r"}
    assert meta.sample_shapes["r"] == ((1,), (3,))
    assert meta.custom_meta == ({"tag": 1}, {})
    assert cat.meta_of("a", [5], ["x"]).field_schemas == {"x": F32}
    with pytest.raises(UnknownFieldError):
        cat.meta_of("a", [5], ["y"])
    with pytest.raises(StoreInputError, match="distinct"):
        cat.meta_of("a", [5, 5])


def test_a_field_no_sample_holds_forgets_its_schema() -> None:
    cat = Catalog("s")
    fill(cat, "a", [0], ready=("x",))
    part = cat.part("a")
    part.unset_ready("x", np.asarray([0]))
    cat.drop_empty_schemas(part)
    assert "x" not in part.schemas and "x" not in part.ready


def test_export_lists_the_samples_with_their_fields_and_consumers() -> None:
    cat = Catalog("s")
    fill(cat, "a", [3, 4], ready=("x",))
    part = cat.part("a")
    part.consume("t", np.asarray([1]))
    out = cat.export_partition("a")
    assert [s.index for s in out.samples] == [3, 4]
    assert out.samples[0].fields == ["x"] and out.consumed == {"t": [4]}
