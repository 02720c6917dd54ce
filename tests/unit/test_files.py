"""``rayless.transport.files``: atomic writes through temporaries no one can have planted,
and appends that refuse links, fifos and other users' files."""

from __future__ import annotations

import errno
import os
import stat
from collections.abc import Iterator
from pathlib import Path

import pytest

from rayless.transport import files


@pytest.fixture
def victim(tmp_path: Path) -> Path:
    path = tmp_path / "victim"
    path.write_text("precious")
    return path


def _names(*values: str) -> Iterator[str]:
    yield from values


def test_a_planted_temporary_name_is_skipped_never_followed(
    tmp_path: Path, victim: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    out = tmp_path / "out"
    out.mkdir()
    names = _names("aaaa", "bbbb")
    monkeypatch.setattr(files.secrets, "token_hex", lambda n: next(names))
    (out / ".f.json.aaaa.tmp").symlink_to(victim)
    files.atomic_write(out / "f.json", "{}")
    assert victim.read_text() == "precious"
    assert (out / "f.json").read_text() == "{}"
    assert sorted(p.name for p in out.iterdir()) == [".f.json.aaaa.tmp", "f.json"]


def test_a_link_as_the_target_is_replaced_not_followed(tmp_path: Path, victim: Path) -> None:
    link = tmp_path / "out.bin"
    link.symlink_to(victim)
    files.atomic_write(link, b"\x00\x01")
    assert victim.read_text() == "precious"
    assert stat.S_ISREG(os.lstat(link).st_mode) and link.read_bytes() == b"\x00\x01"


def test_a_failed_write_leaves_the_target_and_no_temporary(tmp_path: Path) -> None:
    target = tmp_path / "t.txt"
    target.write_text("old")
    with pytest.raises(RuntimeError), files.atomic_file(target) as f:
        f.write("half")
        raise RuntimeError("stop")
    assert target.read_text() == "old"
    assert [p.name for p in tmp_path.iterdir()] == ["t.txt"]


def test_perms_and_a_directory_fd(tmp_path: Path) -> None:
    fd = os.open(tmp_path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        files.atomic_write("secret", "s", perms=0o600, dir_fd=fd)
        with pytest.raises(ValueError):
            files.atomic_write("sub/secret", "s", dir_fd=fd)
    finally:
        os.close(fd)
    assert stat.S_IMODE(os.stat(tmp_path / "secret").st_mode) == 0o600
    assert (tmp_path / "secret").read_text() == "s"


def test_open_append_appends_to_a_file_of_ours(tmp_path: Path) -> None:
    log = tmp_path / "a.log"
    for text in (b"one\n", b"two\n"):
        fd = files.open_append(log)
        os.write(fd, text)
        os.close(fd)
    assert log.read_bytes() == b"one\ntwo\n"


def test_open_append_refuses_a_link_a_fifo_and_another_users_file(
    tmp_path: Path, victim: Path
) -> None:
    link = tmp_path / "link.log"
    link.symlink_to(victim)
    with pytest.raises(OSError) as caught:
        files.open_append(link)
    assert caught.value.errno == errno.ELOOP
    fifo = tmp_path / "fifo.log"
    os.mkfifo(fifo)
    with pytest.raises(OSError):  # ENXIO (no reader): it does not wait for one
        files.open_append(fifo)
    if os.geteuid() == 0:
        theirs = tmp_path / "theirs.log"
        theirs.write_text("")
        os.chown(theirs, 65534, 65534)
        with pytest.raises(PermissionError):
            files.open_append(theirs)
    assert victim.read_text() == "precious"
