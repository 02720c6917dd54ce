"""Versioned shared-memory segments: leases, double buffering, cleanup of a dead creator."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from rayless.transport import segments, shm
from rayless.transport.segments import Reader, Segment, SlotPool, Superseded


def _write(seg: Segment, byte: int) -> None:
    seg.payload[:] = bytes([byte]) * seg.payload_bytes


def test_a_committed_version_is_read_back_and_its_name_follows_the_transport_rule() -> None:
    pool = SlotPool()
    try:
        seg = pool.begin(100)
        _write(seg, 7)
        pool.commit(seg, 3)
        assert shm.NAME.fullmatch(seg.name)
        assert seg.name in segments.owned()
        reader = Reader()
        with reader.lease(seg.name, 3) as payload:
            assert bytes(payload) == b"\x07" * 100
        reader.close()
    finally:
        pool.close()
    assert not os.path.exists(os.path.join(shm.SHM_DIR, seg.name))
    assert seg.name not in segments.owned()


def test_the_writer_never_rewrites_the_newest_version_nor_a_leased_one() -> None:
    pool = SlotPool(max_slots=3)
    reader = Reader()
    try:
        a = pool.begin(8)
        pool.commit(a, 1)
        b = pool.begin(8)
        assert b is not a  # a is the newest
        pool.commit(b, 2)
        with reader.lease(a.name, 1):  # a reader copies version 1 while 3 is written
            c = pool.begin(8)
            assert c is not a and c is not b
            pool.commit(c, 3)
        d = pool.begin(8)  # a is free again: reused, no fourth segment
        assert d is a and len(pool.slots) == 3
        pool.commit(d, 4)
    finally:
        reader.close()
        pool.close()


def test_a_reader_drops_its_mappings_of_segments_the_writer_unlinked() -> None:
    pool = SlotPool(max_slots=2)
    reader = Reader()
    try:
        old = pool.begin(4096)
        pool.commit(old, 1)
        with reader.lease(old.name, 1):
            pass
        pool.close()  # the publisher closed: its memory must not live on in the reader
        assert old.name in reader._open
        pool = SlotPool(max_slots=2)
        new = pool.begin(8192)
        pool.commit(new, 2)
        with reader.lease(new.name, 2):
            pass
        assert list(reader._open) == [new.name]
    finally:
        reader.close()
        pool.close()


def test_a_reader_never_sees_a_half_written_or_replaced_version() -> None:
    pool = SlotPool(max_slots=2)
    reader = Reader()
    try:
        a = pool.begin(8)
        pool.commit(a, 1)
        b = pool.begin(8)
        pool.commit(b, 2)
        again = pool.begin(8)  # rewriting a for version 3: readers of version 1 are refused
        assert again is a
        with pytest.raises(Superseded), reader.lease(a.name, 1):
            pass
        pool.commit(again, 3)
        with pytest.raises(Superseded), reader.lease(a.name, 1):  # now holds version 3
            pass
        with reader.lease(a.name, 3):
            pass
    finally:
        reader.close()
        pool.close()
    with pytest.raises(Superseded), Reader().lease(a.name, 3):  # gone
        pass


def test_open_refuses_names_that_are_not_segments() -> None:
    with pytest.raises(segments.ProtocolError):
        Segment.open("../etc/passwd")


_CHILD = textwrap.dedent(
    """
    import sys, time
    from rayless.transport import shm
    from rayless.transport.segments import SlotPool, Reader
    shm.SHM_DIR = sys.argv[1]  # a directory of the test's own: the host's sweepers never see it
    pool = SlotPool()
    seg = pool.begin(16)
    pool.commit(seg, 1)
    print(seg.name, flush=True)
    time.sleep(60)
    """
)


def _child(where: Path) -> subprocess.Popen[str]:
    argv = [sys.executable, "-c", _CHILD, str(where)]
    return subprocess.Popen(argv, stdout=subprocess.PIPE, text=True)


def test_segments_of_a_process_killed_with_sigkill_are_reaped(tmp_path: Path) -> None:
    child = _child(tmp_path)
    try:
        assert child.stdout is not None
        name = child.stdout.readline().strip()
        path = tmp_path / name
        assert path.exists()
        assert segments.reap(child.pid, str(tmp_path)) == []  # alive: left alone
        os.kill(child.pid, signal.SIGKILL)
        child.wait(10)
        assert segments.reap(child.pid, str(tmp_path)) == [name]
        assert not path.exists()
    finally:
        child.kill()
        child.wait(10)


def test_the_node_agents_sweep_removes_them_too(tmp_path: Path) -> None:
    # the agent runs transport.shm.cleanup_stale periodically: it knows these segments by name
    child = _child(tmp_path)
    try:
        assert child.stdout is not None
        name = child.stdout.readline().strip()
        os.kill(child.pid, signal.SIGKILL)
        child.wait(10)
        assert name in shm.cleanup_stale(directory=str(tmp_path))
        assert not (tmp_path / name).exists()
    finally:
        child.kill()
        child.wait(10)


_LEASER = textwrap.dedent(
    """
    import sys, time
    from rayless.transport.segments import Reader
    reader = Reader()
    with reader.lease(sys.argv[1], 1):
        print("leased", flush=True)
        time.sleep(60)
    """
)


def test_a_reader_killed_while_holding_a_lease_blocks_no_writer() -> None:
    pool = SlotPool(max_slots=2)
    try:
        a = pool.begin(8)
        pool.commit(a, 1)
        b = pool.begin(8)
        pool.commit(b, 2)
        child = subprocess.Popen(
            [sys.executable, "-c", _LEASER, a.name], stdout=subprocess.PIPE, text=True
        )
        assert child.stdout is not None
        assert child.stdout.readline().strip() == "leased"
        assert not a.lock(True, False)  # the reader holds it
        os.kill(child.pid, signal.SIGKILL)
        child.wait(10)
        seg = pool.begin(8)  # the kernel dropped the dead reader's lease
        assert seg is a
        pool.commit(seg, 3)
    finally:
        pool.close()
