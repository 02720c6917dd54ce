"""Resharding: a trainer's shards (tensor parallel 2, FSDP 4, or whole tensors) published on the
shared-memory path; engine ranks (tensor parallel 4 or 2) pull their slices, bit-exact against
slicing the full state dict; a missing shard or a wrongly shaped target names the tensor."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import pytest
import torch

from rayless.transport import segments
from rayless.weights.client import _pieces
from rayless.weights.errors import WeightMismatchError
from rayless.weights.layout import make_layout
from rayless.weights.messages import Entry, ShardSpec
from rayless.weights.paths.base import PublishRequest, Slots
from rayless.weights.paths.shm import ShmPath
from rayless.weights.reshard import box_of, resharding, spec_of
from rayless.weights.sinks import Sink, sink_for

g = torch.Generator().manual_seed(3)
FULL = {
    "qkv.weight": torch.randn(8, 6, generator=g, dtype=torch.float64).to(torch.bfloat16),
    "o.weight": torch.randn(8, 8, generator=g),  # row parallel: split along dim 1
    "embed.weight": torch.randn(16, 6, generator=g),  # vocab parallel
    "norm.weight": torch.randn(8, generator=g),
    "steps": torch.tensor(11),
}
TP_DIMS = {"qkv.weight": 0, "o.weight": 1, "embed.weight": 0}  # norm, steps: replicated


def _tp(rank: int, world: int) -> Callable[[str], ShardSpec | None]:
    return lambda name: ShardSpec(TP_DIMS[name], rank, world) if name in TP_DIMS else None


def _fsdp(rank: int, world: int) -> Callable[[str], ShardSpec | None]:
    return lambda name: None if name == "steps" else ShardSpec(0, rank, world)


def _slice(name: str, spec: ShardSpec | None) -> torch.Tensor:
    t = FULL[name]
    for d, (lo, hi) in enumerate(box_of(name, list(t.shape), spec)):
        t = t.narrow(d, lo, hi - lo)
    return t.clone()


def _publish(split: Callable[[int, int], Any], world: int, version: int = 1) -> list[Entry]:
    """Each trainer rank's entry: its slices, whole tensors from rank 0 only."""
    entries = []
    for rank in range(world):
        want = split(rank, world)
        state = {n: _slice(n, want(n)) for n in FULL if want(n) is not None or rank == 0}
        layout = make_layout(state, 1 << 8)
        slots = Slots(2)
        SLOTS.append(slots)
        written = ShmPath("t", slots).write(PublishRequest(state, layout, version, shard=rank))
        entries.append(dataclasses.replace(written.entry, pieces=_pieces(layout, want)))
    return entries


SLOTS: list[Slots] = []


@pytest.fixture(autouse=True)
def _close_slots() -> Any:
    yield
    for slots in SLOTS:
        slots.close()
    SLOTS.clear()


def _pull(entries: list[Entry], sink: Sink) -> None:
    sink.check_parts(entries)
    reader = segments.Reader()
    try:
        for entry in entries:
            with reader.lease(entry.segment, entry.version) as payload:
                ShmPath("t", Slots(2)).read(entry, payload, sink)
    finally:
        reader.close()
    sink.finish()


@pytest.mark.parametrize(
    ("trainer", "tworld", "eworld"),
    [(_tp, 2, 4), (_fsdp, 4, 2), (_tp, 1, 2), (_tp, 4, 1)],
    ids=["tp2-to-tp4", "fsdp4-to-tp2", "full-to-tp2", "tp4-to-full"],
)
def test_engine_ranks_pull_their_slices_bit_exact(trainer: Any, tworld: int, eworld: int) -> None:
    entries = _publish(trainer, tworld)
    for rank in range(eworld):
        want = _tp(rank, eworld)
        expected = {n: _slice(n, want(n)) for n in FULL}
        targets = {n: torch.zeros_like(t) for n, t in expected.items()}
        _pull(entries, resharding(sink_for(targets, True, None, None, None), want, 1 << 20))
        for name, t in expected.items():
            a, b = targets[name].reshape(-1), t.reshape(-1)
            assert torch.equal(a.view(torch.uint8), b.view(torch.uint8)), name
        got: dict[str, torch.Tensor] = {}
        calls: list[int] = []

        def load(
            weights: Any, got: dict[str, torch.Tensor] = got, calls: list[int] = calls
        ) -> None:
            calls.append(1)
            got.update(weights)

        sink = resharding(sink_for(None, True, load, {"steps": "step"}, torch.float32), want, 64)
        _pull(entries, sink)
        assert sorted(got) == sorted(n if n != "steps" else "step" for n in FULL)
        assert len(calls) > 1  # in groups of about bucket_bytes
        for name, t in expected.items():
            back = got["step" if name == "steps" else name]
            assert back.dtype == (torch.float32 if t.is_floating_point() else t.dtype)
            assert torch.equal(back, t.to(back.dtype)), name


def test_a_missing_shard_or_a_wrong_shape_names_the_tensor() -> None:
    entries = _publish(_tp, 2)
    want = _tp(0, 4)
    targets = {n: torch.zeros_like(_slice(n, want(n))) for n in FULL}
    with pytest.raises(WeightMismatchError, match="shard is missing") as e:
        _pull(entries[:1], resharding(sink_for(targets, True, None, None, None), want, 1 << 20))
    assert e.value.tensor in TP_DIMS
    targets["o.weight"] = torch.zeros(8, 8)
    with pytest.raises(WeightMismatchError) as e:
        _pull(entries, resharding(sink_for(targets, True, None, None, None), want, 1 << 20))
    assert e.value.tensor == "o.weight"
    with pytest.raises(WeightMismatchError, match="does not split"):
        _pull(
            entries,
            resharding(sink_for(targets, True, None, None, None), ShardSpec(0, 0, 3), 1 << 20),
        )
    with pytest.raises(TypeError):
        spec_of(3)  # type: ignore[arg-type]


def test_a_slice_along_a_dimension_the_tensor_has_not_names_it() -> None:
    layout = make_layout({"w": torch.zeros(4)}, 1 << 10)
    with pytest.raises(WeightMismatchError) as e:
        _pieces(layout, spec_of(ShardSpec(1, 0, 2)))
    assert e.value.tensor == "w"
    assert _pieces(layout, spec_of(None)) == ()
