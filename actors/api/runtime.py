"""A process's live connections to its cluster, one :class:`Runtime` per event loop.

Handles are plain data; calling one looks up the runtime of the running loop, which holds a
client to the head (for lookups and events) and one client per actor it talks to. Calls go
straight to the actor. The head pushes actor events: ``died`` fails every pending call to that
actor with ActorDiedError at once, ``restarting`` fails the calls the dead process had and
holds new ones until ``ready`` names the new address.

Sync code reaches a runtime through ``actors.api.portal`` (the home loop of the process).

A session survives its own process's stalls: a driver's session is also held by a keeper
thread (``actors.api.keeper``) that heartbeats whatever the loop does, and when the head
forgot the loop's connection meanwhile (it expired it), the runtime handshakes again,
re-introduces its session, learns the actor events it missed and sends again the head
requests that the head refused unrun. Only a head that stopped answering, or went away, loses
the cluster (ClusterLostError).
"""

from __future__ import annotations

import asyncio
import math
import os
import sys
import time
import weakref
from dataclasses import dataclass, field, replace
from typing import Any, TypeVar, overload

from rayless.actors.api.calls import call_encode_error, call_limit_error
from rayless.actors.api.keeper import SessionKeeper
from rayless.actors.api.remote_errors import caller_hook, materialize, replied
from rayless.actors.control import debug
from rayless.actors.control.death import death_details
from rayless.actors.control.logs import print_lines
from rayless.actors.core import context, gc_policy, timeline
from rayless.actors.errors import ActorDiedError, ClusterLostError, ConnectError
from rayless.actors.protocol.messages import (
    ActorEvent,
    ActorState,
    ActorView,
    DebugRegister,
    EventKind,
    Hello,
    LogLines,
    LookupActor,
    NodeDied,
)
from rayless.actors.protocol.wire import Handlers, Request, ask
from rayless.transport.client import Client
from rayless.transport.codec import encode
from rayless.transport.errors import (
    BrokenError,
    LimitError,
    RaylessError,
    RemoteError,
    Timeout,
    TransportError,
)

RESTART_WAIT = 120.0
R = TypeVar("R")
ALIVE, RESTARTING, DEAD = ActorState.ALIVE, ActorState.RESTARTING, ActorState.DEAD
_PROBE_TIMEOUT = 5.0  # seconds for a fresh session to an actor whose connection broke
_MOVES = 3  # restarts followed while connecting before a call gives up
_CONNECT_TIMEOUT = 10.0  # seconds per handshake with an actor (tried again while it is alive)
_START_WAIT = 3600.0  # a call to an actor found while it was starting waits this long at most
_DEATH_WAIT = 10.0  # seconds to wait for the head to list the death of an unanswering actor


@dataclass
class _ActorConn:
    actor_id: str
    name: str
    address: str
    node: str | None
    state: ActorState = ALIVE
    client: Client | None = None
    death: ActorDiedError | None = None
    # set while the actor serves, and once it is dead for good (waiters then read ``state``)
    alive: asyncio.Event = field(default_factory=asyncio.Event)
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)


