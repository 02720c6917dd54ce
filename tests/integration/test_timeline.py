"""The timeline: spans of calls (both sides, linked by flows), spawns and store operations,
gathered from every process into one Chrome trace-event file (``Cluster.timeline`` and
``rayless timeline``)."""

from __future__ import annotations

import itertools
import json
import os
import subprocess
import sys
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from tensordict import TensorDict

from rayless.actors import Cluster
from rayless.actors.api import timeline
from rayless.store import Store
from tests.integration.timeline_classes import Peer

pytestmark = pytest.mark.integration


def check_trace_format(trace: dict[str, Any]) -> None:
    """Fail unless ``trace`` follows the Chrome trace-event format as Perfetto reads it."""
    assert isinstance(trace["traceEvents"], list) and trace["traceEvents"]
    flows: dict[int, dict[str, list[dict[str, Any]]]] = {}
    for ev in trace["traceEvents"]:
        ph = ev["ph"]
        assert ph in ("X", "s", "f", "M"), ev
        assert isinstance(ev["pid"], int) and isinstance(ev["name"], str), ev
        if ph == "M":
            assert ev["name"] in ("process_name", "process_sort_index", "thread_name"), ev
            assert isinstance(ev["args"], dict), ev
            continue
        assert isinstance(ev["tid"], int), ev
        assert isinstance(ev["ts"], (int, float)) and ev["ts"] >= 0, ev
        if ph == "X":
            assert isinstance(ev["dur"], (int, float)) and ev["dur"] >= 0, ev
            json.dumps(ev["args"])
        else:
            assert isinstance(ev["id"], int) and ev["cat"] == "call", ev
            flows.setdefault(ev["id"], {}).setdefault(ph, []).append(ev)
            if ph == "f":
                assert ev["bp"] == "e", ev
    for fid, ends in flows.items():
        assert len(ends.get("s", [])) == 1 and len(ends.get("f", [])) == 1, (fid, ends)
        assert ends["f"][0]["ts"] >= ends["s"][0]["ts"]
    # spans of one track nest or follow each other (complete events on one thread)
    tracks: dict[tuple[int, int], list[tuple[float, float]]] = {}
    for ev in trace["traceEvents"]:
        if ev["ph"] == "X":
            tracks.setdefault((ev["pid"], ev["tid"]), []).append((ev["ts"], ev["ts"] + ev["dur"]))
    for spans in tracks.values():
        spans.sort()
        for (_, end), (start, _) in itertools.pairwise(spans):
            assert start >= end - 1e-3, spans  # lanes never overlap


