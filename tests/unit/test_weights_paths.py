"""Weight sync's typed wire and its transfer paths: every message round-trips through the codec
and is decoded with checks; every PathKind has one path in the registry, a publish takes the
first path that carries it, and a path written and read in one process moves the bytes."""

from __future__ import annotations

import asyncio
import os
import re
import typing
from pathlib import Path
from typing import Any

import msgpack
import pytest
import torch

from rayless.actors.protocol.wire import MESSAGES
from rayless.transport import codec, segments
from rayless.transport._registry import EXT, MARK
from rayless.transport.errors import ProtocolError
from rayless.weights.errors import WeightSyncError
from rayless.weights.layout import make_layout, rows_of
from rayless.weights.messages import (
    Delta,
    Entry,
    IpcBucket,
    PathKind,
    Piece,
    Published,
    RelayPlace,
    ShardSpec,
    SyncInfo,
)
from rayless.weights.paths.base import PublishRequest, PullRequest, Slots, WeightPath, Written
from rayless.weights.paths.dist import DIST_LOCATION
from rayless.weights.paths.registry import PATHS, Paths
from rayless.weights.service import WeightRegistry, WeightRelay
from rayless.weights.sinks import LoaderSink, Targets

ROOT = Path(__file__).resolve().parents[2]
STATE = {"w": torch.arange(6, dtype=torch.float32).reshape(2, 3), "steps": torch.tensor(7)}
LAYOUT = make_layout(STATE, 1 << 20)
IPC = IpcBucket([64], [1], 0, 0, "GPU-1", b"h", 64, 0, b"rc", 0, b"ev", True, 9)
ENTRY = Entry(PathKind.SHM, 3, LAYOUT, 1, "rayless-1-2-3-ab", [0])
SAMPLES: list[Any] = [
    ENTRY,
    Entry(PathKind.CUDA, 3, LAYOUT, 0, "rayless-1-2-3-ab", [0], (IPC,)),
    Entry(PathKind.DIST, 4, LAYOUT),
    Entry(PathKind.SHM, 5, LAYOUT, 0, "rayless-1-2-3-ab", [0], (), [7, 8], (Delta(4, [1]),)),
    Delta(4, [0, 1]),
    Entry(PathKind.SHM, 6, LAYOUT, pieces=(Piece(0, ShardSpec(1, 0, 2)),)),
    Piece(1, ShardSpec(0, 1, 4)),
    ShardSpec(0, 1, 2),
    IPC,
    Published(3, (ENTRY, ENTRY)),
    SyncInfo(True, 5, {"host#n0": "relay-0"}),
    RelayPlace("host#n0", "host"),
]


def _raw(name: str, state: Any) -> list[bytes]:
    """The frames of an extension record ``name`` with ``state``, as a peer could write it."""
    return [msgpack.packb([MARK[EXT], name, state])]


def test_every_weights_message_has_a_sample_and_round_trips() -> None:
    ours = {c for n, c in MESSAGES.items() if n.startswith("weights.")}
    assert {type(s) for s in SAMPLES} == ours
    for sample in SAMPLES:
        back = codec.decode(codec.encode(sample))
        assert type(back) is type(sample) and back == sample
    back = codec.decode(codec.encode(SAMPLES[1]))
    assert back.kind is PathKind.CUDA and back.ipc[0].fields() == IPC.fields()


def test_no_weights_message_field_is_typed_any() -> None:
    loose = [
        f"{name}.{field}"
        for name, cls in MESSAGES.items()
        if name.startswith("weights.")
        for field, hint in typing.get_type_hints(cls).items()
        if "Any" in repr(hint)
    ]
    assert loose == []


@pytest.mark.parametrize(
    ("fields", "match"),
    [
        (["parts", 3, []], "kind"),  # a kind no path has
        ([PathKind.SHM, "3", []], "version"),
        ([PathKind.SHM, 3, [["w", "torch.float32", (2, 3), 0, 0, 24]]], "layout"),
        ([PathKind.SHM, 3, [("w", "torch.float32", [2, 3], 0, 0, 24)]], "layout"),
        ([PathKind.SHM, 3, [("w", "torch.float32", (2, 3), "0", 0, 24)]], "layout"),
        ([PathKind.SHM, 3, [], 0, "", [0.5]], "starts"),
        ([PathKind.SHM, 3, [], 0, "", [], [[1, 2]]], "ipc"),
    ],
)
def test_a_malformed_entry_is_a_protocol_error(fields: list[Any], match: str) -> None:
    frames = codec.encode(Entry(*fields))  # the sender does not check; the receiver does
    with pytest.raises(ProtocolError, match=match):
        codec.decode(frames)
    with pytest.raises(ProtocolError, match="expected 10 fields"):
        codec.decode(_raw("weights.Entry", ["shm", 3, []]))


