"""The codec carries sets, dataclasses and Enums of importable modules (by name), and
OmegaConf configs, as Ray users and verl pass them to actors; malformed records of them are
ProtocolErrors; a class with no importable name (``__main__``, a function's) travels by
value."""

from __future__ import annotations

import dataclasses
import enum
import threading
from typing import Any

import msgpack
import pytest
import torch

from rayless.transport import ProtocolError, decode, encode
from rayless.transport._registry import EXT, FROZENSET, MARK, OBJECT, SET
from tests.drivers import run_fresh
from tests.unit.codec_classes import Batch, Child, Color, Frozen, Level, NotData, Sample, Slotted


def _round(value: Any) -> Any:
    return decode([bytes(f) for f in encode(value)])


def _record(*items: Any) -> list[bytes]:
    return [msgpack.packb(list(items), use_bin_type=True)]


def test_sets_and_frozensets() -> None:
    value = {"s": {1, "a", (2, 3)}, "f": frozenset({b"x", 4.5}), "empty": set(), frozenset(): 1}
    got = _round(value)
    assert got == value
    assert type(got["s"]) is set and type(got["f"]) is frozenset and got["empty"] == set()


def test_dataclasses_and_enums_round_trip_with_their_tensors() -> None:
    s = Sample("hello", torch.arange(4), 1.5, ["a"])
    batch = Batch([s, Child("x", torch.ones(2), group=3)], Level.HIGH, {"c": Color.BLUE})
    got = _round(batch)
    assert type(got) is Batch and type(got.samples[1]) is Child and got.samples[1].group == 3
    assert got.samples[0].prompt == "hello" and torch.equal(got.samples[0].tokens, torch.arange(4))
    assert got.samples[0].length == 5  # set by __post_init__: not a field, kept as pickle would
    assert got.level is Level.HIGH and got.extra["c"] is Color.BLUE
    frozen = _round(Frozen(7, Color.RED))
    assert frozen == Frozen(7, Color.RED)
    with pytest.raises(dataclasses.FrozenInstanceError):
        frozen.x = 8  # type: ignore[misc]
    assert _round(Slotted(1, (2, 3))) == Slotted(1, (2, 3))
    assert _round([Level.LOW, Color.RED]) == [Level.LOW, Color.RED]


def test_a_class_without_an_importable_name_travels_by_value() -> None:
    @dataclasses.dataclass
    class Local:
        x: int
        mode: Any = None

    class Mode(enum.Enum):
        A = 1
        B = 2

    record = msgpack.unpackb(bytes(encode(Local(1, Mode.B))[0]), raw=False, strict_map_key=False)
    assert len(record) == 6 and type(record[5]) is bytes  # the class travels by value
    got = _round([Local(1, Mode.B), Local(2)])
    assert type(got[0]) is Local and got == [Local(1, Mode.B), Local(2)]  # one class a process
    assert got[0].mode is Mode.B
    frames = [bytes(f).hex() for f in encode({"v": Local(3, Mode.A), "t": torch.arange(3)})]
    out = run_fresh(
        f"""
        from rayless.transport import decode
        got = decode([bytes.fromhex(f) for f in {frames!r}])
        again = decode([bytes.fromhex(f) for f in {frames!r}])
        v = got["v"]
        same = type(again["v"]) is type(v)
        print(type(v).__name__, v.x, v.mode.name, same, got["t"].sum().item())
        """
    )
    assert out.split() == [
        "Local",
        "3",
        "A",
        "True",
        "3",
    ]
    with pytest.raises(TypeError, match="cannot encode NotData"):
        encode(NotData())


def test_classes_themselves_travel_by_name_or_by_value() -> None:
    # a worker class, a sampler class in a config: Ray pickles them, we name them
    class Local:
        pass

    value = {"cls": NotData, "enum": Color, "builtin": int, "data": Batch, "local": Local}
    got = _round(value)
    assert got["cls"] is NotData and got["enum"] is Color and got["builtin"] is int
    assert got["data"] is Batch and got["local"] is Local  # (one class a process, by value)
    assert _round(Level.HIGH) is Level.HIGH  # (a class found once does not let records of
    with pytest.raises(ProtocolError, match="not a dataclass or Enum"):  # others build it)
        decode(_record(MARK[OBJECT], "tests.unit.codec_classes", "NotData", "d", {}))
    omegaconf = pytest.importorskip("omegaconf")
    cfg = omegaconf.OmegaConf.create({"sampler": Local}, flags={"allow_objects": True})
    assert _round(cfg).sampler is Local  # TransferQueue's config, with its sampler class


