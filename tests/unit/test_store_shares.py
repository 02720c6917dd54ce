"""Shares: shared batches are done after every consumer's ack, and hand back on lease expiry
exactly the positions nobody acknowledged."""

from __future__ import annotations

import asyncio

import pytest

from rayless.store.errors import StoreInputError
from rayless.store.fetches import Share, Shares


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
    assert shares.ack("a", [0, 1]) and shares.get(("p", "t", "k")) is share
    assert shares.ack("b", [2, 3]) and shares.get(("p", "t", "k")) is None
    assert not shares.ack("a") and shares.held() == 0
    assert shares.expired(now=float("inf")) == []


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
    assert shares.ack("a", [1]) and shares.held() == 0
