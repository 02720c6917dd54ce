"""The dashboard's HTTP server (aiohttp): the page, its JSON snapshot, ``/metrics``.

Every request must carry the key (``?key=`` or its cookie); anything else is answered 403
and its connection closed. The connections themselves are accepted by
``rayless.dashboard.gate``, which bounds what peers without the key can hold (a deadline for
their request head, caps per peer and in total, a back-off when the fds run out).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import hmac
import json
import secrets
import signal
import socket
import sys
import time
from importlib import resources
from typing import Any

from rayless.actors.api import status as cluster_status
from rayless.dashboard.gate import Gate
from rayless.transport.errors import RaylessError

__all__ = ["Dashboard", "add_arguments", "run"]

COOKIE = "rayless_dashboard_key"
TIMELINE_WINDOW_S = 60.0
MAX_SPANS_PER_PROCESS = 2000
CACHE_S = 0.5  # one snapshot serves every request within this
KEEPALIVE_S = 15.0  # an idle keep-alive connection of a key holder is closed after this


def _static(name: str) -> bytes:
    return (resources.files("rayless.dashboard") / "static" / name).read_bytes()


class Dashboard:
    """Serves one connected cluster's page; ``key`` guards every request."""

    def __init__(
        self, cluster: Any, key: str, *, stores: list[str] | None = None, timeout: float = 10.0
    ) -> None:
        self.cluster = cluster
        self.key = key
        self.stores = list(stores or [])
        self.timeout = timeout
        self._cached: tuple[float, dict[str, Any]] | None = None
        self._lock = asyncio.Lock()
        self.gate: Gate | None = None  # told of each connection that showed the key

    def app(self) -> Any:
        """The aiohttp application."""
        from aiohttp import web

        @web.middleware
        async def guard(request: Any, handler: Any) -> Any:
            return await self._guard(request, handler)

        app = web.Application(middlewares=[guard])
        app.router.add_get("/", self._page)
        app.router.add_get("/app.js", self._script)
        app.router.add_get("/api/snapshot", self._snapshot)
        app.router.add_get("/metrics", self._metrics)
        return app

    # -- requests ------------------------------------------------------------------------

    async def _guard(self, request: Any, handler: Any) -> Any:
        from aiohttp import web

        given = request.query.get("key") or request.cookies.get(COOKIE) or ""
        if not _same_key(given, self.key):
            refused = web.Response(status=403, text="rayless dashboard: wrong or missing key\n")
            refused.force_close()  # a stranger holds no connection past one answer
            return refused
        if self.gate is not None:
            self.gate.trusted(request.protocol)
        response = await handler(request)
        if request.query.get("key"):
            response.set_cookie(COOKIE, self.key, httponly=True, samesite="Strict")
        return response

    async def _page(self, request: Any) -> Any:
        from aiohttp import web

        return web.Response(body=_static("index.html"), content_type="text/html")

    async def _script(self, request: Any) -> Any:
        from aiohttp import web

        return web.Response(body=_static("app.js"), content_type="application/javascript")

    async def _snapshot(self, request: Any) -> Any:
        from aiohttp import web

        try:
            snap = await self.snapshot()
        except (RaylessError, asyncio.TimeoutError) as exc:
            return web.json_response({"error": f"{type(exc).__name__}: {exc}"}, status=503)
        return web.Response(text=json.dumps(snap, default=str), content_type="application/json")

    async def _metrics(self, request: Any) -> Any:
        from aiohttp import web

        from rayless.observe import exposition

        try:
            snap = await self.snapshot()
        except (RaylessError, asyncio.TimeoutError) as exc:
            return web.Response(status=503, text=f"# no snapshot: {type(exc).__name__}: {exc}\n")
        return web.Response(
            text=exposition(snap),
            content_type="text/plain",
            charset="utf-8",
            headers={"X-Content-Type-Options": "nosniff"},
        )

    # -- data ----------------------------------------------------------------------------

    async def snapshot(self) -> dict[str, Any]:
        """``rayless.observe.snapshot_of`` plus the last minute of the timeline, at most one
        gathered per ``CACHE_S``."""
        from rayless.observe import snapshot_of

        async with self._lock:
            now = time.monotonic()
            if self._cached is not None and now - self._cached[0] < CACHE_S:
                return self._cached[1]
            snap = await snapshot_of(self.cluster, stores=self.stores, timeout=self.timeout)
            snap["timeline"] = await self._timeline()
            self._cached = (time.monotonic(), snap)
            return snap

    async def _timeline(self) -> dict[str, Any]:
        from rayless.actors.api import trace

        now = time.time_ns()
        since = now - int(TIMELINE_WINDOW_S * 1e9)
        info = self.cluster.info
        try:
            got = await trace.gather(info.address, info.token, since_ns=since, timeout=self.timeout)
        except (RaylessError, OSError):
            return {"now_ns": now, "window_s": TIMELINE_WINDOW_S, "processes": []}
        processes = []
        for g in got:
            if g.errors or not g.spans:
                continue
            spans = [
                [
                    s[0],
                    s[1],
                    (s[2] - g.offset_ns - since) / 1e6,
                    (s[3] - s[2]) / 1e6,
                    bool((s[5] or {}).get("error")),
                ]
                for s in g.spans[-MAX_SPANS_PER_PROCESS:]
            ]
            processes.append(
                {"name": g.process.get("name"), "node": g.process.get("node"), "spans": spans}
            )
        return {"now_ns": now, "window_s": TIMELINE_WINDOW_S, "processes": processes}


