"""Benchmark rayless's transport against raw pyzmq, side by side in one run.

Rows: small request/response rate with one request in flight (sync) and with a window of
requests in flight (pipelined); bulk tensor throughput of 1, 64 and 256 MiB (one direction,
a small ack back) — over tcp loopback and ipc. Both sides talk to a server in another
process. The raw pyzmq side uses blocking DEALER/ROUTER sockets and no encoding at all (the
fastest Python can drive ZeroMQ); ours goes through the codec, the handshake-authenticated
session and the asyncio loop. Goal: every ratio ≥ 0.8. A client of a ``tcp://`` server on
its own host talks over the same-host UNIX path (``transport.stream``); ``ipc://`` rows stay on
ZeroMQ (with coalesced batches).

    python scripts/bench_transport.py [--quick] [--repeats 3]
    python scripts/bench_transport.py --cpu   # CPU µs per request, client+server in one process
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from typing import Any

import torch
import zmq

from rayless.transport import echo
from rayless.transport.client import Client
from rayless.transport.protocol import new_token

SMALL = b"x" * 16


def raw_server(address: str) -> None:
    """A blocking ROUTER that echoes small messages and acks big ones."""
    ctx = zmq.Context.instance()
    sock = ctx.socket(zmq.ROUTER)
    sock.setsockopt(zmq.LINGER, 0)
    if address.endswith(":0"):
        address = address[:-2] + ":*"
    sock.bind(address)
    print(sock.getsockopt_string(zmq.LAST_ENDPOINT), flush=True)
    while True:
        msg = sock.recv_multipart(copy=False)
        if len(msg[1]) > 1024:
            sock.send_multipart([msg[0].bytes, b"ack"])
        elif msg[1].bytes == b"stop":
            sock.send_multipart([msg[0].bytes, b"bye"])
            return
        else:
            sock.send_multipart([msg[0].bytes, msg[1].bytes])


def spawn_raw(address: str) -> tuple[subprocess.Popen[str], str]:
    proc = subprocess.Popen(
        [sys.executable, __file__, "--raw-server", address], stdout=subprocess.PIPE, text=True
    )
    assert proc.stdout is not None
    return proc, proc.stdout.readline().strip()


def raw_client(address: str) -> zmq.Socket[Any]:
    sock = zmq.Context.instance().socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    sock.connect(address)
    sock.send(SMALL)
    sock.recv()
    return sock


def raw_sync(sock: zmq.Socket[Any], n: int) -> float:
    t = time.perf_counter()
    for _ in range(n):
        sock.send(SMALL)
        sock.recv()
    return n / (time.perf_counter() - t)


def raw_pipelined(sock: zmq.Socket[Any], n: int, window: int) -> float:
    t = time.perf_counter()
    for _ in range(n // window):
        for _ in range(window):
            sock.send(SMALL)
        for _ in range(window):
            sock.recv()
    return (n // window * window) / (time.perf_counter() - t)


def raw_bulk(sock: zmq.Socket[Any], tensor: torch.Tensor, n: int) -> float:
    view = memoryview(tensor.numpy()).cast("B")
    t = time.perf_counter()
    for _ in range(n):
        sock.send(view, copy=False)
        sock.recv()
    return n * tensor.nbytes / (time.perf_counter() - t) / 1e6


async def ours_sync(client: Client, n: int) -> float:
    t = time.perf_counter()
    for _ in range(n):
        await client.request(SMALL)
    return n / (time.perf_counter() - t)


async def ours_pipelined(client: Client, n: int, window: int) -> float:
    t = time.perf_counter()
    for _ in range(n // window):
        await asyncio.gather(*[client.submit(SMALL) for _ in range(window)])
    return (n // window * window) / (time.perf_counter() - t)


async def ours_bulk(client: Client, tensor: torch.Tensor, n: int) -> float:
    t = time.perf_counter()
    for _ in range(n):
        await client.request(("nbytes", tensor))
    return n * tensor.nbytes / (time.perf_counter() - t) / 1e6


def best(samples: list[float]) -> float:
    return statistics.median(samples)


async def run_transport(kind: str, args: argparse.Namespace) -> list[tuple[str, float, float]]:
    tmp = tempfile.mkdtemp(prefix="rayless-bench-")
    address = "tcp://127.0.0.1:0" if kind == "tcp" else f"ipc://{tmp}/s"
    raw_address = "tcp://127.0.0.1:0" if kind == "tcp" else f"ipc://{tmp}/r"
    token = new_token()
    proc, ours_addr = echo.spawn(address, token, torch=True)
    rproc, raw_addr = spawn_raw(raw_address)
    rows: list[tuple[str, float, float]] = []
    try:
        raw = raw_client(raw_addr)
        async with Client(ours_addr, token=token) as client:
            via = "the same-host UNIX path" if client.via_unix else "ZeroMQ"
            print(f"  ({kind}: rayless runs over {via}; RAYLESS_UNIX=0 forces ZeroMQ)")
            n_sync = 1000 if args.quick else 5000
            n_pipe = 10_000 if args.quick else 50_000
            rows.append(
                _row(
                    f"{kind} sync calls/s",
                    [raw_sync(raw, n_sync) for _ in range(args.repeats)],
                    [await ours_sync(client, n_sync) for _ in range(args.repeats)],
                )
            )
            rows.append(
                _row(
                    f"{kind} pipelined calls/s (window 256)",
                    [raw_pipelined(raw, n_pipe, 256) for _ in range(args.repeats)],
                    [await ours_pipelined(client, n_pipe, 256) for _ in range(args.repeats)],
                )
            )
            sizes = [1, 64] if args.quick else [1, 64, 256]
            for mib in sizes:
                tensor = torch.ones(mib * 2**20 // 4, dtype=torch.float32)
                n = max(2, 256 // mib) if not args.quick else max(2, 32 // mib)
                raw_bulk(raw, tensor, 1)
                await ours_bulk(client, tensor, 1)
                rows.append(
                    _row(
                        f"{kind} {mib} MiB tensor MB/s",
                        [raw_bulk(raw, tensor, n) for _ in range(args.repeats)],
                        [await ours_bulk(client, tensor, n) for _ in range(args.repeats)],
                    )
                )
            raw.send(b"stop")
            raw.recv()
            raw.close()
    finally:
        for p in (proc, rproc):
            p.terminate()
            try:
                p.wait(10)
            except subprocess.TimeoutExpired:
                p.kill()
    return rows


def _row(name: str, raw: list[float], ours: list[float]) -> tuple[str, float, float]:
    r, o = best(raw), best(ours)
    print(f"  {name:<38} raw {r:>10.0f}   rayless {o:>10.0f}   ratio {o / r:5.2f}", flush=True)
    return name, r, o


async def main(args: argparse.Namespace) -> int:
    torch.set_num_threads(1)
    print(f"bench_transport: median of {args.repeats} runs, {os.cpu_count()} CPUs")
    rows = []
    for kind in ("tcp", "ipc"):
        rows += await run_transport(kind, args)
    print()
    print("| row | raw pyzmq | rayless | ratio |")
    print("|---|---:|---:|---:|")
    for name, r, o in rows:
        print(f"| {name} | {r:,.0f} | {o:,.0f} | {o / r:.2f} |")
    below = [name for name, r, o in rows if o / r < 0.8]
    print(f"\ngoal >= 0.8x raw pyzmq: {'met' if not below else 'missed on ' + ', '.join(below)}")
    return 0


async def cpu_per_request() -> int:
    """CPU time per request with client and server in this process (insensitive to load)."""
    from rayless.transport.server import Server

    token = new_token()
    async with (
        Server(token=token, handler=lambda r: r.body) as srv,
        Client(srv.address, token=token) as c,
    ):
        await asyncio.gather(*[c.submit(SMALL) for _ in range(2000)])
        pipelined = sync = float("inf")
        for _ in range(5):
            t = time.process_time()
            for _ in range(10):
                await asyncio.gather(*[c.submit(SMALL) for _ in range(256)])
            pipelined = min(pipelined, (time.process_time() - t) / 2560 * 1e6)
            t = time.process_time()
            for _ in range(500):
                await c.request(SMALL)
            sync = min(sync, (time.process_time() - t) / 500 * 1e6)
    print(f"CPU per request (client + server): pipelined {pipelined:.1f} us, sync {sync:.1f} us")
    return 0


def _cli() -> None:
    if len(sys.argv) == 3 and sys.argv[1] == "--raw-server":
        raw_server(sys.argv[2])
        return
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="fewer iterations, no 256 MiB")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--cpu", action="store_true", help="only the CPU-per-request figure")
    args = parser.parse_args()
    sys.exit(asyncio.run(cpu_per_request() if args.cpu else main(args)))


Runner = Callable[[], Awaitable[float]]

if __name__ == "__main__":
    _cli()
