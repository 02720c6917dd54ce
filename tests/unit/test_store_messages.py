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
from rayless.store.data.status import (
    ControllerMetrics,
    ControllerStats,
    ExportedSample,
    KeyListing,
    PartitionExport,
    PartitionMetrics,
    ProductionStatus,
    Rate,
    ShardStats,
    StateStats,
    UnitStats,
)
from rayless.store.errors import StoreInputError
from rayless.transport._registry import EXT, MARK
from rayless.transport.codec import decode, encode
from rayless.transport.errors import ProtocolError

UNIT = UnitView("u0", 0, "node-0", "cpu", 1 << 20, True, None)
WAITING = WaitingFetch("p", False, ["x", "y"], ["y"], "t", 0, None, 1.5, "a fetch waits")
SHARD = ShardStats("u0", "cpu", 96, None, {"p": 4}, 2)
# Each status document with the dict the store's public API shows for it.
STATUS: dict[str, Any] = {
    "Rate": Rate(12, 1.2),
    "ShardStats": SHARD,
    "UnitStats": UnitStats.of(
        SHARD,
        spare_bytes=32,
        incarnation="abc",
        puts=Rate(4, 0.4),
        gets=Rate(0, 0.0),
        reservations=1,
        spare=1,
        reserving=0,
    ),
    "StateStats": StateStats(1, 4, 2, 0, 0, 0, 6, [UNIT]),
    "ControllerStats": ControllerStats(1, 4, 2, 0, 0, 0, 6, [UNIT], 0, 2, 1, False, 0),
    "ProductionStatus": ProductionStatus(
        4, 1, {"x": 4}, {"x": FieldSchema("dense", "float32", (3,), "cpu")}
    ),
    "PartitionMetrics": PartitionMetrics(4, {"x": 4}, {"t": 2}),
    "ControllerMetrics": ControllerMetrics(
        "s0",
        Rate(4, 0.4),
        Rate(2, 0.2),
        [WAITING],
        1,
        {"p": PartitionMetrics(4, {"x": 4}, {"t": 2})},
        [UNIT],
    ),
    "KeyListing": KeyListing({"kv": {"k1": {"tag": [1, "a"]}, "k2": {}}}),
    "ExportedSample": ExportedSample(3, "k1", [2, "g"], {"c": {"d": 1}}, ["x"]),
    "PartitionExport": PartitionExport(
        [ExportedSample(3, None, None, {}, ["x"]), ExportedSample(5, "k", 1, {}, [])],
        {"t": [3]},
        2,
    ),
}
UNIT_DICT = {
    "unit_id": "u0",
    "shard": 0,
    "node_id": "node-0",
    "device": "cpu",
    "capacity_bytes": 1 << 20,
    "alive": True,
}
STATS = {
    "partitions": 1,
    "allocated": 4,
    "free": 2,
    "pending_release": 0,
    "staged": 0,
    "column_puts": 0,
    "high_water": 6,
    "units": [UNIT_DICT],
}
SHARD_DICT = {
    "unit_id": "u0",
    "device": "cpu",
    "used_bytes": 96,
    "capacity_bytes": None,
    "rows": {"p": 4},
    "kv_keys": 2,
}
PUBLIC: dict[str, Any] = {
    "Rate": {"total": 12, "per_s": 1.2},
    "ShardStats": SHARD_DICT,
    "UnitStats": {
        "spare_bytes": 32,
        **SHARD_DICT,
        "incarnation": "abc",
        "puts": {"total": 4, "per_s": 0.4},
        "gets": {"total": 0, "per_s": 0.0},
        "reservations": 1,
        "spare": 1,
        "reserving": 0,
    },
    "StateStats": STATS,
    "ControllerStats": {
        **STATS,
        "unwritten": 0,
        "leased": 2,
        "waiting_fetches": 1,
        "units_starting": False,
        "units_waiters": 0,
    },
    "ProductionStatus": {
        "samples": 4,
        "lost": 1,
        "fields": {"x": 4},
        "schemas": {"x": FieldSchema("dense", "float32", (3,), "cpu").to_dict()},
    },
    "PartitionMetrics": {"samples": 4, "fields": {"x": 4}, "consumers": {"t": 2}},
    "ControllerMetrics": {
        "store_id": "s0",
        "puts": {"total": 4, "per_s": 0.4},
        "fetches": {"total": 2, "per_s": 0.2},
        "waiting": [WAITING.as_dict()],
        "leased": 1,
        "partitions": {"p": {"samples": 4, "fields": {"x": 4}, "consumers": {"t": 2}}},
        "units": [UNIT_DICT],
    },
    "KeyListing": {"kv": {"k1": {"tag": [1, "a"]}, "k2": {}}},
    "ExportedSample": {
        "index": 3,
        "key": "k1",
        "group": [2, "g"],
        "custom": {"c": {"d": 1}},
        "fields": ["x"],
    },
    "PartitionExport": {
        "samples": [
            {"index": 3, "key": None, "group": None, "custom": {}, "fields": ["x"]},
            {"index": 5, "key": "k", "group": 1, "custom": {}, "fields": []},
        ],
        "consumed": {"t": [3]},
        "group_size": 2,
    },
}

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
    *STATUS.values(),
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
        "store.ExportedSample.custom",  # the user's: custom metadata, group values, tags
        "store.ExportedSample.group",
        "store.KeyListing.keys",
        "store.Located.rest",
        "store.Place.ipc",
        "store.Slots.ipc",
        "store.UnitView.handle",
    ]


