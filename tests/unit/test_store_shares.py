"""Shares: shared batches are done after every consumer's ack (a consumer asking again counts
once), stay with their key for their lease, and hand back on lease expiry exactly the
positions nobody acknowledged."""

from __future__ import annotations

import asyncio

import pytest

from rayless.store.controller.fetches import Share, Shares
from rayless.store.errors import StoreInputError


def _share(
    shares: Shares, key: str, consumers: int, indexes: list[int], consumes: bool = True
) -> Share:
    loop = asyncio.new_event_loop()
    try:
        share = shares.add(("p", "t", key), consumers, loop.create_future())
    finally:
        loop.close()
    shares.serve(share, indexes, consumes)
    assert share.served is not None
    return share


def test_a_share_is_done_after_every_consumers_ack() -> None:
    shares = Shares(lease_after=10.0)
    share = _share(shares, "k", 2, [10, 11, 12, 13])
    shares.give(share, "a")
    shares.give(share, "b")
    assert shares.ack("a", [0, 1]) and not shares.done(share)
    assert shares.ack("b", [2, 3]) and shares.done(share)
    assert not shares.ack("a") and shares.get(("p", "t", "k")) is share  # held for its lease
    ((gone, back),) = shares.expired(now=float("inf"))
    assert gone is share and back == [] and shares.held() == 0


def test_a_consumer_asking_again_counts_once() -> None:
    shares = Shares(lease_after=10.0)
    share = _share(shares, "k", 2, [10, 11, 12, 13])
    for fetch_id in ("a1", "a2"):  # rank 0 asks twice
        shares.give(share, fetch_id)
        assert shares.ack(fetch_id, [0, 1], "0.0")
    assert not shares.done(share)  # before: done, and rank 1's part was lost
    shares.give(share, "b")
    assert shares.ack("b", [2, 3], "1.0") and shares.done(share)
    with pytest.raises(StoreInputError):
        shares.ack("b", [2, 3], "")


def test_all_consumers_acked_but_a_part_unread_hands_it_back() -> None:
    shares = Shares(lease_after=10.0)
    share = _share(shares, "k", 2, [10, 11, 12, 13])
    shares.give(share, "a")
    shares.give(share, "b")
    shares.ack("a", [0, 1])
    shares.ack("b", [0, 1])  # two readers of one part: the other part is nobody's
    assert not shares.done(share)
    ((_, back),) = shares.expired(now=float("inf"))
    assert back == [12, 13]


def test_an_expired_share_hands_back_what_nobody_acknowledged() -> None:
    shares = Shares(lease_after=10.0)
    share = _share(shares, "k", 2, [10, 11, 12, 13])
    shares.give(share, "a")
    shares.give(share, "b")  # b dies holding it
    shares.ack("a", [2, 3])
    served = share.served or 0.0
    assert shares.expired(now=served + 1) == []
    ((gone, back),) = shares.expired(now=served + 10)
    assert gone is share and back == [10, 11] and shares.held() == 0
    assert not shares.ack("b", [0, 1])  # too late: the key is forgotten


def test_a_cancel_keeps_the_batch_and_a_peek_hands_back_nothing() -> None:
    shares = Shares(lease_after=0.0)
    share = _share(shares, "k", 1, [5, 6])
    shares.give(share, "a")
    assert shares.cancel("a") and not shares.cancel("a")
    assert shares.get(("p", "t", "k")) is share  # asking again gets the same batch
    peek = _share(shares, "q", 1, [7], consumes=False)
    got = {s.key[2]: back for s, back in shares.expired(now=peek.served or 0.0)}
    assert got == {"k": [5, 6], "q": []}


def test_positions_outside_the_batch_are_refused() -> None:
    shares = Shares()
    share = _share(shares, "k", 1, [5, 6])
    shares.give(share, "a")
    with pytest.raises(StoreInputError):
        shares.ack("a", [2])
    with pytest.raises(StoreInputError):
        shares.give(share, "")
    assert shares.ack("a", [1]) and not shares.done(share)  # position 0 is nobody's yet


def _kept(shares: Shares, key: str, indexes: list[int]) -> Share:
    loop = asyncio.new_event_loop()
    try:
        share = shares.add(("p", "t", key), 1, loop.create_future(), keep=True)
    finally:
        loop.close()
    shares.serve(share, indexes)
    return share


def test_a_kept_share_that_was_read_outlives_its_lease_until_a_sample_is_cleared() -> None:
    shares = Shares(lease_after=10.0)
    share = _kept(shares, "rank0#0", [4, 5])
    other = _kept(shares, "rank1#0", [6, 7])
    for fetch_id, s in (("a", share), ("b", other)):
        shares.give(s, fetch_id)
        assert shares.ack(fetch_id)
    assert shares.expired(now=float("inf")) == []  # read: neither handed back nor dropped
    assert shares.get(("p", "t", "rank0#0")) is share and shares.held() == 2
    shares.give(share, "late")  # a group member far behind still gets the same batch
    assert shares.ack("late") and share.indexes == (4, 5)
    shares.forget([9, 5])  # sample 5 was cleared: its index may be reused
    assert shares.get(("p", "t", "rank0#0")) is None
    assert shares.get(("p", "t", "rank1#0")) is other
    shares.drop_partition("p")
    assert shares.held() == 0
    shares.forget([6, 7])  # nothing left to forget


def test_a_kept_share_nobody_read_goes_back_like_any_other() -> None:
    shares = Shares(lease_after=10.0)
    share = _kept(shares, "rank0#0", [4, 5])
    shares.give(share, "a")  # its reader died before the ack
    ((gone, back),) = shares.expired(now=float("inf"))
    assert gone is share and back == [4, 5] and shares.held() == 0
    shares.forget([4, 5])


def test_kept_shares_of_two_tasks_over_the_same_samples_are_both_forgotten() -> None:
    # two tasks (a pipeline's stages) each keep a batch of the same samples: clearing one
    # sample must forget both (before: the second replaced the first in the index table)
    shares = Shares(lease_after=10.0)
    loop = asyncio.new_event_loop()
    try:
        kept = [
            shares.add(("p", task, "rank-aware:0:0"), 1, loop.create_future(), keep=True)
            for task in ("rollout", "update")
        ]
    finally:
        loop.close()
    for i, share in enumerate(kept):
        shares.serve(share, [4, 5])
        shares.give(share, f"f{i}")
        shares.ack(f"f{i}")
    assert shares.expired(now=float("inf")) == [] and shares.held() == 2
    shares.forget([5])
    assert shares.held() == 0
    assert shares.get(("p", "rollout", "rank-aware:0:0")) is None
