"""The timeline: every process of a cluster records spans of what it does in a bounded ring.

Recorded, each as one span (start and end on the wall clock, in ns):

* actor calls on both sides: the caller's span (``call``: from sending to the reply, naming
  the actor and method) and the actor's (``method``: from the start of the method to its
  return, with the time it waited queued), linked by a flow id both sides derive from the
  session and the request's id (nothing more travels with the call);
* spawns (``Cluster.spawn``);
* store operations at the Store client's API (``put``, ``get_meta``, ``get``, ``clear``:
  partition, rows, bytes) and weight publishes and pulls (version, bytes), through
  :func:`traced`;
* a failure of any of them names the error type and message.

The ring holds the last ``RAYLESS_TIMELINE_SPANS`` records of a process (default 50,000; a
record is about 250 bytes, an actor call one record on each side and one more for its
reply: at most about 12 MB a process, whatever the job's length). Recording is on unless
``RAYLESS_TIMELINE=0`` in the environment the cluster's processes start with: a job that
hangs has its trace already recorded. The per-call hooks build no object, callback or dict:
a timestamp and a tuple of plain values appended to the ring (a reply's end is the time its
batch arrived). In a pipelined call to a trivial method they add about 2.6 µs of CPU, both
sides together, to 29 µs (docs/observability.md, scripts/bench_timeline.py); off, each
hook is one attribute test. The gatherer (``rayless.actors.api.trace``) reads each actor's
ring, and each driver's, through its debug listener and writes one Chrome trace-event file.
"""

from __future__ import annotations

import collections
import functools
import json
import os
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any, TypeVar

from rayless.actors.core import context
from rayless.transport.client import ENDED
from rayless.transport.errors import describe

__all__ = [
    "ENV",
    "METHOD",
    "RECORDER",
    "SENT",
    "Recorder",
    "dump",
    "enabled",
    "process_info",
    "error_text",
    "flow_of",
    "traced",
]

ENV = "RAYLESS_TIMELINE"
ENV_SPANS = "RAYLESS_TIMELINE_SPANS"
DEFAULT_SPANS = 50_000
_ERROR_CHARS = 300

# one span: (category, name, start_ns, end_ns, lane, args, flow_out, flow_in)
Span = tuple[str, str, int, int, str, "dict[str, Any] | None", int, int]
T = TypeVar("T")


def _env_on() -> bool:
    return os.environ.get(ENV, "1").strip().lower() not in ("0", "false", "no", "off")


def _capacity() -> int:
    try:
        return max(1, int(os.environ.get(ENV_SPANS, DEFAULT_SPANS)))
    except ValueError:
        return DEFAULT_SPANS


class Recorder:
    """The ring of one process's records; appending is safe from any thread (a deque append)."""

    def __init__(self, capacity: int | None = None, on: bool | None = None) -> None:
        self.enabled = _env_on() if on is None else on
        # spans, and the compact records of the per-call hooks (see :meth:`snapshot`)
        self.spans: collections.deque[tuple[Any, ...]] = collections.deque(
            maxlen=capacity or _capacity()
        )

    def reset(self) -> None:
        """Forget every record (a forked child starts empty)."""
        self.enabled = _env_on()
        self.spans.clear()

    def add(
        self,
        cat: str,
        name: str,
        start: int,
        end: int,
        lane: str,
        args: dict[str, Any] | None = None,
        flow_out: int = 0,
        flow_in: int = 0,
    ) -> None:
        """Record one span (times: ``time.time_ns()``)."""
        self.spans.append((cat, name, start, end, lane, args, flow_out, flow_in))

    def snapshot(self, since_ns: int = 0) -> list[Span]:
        """The spans that ended at or after ``since_ns``, oldest first (a call still waiting
        for its reply ends now, marked ``pending``).

        The per-call hooks append compact records (:data:`SENT` and the client's
        ``ENDED``, :data:`METHOD`: plain values, no dict or name built per call); they become
        spans here, when someone asks.
        """
        records = list(self.spans)  # a copy first: other threads may append meanwhile
        ends = {(r[1], r[2]): (r[3], r[4]) for r in records if r[0] is ENDED}
        lanes = {t.ident: t.name for t in threading.enumerate()}
        now = time.time_ns()
        spans = []
        for record in records:
            if record[0] is ENDED:
                continue
            span = _span(record, ends, lanes, now)
            if span[3] >= since_ns:
                spans.append(span)
        return spans


