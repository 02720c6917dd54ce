"""Hostile input: random and mutated messages must not stop a server or grow its memory."""

from __future__ import annotations

import asyncio
import random
import struct
import time
from typing import Any

import msgpack
import psutil
import pytest
import zmq

from rayless.transport import echo
from rayless.transport.client import Client
from rayless.transport.protocol import (
    PROTOCOL,
    Kind,
    client_proof,
    new_nonce,
    new_token,
    open_envelope,
    pack_control,
)

pytestmark = pytest.mark.integration
TOKEN = new_token()


def _garbage(rng: random.Random) -> list[bytes]:
    """One random or mutated multipart message."""
    choice = rng.randrange(8)
    nframes = rng.randrange(0, 6)
    frames = [rng.randbytes(rng.choice([0, 1, 11, 12, 13, 64, 2048])) for _ in range(nframes)]
    if choice == 0 or not frames:
        return frames or [b""]
    kind = rng.choice([*list(Kind), 0, 99, 255])
    if choice == 1:  # a well-formed control frame of a random kind, random payload
        frames[0] = struct.pack("<BBHQ", 1, int(kind), 0, rng.getrandbits(64))
    elif choice == 2:  # a wrong protocol version
        frames[0] = struct.pack("<BBHQ", rng.randrange(256), int(kind), 0, 1)
    elif choice == 3:  # a request whose header lies about its buffers
        header = msgpack.packb(
            {"t": "tensor", "dtype": "float32", "shape": [2**31, 2**31], "buf": rng.randrange(9)}
        )
        frames = [pack_control(Kind.REQUEST, 1), header, rng.randbytes(16)]
    elif choice == 4:  # valid msgpack of the wrong shape in a handshake
        frames = [
            pack_control(rng.choice([Kind.HELLO, Kind.AUTH])),
            msgpack.packb(rng.choice([[1, 2], {"nonce": b"short"}, {"proof": 5}, "x" * 100, {}])),
        ]
    elif choice == 5:  # truncated msgpack
        frames = [pack_control(Kind.REQUEST, 2), msgpack.packb({"k": "v" * 50})[:-7]]
    elif choice == 6:  # deep nesting
        frames = [pack_control(Kind.REQUEST, 3), b"\x91" * 5000 + b"\xc0"]
    return frames


def _authenticated_raw(address: str) -> zmq.Socket[Any]:
    """A raw DEALER that completed a real handshake, to send garbage after it."""
    sock = zmq.Context.instance().socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    sock.setsockopt(zmq.RCVTIMEO, 5000)
    sock.connect(address)
    nonce_c = new_nonce()
    sock.send_multipart(
        [pack_control(Kind.HELLO), msgpack.packb({"v": PROTOCOL, "nonce": nonce_c})]
    )
    challenge = msgpack.unpackb(open_envelope(sock.recv_multipart(), 0)[2][0])
    proof = client_proof(TOKEN.encode(), challenge["nonce"], nonce_c)
    sock.send_multipart([pack_control(Kind.AUTH), msgpack.packb({"proof": proof})])
    sock.recv_multipart()
    return sock


def _drain(sock: zmq.Socket[Any]) -> None:
    while True:
        try:
            sock.recv_multipart(zmq.NOBLOCK)
        except zmq.Again:
            return


async def test_fuzz_keeps_the_server_serving_with_bounded_memory() -> None:
    proc, address = echo.spawn("tcp://127.0.0.1:0", TOKEN)
    ctx = zmq.Context.instance()
    rng = random.Random(1234)
    sockets: list[zmq.Socket[Any]] = []
    try:
        server = psutil.Process(proc.pid)
        async with Client(address, token=TOKEN) as client:
            assert await client.request("warm-up") == "warm-up"
        rss_before = server.memory_info().rss
        strangers = []
        for _ in range(8):
            s = ctx.socket(zmq.DEALER)
            s.setsockopt(zmq.LINGER, 0)
            s.connect(address)
            strangers.append(s)
        sockets.extend(strangers)
        insiders = [_authenticated_raw(address) for _ in range(4)]
        sockets.extend(insiders)
        sent = 0
        for round_ in range(6):
            for i in range(2000):
                sock = insiders[i % 4] if i % 2 else strangers[i % 8]
                sock.send_multipart(_garbage(rng), copy=True)
                sent += 1
            for s in sockets:
                _drain(s)
            await asyncio.sleep(0.05)
            assert proc.poll() is None, f"server died in round {round_}"
        assert sent >= 10_000
        async with Client(address, token=TOKEN) as client:
            assert await client.request(("still", "alive"), timeout=10) == ("still", "alive")
            stats = await client.request("__stats__", timeout=10)
        assert stats["dropped"] + stats["unauthenticated"] + stats["requests"] > 1000, stats
        growth = server.memory_info().rss - rss_before
        assert growth < 64 * 2**20, f"server RSS grew by {growth / 2**20:.1f} MiB"
    finally:
        for s in sockets:
            s.close(linger=0)
        proc.terminate()
        try:
            proc.wait(10)
        except Exception:
            proc.kill()
            proc.wait()


async def test_echo_server_exits_on_sigterm() -> None:
    proc, _address = echo.spawn("tcp://127.0.0.1:0", TOKEN)
    start = time.monotonic()
    proc.terminate()
    assert proc.wait(10) == 0
    assert time.monotonic() - start < 10
