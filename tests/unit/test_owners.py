"""Owner tags: pid and start time, liveness (reused pids and zombies are dead), the sweep."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from rayless.actors.control.reaper import DIR_PREFIXES, DIRS
from rayless.transport import owners
from tests import waiting

PATTERN = re.compile(r"x-(?P<pid>[0-9]+)-(?P<start>[0-9]+)-[a-z]+")


def test_this_process_is_its_own_live_owner() -> None:
    pid, start = owners.tag().split("-")
    assert int(pid) == os.getpid() and int(start) == owners.start_time(os.getpid()) > 0
    assert owners.alive(int(pid), int(start))
    assert not owners.alive(int(pid), int(start) + 1)  # another process with this pid
    assert not owners.alive(0, 0)


def test_an_exited_child_not_yet_reaped_is_dead() -> None:
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    try:
        start = owners.start_time(child.pid)
        waiting.wait_until_sync(  # a zombie until we wait for it
            lambda: owners.start_time(child.pid) is None, timeout=30, what="the child to exit"
        )
        assert start is None or not owners.alive(child.pid, start)
        assert owners.pid_alive(child.pid)  # what a pid-only check would have said
    finally:
        child.wait()


def test_sweep_removes_files_and_directories_of_dead_owners_only(tmp_path: Path) -> None:
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    mine = owners.tag()
    names = [f"x-{dead.pid}-1-file", f"x-{dead.pid}-1-dir", f"x-{mine}-live", "x-1-bad"]
    (tmp_path / names[0]).write_bytes(b"x")
    (tmp_path / names[1]).mkdir()
    (tmp_path / names[1] / "inside").write_bytes(b"x")
    (tmp_path / names[2]).write_bytes(b"x")
    (tmp_path / names[3]).write_bytes(b"x")
    os.symlink(tmp_path / names[2], tmp_path / f"x-{dead.pid}-1-link")
    assert owners.sweep(str(tmp_path), PATTERN, grace=60.0) == []  # too recent
    assert sorted(owners.sweep(str(tmp_path), PATTERN)) == sorted(names[:2])
    left = sorted(p.name for p in tmp_path.iterdir())
    assert left == sorted([*names[2:], f"x-{dead.pid}-1-link"])  # links are never followed


@pytest.mark.parametrize("prefix", DIR_PREFIXES)
def test_mkdtemp_names_its_owner_as_the_host_sweep_expects(tmp_path: Path, prefix: str) -> None:
    path = owners.mkdtemp(prefix, str(tmp_path))
    found = DIRS.fullmatch(os.path.basename(path))
    assert found is not None and f"{found['pid']}-{found['start']}" == owners.tag()
    assert os.stat(path).st_mode & 0o777 == 0o700
    assert owners.sweep(str(tmp_path), DIRS) == []  # ours, alive
