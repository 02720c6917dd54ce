"""``actors.core.gc_policy``: the collector's young-generation threshold and freeze."""

from __future__ import annotations

import gc
from collections.abc import Iterator

import pytest

from rayless.actors.core import gc_policy


@pytest.fixture(autouse=True)
def _restore() -> Iterator[None]:
    before = gc.get_threshold()
    yield
    gc.set_threshold(*before)
    gc.unfreeze()


def test_the_threshold_is_raised_to_the_default_or_the_variable() -> None:
    gc.set_threshold(700, 10, 10)
    assert gc_policy.apply({}) == gc_policy.DEFAULT_GEN0
    assert gc.get_threshold()[1:] == (10, 10)
    gc.set_threshold(700, 10, 10)
    assert gc_policy.apply({"RAYLESS_GC_GEN0": "50000"}) == 50_000


def test_zero_or_a_lower_value_leaves_python_alone() -> None:
    gc.set_threshold(700, 10, 10)
    assert gc_policy.apply({"RAYLESS_GC_GEN0": "0"}) == 700
    gc.set_threshold(20_000, 10, 10)
    assert gc_policy.apply({"RAYLESS_GC_GEN0": "5000"}) == 20_000
    assert gc_policy.apply({"RAYLESS_GC_GEN0": "junk"}) == 20_000


def test_freeze_hides_what_exists_unless_turned_off() -> None:
    gc.unfreeze()
    gc_policy.freeze({"RAYLESS_GC_GEN0": "0"})
    assert gc.get_freeze_count() == 0
    gc_policy.freeze({})
    assert gc.get_freeze_count() > 0
