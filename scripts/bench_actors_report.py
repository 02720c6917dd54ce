"""Measurement helpers and the report table of ``scripts/bench_actors.py`` (split out of it:
quantiles, process-tree memory, and the rows that put ours beside Ray)."""

from __future__ import annotations

import os
import statistics
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import psutil

N_PAIRS = 4  # caller/target pairs of the N:N rows
N_SPAWN = 8  # actors of the spawn row

# -- measurement helpers --------------------------------------------------------------------


def percentile(values: Sequence[float], q: float) -> float:
    """The ``q``-quantile (0..1) of ``values`` by nearest rank."""
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q * (len(ordered) - 1))))]


def median(values: Sequence[float]) -> float:
    """The median of a non-empty sequence."""
    return float(statistics.median(values))


def tree_memory(pids: Sequence[int]) -> dict[str, float]:
    """RSS/PSS/USS sums (MB) over ``pids`` and all their descendants, with the count."""
    procs: dict[int, psutil.Process] = {}
    for pid in pids:
        try:
            p = psutil.Process(pid)
        except psutil.NoSuchProcess:
            continue
        procs[pid] = p
        try:
            for child in p.children(recursive=True):
                procs[child.pid] = child
        except psutil.NoSuchProcess:
            pass
    rss = pss = uss = 0
    full = True
    names: list[str] = []
    for p in procs.values():
        try:
            info = p.memory_full_info()
            rss += info.rss
            pss += getattr(info, "pss", 0)
            uss += getattr(info, "uss", 0)
            full = full and hasattr(info, "pss")
            names.append(_short_name(p))
        except psutil.AccessDenied:
            rss += p.memory_info().rss
            full = False
        except psutil.NoSuchProcess:
            continue
    out: dict[str, float] = {"count": len(procs), "rss_mb": rss / 1e6}
    if full:
        out.update(pss_mb=pss / 1e6, uss_mb=uss / 1e6)
    out["names"] = ", ".join(sorted(names))  # type: ignore[assignment]
    return out


def _short_name(p: psutil.Process) -> str:
    try:
        cmd = p.cmdline()
    except (psutil.AccessDenied, psutil.NoSuchProcess):
        return p.name()
    for i, part in enumerate(cmd):
        if part == "-m" and i + 1 < len(cmd):
            return cmd[i + 1].rsplit(".", 1)[-1]
    exe = os.path.basename(cmd[0]) if cmd else p.name()
    if exe.startswith("python"):
        scripts = [c for c in cmd[1:] if not c.startswith("-")]
        return os.path.basename(scripts[0]) if scripts else exe
    return exe


def wait_stable(pid: int, settle: float = 2.0, limit: float = 30.0) -> None:
    """Wait until the set of descendants of ``pid`` did not change for ``settle`` seconds."""
    deadline = time.monotonic() + limit
    last: set[int] = set()
    since = time.monotonic()
    while time.monotonic() < deadline:
        now = {c.pid for c in psutil.Process(pid).children(recursive=True)}
        if now != last:
            last, since = now, time.monotonic()
        elif time.monotonic() - since >= settle:
            return
        time.sleep(0.25)


# -- report ---------------------------------------------------------------------------------


@dataclass
class Row:
    """One line of the table: ours, Ray's, and the goal on ours/Ray (if any)."""

    name: str
    unit: str
    ours: float | None
    ray: float | None
    goal: str = ""  # ">=3" or "<=0.333"

    def ratio(self) -> float | None:
        """Ours divided by Ray's."""
        if self.ours is None or not self.ray:
            return None
        return self.ours / self.ray

    def verdict(self) -> str:
        """PASS/MISS against the goal, or '' without one (or without Ray's figure)."""
        r = self.ratio()
        if not self.goal or r is None:
            return ""
        op, bound = self.goal[:2], float(self.goal[2:])
        ok = r >= bound if op == ">=" else r <= bound
        return "PASS" if ok else "MISS"


def _fmt(v: float | None) -> str:
    if v is None:
        return "-"
    if float(v).is_integer() and abs(v) < 100:
        return str(int(v))
    if v >= 100:
        return f"{v:,.0f}"
    if v >= 10:
        return f"{v:.1f}"
    return f"{v:.2f}"