def test_a_functions_class_sent_back_by_its_receiver_is_the_senders_own() -> None:
    # cloudpickle names the receiver's copy Local of this (importable) module: sent back by
    # that name, it could not be found here
    @dataclasses.dataclass
    class Local:
        x: int

    class Kind:
        pass

    frames = [bytes(f).hex() for f in encode([Local(1), Kind])]
    out = run_fresh(
        f"""
        from rayless.transport import decode, encode
        got = decode([bytes.fromhex(f) for f in {frames!r}])
        print(type(got[0]).__qualname__, got[1].__qualname__)
        print(",".join(bytes(f).hex() for f in encode([got[0], got[1], type(got[0])(2)])))
        """
    )
    names, back = out.splitlines()
    assert names.split() == ["Local", "Kind"]  # (cloudpickle drops the function's name)
    value, kind, again = decode([bytes.fromhex(f) for f in back.split(",")])
    assert type(value) is Local and kind is Kind and type(again) is Local and again.x == 2


def test_a_class_by_value_that_cannot_be_pickled_is_refused_at_the_sender() -> None:
    lock = threading.Lock()

    @dataclasses.dataclass
    class Guarded:
        x: int

        def held(self) -> bool:
            return lock.locked()  # a closure over a lock: cloudpickle cannot pickle it

    with pytest.raises(
        TypeError, match=r"obj\[0\]: cannot encode .*Guarded: a class defined in a function "
    ):
        encode([Guarded(1)])


def test_a_fresh_process_imports_the_module_of_a_class_it_receives() -> None:
    frames = [bytes(f).hex() for f in encode({"b": Batch([], Level.LOW)})]
    out = run_fresh(
        f"""
        import sys
        from rayless.transport import decode
        assert "tests.unit.codec_classes" not in sys.modules
        got = decode([bytes.fromhex(f) for f in {frames!r}])
        print(type(got["b"]).__module__, got["b"].level.name)
        """
    )
    assert out.split() == ["tests.unit.codec_classes", "LOW"]


@pytest.mark.parametrize(
    "frames, error",
    [
        (_record(MARK[SET], [1, 2]), "bad set record"),
        (_record(MARK[FROZENSET], {"a": 1}), "bad frozenset record"),
        (_record(MARK[OBJECT], "no_such_module_xyz", "A", "d", {}), "cannot be imported here"),
        (_record(MARK[OBJECT], "os", "path", "d", {}), "is not a class here"),
        (_record(MARK[OBJECT], "tests.unit.codec_classes", "NotData", "d", {}), "not a datacl"),
        (_record(MARK[OBJECT], "tests.unit.codec_classes", "Frozen", "d", {"x": 1}), "fields"),
        (
            _record(MARK[OBJECT], "tests.unit.codec_classes", "Frozen", "d", {"x": 1, "1": 2}),
            "fields",
        ),
        (_record(MARK[OBJECT], "tests.unit.codec_classes", "Color", "e", "GREEN"), "no member"),
        (_record(MARK[OBJECT], "tests.unit.codec_classes", "Color", "d", {}), "bad dataclass"),
        (_record(MARK[OBJECT], "tests.unit.codec_classes", "Frozen", "e", "x"), "bad Enum"),
        (_record(MARK[OBJECT], "a b", "A", "d", {}), "bad class name"),
        (_record(MARK[OBJECT], "tests.unit.codec_classes", "f.<locals>.A", "d", {}), "bad class"),
        (_record(MARK[OBJECT], 1, "A", "d", {}), "bad object record"),
        (_record(MARK[OBJECT], "tests.unit.codec_classes", "Frozen", "d"), "bad record"),
        (_record(MARK[OBJECT], "os", "sep", "c", None), "is not a class here"),
        (_record(MARK[OBJECT], "tests.unit.codec_classes", "NotData", "c", {}), "bad class rec"),
    ],
)
def test_malformed_records_are_protocol_errors(frames: list[bytes], error: str) -> None:
    with pytest.raises(ProtocolError, match=error):
        decode(frames)


def test_omegaconf_configs_keep_interpolations_and_flags() -> None:
    omegaconf = pytest.importorskip("omegaconf")
    OmegaConf = omegaconf.OmegaConf
    cfg = OmegaConf.create(
        {"data": {"len": 512}, "actor": {"len": "${data.len}", "lr": 1e-6, "ids": [1, 2]}}
    )
    OmegaConf.set_struct(cfg, True)
    got = _round(cfg)
    assert isinstance(got, omegaconf.DictConfig) and OmegaConf.is_struct(got)
    assert got.actor.len == 512
    got.data.len = 1024  # the interpolation travelled: it follows the new value
    assert got.actor.len == 1024
    with pytest.raises(omegaconf.errors.ConfigAttributeError):
        got.actor.nope  # noqa: B018 (struct: an unknown key is an error, as in the sender)
    node = _round(cfg.actor)  # a node inside a config: its interpolations resolved
    assert node.len == 512 and OmegaConf.to_container(node)["len"] == 512
    ids = _round(cfg.actor.ids)
    assert isinstance(ids, omegaconf.ListConfig) and list(ids) == [1, 2]
    frozen = OmegaConf.create({"a": 1})
    OmegaConf.set_readonly(frozen, True)
    assert OmegaConf.is_readonly(_round(frozen))
    with pytest.raises(ProtocolError, match="bad OmegaConf record"):
        decode(_record(MARK[EXT], "omegaconf.DictConfig", [[1], False, False]))