class Runtime:
    """The connections of this process to its cluster, on one event loop."""

    def __init__(self, info: context.ClusterInfo) -> None:
        self.info = info
        self.loop = asyncio.get_running_loop()
        self.head = Client(
            info.address,
            token=info.token,
            name=f"session:{info.session}",
            on_oneway=self._on_oneway,
            on_broken=self._head_broken,
            heartbeat_interval=0.5,
            heartbeat_timeout=10.0,
        )
        self.conns: dict[str, _ActorConn] = {}
        self.print_logs = True
        self.lost: ClusterLostError | None = None
        self._closed = False
        self.keeper: SessionKeeper | None = None
        self.debug: debug.DebugServer | None = None  # a driver's debug listener
        self._resuming: asyncio.Task[None] | None = None
        self._hb_timeout = 10.0
        self._warming: asyncio.Future[None] | None = None
        self.forgets = 0  # how many times the head forgot this connection (we then resume)
        self.resumes = 0  # how many times the session was resumed on a new handshake
        self._pushes: Handlers[None] = Handlers("runtime")  # what the head pushes
        self._pushes.on(ActorEvent, lambda _, ev: self._on_event(ev))
        self._pushes.on(LogLines, lambda _, batch: self._print_logs(batch))
        self._pushes.on(NodeDied, lambda _, died: None)  # its actors' DIED events came first

    async def start(self) -> Runtime:
        """Connect to the head and register this process's session.

        The head's liveness is then checked within its ``node_timeout`` (as the head checks
        its agents): its loss fails every call of this runtime at once with ClusterLostError.
        """
        await self.head.connect()
        hello = await ask(self.head, Hello(self.info.session), timeout=30)
        timeout = max(1.0, hello.node_timeout)
        interval = min(0.5, timeout / 4)
        self.head.set_heartbeat(interval, timeout)
        self._hb_timeout = timeout
        if "torch" in sys.modules and self._warming is None:
            # the codec's tensor support imports tensordict (seconds): in a thread, not on
            # this loop at the first tensor a call sends
            self._warming = asyncio.ensure_future(asyncio.to_thread(_warm_codec))
        if self.info.actor_id is None:  # a driver (an actor's session lives as long as it)
            keeper = SessionKeeper(
                self.info.address,
                self.info.token,
                self.info.session,
                interval=interval,
                timeout=timeout,
            )
            try:
                await keeper.start()
                self.keeper = keeper
                await self._start_debug()
            except BaseException:
                await keeper.aclose()
                await self.head.aclose()
                raise
        return self

    async def _start_debug(self) -> None:
        """A driver's debug listener (``actors.control.debug.start_driver``: when it records
        a timeline, or RAYLESS_DEBUG=1), registered with the head under this session, so that
        ``rayless timeline`` and ``rayless stack`` from another shell reach this process too."""
        server = debug.start_driver(self.info.token, self.info.address, self.loop)
        if server is None:
            return
        try:
            await ask(self.head, self._debug_registration(server.address), timeout=30)
        except RaylessError as exc:
            print(f"rayless: driver: debug listener not registered: {exc}", file=sys.stderr)
            server.stop()
        except BaseException:
            server.stop()
            raise
        else:
            self.debug = server

    async def head_request(self, body: Request[R], timeout: float | None = 60.0) -> R:
        """A request to the head; its reply, checked.

        Raises:
            ClusterLostError: the head is gone.
            ProtocolError: the head answered with something else than ``body`` gets.
        """
        forgets = await self._session_ready()
        try:
            return await ask(self.head, body, timeout=timeout)
        except ActorDiedError:  # the head's answer (a spawn's actor died starting), as itself
            raise
        except BrokenError:
            if self.forgets == forgets:
                raise
        # the head had forgotten this connection and did not run the request: send it again
        # once the session is resumed
        await self._session_ready()
        return await ask(self.head, body, timeout=timeout)

    async def _session_ready(self) -> int:
        """Wait for a resume under way; raise ClusterLostError if the cluster is lost; the
        count of forgets so far."""
        if self._resuming is not None:
            await asyncio.shield(self._resuming)
        if self.lost is not None:
            raise self.lost
        return self.forgets

    def _head_broken(self, reason: str) -> None:
        """The session with the head broke. The head forgot this connection (it expired it
        while our loop was blocked), or the connection ended (the head may have dropped a
        forgotten one): resume the session. The head stopped answering, or a resume finds
        it gone: the cluster is lost; fail everything at once."""
        if self._closed or self.lost is not None:
            return
        why = self.head.broke
        if why == "forgotten":
            self.forgets += 1
        if why in ("forgotten", "lost"):
            if self._resuming is None:
                self._resuming = self.loop.create_task(self._resume(reason))
            return
        self._lose(reason)

    async def _resume(self, reason: str) -> None:
        """Handshake again (within the heartbeat timeout: a head that cannot answer that
        fast counts as lost), re-introduce the session, and catch up on the actor events sent
        while the head did not know this connection."""
        try:
            ids = tuple(a for a, c in self.conns.items() if c.state is not DEAD)
            await self.head.connect(timeout=self._hb_timeout)
            hello = await ask(self.head, Hello(self.info.session, ids), timeout=30)
        except RaylessError as exc:
            self._lose(f"{reason}, and it could not be reached again: {exc}")
        else:
            self._catch_up(hello.actors)
            self.resumes += 1
            if self.debug is not None:  # the head drops it with a session it lost meanwhile
                try:
                    again = self._debug_registration(self.debug.address)
                    await ask(self.head, again, timeout=30)
                except RaylessError as exc:
                    print(f"rayless: driver: debug listener not registered: {exc}", file=sys.stderr)
        finally:
            self._resuming = None

    def _catch_up(self, records: tuple[ActorView, ...]) -> None:
        """Apply the states of actors (head records) whose events we may have missed."""
        for record in records:
            conn = self.conns.get(record.actor_id)
            if conn is None or conn.state is DEAD:
                continue
            death = record.death or ActorEvent(EventKind.DIED, record.actor_id)
            died = replace(death, actor_id=record.actor_id, name=record.name)
            if record.state is DEAD:
                self._on_event(replace(died, kind=EventKind.DIED))
            elif record.state is RESTARTING and conn.state is ALIVE:
                self._on_event(replace(died, kind=EventKind.RESTARTING))
            elif record.state is ALIVE and (
                conn.state is not ALIVE or record.address != conn.address
            ):
                if conn.state is ALIVE:  # it restarted meanwhile: its old calls are lost
                    self._on_event(replace(died, kind=EventKind.RESTARTING))
                self._on_event(
                    ActorEvent(
                        EventKind.READY,
                        record.actor_id,
                        name=record.name,
                        node=record.node_id,
                        pid=record.pid,
                        address=record.address,
                    )
                )

    def _lose(self, reason: str) -> None:
        if self.lost is not None:
            return
        self.lost = ClusterLostError(
            f"the cluster's head at {self.info.address} is gone ({reason}); every call of "
            "this cluster fails. Start or connect to a cluster again."
        )
        for conn in self.conns.values():
            conn.state, conn.death = DEAD, None
            conn.alive.set()  # wake calls waiting for a restart
            if conn.client is not None:
                conn.client.fail_pending(self.lost)

    async def aclose(self) -> None:
        """Close every connection. Idempotent."""
        if self._closed:
            return
        self._closed = True
        _RUNTIMES.pop(self.loop, None)
        if self._resuming is not None:
            self._resuming.cancel()
        if self._warming is not None:
            self._warming.cancel()  # (its thread finishes the import on its own)
        await self._stop_debug()
        if self.keeper is not None:
            await self.keeper.aclose()
        conns = list(self.conns.values())
        for conn in conns:
            if conn.client is not None:
                await conn.client.aclose()
        await self.head.aclose()

    def _debug_registration(self, address: str) -> DebugRegister:
        """The driver's listener at ``address`` ("": withdrawn), for the head's record under
        this session (the head takes the session from the connection, not from the id)."""
        return DebugRegister(f"driver:{self.info.session}", address, os.getpid(), "driver")

    async def _stop_debug(self) -> None:
        """Withdraw the driver's listener from the head (so that no gatherer tries it after
        this; the session's end drops it anyway) and stop it."""
        server, self.debug = self.debug, None
        if server is None:
            return
        if self.lost is None and self.head.ready:
            try:
                await ask(self.head, self._debug_registration(""), timeout=2)
            except RaylessError:
                pass
        await asyncio.to_thread(server.stop)

    # -- events ----------------------------------------------------------------------------

    def _on_oneway(self, body: object) -> None:
        self._pushes.oneway(None, body)  # (a client's pushes come from its one server)

    def _print_logs(self, batch: LogLines) -> None:
        if self.print_logs:
            print_lines(batch)

    def _on_event(self, ev: ActorEvent) -> None:
        actor_id = ev.actor_id
        kind = ev.kind
        conn = self.conns.get(actor_id)
        if conn is None:
            if kind is not EventKind.DIED:
                return
            conn = self.conns[actor_id] = _ActorConn(actor_id, ev.name, "", None)
        if kind is EventKind.DIED or kind is EventKind.RESTARTING:
            death = ActorDiedError(
                ev.name or conn.name,
                pid=ev.pid,
                exitcode=ev.exitcode,
                node=ev.node or conn.node,
                reason=ev.reason,
                **death_details(ev),
            )
            conn.state = DEAD if kind is EventKind.DIED else RESTARTING
            conn.death = death
            if kind is EventKind.DIED:
                conn.alive.set()  # wake calls waiting for a restart: it will never come
            else:
                conn.alive.clear()
            client, conn.client = conn.client, None
            if client is not None:
                client.fail_pending(death)
                self.loop.create_task(client.aclose())
        elif kind is EventKind.READY:
            conn.state, conn.address, conn.death = ALIVE, ev.address, None
            conn.alive.set()

    # -- calls -----------------------------------------------------------------------------

    def _conn_for(self, handle: Any) -> _ActorConn:
        conn = self.conns.get(handle.actor_id)
        if conn is None:
            conn = _ActorConn(handle.actor_id, handle.name, handle.address, handle.node_id)
            conn.alive.set()
            self.conns[handle.actor_id] = conn
        return conn

    async def _ready_client(self, conn: _ActorConn, timeout: float | None = None) -> Client:
        """A ready session with the actor: connect (again) where there is none, following its
        restarts; within ``timeout`` seconds where given.

        A handshake that times out while the head lists the actor alive at that address is
        tried again: its event loop is held by user code (it answers nothing meanwhile), and a
        call waits for it as a call already sent does.

        Raises:
            ActorDiedError: the actor died, is unreachable, or moved too often.
            Timeout: its loop did not answer a handshake within ``timeout``.
        """
        deadline = None if timeout is None else self.loop.time() + timeout
        if self.lost is not None:
            raise self.lost
        if conn.state is RESTARTING:
            try:
                await asyncio.wait_for(conn.alive.wait(), RESTART_WAIT)
            except asyncio.TimeoutError:
                raise conn.death or ActorDiedError(conn.name, reason="restart timed out") from None
        if self.lost is not None:
            raise self.lost
        if conn.state is DEAD:
            raise conn.death or ActorDiedError(conn.name)
        async with conn.lock:
            if not conn.address:
                await self._started(conn)
            moves = 0
            while moves < _MOVES:
                client = conn.client
                if client is not None and client.ready:
                    return client
                if client is not None:
                    await client.aclose()
                client = Client(
                    conn.address,
                    token=self.info.token,
                    name=f"caller->{conn.name}",
                    error_hook=caller_hook,
                    # An actor's loop may be held by user code for minutes; its death is
                    # learnt from the head (the agent reaps it), never from a missed heartbeat.
                    heartbeat_timeout=math.inf,
                )
                if timeline.RECORDER.enabled:  # the ends of the calls it sends (fast_submit)
                    client.trace = timeline.RECORDER.spans
                conn.client = client
                left = None if deadline is None else max(deadline - self.loop.time(), 0.001)
                try:
                    await client.connect(None if left is None else min(left, _CONNECT_TIMEOUT))
                except TransportError as exc:
                    conn.client = None
                    await client.aclose()
                    if isinstance(exc, Timeout) and await self._listed_at(conn):
                        if deadline is not None and self.loop.time() >= deadline:
                            raise Timeout(
                                f"actor {conn.name!r} answered no handshake within {timeout}s "
                                "(alive, its event loop held by user code)"
                            ) from None
                        continue  # alive, its loop held: try again
                    why = await self._why_unreachable(conn, failed=exc)
                    if why is None:
                        moves += 1
                        continue  # it restarted elsewhere; nothing was sent: connect there
                    raise why from None
                return client
            raise ActorDiedError(
                conn.name, node=conn.node, reason=f"it moved {_MOVES} times while we connected"
            )

    async def _listed_at(self, conn: _ActorConn) -> bool:
        """Whether the head lists the actor alive at the address we tried."""
        try:
            info = await self.head_request(LookupActor(conn.actor_id), timeout=10)
        except RaylessError:
            return False
        return info.state is ALIVE and info.address == conn.address

    async def _started(self, conn: _ActorConn) -> None:
        """Wait until an actor that was still starting when its handle was made (found by
        name: no address yet) serves, polling the head's record (at most ``_START_WAIT``;
        its spawn's own timeout usually ends it first: a spawn that times out is dead).

        Raises:
            ActorDiedError: it died or failed to start, or did not start in time.
        """
        deadline = self.loop.time() + _START_WAIT
        pause = 0.01
        while self.loop.time() < deadline:
            info = await self.head_request(LookupActor(conn.actor_id), timeout=10)
            if info.state is DEAD:
                death = info.death
                raise ActorDiedError(
                    conn.name,
                    node=info.node_id,
                    reason="failed to start" if death is None else death.reason,
                    **death_details(death),
                )
            if info.address:
                conn.address, conn.node = info.address, info.node_id
                return
            await asyncio.sleep(pause)
            pause = min(pause * 2, 0.5)
        raise ActorDiedError(conn.name, reason=f"it did not start within {_START_WAIT:g} s")

    @overload
    async def _why_unreachable(
        self, conn: _ActorConn, *, failed: TransportError
    ) -> RaylessError | None: ...
    @overload
    async def _why_unreachable(self, conn: _ActorConn, broke: BrokenError) -> RaylessError: ...
    async def _why_unreachable(
        self,
        conn: _ActorConn,
        broke: BrokenError | None = None,
        *,
        failed: TransportError | None = None,
    ) -> RaylessError | None:
        """Ask the head what became of an actor we cannot reach (a connection that ``failed``
        to open, or that ``broke`` under a call). None: it restarted at a new address (``conn``
        now holds it) and nothing was sent, so the caller connects there."""
        try:
            info = await self.head_request(LookupActor(conn.actor_id), timeout=10)
        except RaylessError as exc:
            return ActorDiedError(conn.name, node=conn.node, reason=f"unreachable ({exc})")
        if info.state is ALIVE and info.address != conn.address:
            conn.address = info.address
            if broke is None:
                return None
            # The process that had the call died and the actor restarted before the head's
            # events reached us: the call failed as every call of a dead process fails.
            return ActorDiedError(
                conn.name,
                node=info.node_id,
                reason=f"its process died under the call ({broke}); it restarted at {info.address}",
            )
        if info.state is ALIVE:  # a call that broke, or a handshake lost, as it died
            if broke is not None and await self._answers(conn):  # the connection, not it
                return BrokenError(
                    f"the connection to actor {conn.name} broke under the call ({broke}); "
                    "the actor is alive and answers again: the call's outcome is unknown"
                )
            info = await self._death_of(conn, info)  # its death, once the head lists it
        death = info.death
        if info.state is ALIVE:
            return ActorDiedError(
                conn.name,
                pid=info.pid,
                node=info.node_id,
                reason=f"unreachable ({broke or failed}; the head still lists it as alive)",
            )
        return ActorDiedError(
            conn.name,
            pid=info.pid if death is None else death.pid,
            exitcode=None if death is None else death.exitcode,
            node=info.node_id,
            reason="unreachable" if death is None else death.reason,
            **death_details(death),
        )

    async def _answers(self, conn: _ActorConn) -> bool:
        """Whether a fresh session with the actor opens within a few seconds."""
        try:
            await asyncio.wait_for(self._ready_client(conn), _PROBE_TIMEOUT)
        except (RaylessError, asyncio.TimeoutError):
            return False
        return True

    async def _death_of(self, conn: _ActorConn, info: ActorView) -> ActorView:
        """The head's view of an actor that stopped answering, once it lists the death (its
        agent reaps the process and tells it), or its last view after ``_DEATH_WAIT``."""
        deadline = self.loop.time() + _DEATH_WAIT
        while info.state is ALIVE and self.loop.time() < deadline:
            await asyncio.sleep(0.2)
            try:
                info = await self.head_request(LookupActor(conn.actor_id), timeout=10)
            except RaylessError:
                break
        return info

    async def call(
        self,
        handle: Any,
        method: str,
        args: tuple[Any, ...],
        kwargs: Any,
        timeout: float | None = None,
        group: str | None = None,
    ) -> Any:
        """Call ``method`` on the actor and return its result (in concurrency group
        ``group`` instead of the method's own, where given).

        Raises:
            ActorDiedError: the actor died before or during the call.
            RemoteError: the method raised (also an instance of the original exception type
                where that type is loaded here).
            Timeout: no result within ``timeout`` seconds (an async method is cancelled in the
                actor; a queued def call is dropped, a running one runs to completion).
            TypeError: an argument cannot be encoded (named as ``argument 0 ['a']``).
        """
        conn = self.conns.get(handle.actor_id) or self._conn_for(handle)
        client = conn.client
        limit = timeout
        if client is None or not client.ready or conn.state is not ALIVE:
            started = self.loop.time()
            client = await self._ready_client(conn, timeout)
            if timeout is not None:
                timeout = max(timeout - (self.loop.time() - started), 0.001)
        body = call_body(method, args, kwargs, group)
        try:
            if not timeline.RECORDER.enabled or client.trace is None:
                return await client.request(body, timeout=timeout)
            start = time.time_ns()
            key = client.trace_key

            def sent(req_id: int) -> None:  # the call's timeline record; its end: the client's
                timeline.RECORDER.spans.append(
                    (timeline.SENT, conn.name, method, start, key, req_id)
                )

            return await client.request(body, timeout=timeout, sent=sent)
        except RemoteError as exc:
            raise materialize(exc) from None
        except TypeError as exc:
            raise call_encode_error(exc, method) from None
        except LimitError as exc:
            raise call_limit_error(exc, method, args, kwargs) from None
        except (BrokenError, Timeout) as exc:
            if replied(exc):  # the method's own outcome (a peer of the actor was lost)
                raise
            if self.lost is not None:
                raise self.lost from None
            if conn.death is not None:
                raise conn.death from None
            if isinstance(exc, BrokenError):
                raise await self._why_unreachable(conn, exc) from None
            raise Timeout(
                f"{method}(...) of actor {conn.name!r} gave no result within {limit}s "
                f"({_after_timeout(_is_async(handle, method))})"
            ) from None

    async def request(self, handle: Any, body: tuple[Any, ...]) -> Any:
        """Send a protocol step other than a call (a streamed result's pull or close) to the
        actor; errors as :meth:`call`'s."""
        conn = self.conns.get(handle.actor_id) or self._conn_for(handle)
        client = conn.client
        if client is None or not client.ready or conn.state is not ALIVE:
            client = await self._ready_client(conn)
        try:
            return await client.request(body)
        except RemoteError as exc:
            raise materialize(exc) from None
        except BrokenError as exc:
            if replied(exc):
                raise
            if self.lost is not None:
                raise self.lost from None
            if conn.death is not None:
                raise conn.death from None
            raise await self._why_unreachable(conn, exc) from None


