"""The physical anchor of a pipelined call on this machine: a raw asyncio UNIX-socket echo.

A server process (``python scripts/bench_raw_echo.py --serve PATH``) and a client coroutine
(:func:`raw_depth`) that speak length-prefixed pickled frames over one UNIX socket, with
``asyncio.Protocol`` on both sides and nothing else: no authentication, no session, no flow
control, no futures per request. The client sends the same message a call to a ``def ping()``
sends (a tuple naming the method and its arguments, with a request id), the server decodes it
and answers a pickled ``(id, 0)`` — what any RPC over asyncio must do at the least. Each frame is
written as it is submitted (one ``transport.write`` per request); the server answers every
frame of one read with one write.

``scripts/bench_actors.py --depths`` measures it beside our calls and Ray's, in the same run.
"""

from __future__ import annotations

import asyncio
import os
import pickle
import struct
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager

_HEADER = struct.Struct("<I")


class _Frames:
    """Splits a byte stream into length-prefixed frames."""

    def __init__(self) -> None:
        self.buf = bytearray()

    def feed(self, data: bytes) -> list[bytes]:
        buf = self.buf
        buf += data
        out: list[bytes] = []
        pos, size = 0, len(buf)
        while size - pos >= 4:
            (n,) = _HEADER.unpack_from(buf, pos)
            if size - pos - 4 < n:
                break
            out.append(bytes(buf[pos + 4 : pos + 4 + n]))
            pos += 4 + n
        del buf[:pos]
        return out


class _EchoServer(asyncio.Protocol):
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.WriteTransport)
        self.transport = transport
        self.frames = _Frames()

    def data_received(self, data: bytes) -> None:
        replies = []
        for frame in self.frames.feed(data):
            request_id = pickle.loads(frame)[0]
            body = pickle.dumps((request_id, 0), protocol=5)
            replies.append(_HEADER.pack(len(body)) + body)
        if replies:
            self.transport.write(b"".join(replies))


def serve(path: str) -> None:
    """Echo on the UNIX socket ``path`` until killed; prints ``ready`` once listening."""

    async def main() -> None:
        loop = asyncio.get_running_loop()
        server = await loop.create_unix_server(_EchoServer, path)
        print("ready", flush=True)
        async with server:
            await server.serve_forever()

    asyncio.run(main())


class _EchoClient(asyncio.Protocol):
    def __init__(self) -> None:
        self.frames = _Frames()
        self.expected = 0
        self.received = 0
        self.done: asyncio.Future[None] | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.WriteTransport)
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        for frame in self.frames.feed(data):
            pickle.loads(frame)
            self.received += 1
        if self.received >= self.expected and self.done is not None and not self.done.done():
            self.done.set_result(None)


@contextmanager
def echo_server() -> Iterator[str]:
    """A raw echo server process for the duration; yields its socket path."""
    tmp = tempfile.mkdtemp(prefix="rayless-raw-echo-")
    path = os.path.join(tmp, "s")
    proc = subprocess.Popen(
        [sys.executable, os.path.abspath(__file__), "--serve", path],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
        yield path
    finally:
        proc.kill()
        proc.wait()
        for name in os.listdir(tmp):
            os.unlink(os.path.join(tmp, name))
        os.rmdir(tmp)


async def raw_depth(path: str, depth: int, total: int) -> dict[str, float]:
    """``depth`` requests sent at once, then all replies awaited, repeated until ``total``:
    messages/s and this process's CPU µs per message."""
    loop = asyncio.get_running_loop()
    transport, client = await loop.create_unix_connection(_EchoClient, path)
    try:

        async def burst(first: int) -> None:
            client.expected += depth
            client.done = loop.create_future()
            for k in range(first, first + depth):
                body = pickle.dumps((k, "c", "ping", (), {}), protocol=5)
                transport.write(_HEADER.pack(len(body)) + body)
            await client.done

        await burst(0)  # warm
        cpu0, start, done = time.process_time(), time.perf_counter(), 0
        while done < total:
            await burst(done)
            done += depth
        elapsed = time.perf_counter() - start
        return {"rate": done / elapsed, "driver_us": (time.process_time() - cpu0) / done * 1e6}
    finally:
        transport.close()


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "--serve":
        serve(sys.argv[2])
    else:
        with echo_server() as sock:
            for d in (200, 3000, 10000):
                print(d, asyncio.run(raw_depth(sock, d, 30_000)))
