"""Verified versions and delta publishing on the shared-memory path, within one process: the
checksums catch a flipped byte (naming the tensor, nothing copied); a delta publish writes only
what changed into a reused segment and every segment still holds its whole version; a relay
seeds a delta from its own copy."""

from __future__ import annotations

import asyncio
import dataclasses
import random
from typing import Any

import pytest
import torch

from rayless.transport import segments
from rayless.weights.checksums import PIECE, sums_of, verify
from rayless.weights.client import _changed_since, _same
from rayless.weights.delta import MERGE_GAP, History, changed_rows, changed_spans
from rayless.weights.errors import WeightChecksumError, WeightSyncError
from rayless.weights.layout import make_layout, row_view
from rayless.weights.messages import Delta, Entry, PathKind
from rayless.weights.paths.base import PublishRequest, Slots
from rayless.weights.paths.shm import ShmPath
from rayless.weights.service import WeightRelay
from rayless.weights.sinks import Targets


def _state(n: int = 20, seed: int = 0) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    out = {f"t{i}": torch.randn(3 + i, 5, generator=g) for i in range(n)}
    out["steps"] = torch.tensor(seed)
    out["tied"] = out["t0"]  # an alias: one place
    return out


def _publish(path: ShmPath, state: dict[str, torch.Tensor], version: int, **kw: bool) -> Entry:
    layout = make_layout(state, 1 << 10)  # several buckets
    return path.write(PublishRequest(state, layout, version, checksums=True, **kw)).entry


def _read(entry: Entry, verify_first: bool = True) -> dict[str, torch.Tensor]:
    """Every tensor of ``entry``'s segment, as a fresh dict (the whole version there)."""
    targets = {r[0]: torch.zeros(r[2], dtype=getattr(torch, r[1][6:])) for r in entry.layout}
    reader = segments.Reader()
    try:
        with reader.lease(entry.segment, entry.version) as payload:
            if verify_first:
                verify(entry, payload)
            flat = torch.frombuffer(payload, dtype=torch.uint8)
            Targets(targets, strict=True).copy(
                entry.layout, [flat] * len(entry.starts), entry.starts
            )
    finally:
        reader.close()
    return targets


