"""Files rayless writes into a directory another user can write: that user plants symbolic
links for the names it will use (its temporaries and its targets), pointing at a file of ours;
the write must leave that file alone and produce a regular file with the right content.

The directory is mode 0777 without the sticky bit, where ``fs.protected_symlinks`` does not
apply: the kernel would follow the stranger's link for us, so only the writer's own care
protects the file. The links are planted by uid ``nobody`` (``tests.integration.strangers``)
when we are root.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import stat
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from rayless.actors import Cluster
from rayless.actors.api import trace
from rayless.demo.report import write_files
from tests.integration.strangers import run_stranger

pytestmark = pytest.mark.integration

PRECIOUS = "the victim's own content\n"
PLANT = """
import os
for link in ARGS["links"]:
    os.symlink(ARGS["target"], link)
RESULT = [os.lstat(link).st_uid for link in ARGS["links"]]
"""


@pytest.fixture
def shared() -> Iterator[tuple[Path, Path]]:
    """A directory anyone can write (0777, not sticky) and a victim file of ours beside it."""
    base = Path(tempfile.mkdtemp(prefix="rayless-files-"))
    try:
        base.chmod(0o755)
        victim = base / "victim"
        victim.write_text(PRECIOUS)
        victim.chmod(0o644)
        out = base / "shared"
        out.mkdir()
        out.chmod(0o777)
        yield out, victim
    finally:
        shutil.rmtree(base, ignore_errors=True)


def _plant(victim: Path, *links: Path) -> None:
    run = run_stranger(PLANT, {"target": str(victim), "links": [str(p) for p in links]})
    assert run.result == [run.uid] * len(links)


def _regular(path: Path) -> bool:
    return stat.S_ISREG(os.lstat(path).st_mode)


def _gathered() -> list[trace.Gathered]:
    span = ["method", "work", 1_000, 2_000, "async", {}, 0, 0]
    return [trace.Gathered({"name": "a", "node": "node-0", "pid": 1}, [span])]


def test_a_trace_does_not_follow_a_link_planted_for_its_temporary(
    shared: tuple[Path, Path],
) -> None:
    out, victim = shared
    target = out / "timeline.json"
    # the names a writer in this process would have used for its temporary file
    _plant(
        victim, out / f"timeline.json.tmp{os.getpid()}", out / f".timeline.json.{os.getpid()}.tmp"
    )
    trace.write_trace(target, _gathered())
    assert victim.read_text() == PRECIOUS
    assert _regular(target)
    assert json.loads(target.read_text())["traceEvents"]


def test_a_trace_replaces_a_link_planted_as_its_target_and_leaves_the_victim(
    shared: tuple[Path, Path],
) -> None:
    out, victim = shared
    target = out / "timeline.json"
    _plant(victim, target)
    trace.write_trace(target, _gathered())
    assert victim.read_text() == PRECIOUS
    assert _regular(target)  # the link itself was replaced, not the file it named
    assert json.loads(target.read_text())["traceEvents"]


async def test_cluster_timeline_does_not_follow_a_link_planted_for_its_temporary(
    local_cluster: Cluster, shared: tuple[Path, Path]
) -> None:
    out, victim = shared
    target = out / "timeline.json"
    await asyncio.to_thread(_plant, victim, out / f"timeline.json.tmp{os.getpid()}")
    assert await local_cluster.timeline(str(target)) == str(target)
    assert victim.read_text() == PRECIOUS
    assert _regular(target) and "traceEvents" in json.loads(target.read_text())


class _Result:
    def to_dict(self) -> dict[str, Any]:
        return {"iterations": 3}


class _Config:
    def to_dict(self) -> dict[str, Any]:
        return {"mode": "sync"}


def test_a_demo_report_does_not_follow_links_planted_as_its_files(
    shared: tuple[Path, Path],
) -> None:
    out, victim = shared
    _plant(victim, out / "metrics.json")
    paths = write_files(_Result(), out, _Config(), lambda result, path: False)
    assert victim.read_text() == PRECIOUS
    assert _regular(paths["json"])
    assert json.loads(paths["json"].read_text()) == {"iterations": 3, "config": {"mode": "sync"}}
