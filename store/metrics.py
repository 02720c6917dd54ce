"""Store metrics: rate meters, the store's metrics snapshot, and its two renderings.

``Store.metrics()`` gathers the controller's and every unit's counters into one plain dict;
:func:`render_text` prints it for ``rayless status --store NAME`` and :func:`prometheus`
writes the Prometheus text exposition format (version 0.0.4) by hand: the format is a few
lines of ``name{labels} value``, so an optional ``prometheus_client`` dependency would buy
nothing but a second code path (serve the text from any HTTP handler, or a textfile
collector).
"""

from __future__ import annotations

import asyncio
import math
import time
from collections import deque
from collections.abc import Iterable, Sequence
from typing import Any

# (registers the units' and the status documents' wire forms: ``rayless status`` decodes the
# controller's units() and metrics() and the units' stats() here)
from rayless.store.data.messages import UnitView
from rayless.store.data.status import ControllerMetrics, Rate, UnitStats

__all__ = ["RateMeter", "collect", "prometheus", "render_text"]

WINDOW = 10.0  # seconds a rate averages over


class RateMeter:
    """A counter with its rate per second over the last ``window`` seconds."""

    def __init__(self, window: float = WINDOW) -> None:
        self.window = window
        self.total = 0
        self._events: deque[tuple[float, int]] = deque()

    def add(self, n: int = 1, now: float | None = None) -> None:
        """Count ``n`` more events."""
        t = time.monotonic() if now is None else now
        self.total += n
        self._events.append((t, n))
        self._trim(t)

    def _trim(self, now: float) -> None:
        while self._events and now - self._events[0][0] > self.window:
            self._events.popleft()

    def rate(self, now: float | None = None) -> float:
        """Events per second over the last window (0 when idle)."""
        self._trim(time.monotonic() if now is None else now)
        return sum(n for _, n in self._events) / self.window

    def snapshot(self) -> Rate:
        """The total and the rate per second (rounded to 3 decimals)."""
        return Rate(self.total, round(self.rate(), 3))


async def collect(
    controller: Any, units: Sequence[UnitView], store_id: str, name: str | None
) -> dict[str, Any]:
    """The store's metrics snapshot from its controller's handle and its ``units()`` list:
    the controller's counters and each live unit's (asked in parallel). Needs no torch, so
    ``rayless status --store`` starts fast."""
    ctl: ControllerMetrics = await controller.metrics()
    infos = {u.unit_id: u for u in ctl.units}
    live = [u for u in units if infos.get(u.unit_id, u).alive]
    stats = await asyncio.gather(
        *[u.handle.stats() for u in live if u.handle is not None],
        return_exceptions=True,
    )
    by_id = {s.unit_id: s for s in stats if isinstance(s, UnitStats)}
    rows = []
    for unit_id, info in infos.items():
        s = by_id.get(unit_id)
        rows.append(
            {
                "unit_id": unit_id,
                "node_id": info.node_id,
                "alive": info.alive and s is not None,
                "device": info.device,
                "bytes_used": 0 if s is None else s.used_bytes,
                "capacity_bytes": info.capacity_bytes,
                "rows": 0 if s is None else sum(s.rows.values()),
                "puts": {} if s is None else s.puts.as_dict(),
                "gets": {} if s is None else s.gets.as_dict(),
            }
        )
    return {"name": name, "store_id": store_id, "controller": ctl.as_dict(), "units": rows}


def _label(value: Any) -> str:
    text = str(value).replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")
    return f'"{text}"'


def _value(value: Any) -> str:
    """A sample value in Prometheus' text format, exact: integers in full (4194304, counters
    past 10**6), other floats as their shortest round-trip form, NaN and +Inf/-Inf spelled."""
    if isinstance(value, (bool, int)):
        return str(int(value))
    number = float(value)
    if math.isnan(number):
        return "NaN"
    if math.isinf(number):
        return "+Inf" if number > 0 else "-Inf"
    if number.is_integer() and abs(number) < 2**53:
        return str(int(number))
    return repr(number)


def _line(name: str, labels: dict[str, Any], value: Any) -> str:
    inner = ",".join(f"{k}={_label(v)}" for k, v in labels.items())
    return f"rayless_store_{name}{{{inner}}} {_value(value)}"


