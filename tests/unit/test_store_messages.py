"""The store's wire messages: each round-trips through the codec as itself, a malformed one is
a ProtocolError naming the field, and the fetch mode is an Enum that still takes its string."""

from __future__ import annotations

from typing import Any

import msgpack
import pytest

from rayless.store.data.fields import FieldSchema
from rayless.store.data.messages import (
    ColumnPut,
    FetchMode,
    LocalInfo,
    Located,
    Place,
    Reservation,
    Slots,
    UnitView,
    WaitingFetch,
)
from rayless.store.data.requests import FetchRequest
from rayless.store.errors import StoreInputError
from rayless.transport._registry import EXT, MARK
from rayless.transport.codec import decode, encode
from rayless.transport.errors import ProtocolError

SAMPLES = [
    FieldSchema("dense", "float32", (4, None), "cpu"),
    FieldSchema("non_tensor"),
    UnitView("u0", 0, "node-0", "cpu", 1 << 20, True, None),
    LocalInfo("host-a", True, False, None),
    Reservation("t0", {"x": Slots("seg", 8, 3, [0, 1, 2])}),
    Located(
        {"x": [Place("seg", 8, 5, [4, 5], [3], None, [0, 1])], "y": []},
        {"z": [1, "a", None]},
    ),
    ColumnPut(7, {"y": {"p": [0, 1]}}),
    WaitingFetch("p", True, ["x"], [], "t", 1, 4, 0.5, "a fetch waits"),
]


@pytest.mark.parametrize("msg", SAMPLES, ids=lambda m: type(m).__name__)
def test_a_message_round_trips_as_itself(msg: object) -> None:
    back = decode(encode(msg))
    assert type(back) is type(msg) and back == msg


def _raw(name: str, state: Any) -> list[bytes]:
    """The frames of an extension record ``name`` with ``state``, as a peer could write it."""
    return [msgpack.packb([MARK[EXT], name, state])]


@pytest.mark.parametrize(
    ("name", "state", "match"),
    [
        ("store.Reservation", [5, {}], "token must be str"),
        ("store.Slots", ["seg", 8, 3, ["0"], None], "slots"),
        ("store.Slots", ["seg", 8, 3], "expected 5 fields"),
        ("store.UnitView", ["u0", 0, None, "cpu", None, "yes", None], "alive must be bool"),
        ("store.LocalInfo", ["h", 1, False, None], "shm must be bool"),
        ("store.Located", [{"x": [{"segment": "s"}]}, {}], "fields"),
        ("store.ColumnPut", ["7", {}], "put_id must be int"),
        ("store.FieldSchema", ["dense", "float32", [4], None], "shape"),  # a tuple, not a list
    ],
)
def test_a_malformed_message_is_a_protocol_error_naming_the_field(
    name: str, state: Any, match: str
) -> None:
    with pytest.raises(ProtocolError, match=match):
        decode(_raw(name, state))


def test_the_fetch_mode_is_an_enum_equal_to_its_string() -> None:
    assert FetchMode.of("peek") is FetchMode.PEEK and FetchMode.FETCH == "fetch"
    with pytest.raises(StoreInputError, match="mode must be one of"):
        FetchMode.of("bogus")
    req = FetchRequest("p", ("x",), 1, "t", "peek")
    assert req.mode is FetchMode.PEEK
    assert decode(encode(req)).mode is FetchMode.PEEK
    with pytest.raises(StoreInputError, match="mode must be one of"):
        FetchRequest("p", ("x",), 1, "t", "bogus")
    state = {**req.to_dict(), "mode": "look"}  # what a peer sent
    with pytest.raises(StoreInputError):
        FetchRequest.from_dict(state)


def test_a_unit_view_shows_as_the_public_dict() -> None:
    view = UnitView("u0", 1, "n", "cuda:0", None, False, None)
    assert view.as_dict() == {
        "unit_id": "u0",
        "shard": 1,
        "node_id": "n",
        "device": "cuda:0",
        "capacity_bytes": None,
        "alive": False,
        "handle": None,
    }


def test_every_store_message_has_a_sample_and_only_free_form_fields_are_any() -> None:
    """Fields typed ``Any``: a unit's actor handle, a CUDA IPC share (transport's own checked
    form), and the rows of the other fields (tensors or plain values)."""
    import typing

    from rayless.actors.protocol.wire import MESSAGES

    store = {n: c for n, c in MESSAGES.items() if n.startswith("store.")}
    assert set(store.values()) == {type(s) for s in SAMPLES} | {Slots, Place}
    loose = sorted(
        f"{name}.{field}"
        for name, cls in store.items()
        for field, hint in typing.get_type_hints(cls).items()
        if "Any" in repr(hint)
    )
    assert loose == [
        "store.Located.rest",
        "store.Place.ipc",
        "store.Slots.ipc",
        "store.UnitView.handle",
    ]
