"""Nothing a local cluster put on the host outlives its processes, however they end.

A driver script (a real ``Cluster.local`` with a published weight version, an actor that
received a large tensor over shared memory and holds a segment of its own) runs in a
subprocess; the test records by name what it created (its segments in /dev/shm, its
``/tmp/rayless-local-*`` directory, its runtime entries) and sends SIGTERM, SIGHUP or SIGKILL
to the driver, to the head, to the node agent, or to all of them at once. Within 10 s nothing
of a dead process may be left (what the still-running driver owns may stay until it ends);
the driver ends with the signal's exit status.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import psutil
import pytest

from rayless.actors.launch.procs import first_line
from rayless.transport import shm
from tests import waiting

pytestmark = [pytest.mark.integration, pytest.mark.timeout(240)]

GONE_WITHIN = 10.0  # seconds (times RAYLESS_TEST_TIMEOUT_SCALE)

DRIVER = """
import asyncio, json, os
import torch
from rayless.actors import Cluster
from rayless.weights import WeightSync
from tests.integration.leftover_classes import Holder

async def main():
    async with Cluster.local(nodes=1, node_timeout=1.0) as cluster:
        ws = await WeightSync.create(cluster, name="leftovers")
        await ws.publish({"w": torch.full((1 << 20,), 1.0)}, version=1)
        await ws.publish({"w": torch.full((1 << 20,), 2.0)}, version=2)
        holder = await cluster.spawn(Holder)
        assert await holder.take(torch.ones(4 << 20)) == 16 << 20  # over shared memory
        held = await holder.hold(1 << 20)
        procs = cluster._local
        info = {
            "head": procs.head.pid,
            "agent": procs.agents[0].pid,
            "reaper": getattr(getattr(procs, "reaper", None), "pid", None),
            "tmpdir": procs.tmpdir,
            "held": held,
        }
        print("READY", json.dumps(info), flush=True)
        await asyncio.sleep(600)

asyncio.run(main())
"""


def _alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def _tree(pid: int, but: int | None) -> set[int]:
    """``pid`` and its descendants now, without ``but`` (the reaper)."""
    try:
        proc = psutil.Process(pid)
        found = {pid, *(p.pid for p in proc.children(recursive=True))}
    except psutil.Error:
        return set()
    return found - {but} if but is not None else found


def _segments(pids: set[int]) -> set[str]:
    """The segments in /dev/shm created by one of ``pids``."""
    out = set()
    for name in os.listdir(shm.SHM_DIR):
        parts = name.split("-")
        if (
            len(parts) > 2
            and parts[0] == "rayless"
            and parts[1].isdigit()
            and int(parts[1]) in pids
        ):
            out.add(name)
    return out


class Run:
    """One driver subprocess and what it created."""

    def __init__(self, tmp_path: Path) -> None:
        self.run_dir = tmp_path / "run"
        env = {**os.environ, "RAYLESS_RUNTIME_DIR": str(self.run_dir), "PYTHONUNBUFFERED": "1"}
        root = Path(__file__).resolve().parents[2]
        self.driver = subprocess.Popen(
            [sys.executable, "-c", DRIVER], cwd=root, env=env, stdout=subprocess.PIPE
        )
        line = first_line(self.driver, "the driver", timeout=waiting.scaled(180))
        assert line.startswith("READY"), f"driver printed {line!r}"
        self.info: dict[str, Any] = json.loads(line.split(" ", 1)[1])
        self.reaper: int | None = self.info["reaper"]
        self.pids = _tree(self.driver.pid, self.reaper)  # driver, head, zygotes, agent, actors
        assert len(self.pids) >= 8  # driver, head, 2 zygotes, agent, registry, relay, holder
        self.segments = _segments(self.pids)
        assert self.info["held"] in self.segments
        assert len(self.segments) >= 3  # the driver's two weight versions, the held one
        self.tmpdir = Path(self.info["tmpdir"])
        assert self.tmpdir.is_dir()
        self.entries = sorted(self.run_dir.glob("cluster-*"))
        assert len(self.entries) == 2  # cluster-<head pid>.json and its .token

    def left(self, *, driver_alive: bool) -> dict[str, Any]:
        """What of this run is still there that should not be (nothing: an empty dict).

        While the driver runs, its own segments and directory are its own; the entries are
        the head's (they must go when the head is gone)."""
        gone = {p for p in self.pids if not _alive(p)} if driver_alive else self.pids
        left: dict[str, Any] = {}
        recorded = {s for s in self.segments if int(s.split("-")[1]) in gone}
        segs = {s for s in recorded if os.path.exists(os.path.join(shm.SHM_DIR, s))}
        segs |= _segments(gone)  # and any made after the recording
        if segs:
            left["segments"] = sorted(segs)
        if not driver_alive and self.tmpdir.exists():
            left["tmpdir"] = str(self.tmpdir)
        entries = [p.name for p in self.entries if p.exists()]
        if entries and not _alive(self.info["head"]):
            left["runtime entries"] = entries
        return left

    def close(self) -> None:
        for pid in sorted(self.pids | ({self.reaper} if self.reaper else set())):
            if _alive(pid):
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
        if self.driver.poll() is None:
            self.driver.kill()
            self.driver.wait()
        if self.driver.stdout is not None:
            self.driver.stdout.close()