HELP = {
    "unit_bytes": ("gauge", "bytes a storage unit holds"),
    "unit_capacity_bytes": ("gauge", "a storage unit's byte capacity (0: unbounded)"),
    "unit_rows": ("gauge", "rows a storage unit holds"),
    "unit_alive": ("gauge", "1 while the unit is registered and alive"),
    "unit_puts_total": ("counter", "rows written to a unit"),
    "unit_gets_total": ("counter", "rows read from a unit"),
    "unit_puts_per_second": ("gauge", "rows written per second (10 s window)"),
    "unit_gets_per_second": ("gauge", "rows read per second (10 s window)"),
    "samples": ("gauge", "samples of a partition"),
    "consumed": ("gauge", "samples of a partition a task consumed"),
    "waiting_fetches": ("gauge", "get_meta calls waiting for data"),
    "puts_total": ("counter", "samples made ready by the controller"),
    "fetches_total": ("counter", "samples handed out by fetches"),
    "puts_per_second": ("gauge", "samples made ready per second (10 s window)"),
    "fetches_per_second": ("gauge", "samples fetched per second (10 s window)"),
}


def _samples(metrics: dict[str, Any]) -> Iterable[tuple[str, dict[str, Any], Any]]:
    store = {"store": metrics.get("store_id", "?")}
    ctl = metrics.get("controller", {})
    yield "waiting_fetches", store, len(ctl.get("waiting", []))
    for name in ("puts", "fetches"):
        c = ctl.get(name, {})
        yield f"{name}_total", store, c.get("total", 0)
        yield f"{name}_per_second", store, c.get("per_s", 0)
    for part, info in ctl.get("partitions", {}).items():
        yield "samples", {**store, "partition": part}, info.get("samples", 0)
        for task, n in info.get("consumers", {}).items():
            yield "consumed", {**store, "partition": part, "task": task}, n
    for unit in metrics.get("units", []):
        labels = {**store, "unit": unit.get("unit_id", "?"), "node": unit.get("node_id", "?")}
        yield "unit_alive", labels, 1 if unit.get("alive") else 0
        yield "unit_bytes", labels, unit.get("bytes_used", 0)
        yield "unit_capacity_bytes", labels, unit.get("capacity_bytes") or 0
        yield "unit_rows", labels, unit.get("rows", 0)
        for name in ("puts", "gets"):
            c = unit.get(name, {})
            yield f"unit_{name}_total", labels, c.get("total", 0)
            yield f"unit_{name}_per_second", labels, c.get("per_s", 0)


def prometheus(metrics: dict[str, Any]) -> str:
    """``metrics`` (from ``Store.metrics()``) in the Prometheus text format."""
    by_name: dict[str, list[str]] = {}
    for name, labels, value in _samples(metrics):
        by_name.setdefault(name, []).append(_line(name, labels, value))
    out = []
    for name, lines in by_name.items():
        kind, text = HELP[name]
        out += [f"# HELP rayless_store_{name} {text}", f"# TYPE rayless_store_{name} {kind}"]
        out += lines
    return "\n".join(out) + "\n"


def render_text(metrics: dict[str, Any]) -> str:
    """A plain-text report: units table, partitions with consumers, waiting fetches."""
    ctl = metrics.get("controller", {})
    head = (
        f"store {metrics.get('name', '?')} ({metrics.get('store_id', '?')}): "
        f"{len(metrics.get('units', []))} units, "
        f"puts {ctl.get('puts', {}).get('per_s', 0):g}/s, "
        f"fetches {ctl.get('fetches', {}).get('per_s', 0):g}/s, "
        f"{len(ctl.get('waiting', []))} waiting fetches"
    )
    lines = [head, "", "Units"]
    rows = []
    for u in metrics.get("units", []):
        cap = u.get("capacity_bytes")
        rows.append(
            [
                u.get("unit_id", "?"),
                u.get("node_id") or "?",
                "yes" if u.get("alive") else "NO",
                u.get("bytes_used", 0),
                cap if cap else "-",
                u.get("rows", 0),
                f"{u.get('puts', {}).get('per_s', 0):g}",
                f"{u.get('gets', {}).get('per_s', 0):g}",
            ]
        )
    lines.append(
        _table(["UNIT", "NODE", "ALIVE", "BYTES", "CAPACITY", "ROWS", "PUTS/S", "GETS/S"], rows)
    )
    lines += ["", "Partitions"]
    prow = []
    for part, info in ctl.get("partitions", {}).items():
        consumers = ", ".join(f"{t}:{n}" for t, n in info.get("consumers", {}).items()) or "-"
        prow.append([part, info.get("samples", 0), consumers])
    lines.append(_table(["PARTITION", "SAMPLES", "CONSUMED PER TASK"], prow) or "(none)")
    waiting = ctl.get("waiting", [])
    if waiting:
        lines += ["", "Waiting fetches"]
        lines += [w.get("text", "?") for w in waiting]
    return "\n".join(lines)


def _table(headers: list[str], rows: list[list[Any]]) -> str:
    if not rows:
        return "(none)"
    cells = [headers] + [[str(c) for c in r] for r in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(headers))]
    return "\n".join(
        "  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in cells
    )
