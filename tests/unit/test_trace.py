"""The timeline's ring and its Chrome trace export (rayless.actors.core.timeline, .trace),
without processes."""

from __future__ import annotations

import asyncio
import gc
import json
import threading

import pytest

from rayless.actors.api.trace import Gathered, _align, chrome_trace
from rayless.actors.core import timeline
from rayless.transport.client import ENDED


def test_the_ring_is_bounded_and_filters_by_end_time() -> None:
    rec = timeline.Recorder(capacity=3, on=True)
    for i in range(5):
        rec.add("store", "put", i * 10, i * 10 + 5, "store")
    assert [s[2] for s in rec.snapshot()] == [20, 30, 40]  # the oldest two fell out
    assert [s[2] for s in rec.snapshot(since_ns=36)] == [40]
    assert timeline.flow_of(7, 1) != timeline.flow_of(7, 2) != timeline.flow_of(8, 1)
    assert timeline.flow_of(2**28 - 1, 2**40) < 2**53  # JSON-safe


def test_on_by_default_and_off_by_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(timeline.ENV, raising=False)
    assert timeline.Recorder().enabled  # on by default (see docs/observability.md)
    for off in ("0", "false", "off", " No "):
        monkeypatch.setenv(timeline.ENV, off)
        assert not timeline.Recorder().enabled
    monkeypatch.setenv(timeline.ENV, "1")
    assert timeline.Recorder().enabled


def test_a_sent_call_pairs_with_its_clients_end_or_stays_pending() -> None:
    rec = timeline.Recorder(on=True)
    sent = timeline.SENT
    rec.spans.append((sent, "a", "m", 100, 7, 1))  # session 7, request 1: replied
    rec.spans.append((sent, "a", "m", 110, 7, 2))  # request 2: failed
    rec.spans.append((sent, "a", "n", 120, 8, 1))  # session 8, request 1: no reply yet
    rec.spans.append((ENDED, 7, 2, 150, "ValueError: boom"))
    rec.spans.append((ENDED, 7, 1, 160, None))
    rec.spans.append((ENDED, 9, 5, 170, None))  # a request sent by no traced call: dropped
    first, second, third = rec.snapshot()
    flow = timeline.flow_of(7, 1)
    assert first == ("call", "a.m", 100, 160, "calls", {"actor": "a"}, flow, 0)
    assert second[2:4] == (110, 150) and second[5] == {"actor": "a", "error": "ValueError: boom"}
    assert third[:3] == ("call", "a.n", 120) and third[5] == {"actor": "a", "pending": True}
    assert third[3] >= 170 and third[6] == timeline.flow_of(8, 1)  # a pending call ends now
    assert [s[2] for s in rec.snapshot(since_ns=155)] == [100, 120]  # by end time


def test_a_method_record_names_its_threads_lane_and_its_callers_flow() -> None:
    rec = timeline.Recorder(on=True)
    ident = threading.get_ident()
    rec.spans.append((timeline.METHOD, "step", 1_000, 9_000, 4_000, ident, None, 7, 1))
    rec.spans.append((timeline.METHOD, "astep", 1_000, 9_000, 2_000, "async", "E: x", 7, 2))
    sync, coro = rec.snapshot()
    name = threading.current_thread().name
    assert sync == (
        "method",
        "step",
        4_000,
        9_000,
        name,
        {"queued_us": 3},
        0,
        timeline.flow_of(7, 1),
    )
    assert coro[4] == "async" and coro[5] == {"queued_us": 1, "error": "E: x"}
    assert coro[7] == timeline.flow_of(7, 2)


