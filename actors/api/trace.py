"""Gather every process's timeline spans (``actors.core.timeline``) into one Chrome
trace-event file (Perfetto, chrome://tracing): ``Cluster.timeline(path)`` and ``rayless
timeline`` (``actors.api.timeline_cli``).

The gatherer asks the head for the debug listeners of the actors and of the drivers (a
driver runs one while it records a timeline, registered under its session) and reads each
one's ring (the ``timeline`` command, authenticated with the cluster token both ways);
``Cluster.timeline`` reads the calling process's own spans in-process instead.

The file: one process track per actor and per driver that runs a debug listener (the
calling one's read in-process), named ``NAME (node N, pid P)`` (``driver (pid P)``); in
it one thread track per lane (``calls``: the calls it made; ``async``: its async methods;
a ``def`` method's worker thread; ``put``/``get``... store and weight operations), spans
that overlap in a lane spread over numbered tracks; complete events (``ph: X``, ``ts`` and
``dur`` in µs from the earliest span), and a flow arrow (``ph: s`` → ``ph: f``) from each
call to the method it ran. Clocks: each node's offset to this process's clock is measured
on reading the rings (the answer's clock against the midpoint of the request, the
reading with the shortest round trip of the node wins) and applied when it is larger than
that reading's whole duration (processes of one host share one clock: no correction).
"""

from __future__ import annotations

import asyncio
import heapq
import json
import os
import time
from dataclasses import dataclass, field
from typing import Any

from rayless.actors.control.debug import open_actor
from rayless.actors.core import timeline
from rayless.actors.errors import DebugBusyError
from rayless.actors.protocol.messages import DebugEndpoints
from rayless.actors.protocol.wire import ask
from rayless.transport.errors import RaylessError
from rayless.transport.files import atomic_file

__all__ = ["Gathered", "chrome_trace", "gather", "write_trace"]


@dataclass
class Gathered:
    """One process's spans as read: who it is, its spans, and its clock's offset (ns)."""

    process: dict[str, Any]
    spans: list[list[Any]]
    offset_ns: int = 0
    rtt_ns: int = 0
    node: str = ""
    errors: list[str] = field(default_factory=list)


async def _endpoints(address: str, token: str, timeout: float) -> list[dict[str, Any]]:
    """Every live actor's record with its ``debug_address``, and every driver's that runs a
    listener (``kind: "driver"``), asked of the head.

    Raises:
        RaylessError: the head did not answer (Timeout) or rejected the token (AuthError).
    """
    from rayless.transport.client import Client

    client = Client(address, token=token, name="rayless-timeline", connect_timeout=timeout)
    try:
        await client.connect()
        return await ask(client, DebugEndpoints(drivers=True), timeout=timeout)
    finally:
        await client.aclose()


def _read_one(record: dict[str, Any], token: str, since_ns: int, timeout: float) -> Gathered:
    """Read one actor's ring through its debug listener (blocking; run in a thread)."""
    t0 = time.time_ns()
    conn = open_actor(record, token, f"timeline {since_ns}", timeout)
    try:
        header = json.loads(conn.readline(limit=1 << 16))
        t1 = time.time_ns()
        chunks = [conn.buffer]
        while True:
            chunk = conn.sock.recv(1 << 20)
            if not chunk:
                break
            chunks.append(chunk)
    finally:
        conn.sock.close()
    spans = json.loads(b"".join(chunks).decode("utf-8", "replace") or "[]")
    offset = int(header.get("now_ns", 0)) - (t0 + t1) // 2
    process = dict(header.get("process") or {})
    node = str(process.get("node") or record.get("node_id") or "")
    return Gathered(process, spans, offset, t1 - t0, node)


async def gather(
    address: str,
    token: str,
    *,
    since_ns: int = 0,
    timeout: float = 10.0,
    local: bool = False,
    session: str = "",
) -> list[Gathered]:
    """Every live actor's and driver's spans ending at or after ``since_ns`` (this
    process's read in-process when ``local``, as the driver of the session ``session``),
    clocks aligned per node. A process that does not answer, or whose listener is busy, is
    skipped: the last item is then ``Gathered({"name": "unreachable"}, [], errors)`` naming
    each (``NAME: why``; also the trace's ``otherData.unreachable``).

    Raises:
        RaylessError: the head did not answer (Timeout) or rejected the token (AuthError).
    """
    records = await _endpoints(address, token, timeout)
    if local:  # this process's own listener: its spans are read here, not twice
        records = [r for r in records if r.get("actor_id") != f"driver:{session}"]

    def read_all() -> tuple[list[Gathered], list[str]]:
        got, missed = [], []
        for record in records:
            try:
                got.append(_read_one(record, token, since_ns, timeout))
            except DebugBusyError as exc:
                missed.append(f"{record.get('name')}: {exc}")
            except (OSError, ValueError, RaylessError) as exc:
                missed.append(f"{record.get('name')}: {type(exc).__name__}: {exc}")
        return got, missed

    got, missed = await asyncio.to_thread(read_all)
    _align(got)
    if local:
        spans = [list(s) for s in timeline.RECORDER.snapshot(since_ns)]
        got.insert(0, Gathered(timeline.process_info(), spans))
    if missed:
        got.append(Gathered({"name": "unreachable"}, [], errors=missed))
    return got


