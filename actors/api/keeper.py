"""A driver's session held alive at the head from a thread of its own.

The head ends a session (and kills its actors) once no connection of it has been heard for
its ``node_timeout``. A driver's event loop may be held longer than that by the driver's own
code (a long synchronous step, a first import of torch): its loop's connection then cannot
heartbeat. The keeper is a second connection to the head, on its own thread and event loop,
that only heartbeats (``("keep_session", session)``; the head sends it no events or logs), so
the session lives as long as the driver's process does, as a Ray driver's does. When the
process dies, the keeper's connection goes silent or closes and the head ends the session as
before. A keeper that loses the head registers again; the loop's connection, not the keeper,
decides whether the cluster is lost.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import logging
import threading

from rayless.actors.protocol.messages import KeepSession
from rayless.actors.protocol.wire import ask
from rayless.transport.client import Client
from rayless.transport.errors import RaylessError

log = logging.getLogger("rayless.actors")


class SessionKeeper:
    """Heartbeats ``session`` to the head at ``address`` from a daemon thread.

    ``await start()`` returns once the head holds the session by this connection too;
    ``await aclose()`` stops the thread (idempotent).
    """

    def __init__(
        self, address: str, token: str, session: str, *, interval: float, timeout: float
    ) -> None:
        self.address = address
        self.session = session
        self._token = token
        self._interval = interval
        self._timeout = timeout
        self._started: concurrent.futures.Future[None] = concurrent.futures.Future()
        self._finished: concurrent.futures.Future[None] = concurrent.futures.Future()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop: asyncio.Event | None = None
        self._thread: threading.Thread | None = None
        self.registrations = 0  # how many times the head took the session from this keeper

    async def start(self) -> None:
        """Start the thread and wait until the head holds the session through it.

        Raises:
            RaylessError: the keeper could not reach or register with the head (the thread
                is then gone).
        """
        if self._thread is not None:
            return
        self._thread = threading.Thread(
            target=self._run, name=f"rayless-keeper-{self.session[:8]}", daemon=True
        )
        self._thread.start()
        await asyncio.wrap_future(self._started)

    async def aclose(self) -> None:
        """Stop heartbeating, close the connection and end the thread. Idempotent."""
        thread, self._thread = self._thread, None
        if thread is None:
            return
        loop, stop = self._loop, self._stop
        if loop is not None and stop is not None:
            try:
                loop.call_soon_threadsafe(stop.set)
            except RuntimeError:  # its loop already ended
                pass
        await asyncio.wrap_future(self._finished)
        await asyncio.to_thread(thread.join, 10)

    # -- the thread ------------------------------------------------------------------------

    def _run(self) -> None:
        loop = asyncio.new_event_loop()
        try:
            loop.run_until_complete(self._main())
        except BaseException as exc:  # never leave start() waiting
            if not self._started.done():
                self._started.set_exception(exc)
        finally:
            loop.close()
            self._finished.set_result(None)

    async def _main(self) -> None:
        self._loop = asyncio.get_running_loop()
        stop = self._stop = asyncio.Event()
        broken = asyncio.Event()
        client = Client(
            self.address,
            token=self._token,
            name=f"keeper:{self.session}",
            heartbeat_interval=self._interval,
            heartbeat_timeout=self._timeout,
            on_broken=lambda reason: broken.set(),
        )
        try:
            try:
                await self._register(client)
            except BaseException as exc:
                self._started.set_exception(exc)
                return
            self._started.set_result(None)
            while not stop.is_set():
                waits = [asyncio.ensure_future(e.wait()) for e in (stop, broken)]
                try:
                    await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
                finally:
                    for w in waits:
                        w.cancel()
                if stop.is_set():
                    break
                broken.clear()
                await self._register_again(client, stop)
        finally:
            await client.aclose()

    async def _register(self, client: Client) -> None:
        await client.connect()
        await ask(client, KeepSession(self.session), timeout=30)
        self.registrations += 1

    async def _register_again(self, client: Client, stop: asyncio.Event) -> None:
        """The head forgot or lost this connection: register again until it takes it (or
        the keeper stops)."""
        while not stop.is_set():
            attempt = asyncio.ensure_future(self._register(client))
            stopping = asyncio.ensure_future(stop.wait())
            try:  # a stop ends the attempt at once (a head that is gone holds it to its timeout)
                await asyncio.wait((attempt, stopping), return_when=asyncio.FIRST_COMPLETED)
            finally:
                stopping.cancel()
                if not attempt.done():
                    attempt.cancel()
                    with contextlib.suppress(asyncio.CancelledError, RaylessError):
                        await attempt
            if attempt.cancelled():
                return
            try:
                attempt.result()
                return
            except RaylessError as exc:
                log.info("session keeper %s: head unreachable (%s)", self.session, exc)
            try:
                await asyncio.wait_for(stop.wait(), self._interval)
            except asyncio.TimeoutError:
                pass


__all__ = ["SessionKeeper"]