def test_no_method_of_the_package_takes_an_untyped_dict() -> None:
    """The structural check of the typed wire: no ``dict[str, Any]`` in a method's arguments."""
    pattern = re.compile(r"^\s+(async )?def [a-z][a-z_]*\(self[^)]*dict\[str, Any\]", re.M)
    found = [
        f"{path.relative_to(ROOT)}: {m.group(0).strip()}"
        for path in sorted((ROOT / "weights").rglob("*.py"))
        for m in pattern.finditer(path.read_text())
    ]
    assert found == []


def test_rows_of_checks_a_layout_decoded_without_types() -> None:
    raw = msgpack.unpackb(msgpack.packb(LAYOUT))  # rows and shapes come back as lists
    assert rows_of(raw) == LAYOUT
    bad_rows: list[Any] = [
        [["w", "torch.float32", [2, "3"], 0, 0, 24]],
        [["w", 1, [], 0, 0, 0]],
        [["w", "torch.float32", [], 0, -1, 0]],
        [["w"]],
        "rows",
        [[True, "x", [], 0, 0, 0]],
    ]
    for bad in bad_rows:
        with pytest.raises(ProtocolError):
            rows_of(bad)


# -- the registry of paths ------------------------------------------------------------------


class _Cuda:
    """Stands for a CUDA tensor where only ``is_cuda`` is asked (no GPU here)."""

    is_cuda = True


def _request(tensors: dict[str, Any], **kw: Any) -> PublishRequest:
    return PublishRequest(tensors, [], 1, **kw)


def test_every_kind_has_one_path_and_a_publish_takes_the_first_that_carries_it() -> None:
    assert set(PATHS) == set(PathKind)
    assert all(cls.kind is kind for kind, cls in PATHS.items())
    paths = Paths("t", Slots(2))
    cpu = dict(STATE)
    assert paths.publisher(_request(cpu)).kind is PathKind.SHM
    assert paths.publisher(_request({"a": _Cuda()})).kind is PathKind.CUDA
    assert paths.publisher(_request({"a": _Cuda()}, cuda_ipc=False)).kind is PathKind.SHM
    assert paths.publisher(_request({"a": _Cuda(), "b": STATE["w"]})).kind is PathKind.SHM
    assert paths.publisher(_request(cpu, group=object())).kind is PathKind.DIST
    assert paths.publisher(_request({}, group=object())).kind is PathKind.DIST
    assert paths.receiver(PullRequest()) is None
    assert paths.receiver(PullRequest(group=object())) is paths[PathKind.DIST]


def test_paths_that_do_not_publish_or_read_say_so() -> None:
    paths = Paths("t", Slots(2))
    with pytest.raises(WeightSyncError, match="relay path does not publish"):
        paths[PathKind.RELAY].write(_request(STATE))
    with pytest.raises(WeightSyncError, match="dist path, which is not read"):
        paths[PathKind.DIST].read(
            Entry(PathKind.DIST, 1, LAYOUT), memoryview(b""), Targets({}, False)
        )
    with pytest.raises(WeightSyncError, match="shm path does not receive"):
        paths[PathKind.SHM].receive(Targets({}, False), PullRequest())
    only = Paths("t", Slots(2), {PathKind.RELAY: PATHS[PathKind.RELAY]})
    with pytest.raises(WeightSyncError, match="no path publishes"):
        only.publisher(_request(STATE))
    with pytest.raises(WeightSyncError, match="no shm path"):
        only[PathKind.SHM]


def _read(paths: Paths, entry: Entry, sink: Any) -> None:
    reader = segments.Reader()
    try:
        with reader.lease(entry.segment, entry.version) as payload:
            path = paths[entry.kind]
            path.read(entry, payload, sink)
            path.settle()
    finally:
        reader.close()