def _warm_codec() -> None:
    """Load the codec's tensor support (worker thread): encode one small tensor."""
    torch = sys.modules.get("torch")
    if torch is not None:
        encode(torch.zeros(1))


def _is_async(handle: Any, method: str) -> bool | None:
    """Whether ``method`` of ``handle``'s actor is async (None: unknown)."""
    info = (handle.methods or {}).get(method)
    return None if info is None else bool(info.is_async)


def _after_timeout(is_async: bool | None) -> str:
    """What became of a call that timed out, by kind of method (None: unknown)."""
    if is_async:
        return "the call was cancelled in the actor"
    sync = (
        "a def method cannot be cancelled: if it had started it runs to completion and "
        "keeps its max_concurrency slot until it returns; if it was queued it was dropped"
    )
    return sync if is_async is False else f"an async method was cancelled in the actor; {sync}"


_RUNTIMES: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, Runtime] = (
    weakref.WeakKeyDictionary()
)
# a start in progress on a loop: the cluster's address, and its outcome for other callers
_STARTING: weakref.WeakKeyDictionary[
    asyncio.AbstractEventLoop, tuple[str, asyncio.Future[Runtime]]
] = weakref.WeakKeyDictionary()


async def get_runtime() -> Runtime:
    """The runtime of the running loop, connecting it on first use.

    Raises:
        RaylessError: this process belongs to no cluster. ConnectError: it left the cluster
            (another became its own) while this call connected to it.
    """
    loop = asyncio.get_running_loop()
    runtime = _RUNTIMES.get(loop)
    if runtime is not None:
        current = context._current
        if current is not None and current.address == runtime.info.address:
            return runtime  # (a lost one too: its calls fail fast with ClusterLostError)
        # A runtime left on a long-lived loop (the sync faces' portal) by a cluster that is
        # no longer this process's: never reuse it for another cluster, or for none.
        _RUNTIMES.pop(loop, None)
        await runtime.aclose()
    info = context.current()
    starting = _STARTING.get(loop)
    if starting is not None and starting[0] == info.address:
        return await asyncio.shield(starting[1])
    # (a start for a cluster this process has left, by a caller of that cluster's, does not
    # hold this one up: it fails on its own, or finds it is stale when it connects)
    fut: asyncio.Future[Runtime] = loop.create_future()
    entry = (info.address, fut)
    _STARTING[loop] = entry
    gc_policy.apply()  # a caller's in-flight calls must not make the collector's passes longer
    try:
        runtime = await Runtime(info).start()
        current = context._current
        if current is None or current.address != info.address:
            await runtime.aclose()
            raise ConnectError(
                f"this process left the cluster at {info.address} while connecting to it"
            )
    except BaseException as exc:
        fut.set_exception(exc)
        fut.exception()  # retrieved: waiters re-raise it
        raise
    finally:
        if _STARTING.get(loop) is entry:
            _STARTING.pop(loop, None)
    _RUNTIMES[loop] = runtime
    fut.set_result(runtime)
    return runtime


