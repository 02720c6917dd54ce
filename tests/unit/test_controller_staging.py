"""StagedPuts alone: staging, discarding cleared samples, committing, counting."""

from __future__ import annotations

import numpy as np

from rayless.store.controller.catalog import Catalog
from rayless.store.controller.records import LOST
from rayless.store.controller.staging import StagedPuts
from tests.unit.controller_state_helpers import fill


def test_a_staged_put_counts_until_committed() -> None:
    staged = StagedPuts()
    staged.stage(7, "p", [4, 5, 6])
    got = staged.get(7)
    assert got is not None and got.order == [4, 5, 6] and got.waiting == {4, 5, 6}
    assert staged.count(7) == 3 and staged.total() == 3 and len(staged) == 1
    staged.commit(7)
    assert staged.get(7) is None and staged.count(7) == 0 and staged.total() == 0


def test_discarding_every_sample_of_a_put_drops_it() -> None:
    staged = StagedPuts()
    staged.stage(1, "p", [0, 1])
    staged.stage(2, "p", [2])
    staged.discard([0, 2, 9], [1, 2, 3])  # 9: of no staged put
    one = staged.get(1)
    assert one is not None and one.members == {1} and one.waiting == {1}
    assert staged.get(2) is None and [s.partition for s in staged] == ["p"]


def test_in_partition_counts_staged_samples_and_those_lost_meanwhile() -> None:
    cat = Catalog("s")
    fill(cat, "p", [0, 1, 2])
    part = cat.part("p")
    staged = StagedPuts()
    staged.stage(1, "p", [1, 2])
    staged.stage(2, "q", [7])
    assert staged.in_partition("p", part, cat.where) == (2, 0)
    part.set_lost(np.asarray([2]), True)
    assert part.flags[2] & LOST
    assert staged.in_partition("p", part, cat.where) == (2, 1)
    assert staged.in_partition("r", None, cat.where) == (0, 0)