def call_rows(ours: dict[str, Any], ray: dict[str, Any] | None, s: Any) -> list[Row]:
    """The rows of actor calls (1:1 sync, pipelined, n:n) from both result dicts."""
    r = ray or {}
    rs = r.get("sync", {})
    return [
        Row(
            "1:1 sync, async def (calls/s)",
            "calls/s",
            ours["sync_async_def"]["rate"],
            rs.get("rate"),
            ">=3",
        ),
        Row("1:1 sync, def (calls/s)", "calls/s", ours["sync_def"]["rate"], rs.get("rate"), ">=3"),
        Row(
            "1:1 sync, async def p50 (µs)", "µs", ours["sync_async_def"]["p50_us"], rs.get("p50_us")
        ),
        Row(
            "1:1 sync, async def p99 (µs)", "µs", ours["sync_async_def"]["p99_us"], rs.get("p99_us")
        ),
        Row("1:1 sync, def p50 (µs)", "µs", ours["sync_def"]["p50_us"], rs.get("p50_us")),
        Row("1:1 sync, def p99 (µs)", "µs", ours["sync_def"]["p99_us"], rs.get("p99_us")),
        Row(
            f"1:1 async x{s.window}, async def (calls/s)",
            "calls/s",
            ours["pipe_async_def"],
            r.get("pipe"),
            ">=5",
        ),
        Row(
            f"1:1 async x{s.window}, def (calls/s)",
            "calls/s",
            ours["pipe_def"],
            r.get("pipe"),
            ">=5",
        ),
        Row(
            f"{N_PAIRS}:{N_PAIRS} async, async def (calls/s)",
            "calls/s",
            ours["nn_async_def"],
            r.get("nn"),
            ">=5",
        ),
        Row(
            f"{N_PAIRS}:{N_PAIRS} async, def (calls/s)",
            "calls/s",
            ours["nn_def"],
            r.get("nn"),
            ">=5",
        ),
    ]


def def_vs_async(ours: dict[str, Any]) -> str:
    """A line comparing pipelined ``def`` with pipelined ``async def`` (goal: >= 0.8)."""
    ratio = ours["pipe_def"] / ours["pipe_async_def"]
    verdict = "PASS" if ratio >= 0.8 else "MISS"
    return f"pipelined def / pipelined async def: {ratio:.2f} (goal ≥ 0.8)  {verdict}"


def build_rows(ours: dict[str, Any], ray: dict[str, Any] | None, s: Any) -> list[Row]:
    """The table's rows from both result dicts."""
    r = ray or {}
    rows = call_rows(ours, ray, s)
    for mib in s.tensor_mib:
        goal = ">=5" if mib == 64 else ""
        rows.append(
            Row(
                f"tensor {mib} MiB (MB/s)",
                "MB/s",
                ours[f"tensor_{mib}"],
                r.get(f"tensor_{mib}"),
                goal,
            )
        )
    for mib in s.tensor_mib:
        ray_np = r.get(f"tensor_np_{mib}")
        rows.append(
            Row(f"  vs Ray zero-copy numpy {mib} MiB", "MB/s", ours[f"tensor_{mib}"], ray_np)
        )
    rows.append(
        Row(f"spawn {N_SPAWN} actors + 1 call (s)", "s", ours["spawn"], r.get("spawn"), "<=0.3334")
    )
    rows.append(
        Row("Cluster.local(nodes=1) up (s) vs ray.init", "s", ours["startup"], r.get("init_s"))
    )
    rows.append(
        Row("Cluster.local(nodes=1) + Store.create(2) (s)", "s", ours["startup_store"], None)
    )
    rm = r.get("memory", {})
    for key, label in (("memory", "eager zygote"), ("memory_lazy", "lazy zygote")):
        om = ours[key]
        # PSS counts pages shared between processes (the zygote and its children, the
        # libraries) once, split among them: the goal is on it
        goal = "<=0.3334" if "pss_mb" in om else ""
        rows.append(Row(f"idle cluster RSS (MB), {label}", "MB", om["rss_mb"], rm.get("rss_mb")))
        if "pss_mb" in om:
            rows.append(
                Row(f"idle cluster PSS (MB), {label}", "MB", om["pss_mb"], rm.get("pss_mb"), goal)
            )
            rows.append(
                Row(f"idle cluster USS (MB), {label}", "MB", om["uss_mb"], rm.get("uss_mb"))
            )
    rows.append(Row("idle cluster processes", "n", ours["memory"]["count"], rm.get("count")))
    return rows


def print_table(rows: list[Row]) -> None:
    """Aligned plain text: row, ours, Ray, ours/Ray, goal, verdict."""
    header = ("row", "rayless", "ray 2.60", "ours/ray", "goal", "")
    lines = [header]
    for row in rows:
        ratio = row.ratio()
        goal = row.goal.replace(">=", "≥ ").replace("<=0.3334", "≤ 1/3")
        if goal.startswith("≥"):
            goal += "x"
        lines.append(
            (
                row.name,
                _fmt(row.ours),
                _fmt(row.ray),
                "-" if ratio is None else f"{ratio:.2f}x",
                goal,
                row.verdict(),
            )
        )
    widths = [max(len(line[i]) for line in lines) for i in range(len(header))]
    for j, line in enumerate(lines):
        cells = [line[0].ljust(widths[0])] + [
            c.rjust(w) for c, w in zip(line[1:5], widths[1:5], strict=True)
        ]
        print("  ".join(cells) + "  " + line[5])
        if j == 0:
            print("  ".join("-" * w for w in widths[:5]) + "  ----")