def _equal(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def test_sums_hash_big_tensors_in_pieces_and_small_ones_whole() -> None:
    data = bytearray(random.Random(1).randbytes(2 * PIECE + 123))
    views = [memoryview(data), memoryview(data)[:10], memoryview(b"")]
    first = sums_of(views)
    assert sums_of(views) == first and len(first) == 3
    assert sums_of([memoryview(data)[:10]]) == [first[1]]
    data[PIECE + 5] ^= 1  # one flipped bit in the second piece
    assert sums_of(views)[0] != first[0] and sums_of(views)[1:] == first[1:]


def test_a_flipped_byte_in_shared_memory_names_the_tensor_and_nothing_is_copied() -> None:
    slots = Slots(3)
    try:
        state = _state()
        entry = _publish(ShmPath("t", slots), state, 1)
        assert len(entry.sums) == len(entry.layout)
        assert _equal(_read(entry), {k: v for k, v in state.items()})
        row = next(r for r in entry.layout if r[0] == "t7")
        seg = slots.pool().newest
        assert seg is not None
        seg.payload[entry.starts[row[3]] + row[4] + 3] ^= 0x10  # corrupt t7 in the segment
        targets = {r[0]: torch.zeros(r[2]) for r in entry.layout}
        reader = segments.Reader()
        try:
            with reader.lease(entry.segment, 1) as payload, pytest.raises(WeightChecksumError) as e:
                verify(entry, payload)
        finally:
            reader.close()
        assert (e.value.tensor, e.value.version) == ("t7", 1)
        assert all(not t.any() for t in targets.values())  # verify runs before any copy
        with pytest.raises(WeightSyncError, match="without checksums"):
            verify(dataclasses.replace(entry, sums=[]), memoryview(b""))
    finally:
        slots.close()


def test_changed_rows_compare_bytes_and_follow_aliases() -> None:
    state = _state(4)
    layout = make_layout(state, 1 << 20)
    buf = torch.zeros(4096, dtype=torch.uint8)
    for row in layout:
        row_view(buf, row, 0).copy_(state[row[0]])
    assert changed_rows(state, layout, [buf], None) == set()
    new = dict(state, t0=state["t0"].clone(), t2=state["t2"].clone())
    new["t0"][0, 0] += 1
    new["tied"] = new["t0"]
    z = dict(state, t3=torch.zeros(6, 5))
    z["t3"][0, 0] = -0.0
    names = [r[0] for r in layout]
    assert {names[i] for i in changed_rows(new, layout, [buf], None)} == {"t0", "tied"}
    zero_layout = make_layout(z, 1 << 20)
    zbuf = torch.zeros(4096, dtype=torch.uint8)  # +0.0 everywhere
    for row in zero_layout:
        if row[0] != "t3":
            row_view(zbuf, row, 0).copy_(z[row[0]])
    got = {zero_layout[i][0] for i in changed_rows(z, zero_layout, [zbuf], None)}
    assert got == {"t3"}  # -0.0 == 0.0 by value, not by bytes


def test_history_knows_what_changed_since_each_recent_version() -> None:
    h = History(window=3)
    layout = make_layout({"a": torch.zeros(2), "b": torch.zeros(2), "c": torch.zeros(2)}, 64)
    h.record(layout, 1, "s1", None, [])
    h.record(layout, 2, "s2", {0}, [])
    h.record(layout, 3, "s3", {2}, [])
    assert h.since(1) == {0, 2} and h.since(2) == {2} and h.since(3) == set()
    assert h.deltas() == (Delta(1, [0, 2]), Delta(2, [2]))
    assert h.to_write("s1", {1}) == {0, 1, 2} and h.to_write("new", {1}) is None
    h.record(layout, 4, "s1", {1}, [])  # the window keeps 3 versions
    assert h.since(1) is None and h.since(2) == {1, 2}
    assert h.newest(layout) == 4 and h.newest(layout[:1]) is None
    h.record(layout, 5, "s2", None, [])  # a full publish: no deltas before it
    assert h.deltas() == () and h.to_write("s1", set()) is None


def test_delta_publishes_keep_every_segment_whole_under_slot_rotation() -> None:
    """Many versions, random tensors changed each time, three segments in rotation: each
    version's segment reads back bit-exact, its sums verify, and its deltas name exactly
    the tensors that differ from each earlier version."""
    slots = Slots(3)
    rng = random.Random(7)
    try:
        path = ShmPath("t", slots)
        state = _state(30)
        published: dict[int, dict[str, torch.Tensor]] = {}
        for version in range(1, 25):
            state = dict(state)
            for name in rng.sample([f"t{i}" for i in range(30)], 3):
                state[name] = state[name] + version  # a new tensor: 10% changed
            state["tied"] = state["t0"]
            entry = _publish(path, state, version, delta=True)
            published[version] = {k: v.clone() for k, v in state.items()}
            assert _equal(_read(entry), published[version])
            for d in entry.deltas:
                old = published[d.version]
                differ = {r[0] for r in entry.layout if not torch.equal(old[r[0]], state[r[0]])}
                assert {entry.layout[i][0] for i in d.rows} == differ
            if version > 1:
                assert [d.version for d in entry.deltas] == list(
                    range(max(1, version - 7), version)
                )
    finally:
        slots.close()


def test_a_pull_copies_only_the_delta_from_the_version_it_holds() -> None:
    layout = make_layout({"a": torch.zeros(2), "b": torch.zeros(2)}, 64)
    entry = Entry(PathKind.SHM, 5, layout, 0, "seg", [0], (), [11, 22], (Delta(3, [1]),))
    assert _changed_since(entry, None) is entry
    assert _changed_since(entry, 4) is entry  # no delta from 4: the whole version
    part = _changed_since(entry, 3)
    assert part.layout == [layout[1]] and part.sums == [22]

    class Engine:
        def load(self, weights: object) -> None: ...

    e = Engine()
    assert _same(e.load, e.load) and not _same(e.load, Engine().load)
    assert _same(layout, layout) and not _same({}, {})


def test_changed_spans_merge_nearby_tensors() -> None:
    state = {"a": torch.zeros(4), "b": torch.zeros(4), "c": torch.zeros(MERGE_GAP)}
    state["d"] = torch.zeros(4)
    layout = make_layout(state, 1 << 30)
    entry = Entry(PathKind.SHM, 1, layout, 0, "s", [0])
    assert changed_spans(entry, [0, 1]) == [(0, 0, 64 + 16)]
    far = layout[3][4]
    assert changed_spans(entry, [0, 3]) == [(0, 0, 16), (0, far, far + 16)]


def test_a_relay_seeds_a_delta_from_the_version_it_holds() -> None:
    async def main() -> None:
        relay = WeightRelay(per_node=True, max_slots=2)
        layout = make_layout({"a": torch.zeros(16, dtype=torch.uint8)}, 64)
        try:
            assert await relay.begin(1, 64, 0, base=0) is False  # nothing held: everything
            await relay.write(1, 0, torch.full((64,), 7, dtype=torch.uint8), 0)
            first = relay.commit(Entry(PathKind.SHM, 1, layout, 0, "theirs", [0], (), [5]))
            assert first.sums == [5]
            assert await relay.begin(2, 64, 0, base=1) is True  # a copy of version 1 first
            await relay.write(2, 0, torch.full((8,), 9, dtype=torch.uint8), 0)
            await relay.write(2, 40, torch.full((2,), 5, dtype=torch.uint8), 0)  # outside "a"
            second = relay.commit(Entry(PathKind.SHM, 2, layout, 0, "theirs", [0]))
            reader = segments.Reader()
            try:
                with reader.lease(second.segment, 2) as payload:
                    got = bytes(payload)
            finally:
                reader.close()
            assert got == bytes([9] * 8 + [7] * 32 + [5] * 2 + [7] * 22)
            # version 3 lands in version 1's segment (two slots): only what changed since 1
            # (row 0, per the entry's deltas) comes from version 2's copy, the rest stays
            three = Entry(PathKind.SHM, 3, layout, 0, "theirs", [0], deltas=(Delta(1, [0]),))
            assert await relay.begin(3, 64, 0, 2, three) is True
            await relay.write(3, 4, torch.full((2,), 3, dtype=torch.uint8), 0)
            third = relay.commit(three)
            reader = segments.Reader()
            try:
                with reader.lease(third.segment, 3) as payload:
                    got = bytes(payload)
            finally:
                reader.close()
            # bytes 40-41 kept version 1's 7s: only row "a"'s span was copied, not the whole
            assert got == bytes([9] * 4 + [3] * 2 + [9] * 2 + [7] * 56)
            assert await relay.begin(4, 128, 0, base=3) is False  # another size
        finally:
            await relay.teardown()

    asyncio.run(main())


def test_a_delta_publish_writes_only_what_changed_since_the_segment_s_version(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from rayless.weights.paths import shm

    written: list[list[str]] = []
    real = shm.write_from

    def counting(tensors: Any, layout: Any, *args: Any) -> None:
        written.append(sorted({r[0] for r in layout}))
        real(tensors, layout, *args)

    monkeypatch.setattr(shm, "write_from", counting)
    slots = Slots(2)  # two segments: each version overwrites the one before the newest
    try:
        path = ShmPath("t", slots)
        state = _state(10)
        _publish(path, state, 1, delta=True)  # no base: everything
        _publish(path, dict(state, t3=state["t3"] + 1), 2, delta=True)  # a new segment: all
        _publish(path, dict(state, t3=state["t3"] + 1, t5=state["t5"] + 1), 3, delta=True)
        assert written[2] == ["t3", "t5"]  # the segment of version 1: changed since 1
        entry = _publish(path, dict(state, t3=state["t3"] + 1, t5=state["t5"] + 1), 4, delta=True)
        assert written[3] == ["t5"] and entry.deltas[-1] == Delta(3, [])
        _publish(path, state, 5)  # without delta: everything
        assert len(written[4]) == 12
    finally:
        slots.close()


def test_forward_sends_a_relay_that_holds_the_base_only_the_changed_bytes() -> None:
    from rayless.weights.paths.relay import forward

    class Relay:
        def __init__(self, seeded: bool) -> None:
            self.seeded = seeded
            self.writes: list[tuple[int, int]] = []

        async def begin(
            self, version: int, nbytes: int, shard: int, base: int = -1, entry: Any = None
        ) -> bool:
            return self.seeded and base >= 0

        async def write(self, version: int, offset: int, chunk: torch.Tensor, shard: int) -> None:
            self.writes.append((offset, chunk.numel()))

        async def commit(self, entry: Entry) -> Entry:
            return entry

    class Registry:
        async def announce(self, where: str, entry: Entry) -> None: ...

    state = {"a": torch.zeros(4), "big": torch.zeros(MERGE_GAP), "b": torch.zeros(4)}
    layout = make_layout(state, 1 << 30)
    chunks = [torch.zeros(sum(r[5] for r in layout) + 128, dtype=torch.uint8)]
    entry = Entry(PathKind.SHM, 2, layout, 0, "s", [0], deltas=(Delta(1, [2]),))
    for seeded, base, want in [
        (True, 1, [(layout[2][4], 16)]),
        (False, 1, [(0, chunks[0].numel())]),
        (True, 0, [(0, chunks[0].numel())]),  # no delta from 0: everything
    ]:
        relay = Relay(seeded)
        asyncio.run(forward(Registry(), "w", relay, entry, chunks, base))  # type: ignore[arg-type]
        assert relay.writes == want


@pytest.mark.parametrize("nbytes", [64, 68, 66, 65])  # as int64, int32, bytes, bytes
@pytest.mark.parametrize("offset", [0, 1, 4])  # a view starting off the 8-byte grid too
def test_a_single_changed_byte_is_found_whatever_the_width_compared(
    nbytes: int, offset: int
) -> None:
    from rayless.weights.delta import _differ

    base = torch.arange(nbytes + 8, dtype=torch.uint8)
    a = base[offset : offset + nbytes]
    assert not _differ((a, a.clone()))
    for k in range(nbytes):
        b = a.clone()
        b[k] ^= 0x80
        assert _differ((a, b)), k
    zero, negzero = torch.tensor([0.0]).view(torch.uint8), torch.tensor([-0.0]).view(torch.uint8)
    assert _differ((zero, negzero))  # bits, not values
