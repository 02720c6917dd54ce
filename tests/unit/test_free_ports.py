"""``actors.control.free_ports``: a group's MASTER_PORT comes from below the ephemeral range,
is free on every address, and is not handed out twice in a row."""

from __future__ import annotations

import random
import socket
from pathlib import Path

from rayless.actors.control.free_ports import PortPicker, ephemeral_range


def test_ports_come_from_below_the_ephemeral_range_free_and_not_repeated() -> None:
    """bind(0) drew MASTER_PORT from the ephemeral range, where every outgoing connection
    and bind(0) on the host draws too: beside another test suite, one took it first and
    rank 0's init_process_group failed with EADDRINUSE."""
    picker = PortPicker(ephemeral=(32768, 60999), rng=random.Random(7))
    ports = [picker.pick() for _ in range(50)]
    assert all(10000 <= p < 32768 for p in ports)
    assert len(set(ports)) == len(ports)  # none handed out twice
    for port in ports[:5]:  # each free to listen on every address
        with socket.socket() as sock:
            sock.bind(("0.0.0.0", port))


def test_a_port_bound_by_another_process_is_skipped() -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))  # bound on one address only
        port = taken.getsockname()[1]
        picker = PortPicker(ephemeral=(port + 1, 60999), rng=random.Random(1))
        picker._rng.randint = lambda a, b: port  # type: ignore[method-assign]
        got = picker.pick()  # every draw is the taken port: the kernel's bind(0) instead
    assert got != port


def test_without_room_below_the_range_the_kernel_picks() -> None:
    picker = PortPicker(ephemeral=(10010, 60999))
    assert picker.pick() >= 1024


def test_the_kernels_range_is_read(tmp_path: Path) -> None:
    path = tmp_path / "range"
    path.write_text("32768\t60999\n")
    assert ephemeral_range(str(path)) == (32768, 60999)
    path.write_text("junk")
    assert ephemeral_range(str(path)) is None
    assert ephemeral_range(str(tmp_path / "missing")) is None
