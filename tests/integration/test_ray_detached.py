"""``lifetime="detached"`` across drivers: a detached actor outlives the driver (or actor)
that started it, on a cluster that outlives them both (``rayless launch``; here the suite's
local cluster processes), and ends when it is killed."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from rayless.actors.testing import LocalProcesses
from tests.drivers import ROOT
from tests.environ import without_rayless

pytestmark = pytest.mark.integration

PRELUDE = """
from rayless import ray

@ray.remote
class Tally:
    def __init__(self):
        self.n = 0

    def add(self, k):
        self.n += k
        return self.n

    def pid(self):
        import os
        return os.getpid()

    def start_detached_child(self):
        child = Tally.options(name="child", namespace="jobs", lifetime="detached").remote()
        ray.get(child.add.remote(5))
        return True

ray.init(namespace="jobs")
"""


def _driver(procs: LocalProcesses, tmp_path: Path, body: str) -> list[str]:
    path = tmp_path / "driver.py"
    path.write_text(textwrap.dedent(PRELUDE) + textwrap.dedent(body))
    env = {
        **without_rayless(),
        "RAYLESS_ADDRESS": procs.address,
        "RAYLESS_TOKEN": procs.token,
        "PYTHONPATH": str(ROOT),
    }
    out = subprocess.run(
        [sys.executable, str(path)], cwd=ROOT, env=env, capture_output=True, text=True, timeout=180
    )
    assert out.returncode == 0, out.stderr[-4000:]
    return out.stdout.split()


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def test_a_detached_actor_outlives_its_driver(
    local_cluster_processes: LocalProcesses, tmp_path: Path
) -> None:
    # the Ray habit: get the named detached actor, or start it; a later driver finds it
    first = _driver(
        local_cluster_processes,
        tmp_path,
        """
        t = Tally.options(name="tally", lifetime="detached", get_if_exists=True).remote()
        kept = Tally.options(name="kept").remote()  # named, not detached: ends with us
        anon = Tally.options(lifetime="detached").remote()  # its handle dropped: kept too
        print(ray.get(t.add.remote(2)), ray.get(kept.pid.remote()), ray.get(anon.pid.remote()))
        del anon
        """,
    )
    assert first[0] == "2"
    kept_pid, anon_pid = int(first[1]), int(first[2])
    second = _driver(
        local_cluster_processes,
        tmp_path,
        """
        t = ray.get_actor("tally")
        print(ray.get(t.add.remote(3)))
        try:
            ray.get_actor("kept")
            print("kept-found")
        except ValueError:
            print("kept-gone")
        boss = Tally.remote()
        ray.get(boss.start_detached_child.remote())
        ray.kill(boss)  # its detached child stays
        """,
    )
    assert second == ["5", "kept-gone"]
    assert not _alive(kept_pid) and _alive(anon_pid)
    third = _driver(
        local_cluster_processes,
        tmp_path,
        """
        child = ray.get_actor("child")
        t = ray.get_actor("tally")
        print(ray.get(child.add.remote(1)), ray.get(t.pid.remote()))
        ray.kill(child)
        ray.kill(t)
        try:
            ray.get_actor("tally")
        except ValueError:
            print("tally-gone")
        """,
    )
    assert third[0] == "6" and third[2] == "tally-gone"
    os.kill(anon_pid, 9)  # (nobody can name it: the suite's cluster must not keep it)