@pytest.mark.parametrize("kind", [PathKind.SHM, PathKind.RELAY])
def test_the_shared_memory_paths_move_a_version_within_one_process(kind: PathKind) -> None:
    slots = Slots(2)
    paths = Paths("t", slots)
    try:
        written = paths[PathKind.SHM].write(PublishRequest(STATE, LAYOUT, 5, shard=1))
        entry = written.entry
        assert (entry.kind, entry.version, entry.shard, written.where) == (PathKind.SHM, 5, 1, None)
        assert written.chunks is not None and sum(c.numel() for c in written.chunks) > 0
        entry = codec.decode(codec.encode(Entry(kind, 5, entry.layout, 1, entry.segment,
                                                entry.starts)))  # fmt: skip
        targets = {"w": torch.zeros(2, 3, dtype=torch.float16), "steps": torch.tensor(0)}
        _read(paths, entry, Targets(targets, strict=True))
        assert torch.equal(targets["w"], STATE["w"].half()) and int(targets["steps"]) == 7
        got: list[str] = []
        _read(paths, entry, LoaderSink(lambda ws: got.extend(n for n, _ in ws), str, None))
        assert sorted(got) == ["steps", "w"]
    finally:
        slots.close()


class _Toy(WeightPath):
    """A path that carries what the test tags (the shape of a new path, in the test)."""

    kind = PathKind.SHM

    def publishes(self, request: PublishRequest) -> bool:
        return request.version == 42

    def write(self, request: PublishRequest) -> Written:
        return Written(Entry(self.kind, request.version, request.layout), None, "toy")


def test_a_table_of_paths_is_what_a_client_chooses_from() -> None:
    paths = Paths("t", Slots(2), {**PATHS, PathKind.SHM: _Toy})
    assert type(paths[PathKind.SHM]) is _Toy
    toy = paths.publisher(PublishRequest(STATE, LAYOUT, 42))
    assert toy.write(PublishRequest(STATE, LAYOUT, 42)).where == "toy"
    assert paths.publisher(_request(STATE, group=object())).kind is PathKind.DIST


# -- the registry actor and the relay, in-process ---------------------------------------------


def test_the_registry_keeps_typed_versions_and_joins_shards() -> None:
    async def main() -> None:
        registry = WeightRegistry("t", per_node=False)
        assert registry.info() == SyncInfo(False, -1, {})
        assert await registry.begin(1, os.getpid(), "h", "here", 0, 2) == []
        await registry.begin(1, os.getpid(), "h", "here", 1, 2)
        second = Entry(PathKind.SHM, 1, LAYOUT, 1, "seg-b", [0])
        await registry.announce("here", second)
        assert registry.latest_version() == -1  # shard 0 has not announced it
        first = Entry(PathKind.SHM, 1, LAYOUT, 0, "seg-a", [0])
        await registry.announce("here", first)
        published = await registry.wait("here", 1, 1.0)
        assert published == Published(1, (first, second))
        await registry.announce(DIST_LOCATION, Entry(PathKind.DIST, 2, LAYOUT, 0))
        assert registry.latest_version() == 1  # one shard of two over a group
        with pytest.raises(ProtocolError, match=r"weights\.Entry"):
            await registry.announce("here", {"version": 3})  # type: ignore[arg-type]

    asyncio.run(main())


def test_a_relay_commits_the_publishers_entry_as_its_own_copy() -> None:
    async def main() -> None:
        relay = WeightRelay(per_node=True)
        try:
            place = relay.where()
            assert place == RelayPlace(relay.location, place.host) and "#" in place.location
            await relay.begin(2, 64, 0)
            await relay.write(2, 0, torch.ones(64, dtype=torch.uint8), 0)
            committed = relay.commit(Entry(PathKind.CUDA, 2, LAYOUT, 0, "theirs", [0], (IPC,)))
            assert (committed.kind, committed.version, committed.ipc) == (PathKind.RELAY, 2, ())
            assert committed.segment != "theirs" and committed.layout == LAYOUT
            with pytest.raises(WeightSyncError, match="not begun"):
                relay.commit(Entry(PathKind.SHM, 9, LAYOUT))
        finally:
            await relay.teardown()

    asyncio.run(main())
