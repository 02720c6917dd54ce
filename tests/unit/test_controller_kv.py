"""KeyValues alone (over a Catalog filled by hand): key checks, lookups, listings, tags."""

from __future__ import annotations

import pytest

from rayless.store.controller.catalog import Catalog
from rayless.store.controller.kv import KeyValues, check_custom, check_new_keys
from rayless.store.errors import StoreInputError, UnknownFieldError, UnknownKeyError
from tests.unit.controller_state_helpers import fill


def _kv() -> tuple[Catalog, KeyValues]:
    cat = Catalog("s")
    fill(cat, "p", [0, 1, 2], ready=("x",))
    part = cat.part("p")
    part.keys.update({"a": 0, "b": 1})
    part.key_at.update({0: "a", 1: "b"})
    return cat, KeyValues(cat)


def test_new_keys_and_custom_meta_are_checked() -> None:
    cat, _ = _kv()
    check_new_keys(cat.part("p"), ["c"], 1)
    check_new_keys(None, None, 3)
    with pytest.raises(StoreInputError, match="already name"):
        check_new_keys(cat.part("p"), ["a"], 1)
    with pytest.raises(StoreInputError, match="distinct"):
        check_new_keys(None, ["c", "c"], 2)
    with pytest.raises(StoreInputError, match="entries"):
        check_new_keys(None, ["c"], 2)
    assert check_custom([{"k": 1}], 1) == [{"k": 1}] and check_custom(None, 2) is None
    with pytest.raises(StoreInputError, match="not a dict"):
        check_custom([1], 1)  # type: ignore[list-item]
    with pytest.raises(StoreInputError):
        check_custom([{"k": object()}], 1)


def test_keys_look_up_their_samples_in_order() -> None:
    _, kv = _kv()
    meta, missing = kv.lookup("p", ["b", "z", "a"])
    assert meta.global_indexes == (1, 0) and missing == [1] and list(meta.field_schemas) == ["x"]
    assert kv.lookup("q", ["a"])[1] == [0]
    assert kv.meta("p", ["a", "b"], ["x"]).global_indexes == (0, 1)
    with pytest.raises(UnknownKeyError):
        kv.meta("p", ["z"])
    with pytest.raises(UnknownFieldError):
        kv.meta("p", ["a"], ["y"])
    with pytest.raises(StoreInputError, match="distinct"):
        kv.lookup("p", ["a", "a"])


def test_tags_are_set_per_sample_and_listed_per_key() -> None:
    cat, kv = _kv()
    meta = cat.meta_of("p", [0, 1])
    kv.set_custom_meta(meta, [{"t": 1}, {}])
    assert kv.listing("p") == {"p": {"a": {"t": 1}, "b": {}}}
    assert kv.listing() == kv.listing("p") and kv.listing("q") == {}
    kv.set_custom_meta(meta, [{}, {}])
    assert not cat.part("p").custom