@pytest.fixture
def timeline_on(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """RAYLESS_TIMELINE=1 for this process and the cluster's processes it starts."""
    monkeypatch.setenv(timeline.ENV, "1")
    timeline.RECORDER.reset()
    yield
    monkeypatch.delenv(timeline.ENV)
    timeline.RECORDER.reset()


@pytest.fixture
async def traced_cluster(timeline_on: None) -> AsyncIterator[Cluster]:
    async with Cluster.local(nodes=2) as cluster:
        yield cluster


def _by(trace: dict[str, Any]) -> tuple[dict[int, str], list[dict[str, Any]]]:
    names = {
        ev["pid"]: ev["args"]["name"]
        for ev in trace["traceEvents"]
        if ev["ph"] == "M" and ev["name"] == "process_name"
    }
    return names, [ev for ev in trace["traceEvents"] if ev["ph"] != "M"]


async def test_two_actors_calling_each_other_make_one_trace_with_flows(
    traced_cluster: Cluster, tmp_path: Path
) -> None:
    a = await traced_cluster.spawn(Peer, name="peer-a", node="node-0")
    b = await traced_cluster.spawn(Peer, name="peer-b", node="node-1")
    assert await a.ping(b, 3) == sum(i + 1 + i * i for i in range(3))
    assert await b.ping(a, 2) == sum(i + 1 + i * i for i in range(2))
    with pytest.raises(ValueError):
        await b.fail()
    store = await Store.create(traced_cluster, num_units=1)
    try:
        td = TensorDict({"obs": torch.zeros(4, 8)}, batch_size=[4])
        await store.put(td, "train")
        meta = await store.get_meta("train", ["obs"], 4)
        got = await store.get(meta)
        assert got["obs"].shape == (4, 8)
        await store.clear(meta)
        path = await traced_cluster.timeline(tmp_path / "trace.json")
    finally:
        await store.shutdown()
    trace = json.loads(Path(path).read_text())
    check_trace_format(trace)
    names, events = _by(trace)
    pid_of = {label.split(" (")[0]: pid for pid, label in names.items()}
    assert {"driver", "peer-a", "peer-b"} <= set(pid_of)
    assert "node node-0" in names[pid_of["peer-a"]] and "node node-1" in names[pid_of["peer-b"]]

    def spans(pid: int, cat: str, name: str) -> list[dict[str, Any]]:
        return [
            e
            for e in events
            if e["ph"] == "X" and e["pid"] == pid and e["cat"] == cat and e["name"] == name
        ]

    # caller side and actor side of each call, linked by flows
    assert len(spans(pid_of["peer-a"], "call", "peer-b.pong")) == 3
    assert len(spans(pid_of["peer-a"], "call", "peer-b.square")) == 3
    assert len(spans(pid_of["peer-b"], "method", "pong")) == 3
    assert len(spans(pid_of["peer-b"], "method", "square")) == 3
    (ping,) = spans(pid_of["peer-a"], "method", "ping")
    assert ping["args"]["pid"] == await a.pid() and ping["args"]["node"] == "node-0"
    assert "queued_us" in ping["args"]
    flows = {}
    for e in events:
        if e["ph"] in "sf":
            flows.setdefault(e["id"], {})[e["ph"]] = e
    pairs = {(f["s"]["pid"], f["f"]["pid"]) for f in flows.values() if len(f) == 2}
    assert (pid_of["driver"], pid_of["peer-a"]) in pairs
    assert (pid_of["peer-a"], pid_of["peer-b"]) in pairs
    assert (pid_of["peer-b"], pid_of["peer-a"]) in pairs
    # a failure names its error on both sides
    (failed,) = spans(pid_of["peer-b"], "method", "fail")
    assert failed["args"]["error"] == "ValueError: failing on purpose"
    (failed_call,) = spans(pid_of["driver"], "call", "peer-b.fail")
    assert "failing on purpose" in failed_call["args"]["error"]
    # spawns and store operations (the driver's client)
    spawned = {e["args"].get("actor") for e in spans(pid_of["driver"], "spawn", "spawn")}
    assert {"peer-a", "peer-b"} <= spawned
    (put,) = spans(pid_of["driver"], "store", "put")
    assert put["args"]["partition"] == "train" and put["args"]["rows"] == 4
    assert put["args"]["bytes"] == 4 * 8 * 4
    (get,) = spans(pid_of["driver"], "store", "get")
    assert get["args"]["rows"] == 4 and get["args"]["bytes"] == 4 * 8 * 4
    (get_meta,) = spans(pid_of["driver"], "store", "get_meta")
    assert get_meta["args"] == {
        "partition": "train",
        "rows": 4,
        **{k: get_meta["args"][k] for k in ("pid", "node")},
    }
    (clear,) = spans(pid_of["driver"], "store", "clear")
    assert clear["args"]["partition"] == "train" and clear["args"]["rows"] == 4
    # the store's own actors have tracks too: the controller's methods, called by the driver
    controller = pid_of["rayless-store"]
    assert [e for e in events if e["pid"] == controller and e["cat"] == "method"]


async def test_rayless_timeline_cli_writes_the_trace_and_since_filters(
    traced_cluster: Cluster, tmp_path: Path
) -> None:
    a = await traced_cluster.spawn(Peer, name="cli-a")
    assert await a.square(3) == 9
    token = tmp_path / "token"
    token.write_text(traced_cluster.info.token + "\n")
    token.chmod(0o600)
    clean = {k: v for k, v in os.environ.items() if not k.startswith("RAYLESS_")}
    base = [sys.executable, "-m", "rayless.cli", "timeline", "--address", traced_cluster.address]

    def cli(*args: str) -> dict[str, Any]:
        out = tmp_path / f"cli-{len(args)}.json"
        done = subprocess.run(
            [*base, "--token-file", str(token), "-o", str(out), *args],
            capture_output=True,
            text=True,
            timeout=120,
            env=clean,
        )
        assert done.returncode == 0, done.stderr
        assert f"wrote {out}" in done.stdout
        trace: dict[str, Any] = json.loads(out.read_text())
        check_trace_format(trace)
        return trace

    names, events = _by(cli())
    (pid,) = [p for p, label in names.items() if label.startswith("cli-a ")]
    assert any(e["pid"] == pid and e["name"] == "square" for e in events)
    # the driver is another process: its spans are not in the CLI's trace
    assert not [label for label in names.values() if label.startswith("driver")]
    _, recent = _by(cli("--since", "0.000001"))  # the actor's call is older than that
    assert not [e for e in recent if e.get("name") == "square"]


async def test_weight_publish_and_pull_are_spans(traced_cluster: Cluster, tmp_path: Path) -> None:
    from rayless.weights import WeightSync
    from tests.integration.weights_classes import state

    async with WeightSync.create(traced_cluster, name="tl-weights") as ws:
        await ws.publish(state(3), version=3)
        target = state(0)
        assert await ws.pull(target, 3) == 3
        path = await traced_cluster.timeline(tmp_path / "weights.json")
    trace = json.loads(Path(path).read_text())
    check_trace_format(trace)
    names, events = _by(trace)
    (driver,) = [p for p, label in names.items() if label.startswith("driver ")]
    mine = [e for e in events if e["ph"] == "X" and e["pid"] == driver and e["cat"] == "weights"]
    (publish,) = [e for e in mine if e["name"] == "publish"]
    nbytes = sum(t.nbytes for t in state(3).values())
    assert publish["args"]["version"] == 3 and publish["args"]["bytes"] == nbytes
    assert publish["args"]["tensors"] == len(state(3))
    (pull,) = [e for e in mine if e["name"] == "pull"]
    assert pull["args"]["version"] == 3
