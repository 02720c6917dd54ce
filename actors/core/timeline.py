"""The timeline: every process of a cluster records spans of what it does in a bounded ring.

Recorded, each as one span (start and end on the wall clock, in ns):

* actor calls on both sides: the caller's span (``call``: from sending to the reply, naming
  the actor and method) and the actor's (``method``: from the start of the method to its
  return, with the time it waited queued), linked by a flow id that travels with the call;
* spawns (``Cluster.spawn``);
* store operations at the Store client's API (``put``, ``get_meta``, ``get``, ``clear``:
  partition, rows, bytes) and weight publishes and pulls (version, bytes), through
  :func:`traced`;
* a failure of any of them names the error type and message.

The ring holds the last ``RAYLESS_TIMELINE_SPANS`` spans (default 100,000) of a process; a span
costs a few hundred bytes, so memory is bounded whatever the job's length. Recording is off
unless ``RAYLESS_TIMELINE=1`` in the environment the cluster's processes start with (about
3-4 µs of CPU per actor call, both sides together: 20-25% of a pipelined call, see
docs/observability.md and scripts/bench_timeline.py); off, each hook is one attribute
test. The gatherer (``rayless.actors.api.trace``) reads each actor's ring, and each driver's,
through its debug listener and writes one Chrome trace-event file.
"""

from __future__ import annotations

import collections
import functools
import itertools
import json
import os
import random
import threading
import time
from asyncio import Future
from collections.abc import Awaitable, Callable, Mapping
from typing import Any, TypeVar

from rayless.actors.core import context

__all__ = [
    "ENV",
    "RECORDER",
    "CallSpan",
    "Recorder",
    "call_span",
    "dump",
    "enabled",
    "process_info",
    "traced",
    "traced_method",
]

ENV = "RAYLESS_TIMELINE"
ENV_SPANS = "RAYLESS_TIMELINE_SPANS"
DEFAULT_SPANS = 100_000
_ERROR_CHARS = 300

# one span: (category, name, start_ns, end_ns, lane, args, flow_out, flow_in)
Span = tuple[str, str, int, int, str, "dict[str, Any] | None", int, int]
T = TypeVar("T")


def _env_on() -> bool:
    return os.environ.get(ENV, "0").strip().lower() in ("1", "true", "yes", "on")


def _capacity() -> int:
    try:
        return max(1, int(os.environ.get(ENV_SPANS, DEFAULT_SPANS)))
    except ValueError:
        return DEFAULT_SPANS


class Recorder:
    """The ring of one process's spans; ``add`` is safe from any thread (a deque append)."""

    def __init__(self, capacity: int | None = None, on: bool | None = None) -> None:
        self.enabled = _env_on() if on is None else on
        # spans, and the compact records of the per-call hooks (see :meth:`snapshot`)
        self.spans: collections.deque[tuple[Any, ...]] = collections.deque(
            maxlen=capacity or _capacity()
        )
        self._ids = itertools.count(1)
        self._base = random.getrandbits(28) << 24  # flow ids: unique across processes (JSON-safe)

    def reset(self) -> None:
        """Forget every span and draw new flow ids (a forked child starts empty)."""
        self.enabled = _env_on()
        self.spans.clear()
        self._ids = itertools.count(1)
        self._base = random.getrandbits(28) << 24

    def flow_id(self) -> int:
        """A new flow id (caller → actor arrows)."""
        return self._base + (next(self._ids) & 0xFFFFFF)

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
        """The spans that ended at or after ``since_ns``, oldest first.

        The per-call hooks append compact records (:data:`_CALL`, :data:`_METHOD`: plain
        values, no dict or name built per call); they become spans here, when someone asks.
        """
        spans = list(self.spans)  # a copy first: other threads may append meanwhile
        return [_span(s) for s in spans if s[3] >= since_ns]


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


def _error(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}"[:_ERROR_CHARS]


# Compact records the per-call hooks append (first item: which kind; the 4th: the end, as
# in a span, so that ``snapshot`` filters both alike); :func:`_span` makes spans of them.
_CALL = "\x00call"  # (_CALL, actor, method, end, start, error or None, flow_out)
_METHOD = "\x00method"  # (_METHOD, method, queued_ns, end, start, lane, error or None, flow_in)
_LANES: dict[int, str] = {}  # thread ident -> its name, for the lanes of def methods