def _same_key(given: str, key: str) -> bool:
    """Whether ``given`` (from a query or cookie: any text, undecodable bytes as surrogates)
    is ``key``, compared in constant time."""
    try:
        given_bytes = given.encode("ascii")  # the key is URL-safe ASCII: nothing else matches
    except UnicodeEncodeError:
        return False
    return hmac.compare_digest(given_bytes, key.encode("ascii"))


def _listen(host: str, port: int) -> socket.socket:
    """A listening TCP socket on ``host``:``port`` (the first address ``host`` resolves to).

    Raises:
        OSError: it cannot be resolved or bound.
    """
    family, kind, proto, _, address = socket.getaddrinfo(
        host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE
    )[0]
    sock = socket.socket(family, kind, proto)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(address)
        sock.listen(128)
    except BaseException:
        sock.close()
        raise
    return sock


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Add ``rayless dashboard``'s options to ``parser``."""
    cluster_status.add_cluster_arguments(parser)
    parser.add_argument("--port", type=int, default=8265, help="port to serve on (0: any free)")
    parser.add_argument(
        "--host", default="127.0.0.1", help="address to bind (default 127.0.0.1: this host only)"
    )
    parser.add_argument(
        "--store", action="append", metavar="NAME", help="only these stores (default: every one)"
    )


async def _serve(args: argparse.Namespace, address: str, token: str) -> int:
    from aiohttp import web

    from rayless.actors.api.cluster import connect
    from rayless.actors.api.runtime import close_runtimes

    timeout = float(args.timeout)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    cluster = await asyncio.wait_for(connect(address, token=token), timeout)
    runner = None
    gate = None
    try:
        key = secrets.token_urlsafe(18)
        dashboard = Dashboard(cluster, key, stores=args.store, timeout=timeout)
        runner = web.AppRunner(dashboard.app(), access_log=None, keepalive_timeout=KEEPALIVE_S)
        await runner.setup()
        server = runner.server
        assert server is not None  # set up
        gate = dashboard.gate = Gate(_listen(args.host, args.port), server)
        gate.start()
        port = gate.sock.getsockname()[1]
        host = args.host if ":" not in args.host else f"[{args.host}]"
        print(f"rayless dashboard: http://{host}:{port}/?key={key}", flush=True)
        await stop.wait()
        return 0
    finally:
        if gate is not None:
            await gate.close()
        if runner is not None:
            await runner.cleanup()
        with contextlib.suppress(RaylessError, asyncio.TimeoutError):
            await asyncio.wait_for(cluster.aclose(), timeout)
        await close_runtimes()


def run(args: argparse.Namespace) -> int:
    """Run ``rayless dashboard`` until Ctrl-C or SIGTERM; returns the exit code."""
    try:
        import aiohttp  # noqa: F401
    except ImportError:
        print("rayless dashboard: needs aiohttp: pip install 'rayless[dashboard]'", file=sys.stderr)
        return 1
    try:
        address, token = cluster_status.resolve(args)
        return asyncio.run(_serve(args, address, token))
    except cluster_status.StatusError as exc:
        print(f"rayless dashboard: {exc}", file=sys.stderr)
    except (RaylessError, asyncio.TimeoutError) as exc:
        print(
            f"rayless dashboard: no cluster at the address ({type(exc).__name__}: {exc})",
            file=sys.stderr,
        )
    except OSError as exc:
        print(f"rayless dashboard: cannot serve on {args.host}:{args.port}: {exc}", file=sys.stderr)
    return 1
