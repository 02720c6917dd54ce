"""Extension families (``register_family``/``join_family``) and ``ray.util.register_serializer``,
which builds on one: the record carries what rebuilds it, so a receiver registers nothing."""

from __future__ import annotations

import dataclasses
import pickle
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import msgpack
import pytest
import torch

from rayless.ray.util import deregister_serializer, register_serializer
from rayless.transport import _objects as objects
from rayless.transport import codec
from rayless.transport.errors import ProtocolError


def rt(obj: Any) -> Any:
    return codec.decode([bytes(f) for f in codec.encode(obj)])


class Locked:
    def __init__(self, x: int) -> None:
        self.x = x
        self.lock = threading.Lock()


class LockedChild(Locked):
    pass


@dataclasses.dataclass
class Point:
    x: int


@pytest.fixture
def locked() -> Iterator[None]:
    register_serializer(Locked, serializer=lambda v: {"x": v.x}, deserializer=_rebuild)
    yield
    deregister_serializer(Locked)


def _rebuild(state: dict[str, Any]) -> Locked:
    return Locked(state["x"])


def test_a_registered_class_travels_through_its_functions(locked: None) -> None:
    out = rt({"a": [Locked(1), Locked(2)], "t": torch.ones(2)})
    assert [type(v) for v in out["a"]] == [Locked, Locked] and [v.x for v in out["a"]] == [1, 2]
    assert torch.equal(out["t"], torch.ones(2))
    # exactly the class, as in Ray: a subclass is not covered
    with pytest.raises(TypeError, match=r"obj\[0\]: cannot encode LockedChild"):
        codec.encode([LockedChild(1)])


def test_deregistering_and_registering_again(locked: None) -> None:
    deregister_serializer(Locked)
    deregister_serializer(Locked)  # nothing registered: nothing happens
    with pytest.raises(TypeError, match="cannot encode Locked"):
        codec.encode(Locked(1))
    register_serializer(Locked, serializer=lambda v: {"x": v.x * 10}, deserializer=_rebuild)
    assert rt(Locked(2)).x == 20


def test_a_registered_dataclass_goes_through_its_serializer() -> None:
    register_serializer(Point, serializer=lambda p: p.x + 1, deserializer=lambda x: Point(-x))
    try:
        assert rt(Point(1)) == Point(-2)
    finally:
        deregister_serializer(Point)
    assert rt(Point(1)) == Point(1)


def test_a_class_the_codec_sends_itself_keeps_its_encoding() -> None:
    with pytest.warns(UserWarning, match=r"has no effect: the codec already encodes Tensor itself"):
        register_serializer(torch.Tensor, serializer=lambda t: 0, deserializer=lambda s: s)
    assert torch.equal(rt(torch.arange(3)), torch.arange(3))
    with pytest.raises(TypeError, match="needs a class"):
        register_serializer(Locked(1), serializer=str, deserializer=str)  # type: ignore[arg-type]


def test_the_receiver_needs_no_registration(locked: None) -> None:
    """Another interpreter that never imported rayless.ray decodes the value (the lazy
    extension loads the family's decoder; the deserializer comes with the record)."""
    frames = [bytes(f) for f in codec.encode(Locked(7))]
    code = (
        "import pickle, sys; from rayless.transport.codec import decode; "
        "v = decode(pickle.loads(sys.stdin.buffer.read())); print(type(v).__name__, v.x)"
    )
    out = subprocess.run(
        [sys.executable, "-c", code],
        input=pickle.dumps(frames),
        capture_output=True,
        check=True,
        cwd=str(Path(__file__).resolve().parents[2]),
        timeout=120,
    )
    assert out.stdout.split() == [b"Locked", b"7"]


def test_a_process_that_runs_no_user_code_refuses_the_record(
    locked: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    frames = [bytes(f) for f in codec.encode(Locked(1))]
    monkeypatch.setattr(objects, "_REFUSED", True)
    with pytest.raises(ProtocolError, match="does not load"):
        codec.decode(frames)


def test_bad_records_and_failing_deserializers_are_protocol_errors() -> None:
    ext = msgpack.ExtType(16, b"")
    for state in ([1, 2], "x", [b"\x80\x05N.", 1, 2]):
        header = msgpack.packb([ext, "rayless.ray.custom", state])
        with pytest.raises(ProtocolError, match="bad custom-serialized value"):
            codec.decode([header])
    header = msgpack.packb([ext, "rayless.ray.custom", [b"not a pickle", 1]])
    with pytest.raises(ProtocolError, match="cannot be loaded here"):
        codec.decode([header])

    def broken(state: Any) -> Any:
        raise ValueError("no")

    register_serializer(Locked, serializer=lambda v: v.x, deserializer=broken)
    try:
        with pytest.raises(ProtocolError, match=r"deserializer .*broken.* raised ValueError: no"):
            rt(Locked(1))
    finally:
        deregister_serializer(Locked)


def test_family_registration_conflicts_are_value_errors() -> None:
    with pytest.raises(ValueError, match="is taken by"):
        codec.register_family("rayless.ray.object_ref", lambda s: s)
    with pytest.raises(ValueError, match="registered family"):
        codec.join_family(Locked, "no.such.family", lambda v: v)
    with pytest.raises(ValueError, match="the codec already encodes int"):
        codec.join_family(int, "rayless.ray.custom", lambda v: v)
    with pytest.raises(ValueError, match="is taken by"):
        codec.register_extension(Locked, "rayless.ray.custom", lambda v: v, lambda s: s)