def _span(record: tuple[Any, ...]) -> Span:
    kind = record[0]
    if kind is _CALL:
        _, actor, method, end, start, error, flow = record
        args: dict[str, Any] = {"actor": actor}
        if error is not None:
            args["error"] = error
        return ("call", f"{actor}.{method}", start, end, "calls", args, flow, 0)
    if kind is _METHOD:
        _, method, queued, end, start, lane, error, flow_in = record
        args = {"queued_us": (start - queued) // 1000}
        if error is not None:
            args["error"] = error
        name = lane if isinstance(lane, str) else _LANES.get(lane, f"thread {lane}")
        return ("method", method, start, end, name, args, 0, flow_in)
    return record  # a span recorded as one (``Recorder.add``)


class CallSpan:
    """The caller's side of one actor call: ``await span.wrap(request)``, or ``span.done``
    as the reply future's done callback."""

    __slots__ = ("actor", "flow", "method", "start")

    def __init__(self, actor: str, method: str) -> None:
        self.actor = actor
        self.method = method
        self.flow = RECORDER.flow_id()
        self.start = time.time_ns()

    def done(self, fut: Future[Any]) -> None:
        """Record the span of a call whose future ``fut`` is done (a done callback)."""
        error = None
        if fut.cancelled():
            error = "cancelled"
        elif fut.exception() is not None:
            error = _error(fut.exception())  # type: ignore[arg-type]
        RECORDER.spans.append(
            (_CALL, self.actor, self.method, time.time_ns(), self.start, error, self.flow)
        )

    async def wrap(self, request: Awaitable[T]) -> T:
        """Await the call's ``request`` and record its span (with its failure, if any)."""
        error = None
        try:
            return await request
        except BaseException as exc:
            error = _error(exc)
            raise
        finally:
            RECORDER.spans.append(
                (_CALL, self.actor, self.method, time.time_ns(), self.start, error, self.flow)
            )


def call_span(actor: str, method: str) -> CallSpan | None:
    """A span for a call about to be sent (None when this process records nothing)."""
    return CallSpan(actor, method) if RECORDER.enabled else None


class _Method:
    """An actor's bound method wrapped to record its span when it runs (see
    :func:`traced_method`); a plain object, cheaper per call than a closure with
    ``functools.wraps``."""

    __slots__ = ("__name__", "flow_in", "fn", "queued")

    def __init__(self, fn: Any, method: str, flow_in: int) -> None:
        self.fn = fn
        self.__name__ = method
        self.flow_in = flow_in
        self.queued = time.time_ns()

    def _finish(self, start: int, lane: int | str, error: BaseException | None) -> None:
        RECORDER.spans.append(
            (
                _METHOD,
                self.__name__,
                self.queued,
                time.time_ns(),
                start,
                lane,
                None if error is None else _error(error),
                self.flow_in,
            )
        )


class _SyncMethod(_Method):
    __slots__ = ()

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        start = time.time_ns()
        lane = threading.get_ident()
        if lane not in _LANES:
            _LANES[lane] = threading.current_thread().name
        try:
            result = self.fn(*args, **kwargs)
        except BaseException as exc:
            self._finish(start, lane, exc)
            raise
        self._finish(start, lane, None)
        return result


class _AsyncMethod(_Method):
    __slots__ = ()

    async def __call__(self, *args: Any, **kwargs: Any) -> Any:
        start = time.time_ns()
        try:
            result = await self.fn(*args, **kwargs)
        except BaseException as exc:
            self._finish(start, "async", exc)
            raise
        self._finish(start, "async", None)
        return result


def traced_method(fn: Any, method: str, flow: Any, is_async: bool) -> Any:
    """``fn`` (an actor's bound method, about to be queued) recording its span when it runs:
    the time it waited queued, then its run, on the lane of its thread (``def``) or
    ``async``; ``flow``: the caller's flow id (anything but an int: none)."""
    flow_in = flow if type(flow) is int else 0
    return (_AsyncMethod if is_async else _SyncMethod)(fn, method, flow_in)


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
                        info = {"describe_error": _error(exc)}
                if error is not None:
                    info["error"] = _error(error)
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
    fn = getattr(td, "bytes", None)
    if not callable(fn):
        return None
    try:
        return int(fn())
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
