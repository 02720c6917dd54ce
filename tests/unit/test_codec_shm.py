"""Same-host shared memory for large CPU buffers: round trips, cleanup, hostile input, fallback."""

from __future__ import annotations

import errno
import glob
import os
import subprocess
import sys
import textwrap
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import msgpack
import numpy as np
import pytest
import torch

from rayless.transport import owners, shm
from rayless.transport._decoder import TENSOR
from rayless.transport.client import Client
from rayless.transport.codec import _MARK, decode, encode, sweep_shm
from rayless.transport.errors import ProtocolError
from rayless.transport.protocol import new_token
from rayless.transport.server import Request, Server
from tests.unit.test_codec_helpers import assert_same

BIG = 2 << 20  # bytes: over the SHM_MIN_BYTES these tests use (1 MiB)
DTYPES = [torch.float32, torch.bfloat16, torch.int64, torch.uint8, torch.bool, torch.complex64]


def ours() -> list[str]:
    """This process's segments in /dev/shm."""
    return glob.glob(f"{shm.SHM_DIR}/rayless-{os.getpid()}-*")


@pytest.fixture(autouse=True)
def clean(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Each test starts and ends with no segment of ours around; 1 MiB threshold (small data)."""
    monkeypatch.setattr(shm, "SHM_MIN_BYTES", 1 << 20)
    sweep_shm(0.0)
    yield
    sweep_shm(0.0)
    assert not ours()


def big_tensor(dtype: torch.dtype, nbytes: int = BIG) -> torch.Tensor:
    n = nbytes // dtype.itemsize + 3
    gen = torch.Generator().manual_seed(n)
    if dtype == torch.bool:
        return torch.rand(n, generator=gen) > 0.5
    if dtype.is_floating_point or dtype.is_complex:
        return torch.randn(n, generator=gen, dtype=dtype)
    return torch.randint(0, 100, (n,), generator=gen, dtype=dtype)


def mapped_file(address: int) -> str | None:
    """The file whose mapping in this process holds ``address`` (None: anonymous or none)."""
    with open("/proc/self/maps") as maps:
        for line in maps:
            fields = line.split(maxsplit=5)
            start, end = (int(x, 16) for x in fields[0].split("-"))
            if start <= address < end:
                return fields[5].strip() if len(fields) == 6 else None
    return None


def test_round_trip_in_process_is_zero_copy_on_the_segment() -> None:
    value: dict[str, Any] = {f"t{i}": big_tensor(d).reshape(-1, 1) for i, d in enumerate(DTYPES)}
    value["strided"] = torch.randn(BIG // 2).reshape(-1, 4)[:, ::2]
    value["array"] = np.arange(BIG // 8, dtype=np.float64).reshape(2, -1)
    frames = encode(value, shm=True)
    assert len(frames) == 1  # no buffer frame: everything went through shared memory
    assert len(ours()) == len(value)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no non-writable-buffer warning
        out = decode([bytes(frames[0])])
    assert not ours()  # the receiver unlinked every segment
    assert_same(out, value)
    t = out["t0"]
    place = mapped_file(t.data_ptr())
    assert place is not None and "/dev/shm/rayless-" in place and "(deleted)" in place, place
    t.add_(1)  # writable, in place
    assert torch.equal(t, value["t0"] + 1)
    out["array"][0, 0] = -1.0
    assert "/dev/shm/rayless-" in str(mapped_file(out["array"].ctypes.data))


def test_round_trip_to_another_process(tmp_path: Path) -> None:
    x, a = big_tensor(torch.float32), np.full(BIG // 4, 7, dtype=np.int32)
    frames = encode({"x": x, "a": a}, shm=True)
    path = tmp_path / "frames.msgpack"
    path.write_bytes(msgpack.packb([bytes(f) for f in frames]))
    proc = subprocess.run(
        [
            sys.executable,
            "-c",
            textwrap.dedent(
                f"""
                import msgpack
                from rayless.transport.codec import decode
                out = decode(msgpack.unpackb(open({str(path)!r}, "rb").read()))
                out["x"].mul_(2)
                print(float(out["x"].double().sum()), int(out["a"].sum()))
                """
            ),
        ],
        capture_output=True,
        text=True,
        # a hang guard: a fresh interpreter that imports torch beside a full suite and CPU
        # burners took more than 60 s
        timeout=240,
    )
    assert proc.returncode == 0, proc.stderr
    total, asum = proc.stdout.split()
    assert float(total) == pytest.approx(2 * float(x.double().sum()), rel=1e-9)
    assert int(asum) == int(a.sum())
    assert not ours()


def test_shm_off_and_small_buffers_use_frames() -> None:
    value = {"t": big_tensor(torch.float32), "small": torch.ones(16), "s": np.ones(3)}
    frames = encode(value, shm=False)
    assert len(frames) == 4 and not ours()
    assert_same(decode(frames), value)
    small = {"t": torch.ones(1000), "a": np.ones(1000)}
    frames = encode(small, shm=True)
    assert len(frames) == 3 and not ours()
    assert_same(decode(frames), small)


def test_threshold_is_adjustable_and_zero_disables(monkeypatch: pytest.MonkeyPatch) -> None:
    t = torch.ones(1000)
    monkeypatch.setattr(shm, "SHM_MIN_BYTES", 1024)
    frames = encode(t, shm=True)
    assert len(frames) == 1 and len(ours()) == 1
    assert torch.equal(decode(frames), t)
    monkeypatch.setattr(shm, "SHM_MIN_BYTES", 0)
    assert len(encode(big_tensor(torch.uint8), shm=True)) == 2 and not ours()


def header(ref: Any, n: int = 1024) -> bytes:
    """A hand-made header: one uint8 tensor of ``n`` elements whose buffer is ``ref``."""
    return msgpack.packb([_MARK[TENSOR], "uint8", [n], ref, None, False])


@pytest.mark.parametrize(
    "ref",
    [
        ["../etc/passwd", 1024],
        ["rayless-1-1-1-../../etc/passwd", 1024],
        ["rayless-1-1-1-ABC", 1024],
        ["rayless-1-1-1-abc/x", 1024],
        ["rayless-1-1-ab", 1024],  # no start time
        [f"rayless-{os.getpid()}-1-999999999-abcdef", 1024],  # no such segment
        ["rayless-1-1-1-ab", -1],
        ["rayless-1-1-1-ab", "1024"],
        ["rayless-1-1-1-ab"],
        [b"rayless-1-1-1-ab", 1024],
    ],
)
def test_hostile_references_are_protocol_errors(ref: Any) -> None:
    with pytest.raises(ProtocolError):
        decode([header(ref)])


def test_size_mismatch_is_a_protocol_error_and_leaves_the_segment() -> None:
    name = shm.write(memoryview(bytes(2048)))
    assert name is not None
    with pytest.raises(ProtocolError, match="2048 bytes"):
        decode([header([name, 1024])])
    assert len(ours()) == 1  # not ours to consume: the sender's sweep removes it
    with pytest.raises(ProtocolError, match="needs 1024"):  # segment fine, record wrong
        decode([header([name, 2048])])
    assert not ours()


def test_sweep_removes_unconsumed_segments_after_max_age() -> None:
    encode({"t": big_tensor(torch.float32)}, shm=True)
    assert len(ours()) == 1
    assert sweep_shm() == 0 and len(ours()) == 1  # younger than SHM_MAX_AGE
    assert sweep_shm(0.0) == 1 and not ours()
    frames = encode(big_tensor(torch.float32), shm=True)
    decode(frames)
    assert sweep_shm(0.0) == 0  # already consumed: nothing left to remove
    assert not shm.LIVE


def test_failed_encode_discards_its_segments() -> None:
    with pytest.raises(TypeError, match="cannot encode range"):
        encode({"t": big_tensor(torch.float32), "z": range(1)}, shm=True)
    assert not ours() and not shm.LIVE


def test_cleanup_stale_removes_dead_owners_only(tmp_path: Path) -> None:
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    live = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        started = owners.start_time(live.pid)
        assert started
        names = [
            f"rayless-{dead.pid}-1-1-ab",  # its owner is gone
            f"rayless-{live.pid}-{started + 1}-1-ab",  # the pid was reused: its owner is gone
            f"rayless-{live.pid}-{started}-1-ab",
            f"rayless-{owners.tag()}-1-ab",
            "other-file",
        ]
        for name in names:
            (tmp_path / name).write_bytes(b"x")
        assert shm.cleanup_stale(60.0, str(tmp_path)) == []  # too young
        assert sorted(shm.cleanup_stale(0.0, str(tmp_path))) == sorted(names[:2])
        assert sorted(p.name for p in tmp_path.iterdir()) == sorted(names[2:])
        assert shm.reap(live.pid, str(tmp_path)) == []  # alive
    finally:
        live.kill()
        live.wait()
    assert shm.reap(live.pid, str(tmp_path)) == [names[2]]


def test_missing_directory_falls_back_to_frames(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setattr(shm, "SHM_DIR", str(tmp_path / "missing"))
    t = big_tensor(torch.float32)
    frames = encode(t, shm=True)
    assert len(frames) == 2
    assert torch.equal(decode(frames), t)


def test_full_directory_falls_back_and_leaves_nothing(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setattr(shm, "SHM_DIR", str(tmp_path))

    def full(fd: int, data: Any, offset: int) -> int:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(shm.os, "pwrite", full)
    t = big_tensor(torch.int64)
    frames = encode(t, shm=True)
    assert len(frames) == 2 and not list(tmp_path.iterdir()) and not shm.LIVE
    assert torch.equal(decode(frames), t)


async def test_endpoints_on_one_host_send_large_tensors_through_shm() -> None:
    def handler(req: Request) -> Any:
        assert not ours()  # the request's segment is already consumed
        return req.body

    token = new_token()
    t = big_tensor(torch.float32)
    async with (
        Server(token=token, handler=handler) as srv,
        Client(srv.address, token=token) as client,
    ):
        assert client.same_host
        out = await client.request({"t": t})
        assert torch.equal(out["t"], t)
        assert mapped_file(out["t"].data_ptr()) is not None
    assert not ours()


def test_default_threshold_keeps_mid_sized_buffers_on_the_socket() -> None:
    assert shm._DEFAULT_MIN == 8 << 20  # below it the socket copy is as fast (measured)