def _nothing_left(run: Run, *, driver_alive: bool, what: str) -> None:
    left: dict[str, Any] = {}

    def clean() -> bool:
        left.clear()
        left.update(run.left(driver_alive=driver_alive))
        return not left

    gone = waiting.eventually_sync(clean, timeout=GONE_WITHIN, interval=0.2, what=what)
    assert gone, f"{what}: still there after {waiting.scaled(GONE_WITHIN):g} s: {left}"


SIGNALS = [signal.SIGTERM, signal.SIGHUP, signal.SIGKILL]
TARGETS = ["driver", "head", "agent", "all"]


def _case(target: str, sig: signal.Signals) -> Any:
    # the driver's SIGTERM (how Slurm, Kubernetes and `timeout` end a job) and SIGKILL of
    # everything (only the reaper survives) run by default; the rest (the same paths through
    # other processes, ~20 s each) are slow
    quick = (target, sig) in (("driver", signal.SIGTERM), ("all", signal.SIGKILL))
    marks = () if quick else (pytest.mark.slow,)
    return pytest.param(target, sig, marks=marks, id=f"{target}-{sig.name}")


@pytest.mark.parametrize(("target", "sig"), [_case(t, s) for t in TARGETS for s in SIGNALS])
def test_nothing_of_a_signalled_process_is_left_within_seconds(
    target: str, sig: signal.Signals, tmp_path: Path
) -> None:
    run = Run(tmp_path)
    try:
        victims = {
            "driver": [run.driver.pid],
            "head": [run.info["head"]],
            "agent": [run.info["agent"]],
            "all": sorted(run.pids),
        }[target]
        for pid in victims:
            try:
                os.kill(pid, sig)
            except ProcessLookupError:
                pass
        if target in ("driver", "all"):
            code = run.driver.wait(waiting.scaled(60))
            assert code == -sig, f"the driver exited with {code} after {sig.name}"
            _nothing_left(run, driver_alive=False, what=f"{target} {sig.name}")
        else:
            waiting.wait_until_sync(
                lambda: not _alive(victims[0]), timeout=30, what=f"the {target} to exit"
            )
            _nothing_left(run, driver_alive=True, what=f"{target} {sig.name}")
            assert run.driver.poll() is None  # the driver outlives its cluster
            run.driver.send_signal(signal.SIGTERM)
            code = run.driver.wait(waiting.scaled(60))
            assert code == -signal.SIGTERM, f"the driver exited with {code} after SIGTERM"
            _nothing_left(run, driver_alive=False, what=f"{target} {sig.name}, then the driver")
        everyone = run.pids | ({run.reaper} if run.reaper else set())
        waiting.wait_until_sync(
            lambda: not [p for p in everyone if _alive(p)],
            timeout=30,
            what="every process of the run (the reaper too) to exit",
        )
    finally:
        run.close()
