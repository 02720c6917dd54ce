"""Row runs of a put's slots (rayless.store.samehost.slots.run_of): a progression is found
whatever sequence type holds it, and nothing else is taken for one."""

from __future__ import annotations

import itertools
from collections.abc import Sequence

from hypothesis import given
from hypothesis import strategies as st

from rayless.store.samehost.slots import run_of


def _reference(idx: Sequence[int]) -> tuple[int, int] | None:
    if not idx:
        return None
    if len(idx) == 1:
        return idx[0], 1
    step = idx[1] - idx[0]
    if step < 1 or any(b - a != step for a, b in itertools.pairwise(idx)):
        return None
    return idx[0], step


@st.composite
def indexes(draw: st.DrawFn) -> list[int]:
    """Progressions (any step, long ones too), some with their last index changed, and short
    random lists."""
    if draw(st.booleans()):
        return draw(st.lists(st.integers(0, 50), max_size=8))
    start, step, n = draw(st.integers(0, 1000)), draw(st.integers(-2, 5)), draw(st.integers(0, 600))
    run = [start + step * i for i in range(n)]
    if run and draw(st.booleans()):
        run[-1] = draw(st.integers(0, 5000))
    return run


@given(indexes())
def test_run_of_agrees_with_the_pairwise_definition(idx: list[int]) -> None:
    want = _reference(idx)
    assert run_of(idx) == want
    assert run_of(tuple(idx)) == want
    assert run_of(_Seq(idx)) == want


class _Seq(Sequence[int]):
    """A sequence that is neither a list nor a tuple."""

    def __init__(self, items: list[int]) -> None:
        self._items = items

    def __len__(self) -> int:
        return len(self._items)

    def __getitem__(self, i: int) -> int:  # type: ignore[override]
        return self._items[i]
