"""A process that talks to more than a thousand peers over ZeroMQ (a driver calling over a
thousand actors, a Ray-style task fan-out): ZeroMQ's default context allows 1,023 sockets and
a shell's soft descriptor limit is often 1,024 (``transport.zmq_context`` raises both)."""

from __future__ import annotations

import resource
import subprocess
import sys
import textwrap

import pytest

pytestmark = pytest.mark.integration

_SCRIPT = textwrap.dedent(
    """
    import asyncio, os
    os.environ["RAYLESS_UNIX"] = "0"  # ZeroMQ, as to actors on other hosts
    from rayless.transport.client import Client
    from rayless.transport.protocol import new_token
    from rayless.transport.server import Server

    N = 1100

    async def main():
        token = new_token()
        async with Server(token=token, handler=lambda r: r.body) as srv:
            clients = [Client(srv.address, token=token) for _ in range(N)]
            try:
                for i, c in enumerate(clients):
                    await c.connect()
                    assert await c.request(i) == i
            finally:
                for c in clients:
                    await c.aclose()
        print("ok", N, flush=True)

    asyncio.run(main())
    """
)


def _low_fd_limit() -> None:
    hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    resource.setrlimit(resource.RLIMIT_NOFILE, (1024, hard))


def test_more_than_a_thousand_zeromq_peers_from_one_process_under_a_1024_fd_limit() -> None:
    hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    if hard != resource.RLIM_INFINITY and hard < 8192:
        pytest.skip(f"the hard descriptor limit ({hard}) leaves no room for 1,100 peers")
    out = subprocess.run(
        [sys.executable, "-c", _SCRIPT],
        preexec_fn=_low_fd_limit,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 0 and "ok 1100" in out.stdout, out.stderr[-2000:]
