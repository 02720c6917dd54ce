"""FreeIndexes hands out the smallest free indexes first, exactly as a heap of single indexes
would, whatever the order indexes are given back in."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from rayless.store.controller.records import FreeIndexes

ops = st.lists(
    st.one_of(
        st.tuples(st.just("add"), st.lists(st.integers(0, 300), max_size=40)),
        st.tuples(st.just("take"), st.integers(0, 60)),
    ),
    max_size=40,
)


@settings(max_examples=300, deadline=None)
@given(ops)
def test_free_indexes_match_a_sorted_set(steps: list[tuple[str, object]]) -> None:
    free = FreeIndexes()
    model: set[int] = set()
    for op, arg in steps:
        if op == "add":
            new = sorted(set(arg) - model)  # type: ignore[call-overload]
            free.add(np.asarray(new, dtype=np.int64))
            model |= set(new)
        else:
            n = int(arg)  # type: ignore[call-overload]
            got = free.take(n).tolist()
            want = sorted(model)[:n]
            assert got == want
            model -= set(want)
        assert len(free) == len(model)


def test_a_released_batch_is_one_run() -> None:
    free = FreeIndexes()
    free.add(np.arange(1000, 2024))
    free.add(np.arange(0, 10)[::-1].copy())
    assert len(free._runs) == 2
    assert free.take(5).tolist() == [0, 1, 2, 3, 4]
    assert free.take(7).tolist() == [5, 6, 7, 8, 9, 1000, 1001]
    assert len(free) == 1022 and free.take(5000)[-1] == 2023 and len(free) == 0