def test_traced_records_arguments_and_failures(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(timeline, "RECORDER", timeline.Recorder(on=True))

    class Client:
        @timeline.traced("store", "clear_partition", timeline.store_span)
        async def clear_partition(self, partition: str, fail: bool = False) -> None:
            if fail:
                raise KeyError(partition)

    asyncio.run(Client().clear_partition("p1"))
    with pytest.raises(KeyError):
        asyncio.run(Client().clear_partition("p2", fail=True))
    first, second = timeline.RECORDER.snapshot()
    assert first[:2] == ("store", "clear_partition") and first[5] == {"partition": "p1"}
    assert second[5] == {"partition": "p2", "error": "KeyError: 'p2'"}


def _gathered(name: str, spans: list[list[object]], node: str = "n0") -> Gathered:
    return Gathered({"name": name, "node": node, "pid": 1}, spans, node=node)


def test_overlapping_spans_of_a_lane_get_tracks_of_their_own_and_flows_link() -> None:
    caller = _gathered(
        "driver",
        [
            ["call", "a.m", 1_000, 9_000, "calls", {"actor": "a"}, 77, 0],
            ["call", "a.m", 2_000, 3_000, "calls", {"actor": "a"}, 78, 0],  # overlaps
            ["call", "a.m", 9_500, 9_900, "calls", {"actor": "a"}, 79, 0],  # fits a track
        ],
    )
    actor = _gathered("a", [["method", "m", 2_500, 2_900, "async", {}, 0, 78]], node="n1")
    trace = chrome_trace([caller, actor])
    json.dumps(trace)
    xs = [e for e in trace["traceEvents"] if e["ph"] == "X"]
    tids = [e["tid"] for e in xs if e["pid"] == 1]
    assert tids[0] != tids[1] and tids[2] in tids[:2]  # two tracks are enough
    lanes = {e["args"]["name"] for e in trace["traceEvents"] if e["name"] == "thread_name"}
    assert lanes == {"calls", "calls #2", "async"}
    (s,) = [e for e in trace["traceEvents"] if e["ph"] == "s"]
    (f,) = [e for e in trace["traceEvents"] if e["ph"] == "f"]
    assert s["id"] == f["id"] == 78 and s["pid"] == 1 and f["pid"] == 2 and f["bp"] == "e"
    assert min(e["ts"] for e in xs) == 0 and s["ts"] == 1.0  # µs from the earliest span


def test_clock_offsets_apply_per_node_only_beyond_the_reading_uncertainty() -> None:
    near = Gathered({}, [], offset_ns=400, rtt_ns=1_000, node="n0")  # within its round trip
    far1 = Gathered({}, [], offset_ns=5_000_000, rtt_ns=2_000, node="n1")
    far2 = Gathered({}, [], offset_ns=5_000_900, rtt_ns=9_000, node="n1")  # a worse reading
    _align([near, far1, far2])
    assert near.offset_ns == 0
    assert far1.offset_ns == far2.offset_ns == 5_000_000
    span = ["method", "m", 10_000_000, 10_001_000, "async", {}, 0, 0]
    trace = chrome_trace([Gathered({"name": "x"}, [span], offset_ns=5_000_000)])
    (x,) = [e for e in trace["traceEvents"] if e["ph"] == "X"]
    assert trace["otherData"]["t0_unix_ns"] == 5_000_000 and x["ts"] == 0


def test_an_error_whose_str_raises_is_named_by_its_type() -> None:
    """A record of a method that raised such an error must not replace it (the actor's
    worker records in a ``finally``)."""

    class BadStr(Exception):
        def __str__(self) -> str:
            raise ValueError("no str for you")

    assert timeline.error_text(BadStr()) == "BadStr: <unprintable>"
    assert timeline.error_text(KeyError("k")) == "KeyError: 'k'"


def test_a_get_span_leaves_its_result_to_be_freed_at_once() -> None:
    """Describing a get counts the result's bytes without keeping it alive: once the caller
    drops it, its mapping is recycled for the next get at once, not at the next collection
    (``TensorDict.bytes()`` left a cycle: a 16 MiB get then took 25 ms instead of 4)."""
    import torch
    from tensordict import TensorDict

    from rayless.store.samehost import results

    results._RESULTS.clear()
    gc.disable()
    try:
        td = TensorDict({"x": results.result((1024, 4096), torch.float32)}, [1024])
        info = timeline.store_span(("p",), {}, td)
        assert info == {"partition": "p", "rows": 1024, "bytes": 16 << 20}
        del td
        assert sum(len(v) for v in results._RESULTS.values()) == 1  # recycled now
    finally:
        gc.enable()
        results._RESULTS.clear()
