"""Samplers: sequential, seeded random, grouped-N (never splits a group)."""

from __future__ import annotations

from collections.abc import Hashable

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rayless.store.controller.samplers import (
    GroupedSampler,
    RandomSampler,
    Sampler,
    SequentialSampler,
    make_sampler,
)
from rayless.store.errors import StoreInputError


def by_four(index: int) -> Hashable:
    return index // 4


def test_sequential() -> None:
    s = SequentialSampler()
    assert s.select([5, 3, 9], 2, by_four) == [5, 3]
    assert s.select([5, 3], 3, by_four) is None
    with pytest.raises(StoreInputError):
        s.select([1], 0, by_four)
    with pytest.raises(StoreInputError):
        s.select([1], True, by_four)


def test_random_is_seeded_and_distinct() -> None:
    a, b = RandomSampler(7), RandomSampler(7)
    cands = list(range(100))
    picks = [a.select(cands, 10, by_four) for _ in range(3)]
    assert picks == [b.select(cands, 10, by_four) for _ in range(3)]
    assert picks[0] != picks[1]  # the generator advances
    assert all(p is not None and len(set(p)) == 10 and set(p) <= set(cands) for p in picks)
    assert a.select(cands[:3], 4, by_four) is None
    with pytest.raises(StoreInputError):
        RandomSampler("7")  # type: ignore[arg-type]


def test_grouped_waits_for_whole_groups() -> None:
    g = GroupedSampler(4)
    # group 0 complete (0..3), group 1 has 3 of 4 ready
    assert g.select([0, 1, 2, 3, 4, 5, 6], 4, by_four) == [0, 1, 2, 3]
    assert g.select([0, 1, 2, 3, 4, 5, 6], 8, by_four) is None
    assert g.select([1, 2, 3, 4, 5, 6, 7], 4, by_four) == [4, 5, 6, 7]
    assert g.select([0, 1, 2], 4, by_four) is None


def test_grouped_argument_errors() -> None:
    with pytest.raises(StoreInputError, match="multiple"):
        GroupedSampler(4).select(list(range(8)), 6, by_four)
    with pytest.raises(StoreInputError, match="more than the group size"):
        GroupedSampler(2).select(list(range(4)), 2, by_four)
    for bad in (0, -1, 1.5, True):
        with pytest.raises(StoreInputError):
            GroupedSampler(bad)  # type: ignore[arg-type]


@settings(max_examples=60, deadline=None)
@given(
    ready=st.sets(st.integers(0, 63)),
    n=st.sampled_from([1, 2, 4, 8]),
    groups=st.integers(1, 4),
    shuffle=st.booleans(),
    seed=st.integers(0, 5),
)
def test_grouped_never_splits_a_group(
    ready: set[int], n: int, groups: int, shuffle: bool, seed: int
) -> None:
    def group_of(index: int) -> Hashable:
        return index // n

    cands = sorted(ready)
    picked = GroupedSampler(n, shuffle=shuffle, seed=seed).select(cands, groups * n, group_of)
    complete = {
        k for k in {group_of(i) for i in cands} if sum(group_of(i) == k for i in cands) == n
    }
    if len(complete) < groups:
        assert picked is None
        return
    assert picked is not None and len(picked) == groups * n == len(set(picked))
    chosen = {group_of(i) for i in picked}
    assert len(chosen) == groups and chosen <= complete
    for k in chosen:  # every member of a chosen group is in the batch
        assert {i for i in cands if group_of(i) == k} <= set(picked)


def test_make_sampler_specs() -> None:
    assert isinstance(make_sampler(None), SequentialSampler)
    assert isinstance(make_sampler("sequential"), SequentialSampler)
    assert isinstance(make_sampler("random"), RandomSampler)
    g = make_sampler({"name": "grouped", "n": 4, "shuffle": True, "seed": 3})
    assert isinstance(g, GroupedSampler) and (g.n, g.shuffle, g.seed) == (4, True, 3)
    assert make_sampler(g.spec()).spec() == g.spec()
    mine = RandomSampler(1)
    assert make_sampler(mine) is mine
    assert isinstance(mine, Sampler)
    for bad in ("grouped", {"name": "grouped", "m": 2}, {"name": "nope"}, 42, {"n": 2}):
        with pytest.raises(StoreInputError):
            make_sampler(bad)  # type: ignore[arg-type]


def test_the_loader_and_its_samplers_are_exported_from_rayless_store() -> None:
    import rayless.store as store
    from rayless.store.client.loader import StreamingDataset, StreamingLoader
    from rayless.store.controller.samplers import SeqlenBalancedSampler

    assert store.SeqlenBalancedSampler is SeqlenBalancedSampler
    assert store.StreamingLoader is StreamingLoader
    assert store.StreamingDataset is StreamingDataset
    assert {"SeqlenBalancedSampler", "StreamingLoader", "StreamingDataset"} <= set(store.__all__)