def flow_of(key: int, req_id: int) -> int:
    """The flow id (a caller → actor arrow) of request ``req_id`` of the session ``key``
    (``transport.protocol.session_key``): both ends compute it alike; JSON-safe."""
    return (key << 24) | (req_id & 0xFFFFFF)


RECORDER = Recorder()
os.register_at_fork(after_in_child=RECORDER.reset)


def enabled() -> bool:
    """Whether this process records spans."""
    return RECORDER.enabled


def process_info() -> dict[str, Any]:
    """Who this process is, for its track in the trace: actor name and id (or the driver),
    node, pid."""
    env = os.environ
    actor_id = env.get(context.ENV_ACTOR_ID, "")
    return {
        "name": env.get(context.ENV_ACTOR_NAME, actor_id) if actor_id else "driver",
        "actor_id": actor_id,
        "node": env.get(context.ENV_NODE_ID, ""),
        "pid": os.getpid(),
    }


def error_text(exc: BaseException) -> str:
    """How a record names a failure: the error's type and message, bounded (never raises: an
    error whose ``__str__`` fails is named by its type)."""
    return describe(exc, _ERROR_CHARS)


# Compact records the per-call hooks append (first item: which kind); :func:`_span` makes
# spans of them. A call: ``SENT`` as it is sent, and the client's ``ENDED``
# (``transport.client``) as it ends, paired by (session key, request id); the actor's run of
# it: ``METHOD``. The session key and request id make the flow id (:func:`flow_of`).
SENT = "\x00sent"  # (SENT, actor, method, start, session key, request id)
METHOD = "\x00method"  # (METHOD, method, queued, end, start, lane, error, session key, request id)


