"""Addresses in both forms, and the per-user runtime directory of embedded clusters."""

from __future__ import annotations

import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from rayless.actors.core import context, published
from rayless.errors import ConnectError


@pytest.mark.parametrize(
    ("given", "expected"),
    [
        ("127.0.0.1:7000", "tcp://127.0.0.1:7000"),
        ("tcp://127.0.0.1:7000", "tcp://127.0.0.1:7000"),
        ("head-node.cluster:29500", "tcp://head-node.cluster:29500"),
        (" node1:1 ", "tcp://node1:1"),
        ("[::1]:7000", "tcp://[::1]:7000"),
        ("tcp://[fe80::1]:7000", "tcp://[fe80::1]:7000"),
    ],
)
def test_addresses_with_or_without_tcp(given: str, expected: str) -> None:
    assert context.normalize_address(given) == expected


@pytest.mark.parametrize(
    "bad", ["", "host", "host:", ":7000", "http://h:1", "tcp://h", "h:0", "h:70000", "h:1/x"]
)
def test_other_addresses_are_a_value_error_naming_the_forms(bad: str) -> None:
    with pytest.raises(ValueError, match=r"'host:port', 'tcp://host:port'"):
        context.normalize_address(bad)


def test_a_malformed_environment_address_is_a_value_error(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("RAYLESS_ADDRESS", "not an address")
    monkeypatch.setenv("RAYLESS_TOKEN", "t" * 32)
    with pytest.raises(ValueError, match=r"RAYLESS_ADDRESS.*host:port"):
        context.from_env()
    monkeypatch.setenv("RAYLESS_ADDRESS", "10.0.0.1:7000")
    info = context.from_env()
    assert info is not None and info.address == "tcp://10.0.0.1:7000"


@pytest.fixture
def rt(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    path = tmp_path / "rt"
    monkeypatch.setenv("RAYLESS_RUNTIME_DIR", str(path))
    return path


def test_publish_is_private_and_unpublish_removes_it(rt: Path) -> None:
    entry = published.publish("tcp://127.0.0.1:1234", "s" * 32, os.getpid())
    assert entry is not None
    assert stat.S_IMODE(rt.stat().st_mode) == 0o700
    token_file = Path(entry.removesuffix(".json") + ".token")
    assert stat.S_IMODE(token_file.stat().st_mode) == 0o600
    found = published.find_one()
    assert found.address == "tcp://127.0.0.1:1234" and found.token() == "s" * 32
    assert published.find_address("tcp://127.0.0.1:1234") == found
    published.unpublish(entry)
    assert sorted(rt.iterdir()) == []
    with pytest.raises(ConnectError, match="no local rayless cluster"):
        published.find_one()


def test_stale_entries_are_ignored_and_removed(rt: Path) -> None:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    entry = published.publish("tcp://127.0.0.1:1", "a" * 32, proc.pid)
    proc.wait()  # its "head" is gone now
    assert entry is not None
    assert published.discover() == []
    assert sorted(rt.iterdir()) == []


class _Killed(BaseException):
    """The SIGKILL that ends a head between two unlinks."""


def test_a_head_killed_while_unpublishing_leaves_what_a_sweep_removes(
    rt: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # before: the entry went first, and a head killed right after left its token for good
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        entry = published.publish("tcp://127.0.0.1:1", "a" * 32, proc.pid)
        assert entry is not None
        unlink = os.unlink

        def killed_after_one(path: str, *args: object, **kw: object) -> None:
            unlink(path)
            raise _Killed

        monkeypatch.setattr(published.os, "unlink", killed_after_one)
        with pytest.raises(_Killed):
            published.unpublish(entry)
        monkeypatch.setattr(published.os, "unlink", unlink)
        assert [p.name for p in rt.iterdir()] == [Path(entry).name]  # the listed one stays
    finally:
        proc.kill()
        proc.wait()
    assert published.discover() == [] and sorted(rt.iterdir()) == []


def test_a_token_without_its_entry_goes_once_its_head_is_gone(rt: Path) -> None:
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        entry = published.publish("tcp://127.0.0.1:1", "a" * 32, proc.pid)
        assert entry is not None
        os.unlink(entry)  # what an older unpublish killed between its unlinks left
        token = Path(entry.removesuffix(".json") + ".token")
        assert published.discover() == [] and token.exists()  # its head lives (or is publishing)
    finally:
        proc.kill()
        proc.wait()
    assert published.discover() == [] and sorted(rt.iterdir()) == []


def test_several_live_clusters_are_listed_not_guessed(rt: Path) -> None:
    published.publish("tcp://127.0.0.1:1", "a" * 32, os.getpid())
    published.publish("tcp://127.0.0.1:2", "b" * 32, os.getppid())
    with pytest.raises(ConnectError, match=r"2 local rayless clusters.*:1.*:2|:2.*:1"):
        published.find_one()
    assert published.find_address("tcp://127.0.0.1:2").token() == "b" * 32  # type: ignore[union-attr]


def test_a_directory_others_can_read_is_not_trusted(rt: Path) -> None:
    rt.mkdir(mode=0o755)
    rt.chmod(0o755)
    (rt / "cluster-1.json").write_text("{}")
    assert published.discover() == []  # never read an open directory
    entry = published.publish("tcp://127.0.0.1:3", "c" * 32, os.getpid())
    assert entry is not None and stat.S_IMODE(rt.stat().st_mode) == 0o700  # made private
