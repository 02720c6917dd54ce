"""Consumption alone (over a Catalog filled by hand): fetches, samplers, consumed bitmaps."""

from __future__ import annotations

import numpy as np
import pytest

from rayless.store.controller.catalog import Catalog
from rayless.store.controller.consumption import Consumption, check_group_n
from rayless.store.data.messages import FetchMode
from rayless.store.errors import StoreInputError
from tests.unit.controller_state_helpers import fill


def _consumption(n: int = 6) -> tuple[Catalog, Consumption]:
    cat = Catalog("s")
    fill(cat, "p", list(range(n)), ready=("x",))
    return cat, Consumption(cat)


def test_a_sequential_fetch_takes_the_oldest_and_marks_them_consumed() -> None:
    cat, cons = _consumption()
    meta = cons.try_fetch("p", ["x"], 4, task="t")
    assert meta is not None and meta.global_indexes == (0, 1, 2, 3)
    assert cons.positions_examined >= 4
    peek = cons.try_fetch("p", ["x"], 2, task="t", mode=FetchMode.PEEK)
    assert peek is not None and peek.global_indexes == (4, 5)
    assert cons.try_fetch("p", ["x"], 3, task="t") is None  # 2 left
    assert cons.ready_indexes("p", ["x"], "t") == [4, 5]
    assert cons.consumers() == {"p": {"t": 4}}
    rest = cons.try_fetch("p", ["x"], None, task="t")
    assert rest is not None and rest.global_indexes == (4, 5)
    assert cons.try_fetch("q", ["x"], None) == cat.empty_meta()
    assert cons.try_fetch("q", ["x"], 1) is None
    with pytest.raises(StoreInputError, match="batch_size"):
        cons.try_fetch("p", ["x"], 0)


def test_consumption_is_handed_back_reset_and_restored() -> None:
    _, cons = _consumption()
    meta = cons.try_fetch("p", ["x"], 4, task="t")
    assert meta is not None
    assert cons.unconsume("t", "p", [1, 9]) == [1]
    assert cons.unconsume("other", "p", [1]) == []
    cons.reset_consumption("t", meta=meta.select([0]))
    assert cons.ready_indexes("p", ["x"], "t") == [0, 1, 4, 5]
    cons.mark_consumed("t", meta)
    assert cons.ready_indexes("p", ["x"], "t") == [4, 5]
    cons.reset_consumption(None, "p")
    assert cons.consumers() == {"p": {}}
    with pytest.raises(StoreInputError, match="task"):
        cons.mark_consumed("", meta)


def test_a_spec_sampler_is_kept_per_partition_and_task_until_the_partition_goes() -> None:
    _, cons = _consumption(8)
    spec = {"name": "random", "seed": 3}

    def draw(task: str = "t") -> tuple[int, ...]:
        meta = cons.try_fetch("p", ["x"], 2, task=task, sampler=spec, mode="peek")
        assert meta is not None
        return meta.global_indexes

    first, second = draw(), draw()
    assert first != second  # the kept sampler advanced
    assert draw("other") == first  # another task's sampler starts from the seed
    cons.forget_partition("p")
    assert draw() == first  # forgotten with the partition: it starts from the seed again


def test_a_grouped_fetch_fixes_the_group_size_and_refuses_another() -> None:
    cat, cons = _consumption(4)
    meta = cons.try_fetch("p", ["x"], 4, task="t", sampler={"name": "grouped", "n": 2})
    assert meta is not None and cat.part("p").group_size == 2
    with pytest.raises(StoreInputError, match="groups of 3"):
        check_group_n(cat.part("p"), "p", 3)
    assert np.all(cat.part("p").consumed["t"][:4])