@pytest.mark.parametrize("name", sorted(STATUS))
def test_a_status_document_shows_as_the_dict_the_public_api_returns(name: str) -> None:
    msg = STATUS[name]
    assert type(msg).__name__ == name
    assert msg.as_dict() == PUBLIC[name]
    assert decode(encode(msg)).as_dict() == PUBLIC[name]


@pytest.mark.parametrize(
    ("name", "state", "match"),
    [
        ("store.Rate", ["12", 1.0], "total must be int"),
        ("store.ShardStats", ["u0", "cpu", 0, None, {"p": "4"}, 0], "rows"),
        ("store.ControllerMetrics", ["s", None, None, [], 0, {}, []], "puts"),
        ("store.PartitionExport", [[{"index": 3}], {}, None], "samples"),
        ("store.KeyListing", [{"kv": ["k1"]}], "keys"),
    ],
)
def test_a_malformed_status_document_is_a_protocol_error_naming_the_field(
    name: str, state: Any, match: str
) -> None:
    with pytest.raises(ProtocolError, match=match):
        decode(_raw(name, state))


def _untyped(hint: Any) -> bool:
    """Whether ``hint`` is or holds ``dict[str, Any]`` / ``Mapping[str, Any]``."""
    import collections.abc
    import typing

    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin in (dict, collections.abc.Mapping) and args == (str, Any):
        return True
    return any(_untyped(a) for a in args)


def test_no_remote_method_of_the_store_actors_moves_an_untyped_dict() -> None:
    """Every public method of the controller and the units takes and returns typed values;
    the one exception is the user's own custom metadata (``set_custom_meta``)."""
    import inspect
    import typing

    from rayless.actors.api.binding import public_methods
    from rayless.store.controller.actor import StoreController
    from rayless.store.unit.actor import StorageUnit

    found = []
    for cls in (StoreController, StorageUnit):
        methods = public_methods(cls)
        assert "stats" in methods
        for name in methods:
            func = getattr(cls, name)
            hints = typing.get_type_hints(func)
            assert "return" in hints, f"{cls.__name__}.{name} has no return annotation"
            params = set(inspect.signature(func).parameters) - {"self"}
            assert params <= set(hints), f"{cls.__name__}.{name} has unannotated parameters"
            found += [
                f"{cls.__name__}.{name}:{arg}" for arg, hint in hints.items() if _untyped(hint)
            ]
    assert found == ["StoreController.set_custom_meta:custom"]
