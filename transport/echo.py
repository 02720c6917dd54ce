"""An echo server in its own process: for diagnostics, the transport demo, benchmarks and tests.

Run ``python -m rayless.transport.echo ADDRESS [--torch]`` with the token in ``RAYLESS_TOKEN``
(never on the command line); ``--torch`` imports torch and tensordict before it serves, so the
first tensor request does not wait for them (benchmarks; the codec imports them on demand).
It prints its bound address as the first line of stdout, then echoes every request until
SIGTERM/SIGINT or a ``"__stop__"`` request. A ``("sum", tensor)`` request returns the sum
(so large tensors need not travel back), ``"__stats__"`` returns the server's counters.
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
from typing import Any

from rayless.transport import loop
from rayless.transport.server import Request, Server


def _handle(stop: asyncio.Event, server: list[Server]) -> Any:
    def handler(req: Request) -> Any:
        body = req.body
        if isinstance(body, str):
            if body == "__stop__":
                stop.set()
                return "stopping"
            if body == "__stats__":
                return dict(server[0].stats)
        if isinstance(body, tuple) and len(body) == 2 and body[0] == "nbytes":
            return int(body[1].nbytes) if hasattr(body[1], "nbytes") else len(body[1])
        return body

    return handler


async def serve(address: str, token: str, *, preload_torch: bool = False) -> None:
    """Serve echo requests on ``address`` until a signal or a ``"__stop__"`` request;
    ``preload_torch``: import torch and tensordict first (no first-request import stall)."""
    if preload_torch:
        try:
            import tensordict  # noqa: F401
            import torch  # noqa: F401
        except ImportError:
            pass
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    holder: list[Server] = []
    async with Server(address, token=token, handler=_handle(stop, holder), name="echo") as srv:
        holder.append(srv)
        print(srv.address, flush=True)
        await stop.wait()


def spawn(
    address: str, token: str, *, timeout: float = 30.0, torch: bool = False
) -> tuple[subprocess.Popen[str], str]:
    """Start an echo server process (``torch``: with torch imported before it serves); return
    it and its bound address.

    Raises:
        RuntimeError: the process exited or printed nothing within ``timeout`` seconds.
    """
    env = {**os.environ, "RAYLESS_TOKEN": token}
    proc = subprocess.Popen(
        [sys.executable, "-m", "rayless.transport.echo", address, *(["--torch"] if torch else [])],
        stdout=subprocess.PIPE,
        env=env,
        text=True,
    )
    import selectors

    sel = selectors.DefaultSelector()
    assert proc.stdout is not None  # internal invariant: stdout=PIPE
    sel.register(proc.stdout, selectors.EVENT_READ)
    if not sel.select(timeout):
        proc.kill()
        proc.wait()
        raise RuntimeError(f"echo server did not start within {timeout}s")
    line = proc.stdout.readline().strip()
    if not line:
        proc.wait()
        raise RuntimeError(f"echo server exited with {proc.returncode}")
    return proc, line


def main() -> None:
    """Entry point of ``python -m rayless.transport.echo ADDRESS [--torch]``."""
    token = os.environ.get("RAYLESS_TOKEN", "")
    args = sys.argv[1:]
    preload = "--torch" in args
    args = [a for a in args if a != "--torch"]
    if len(args) != 1 or not token:
        sys.exit(
            "usage: RAYLESS_TOKEN=... python -m rayless.transport.echo tcp://127.0.0.1:0 [--torch]"
        )
    loop.run(serve(args[0], token, preload_torch=preload))


if __name__ == "__main__":
    main()
