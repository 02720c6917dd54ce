"""The timeline: spans of calls (both sides, linked by flows), spawns and store operations,
gathered from every process into one Chrome trace-event file (``Cluster.timeline`` and
``rayless timeline``)."""

from __future__ import annotations

import asyncio
import itertools
import json
import os
import socket
import subprocess
import sys
import textwrap
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from tensordict import TensorDict

from rayless.actors import Cluster
from rayless.actors.core import timeline
from rayless.store import Store
from tests.environ import without_rayless
from tests.integration.timeline_classes import Keeper, Peer
from tests.waiting import wait_until

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
    clean = without_rayless()
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
    # the driver (this process) is in the CLI's trace too, through its own debug listener
    (driver,) = [p for p, label in names.items() if label == f"driver (pid {os.getpid()})"]
    assert [e for e in events if e["pid"] == driver and e.get("name") == "cli-a.square"]
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


DRIVER = textwrap.dedent(
    """
    import asyncio, json, os, sys

    from rayless.actors import Cluster


    class Echo:
        def twice(self, x):
            return 2 * x


    async def main():
        async with Cluster.local(nodes=1) as cluster:
            echo = await cluster.spawn(Echo, name="echo")
            for i in range(4):
                assert await echo.twice(i) == 2 * i
            fd = os.open(sys.argv[1], os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            os.write(fd, cluster.info.token.encode() + b"\\n")
            os.close(fd)
            print(json.dumps({"address": cluster.address, "pid": os.getpid()}), flush=True)
            await asyncio.to_thread(sys.stdin.readline)  # until the test is done


    asyncio.run(main())
    """
)


def _refused(address: str) -> bool:
    host, _, port = address.removeprefix("tcp://").rpartition(":")
    try:
        socket.create_connection((host.strip("[]"), int(port)), timeout=5).close()
    except ConnectionRefusedError:
        return True
    return False


