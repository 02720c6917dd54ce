"""The put and fetch parameter objects: what the client builds, what crosses the wire, and
the typed refusal of a malformed one a peer sends."""

from __future__ import annotations

import pytest

from rayless.store.data.requests import FetchRequest, PutOptions
from rayless.store.errors import StoreInputError
from rayless.transport.codec import decode, encode


def test_put_options_copy_the_callers_sequences_and_round_trip() -> None:
    ids = ("e0", "e1")
    metas = [{"a": 1}, {"a": 2}]
    opts = PutOptions.of(env_ids=ids, custom_meta=metas, keys=["k0", "k1"], group_size=2)
    metas[0]["a"] = 9  # the caller's dicts stay theirs
    assert opts.env_ids == ["e0", "e1"] and opts.custom_meta == [{"a": 1}, {"a": 2}]
    assert opts.for_new_samples and not PutOptions.of(env_ids=ids).for_new_samples
    assert decode(encode(opts)) == opts


def test_fetch_request_round_trips() -> None:
    req = FetchRequest("p", ("x", "y"), 4, "t", "peek", {"name": "grouped", "n": 2}, 1.5)
    assert decode(encode(req)) == req


@pytest.mark.parametrize(
    "state",
    [
        {"partition": "p"},  # fields missing
        ["p", ["x"]],
        {
            "partition": "p",
            "fields": "xy",  # a str, not a list of names
            "batch_size": 1,
            "task": "t",
            "mode": "fetch",
            "sampler": None,
            "timeout": None,
        },
    ],
)
def test_a_malformed_fetch_request_is_refused(state: object) -> None:
    with pytest.raises(StoreInputError):
        FetchRequest.from_dict(state)


@pytest.mark.parametrize(
    "state",
    [
        {"env_ids": None},
        {"env_ids": "e0", "group_ids": None, "custom_meta": None, "keys": None, "group_size": 1},
        {"env_ids": None, "group_ids": None, "custom_meta": [1], "keys": None, "group_size": 1},
    ],
)
def test_malformed_put_options_are_refused(state: object) -> None:
    with pytest.raises(StoreInputError):
        PutOptions.from_dict(state)
