"""Samplers: sequential, seeded random, grouped-N (never splits a group); the registry, class
references and the capabilities the controller relies on."""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rayless.store.controller import samplers
from rayless.store.controller.samplers import (
    Capabilities,
    GroupedSampler,
    GroupOf,
    RandomSampler,
    Sampler,
    SeqlenBalancedSampler,
    SequentialSampler,
    capabilities_of,
    make_sampler,
    register_sampler,
    sampler_names,
    sampler_ref,
)
from rayless.store.errors import StoreInputError
from tests.unit.controller_state_helpers import put, state_with_units


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


class _OldestFirst:
    """A sampler of the user's own that declares it takes the oldest candidates: the
    controller takes them itself and never asks it."""

    capabilities = Capabilities(sequential=True)

    def select(
        self, candidates: Sequence[int], batch_size: int, group_of: GroupOf
    ) -> list[int] | None:
        raise AssertionError("a sequential sampler is never asked")

    def spec(self) -> dict[str, Any]:
        return {"name": sampler_ref(type(self))}


def test_samplers_are_found_by_name_in_the_registry() -> None:
    assert {"sequential", "random", "grouped", "seqlen_balanced"} <= set(sampler_names())

    @register_sampler("test-every-other")
    class EveryOther:
        def select(
            self, candidates: Sequence[int], batch_size: int, group_of: GroupOf
        ) -> list[int] | None:
            picked = list(candidates[::2])
            return picked[:batch_size] if len(picked) >= batch_size else None

        def spec(self) -> dict[str, Any]:
            return {"name": "test-every-other"}

    try:
        made = make_sampler({"name": "test-every-other"})
        assert isinstance(made, EveryOther) and capabilities_of(made) == Capabilities()
        assert made.select([0, 1, 2, 3], 2, by_four) == [0, 2]
        with pytest.raises(ValueError, match="taken"):
            register_sampler("random")(EveryOther)
        with pytest.raises(ValueError, match="':'"):
            register_sampler("a:b")
        with pytest.raises(StoreInputError, match="bad arguments"):
            make_sampler({"name": "test-every-other", "k": 1})
    finally:
        samplers._REGISTRY.pop("test-every-other", None)


def test_a_sampler_class_travels_by_reference() -> None:
    ref = sampler_ref(RandomSampler)
    assert ref == "rayless.store.controller.samplers:RandomSampler"
    made = make_sampler({"name": ref, "seed": 4})
    assert isinstance(made, RandomSampler) and made.seed == 4
    for bad in ("no_such_module_xyz:Thing", "collections:OrderedDict", "collections:Nope"):
        with pytest.raises(StoreInputError):
            make_sampler(bad)


def test_declared_capabilities_are_what_the_controller_relies_on() -> None:
    assert capabilities_of(SequentialSampler()) == Capabilities(sequential=True)
    assert capabilities_of(GroupedSampler(4)) == Capabilities(group_size=4)
    assert capabilities_of(SeqlenBalancedSampler(2)).sequential
    assert capabilities_of(SeqlenBalancedSampler(2, n=3)) == Capabilities(group_size=3)
    assert capabilities_of(object()) == Capabilities()  # declares nothing
    c = state_with_units()
    put(c, "p", 4)
    meta = c.try_fetch("p", ["x"], 3, task="t", sampler=_OldestFirst())
    assert meta is not None and list(meta.global_indexes) == [0, 1, 2]