def test_rayless_timeline_cli_gathers_the_driver_of_another_process(tmp_path: Path) -> None:
    """A driver recording a timeline runs a debug listener, registered under its session:
    ``rayless timeline`` from another process has the driver's call spans, linked by flows
    to the actor's; when the driver ends, its listener is gone."""
    from rayless.actors.api import debugger

    script, token = tmp_path / "driver.py", tmp_path / "token"
    script.write_text(DRIVER)
    clean = without_rayless()
    driver = subprocess.Popen(
        [sys.executable, str(script), str(token)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        env={**clean, timeline.ENV: "1"},
    )
    try:
        assert driver.stdout is not None and driver.stdin is not None
        started = json.loads(driver.stdout.readline())
        address = started["address"]
        listed = debugger.endpoints(address, token.read_text().strip(), 30, drivers=True)
        drivers = [r for r in asyncio.run(listed) if r.get("kind") == "driver"]
        assert [(r["name"], r["pid"]) for r in drivers] == [("driver", started["pid"])]
        out = tmp_path / "trace.json"
        done = subprocess.run(
            [sys.executable, "-m", "rayless.cli", "timeline", "--address", address,
             "--token-file", str(token), "-o", str(out)],
            capture_output=True, text=True, timeout=120, env=clean,
        )  # fmt: skip
        assert done.returncode == 0, done.stderr
        trace = json.loads(out.read_text())
        check_trace_format(trace)
        names, events = _by(trace)
        pid_of = {label: pid for pid, label in names.items()}
        me = pid_of[f"driver (pid {started['pid']})"]
        (echo,) = [pid for label, pid in pid_of.items() if label.startswith("echo (node ")]
        calls = [e for e in events if e["ph"] == "X" and e["pid"] == me and e["cat"] == "call"]
        assert [e["name"] for e in calls] == ["echo.twice"] * 4
        assert [e for e in events if e["pid"] == me and e["cat"] == "spawn"]
        methods = [e for e in events if e["ph"] == "X" and e["pid"] == echo]
        assert [e["name"] for e in methods if e["cat"] == "method"] == ["twice"] * 4
        flows: dict[int, dict[str, Any]] = {}
        for e in events:
            if e["ph"] in "sf":
                flows.setdefault(e["id"], {})[e["ph"]] = e
        linked = [f for f in flows.values() if (f["s"]["pid"], f["f"]["pid"]) == (me, echo)]
        assert len(linked) == 4
        # `rayless stack driver`: the driver's threads and its loop's tasks
        stack = subprocess.run(
            [sys.executable, "-m", "rayless.cli", "stack", "driver", "--address", address,
             "--token-file", str(token)],
            capture_output=True, text=True, timeout=120, env=clean,
        )  # fmt: skip
        assert stack.returncode == 0, stack.stderr
        assert stack.stdout.startswith(f"driver (pid {started['pid']})")
        assert "--- asyncio task" in stack.stdout and ", in main" in stack.stdout
        driver.stdin.close()  # the driver ends, and its cluster with it
        assert driver.wait(timeout=60) == 0
    finally:
        if driver.poll() is None:
            driver.kill()
            driver.wait()
    assert _refused(drivers[0]["debug_address"])


JOINER = textwrap.dedent(
    """
    import asyncio, os, sys

    from rayless import actors


    async def main():
        token = open(sys.argv[2]).read().strip()
        async with actors.connect(sys.argv[1], token=token):
            print(os.getpid(), flush=True)
            await asyncio.to_thread(sys.stdin.readline)


    asyncio.run(main())
    """
)


async def test_the_head_forgets_a_driver_s_listener_when_its_session_ends(
    traced_cluster: Cluster, tmp_path: Path
) -> None:
    """A driver that ends withdraws its listener; one killed is dropped with its session."""
    from rayless.actors.api import debugger

    script, token = tmp_path / "joiner.py", tmp_path / "token"
    script.write_text(JOINER)
    token.write_text(traced_cluster.info.token + "\n")
    token.chmod(0o600)
    clean = without_rayless()

    async def drivers() -> dict[int, str]:
        found = await debugger.endpoints(traced_cluster.address, traced_cluster.info.token, 30,
                                         drivers=True)  # fmt: skip
        return {r["pid"]: r["debug_address"] for r in found if r.get("kind") == "driver"}

    # this process's own listener is listed, actors' records are not drivers
    assert list(await drivers()) == [os.getpid()]
    for end in ("exit", "kill"):
        joiner = subprocess.Popen(
            [sys.executable, str(script), traced_cluster.address, str(token)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            env={**clean, timeline.ENV: "1"},
        )
        try:
            assert joiner.stdout is not None and joiner.stdin is not None
            pid = int(await asyncio.to_thread(joiner.stdout.readline))
            listed = await drivers()
            assert set(listed) == {os.getpid(), pid}
            if end == "exit":
                joiner.stdin.close()
                assert await asyncio.to_thread(joiner.wait, 60) == 0
                assert list(await drivers()) == [os.getpid()]  # withdrawn as it closed
            else:
                joiner.kill()
                await asyncio.to_thread(joiner.wait, 60)

                async def dropped(pid: int = pid) -> bool:
                    return pid not in await drivers()

                await wait_until(dropped, timeout=60, what="the head to drop the killed driver")
            assert _refused(listed[pid])
        finally:
            if joiner.poll() is None:
                joiner.kill()
                joiner.wait()


async def test_recording_is_on_by_default_and_a_hung_call_shows_as_pending(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """Nothing set: the driver and its actors record; a call that never returned is in the
    trace, ending when the trace was read and marked pending. RAYLESS_TIMELINE=0: none."""
    monkeypatch.delenv(timeline.ENV, raising=False)
    timeline.RECORDER.reset()
    async with Cluster.local(nodes=1) as cluster:
        peer = await cluster.spawn(Peer, name="peer")
        hung = asyncio.ensure_future(peer.stuck())
        assert await peer.square(3) == 9

        async def with_the_actor() -> dict[str, Any] | None:
            # the actor's listener may not be registered with the head (or may be busy) at
            # the first read: the trace then names it unreachable; read again
            got = json.loads(Path(await cluster.timeline(tmp_path / "on.json")).read_text())
            return got if any(n.startswith("peer ") for n in _by(got)[0].values()) else None

        trace = await wait_until(with_the_actor, timeout=60, what="a trace with the actor's spans")
        hung.cancel()
    check_trace_format(trace)
    names, events = _by(trace)
    pid_of = {label.split(" (")[0]: pid for pid, label in names.items()}
    calls = {e["name"]: e for e in events if e["ph"] == "X" and e["pid"] == pid_of["driver"]}
    assert calls["peer.stuck"]["args"].get("pending") is True
    assert "pending" not in calls["peer.square"]["args"]
    methods = [e["name"] for e in events if e["ph"] == "X" and e["pid"] == pid_of["peer"]]
    assert "square" in methods and "stuck" not in methods  # still running: no end yet

    monkeypatch.setenv(timeline.ENV, "0")
    timeline.RECORDER.reset()
    try:
        async with Cluster.local(nodes=1) as cluster:
            peer = await cluster.spawn(Peer, name="quiet")
            assert await peer.square(2) == 4
            assert not timeline.RECORDER.spans  # the driver recorded nothing
            assert not timeline.enabled()
    finally:
        monkeypatch.delenv(timeline.ENV)
        timeline.RECORDER.reset()


@pytest.mark.parametrize("method", ["fail_with", "afail_with"])
async def test_a_failed_call_frees_its_arguments_at_once(
    monkeypatch: pytest.MonkeyPatch, method: str
) -> None:
    """Neither recording a method's failure (a reference cycle through the error's traceback)
    nor the ``def`` worker (its last outcome, kept until its next job) keeps the arguments of
    a call that raised: they are freed when it ends, not at the next collection or call (a
    big tensor would otherwise stay in memory)."""
    monkeypatch.delenv(timeline.ENV, raising=False)
    async with Cluster.local(nodes=1) as cluster:
        keeper = await cluster.spawn(Keeper)
        with pytest.raises(ValueError):
            await getattr(keeper, method)(torch.zeros(4))
        assert await keeper.alive() is False