def _align(got: list[Gathered]) -> None:
    """One offset per node: the reading with the shortest round trip; zero when within its
    uncertainty (the whole time of the reading: connect, handshake and answer)."""
    best: dict[str, Gathered] = {}
    for g in got:
        if g.node not in best or g.rtt_ns < best[g.node].rtt_ns:
            best[g.node] = g
    for g in got:
        ref = best[g.node]
        g.offset_ns = ref.offset_ns if abs(ref.offset_ns) > ref.rtt_ns else 0


def _lanes(spans: list[list[Any]]) -> list[tuple[str, int]]:
    """For each span (in order), its (lane name, track number within the lane): spans of a
    lane that overlap go to different tracks (the fewest, by start time)."""
    out: list[tuple[str, int]] = [("", 0)] * len(spans)
    by_lane: dict[str, list[int]] = {}
    for i, s in enumerate(spans):
        by_lane.setdefault(str(s[4]), []).append(i)
    for lane, idx in by_lane.items():
        idx.sort(key=lambda i: spans[i][2])
        free: list[tuple[int, int]] = []  # (end of its last span, track)
        tracks = 0
        for i in idx:
            start, end = spans[i][2], spans[i][3]
            if free and free[0][0] <= start:
                _, track = heapq.heappop(free)
            else:
                track, tracks = tracks, tracks + 1
            heapq.heappush(free, (end, track))
            out[i] = (lane, track)
    return out


def chrome_trace(gathered: list[Gathered]) -> dict[str, Any]:
    """The Chrome trace-event JSON object of ``gathered`` (see the module docstring)."""
    events: list[dict[str, Any]] = []
    starts = [s[2] - g.offset_ns for g in gathered for s in g.spans]
    t0 = min(starts) if starts else time.time_ns()
    flows_out: dict[int, tuple[int, int, float]] = {}  # flow id -> (pid, tid, ts)
    flows_in: dict[int, tuple[int, int, float]] = {}
    unreachable: list[str] = []
    for pid, g in enumerate(gathered, start=1):
        unreachable.extend(g.errors)
        if not g.spans and g.errors:
            continue
        p = g.process
        where = f"node {p['node']}, " if p.get("node") else ""  # (a driver has no node)
        label = f"{p.get('name', '?')} ({where}pid {p.get('pid', '?')})"
        events.append({"ph": "M", "name": "process_name", "pid": pid, "args": {"name": label}})
        events.append(
            {"ph": "M", "name": "process_sort_index", "pid": pid, "args": {"sort_index": pid}}
        )
        tids: dict[tuple[str, int], int] = {}
        for s, key in zip(g.spans, _lanes(g.spans), strict=True):
            cat, name, start, end, _, args, flow_out, flow_in = s
            tid = tids.get(key)
            if tid is None:
                tid = tids[key] = len(tids) + 1
                lane = key[0] if key[1] == 0 else f"{key[0]} #{key[1] + 1}"
                events.append(
                    {
                        "ph": "M",
                        "name": "thread_name",
                        "pid": pid,
                        "tid": tid,
                        "args": {"name": lane},
                    }
                )
            ts = (start - g.offset_ns - t0) / 1000
            info = dict(args or {})
            info.setdefault("pid", p.get("pid"))
            info.setdefault("node", p.get("node"))
            events.append(
                {
                    "ph": "X",
                    "cat": cat,
                    "name": name,
                    "pid": pid,
                    "tid": tid,
                    "ts": ts,
                    "dur": max(0.0, (end - start) / 1000),
                    "args": info,
                }
            )
            if flow_out:
                flows_out[int(flow_out)] = (pid, tid, ts)
            if flow_in:
                flows_in[int(flow_in)] = (pid, tid, ts)
    for fid, (pid, tid, ts) in flows_out.items():
        end = flows_in.get(fid)
        if end is None:
            continue
        common = {"cat": "call", "name": "call", "id": fid}
        events.append({"ph": "s", "pid": pid, "tid": tid, "ts": ts, **common})
        events.append(
            {"ph": "f", "bp": "e", "pid": end[0], "tid": end[1], "ts": max(ts, end[2]), **common}
        )
    return {
        "traceEvents": events,
        "displayTimeUnit": "ms",
        "otherData": {"t0_unix_ns": t0, "unreachable": unreachable},
    }


def write_trace(path: str | os.PathLike[str], gathered: list[Gathered]) -> str:
    """Write the trace of ``gathered`` to ``path`` (atomically, through a fresh temporary
    that no one can have planted: ``transport.files``); returns the path."""
    target = os.fspath(path)
    with atomic_file(target) as f:
        json.dump(chrome_trace(gathered), f)
    return target