async def close_runtimes() -> None:
    """Close the runtime of the running loop, if it has one."""
    runtime = _RUNTIMES.pop(asyncio.get_running_loop(), None)
    if runtime is not None:
        await runtime.aclose()


def call_body(
    method: str, args: tuple[Any, ...], kwargs: Any, group: str | None
) -> tuple[Any, ...]:
    """An actor call's body (docs/protocol.md): a fifth field only for a group of its own."""
    return ("c", method, args, kwargs) if group is None else ("c", method, args, kwargs, group)


def fast_submit(
    handle: Any,
    method: str,
    args: tuple[Any, ...],
    kwargs: Any,
    timeout: float | None = None,
    group: str | None = None,
) -> Any:
    """A future of the call when this loop's runtime already talks to the live actor and no
    timeout is given, else None (the caller then takes the full path that connects, waits for
    restarts, and says what became of a call that timed out)."""
    if timeout is not None:
        return None
    try:
        loop = asyncio.get_running_loop()
    except RuntimeError:
        return None
    runtime = _RUNTIMES.get(loop)
    if runtime is None:
        return None
    conn = runtime.conns.get(handle.actor_id)
    if conn is None or conn.state is not ALIVE or conn.client is None:
        return None
    client = conn.client
    fut = client.submit_nowait(call_body(method, args, kwargs, group), timeout)
    recorder = timeline.RECORDER
    if recorder.enabled and fut is not None and not fut.done() and client.trace is not None:
        # the call's timeline record (its end: the client's, as the reply comes)
        recorder.spans.append(
            (
                timeline.SENT,
                conn.name,
                method,
                time.time_ns(),
                client.trace_key,
                client.last_request_id,
            )
        )
    if fut is not None and fut.done() and not fut.cancelled():
        error = fut.exception()
        if isinstance(error, (TypeError, LimitError)):  # not sent: an argument's fault
            failed: asyncio.Future[Any] = loop.create_future()
            if isinstance(error, TypeError):
                failed.set_exception(call_encode_error(error, method))
            else:
                failed.set_exception(call_limit_error(error, method, args, kwargs))
            return failed
    return fut
