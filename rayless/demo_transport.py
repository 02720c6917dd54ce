"""``rayless demo-transport``: an echo server process and a client exchanging requests/tensors.

Shows the transport working end to end on this machine: a fresh token, the HMAC handshake,
small request rate and tensor throughput to another process.
"""

from __future__ import annotations

import argparse
import asyncio
import time

from rayless.transport import echo
from rayless.transport.client import Client
from rayless.transport.protocol import new_token


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Arguments of ``rayless demo-transport``."""
    parser.add_argument("--size-mib", type=int, default=64, help="tensor size")
    parser.add_argument("--requests", type=int, default=2000, help="small requests to time")


async def _demo(size_mib: int, requests: int) -> None:
    import torch

    token = new_token()
    proc, address = echo.spawn("tcp://127.0.0.1:0", token, torch=True)
    try:
        async with Client(address, token=token, name="demo") as client:
            print(f"connected to an echo server (pid {proc.pid}) at {address}, authenticated")
            t = time.perf_counter()
            for i in range(requests):
                await client.request(i)
            rate = requests / (time.perf_counter() - t)
            print(f"{requests} request/reply round trips: {rate:,.0f}/s")
            t = time.perf_counter()
            await asyncio.gather(*[client.submit(i) for i in range(requests * 5)])
            rate = requests * 5 / (time.perf_counter() - t)
            print(f"{requests * 5} pipelined requests: {rate:,.0f}/s")
            tensor = torch.randn(size_mib * 2**20 // 4)
            await client.request(("nbytes", tensor[:1024]))  # the server imports torch lazily
            t = time.perf_counter()
            nbytes = await client.request(("nbytes", tensor))
            dt = time.perf_counter() - t
            print(f"{nbytes / 2**20:.0f} MiB tensor to the server: {nbytes / dt / 1e6:,.0f} MB/s")
    finally:
        proc.terminate()
        proc.wait()


def run(args: argparse.Namespace) -> int:
    """Entry point of ``rayless demo-transport``."""
    asyncio.run(_demo(args.size_mib, args.requests))
    return 0