def _span(
    record: tuple[Any, ...],
    ends: Mapping[tuple[int, int], tuple[int, str | None]],
    lanes: Mapping[int | None, str],
    now: int,
) -> Span:
    kind = record[0]
    if kind is SENT:
        _, actor, method, start, key, req_id = record
        args: dict[str, Any] = {"actor": actor}
        end, error = ends.get((key, req_id), (0, None))
        if not end:
            end = now
            args["pending"] = True
        elif error is not None:
            args["error"] = error
        return ("call", f"{actor}.{method}", start, end, "calls", args, flow_of(key, req_id), 0)
    if kind is METHOD:
        _, method, queued, end, start, lane, error, key, req_id = record
        args = {"queued_us": (start - queued) // 1000}
        if error is not None:
            args["error"] = error
        name = lane if isinstance(lane, str) else lanes.get(lane, f"thread {lane}")
        return ("method", method, start, end, name, args, 0, flow_of(key, req_id))
    return record  # a span recorded as one (``Recorder.add``)


Describe = Callable[[tuple[Any, ...], Mapping[str, Any], Any], "dict[str, Any]"]


def traced(cat: str, name: str, describe: Describe | None = None) -> Callable[[T], T]:
    """Decorate an ``async def`` method so that each call records a span ``cat``/``name``.

    ``describe(args, kwargs, result)`` (result None on failure) gives the span's arguments
    (partition, rows, bytes...); it must be cheap and must not raise (what it raises is
    dropped: a trace never fails an operation).
    """

    def decorate(fn: Any) -> Any:
        @functools.wraps(fn)
        async def wrapper(*args: Any, **kwargs: Any) -> Any:
            if not RECORDER.enabled:
                return await fn(*args, **kwargs)
            start = time.time_ns()
            error: BaseException | None = None
            result = None
            try:
                result = await fn(*args, **kwargs)
                return result
            except BaseException as exc:
                error = exc
                raise
            finally:
                end = time.time_ns()
                info: dict[str, Any] = {}
                if describe is not None:
                    try:
                        info = describe(args[1:], kwargs, result)
                    except Exception as exc:  # a trace never fails an operation
                        info = {"describe_error": error_text(exc)}
                if error is not None:
                    info["error"] = error_text(error)
                RECORDER.add(cat, name, start, end, cat, info)

        return wrapper

    return decorate


def dump(since: str = "") -> str:
    """This process's spans as the debug listener's ``timeline`` answer: a header line (the
    process, its clock now) then one JSON list of spans ending at or after ``since`` (ns)."""
    try:
        since_ns = int(since.strip() or 0)
    except ValueError:
        since_ns = 0
    header = {"process": process_info(), "now_ns": time.time_ns(), "enabled": RECORDER.enabled}
    spans = RECORDER.snapshot(since_ns)
    return json.dumps(header) + "\n" + json.dumps(spans, default=str) + "\n"


# -- span arguments of the store's and weights' client calls (duck-typed: no store import) --


def _rows(value: Any) -> int | None:
    try:
        return len(value)
    except TypeError:
        return None


def _nbytes(td: Any) -> int | None:
    """The bytes of a TensorDict's tensor leaves (numel x element size: nothing is read), or
    None for anything else. Not ``TensorDict.bytes()``: it leaves a reference cycle that keeps
    the TensorDict alive until the collector runs, so a store get's result mapping was not
    recycled for the next get (a 16 MiB get took 25 ms instead of 4)."""
    if not callable(getattr(td, "bytes", None)) or not callable(getattr(td, "values", None)):
        return None
    try:
        total = 0
        for leaf in td.values(True, True):
            numel, size = getattr(leaf, "numel", None), getattr(leaf, "element_size", None)
            if callable(numel) and callable(size):  # a tensor (nested too); not strings
                total += int(numel()) * int(size())
        return total
    except Exception:
        return None


def _partition(value: Any) -> str | None:
    if isinstance(value, str):
        return value
    pid = getattr(value, "partition_id", None)  # a BatchMeta of one partition
    if isinstance(pid, str):
        return pid
    ids = getattr(value, "partition_ids", None)
    return ",".join(sorted(set(ids))) if ids else None


def store_span(args: tuple[Any, ...], kwargs: Mapping[str, Any], result: Any) -> dict[str, Any]:
    """Arguments of a store span: its partition, rows and bytes, as far as they are known.

    Understands ``put(td, partition, meta=...)``, ``get_meta(partition, fields, n)``,
    ``get(meta, fields)``, ``clear(meta)``, ``clear_partition(partition)``.
    """
    info: dict[str, Any] = {}
    first = args[0] if args else None
    if _nbytes(first) is not None:  # put: a TensorDict first
        part = kwargs.get("partition", args[1] if len(args) > 1 else None)
        info["partition"] = _partition(part) or _partition(kwargs.get("meta"))
        info["rows"], info["bytes"] = _rows(first), _nbytes(first)
        return info
    info["partition"] = _partition(first) or _partition(kwargs.get("partition"))
    if _nbytes(result) is not None:  # get: the data read
        info["rows"], info["bytes"] = _rows(result), _nbytes(result)
    elif result is not None:  # get_meta: the samples granted
        info["rows"] = _rows(result)
    elif first is not None and not isinstance(first, str):
        info["rows"] = _rows(first)
    return info


def weights_span(args: tuple[Any, ...], kwargs: Mapping[str, Any], result: Any) -> dict[str, Any]:
    """Arguments of a weights span: the version and, for a publish, the bytes of its state."""
    info: dict[str, Any] = {}
    if isinstance(result, int):
        info["version"] = result
    state = args[0] if args else None
    if isinstance(state, Mapping):  # publish(state, version)
        info["bytes"] = sum(int(getattr(v, "nbytes", 0) or 0) for v in state.values())
        info["tensors"] = len(state)
    return info
