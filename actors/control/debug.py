"""Debugging inside actors: ``breakpoint()`` opens a remote pdb, and every thread's stack on
demand. The client side is ``rayless debug`` / ``rayless stack`` (``actors.api.debugger``).

Each actor process runs one small TCP listener in a thread of its own, on its node's address
(loopback in a local cluster), and registers it with the head. Being a thread, it answers
while the actor's event loop is held by a method, or paused at a breakpoint. Every connection
starts with the cluster token's HMAC challenge-response in both directions (the same proofs as
the transport's handshake, ``transport.protocol``): only a holder of the token gets a stack
or a pdb prompt, and the client knows it talks to the cluster's actor. The session itself is
plain text, unencrypted: with RAYLESS_CURVE=1 the listener binds loopback only, so that
``rayless debug``/``stack`` then work from the actor's own host (see docs/security.md).

The protocol, one line each way, then the command's answer::

    S: RAYLESS-DEBUG 1 <server nonce, hex>
    C: <client nonce, hex> <client proof, hex> <command>
    S: OK <server proof, hex>      (or "ERR <why>", and the connection closes)

Commands: ``stack`` (the text of every thread's stack and every asyncio task's, then close),
``timeline [SINCE_NS]`` (this process's timeline spans, ``actors.core.timeline.dump``),
``metrics`` (its calls and errors per method and queue depth, ``actors.core.callstats.dump``),
``list`` (a JSON list of the breakpoints paused in this process, then close) and ``attach
ID`` (``READY``, then the pdb session of breakpoint ID over the connection).

Strangers are bounded: at most ``MAX_HANDSHAKES`` connections handshake at once (one thread
each). A connection beyond them takes the slot of the oldest one handshaking for longer than
``EVICT_AFTER`` seconds (a token holder's handshake takes milliseconds; that one is cut), so
idle strangers cannot keep a token holder out; when every slot is younger, it is closed at
once, unread, after one line ``RAYLESS-DEBUG BUSY ...``, which the client raises as
``DebugBusyError``. Each gets ``HANDSHAKE_TIMEOUT``
seconds in all to authenticate (a deadline for the whole handshake, not per read), and
rejections are logged at a bounded rate (``transport.ratelog``). When ``accept()`` fails for
want of fds or memory (strangers elsewhere in the process may hold them) the listener pauses
(50 ms doubling to 1 s) and tries again, logging at the same bounded rate: it never stops
listening while the actor lives. ``DebugServer.stats`` counts all this.

``breakpoint()`` in a method (sync or async) pauses the calling thread until a client
attaches; the actor's stderr, forwarded to the driver, says so. ``c`` continues and ends the
session; a client that disconnects continues too (the actor never stays stopped for
nobody); ``q`` raises ``bdb.BdbQuit`` in the method, which its caller receives as a
RemoteError. PYTHONBREAKPOINT set in the actor's environment (``0`` to ignore every
breakpoint) takes precedence over all this, as in plain Python; ``RAYLESS_DEBUG=0`` turns
the listener off.

A driver runs the same listener (:func:`start_driver`, named ``driver``) while it records a
timeline, or with ``RAYLESS_DEBUG=1``: its runtime (``actors.api.runtime``) registers it with
the head under its session (``DebugRegister(kind="driver")``; the head keeps it until the
session ends) and stops it as it closes, so that ``rayless timeline`` and ``rayless stack``
reach the driver too. It answers ``stack``, ``timeline``, ``metrics`` and ``list``; its
``breakpoint()`` stays the terminal's own pdb.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import errno
import itertools
import json
import logging
import os
import pdb
import queue
import socket
import sys
import threading
import time
import traceback
import weakref
from collections.abc import Iterator
from dataclasses import dataclass, field
from types import FrameType
from typing import Any

from rayless.actors.core import callstats, timeline
from rayless.actors.errors import DebugBusyError
from rayless.actors.protocol.messages import DebugRegister
from rayless.actors.protocol.wire import ask
from rayless.transport import protocol
from rayless.transport.errors import AuthError, ProtocolError
from rayless.transport.ratelog import RateLimitedLog

MAGIC = "RAYLESS-DEBUG 1"
BUSY = "RAYLESS-DEBUG BUSY"  # the one line a connection refused for want of a slot gets
HANDSHAKE_TIMEOUT = 10.0
MAX_HANDSHAKES = 8
EVICT_AFTER = 2.0  # a stranger handshaking longer than this gives its slot to a newcomer
LOG_INTERVAL = 5.0  # seconds between two log lines about strangers (of one kind)
# accept() errors that pass (fds or memory short, a client gone first): retried, not fatal
_RETRY_ACCEPT = {
    errno.EMFILE,
    errno.ENFILE,
    errno.ENOBUFS,
    errno.ENOMEM,
    errno.ECONNABORTED,
    errno.EPROTO,
}
log = logging.getLogger("rayless.debug")
ENV_DEBUG = "RAYLESS_DEBUG"
DRIVER = "driver"  # a driver's listener: its name and its kind at the head


# -- the handshake (both sides) ------------------------------------------------------------


class LineSocket:
    """A socket read line by line (the handshake) and then as raw bytes (the session)."""

    def __init__(self, sock: socket.socket, deadline: float | None = None) -> None:
        self.sock = sock
        self.buffer = b""
        self.deadline = deadline  # time.monotonic() by which every read must be done

    def readline(self, limit: int = 4096) -> str:
        """One line without its newline; '' at end of stream.

        Raises:
            ProtocolError: the line is longer than ``limit``.
            TimeoutError: the deadline passed first.
        """
        while b"\n" not in self.buffer:
            if len(self.buffer) > limit:
                raise ProtocolError("debug line too long")
            if self.deadline is not None:
                left = self.deadline - time.monotonic()
                if left <= 0:
                    raise TimeoutError("debug handshake deadline passed")
                self.sock.settimeout(left)
            chunk = self.sock.recv(4096)
            if not chunk:
                line, self.buffer = self.buffer, b""
                return line.decode("utf-8", "replace")
            self.buffer += chunk
        line, _, self.buffer = self.buffer.partition(b"\n")
        return line.decode("utf-8", "replace")

    def send_line(self, text: str) -> None:
        """Send ``text`` and a newline."""
        self.sock.sendall(text.encode() + b"\n")


def client_handshake(sock: socket.socket, token: str, command: str) -> LineSocket:
    """Prove the token, check the actor's proof, send ``command``.

    Raises:
        AuthError: the actor rejected the token, or could not prove it knows it.
        DebugBusyError: the listener is busy (every handshake slot taken): it said so.
        ProtocolError: the peer does not speak this protocol, or closed the connection.
    """
    key = protocol.as_token(token)
    conn = LineSocket(sock)
    line = conn.readline()
    if line.startswith(BUSY):
        raise DebugBusyError(f"the debug listener is busy ({line.removeprefix(BUSY).strip():.80})")
    if not line:
        raise ProtocolError("the debug listener closed the connection without a greeting")
    greeting = line.split()
    try:
        if len(greeting) != 3 or " ".join(greeting[:2]) != MAGIC:
            raise ValueError
        nonce_s = bytes.fromhex(greeting[2])
    except ValueError:
        raise ProtocolError(f"not a rayless debug endpoint (it said {line!r:.60})") from None
    nonce_c = protocol.new_nonce()
    proof = protocol.client_proof(key, nonce_s, nonce_c)
    conn.send_line(f"{nonce_c.hex()} {proof.hex()} {command}")
    answer = conn.readline().split(maxsplit=1)
    if not answer:
        raise ProtocolError("the debug listener closed the connection during the handshake")
    if answer[0] != "OK":
        raise AuthError(f"the actor refused: {' '.join(answer)}")
    try:
        given = bytes.fromhex(answer[1]) if len(answer) == 2 else b""
    except ValueError:
        given = b""
    if not protocol.proofs_match(protocol.server_proof(key, nonce_c, nonce_s), given):
        raise AuthError("the debug endpoint could not prove it knows the cluster token")
    return conn


def open_actor(record: dict[str, Any], token: str, command: str, timeout: float) -> LineSocket:
    """A connection to an actor's debug listener that sent ``command``.

    Raises:
        OSError: the listener cannot be reached or does not answer within ``timeout``.
        AuthError, DebugBusyError, ProtocolError: the handshake failed.
    """
    host, _, port = str(record["debug_address"]).removeprefix("tcp://").rpartition(":")
    sock = socket.create_connection((host.strip("[]"), int(port)), timeout=timeout)
    try:
        return client_handshake(sock, token, command)
    except BaseException:
        sock.close()
        raise


# -- breakpoints ---------------------------------------------------------------------------


@dataclass
class Pause:
    """A thread stopped at ``breakpoint()``, waiting for a client."""

    id: int
    where: str
    function: str
    thread: str
    since: float = field(default_factory=time.time)
    attached: queue.SimpleQueue[LineSocket] = field(default_factory=queue.SimpleQueue)

    def public(self) -> dict[str, Any]:
        """Plain values for ``list``."""
        return {"id": self.id, "where": self.where, "function": self.function,
                "thread": self.thread, "since": self.since}  # fmt: skip


class _SocketIO:
    """pdb's stdin and stdout over a connection; a lost client reads as end of input."""

    def __init__(self, conn: LineSocket) -> None:
        self.conn = conn
        self.closed = False

    def readline(self) -> str:
        if self.closed:
            return ""
        try:
            line = self.conn.readline(limit=1 << 20)
        except (OSError, ProtocolError):
            line = ""
        return line + "\n" if line else ""

    def write(self, text: str) -> int:
        if not self.closed:
            try:
                self.conn.sock.sendall(text.encode("utf-8", "replace"))
            except OSError:
                self.closed = True
        return len(text)

    def flush(self) -> None:
        pass

    def isatty(self) -> bool:
        return False

    def close(self) -> None:
        if not self.closed:
            self.closed = True
            try:
                self.conn.sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            self.conn.sock.close()


class RemotePdb(pdb.Pdb):
    """pdb over a connection: ``c`` and a lost client continue; ``q`` quits (BdbQuit)."""

    def __init__(self, io: _SocketIO) -> None:
        super().__init__(stdin=io, stdout=io, nosigint=True, readrc=False)  # type: ignore[arg-type]
        self.use_rawinput = False
        self._io = io

    def do_continue(self, arg: str) -> bool | None:
        self._io.close()
        return bool(super().do_continue(arg))

    do_c = do_cont = do_continue

    def do_quit(self, arg: str) -> bool | None:
        self._io.close()
        return bool(super().do_quit(arg))

    do_q = do_exit = do_quit

    def do_EOF(self, arg: str) -> bool | None:
        return self.do_continue(arg)  # the client went away: let the actor go on


# -- stacks --------------------------------------------------------------------------------


def _coroutine_frames(task: asyncio.Task[Any]) -> Iterator[FrameType]:
    """A task's frames, outermost first, following what each coroutine awaits."""
    coro: Any = task.get_coro()
    for _ in range(200):
        frame = getattr(coro, "cr_frame", None) or getattr(coro, "gi_frame", None)
        if frame is None:
            return
        yield frame
        coro = getattr(coro, "cr_await", None) or getattr(coro, "gi_yieldfrom", None)


def _frame_lines(frames: list[FrameType]) -> list[str]:
    summary = traceback.StackSummary.extract((f, f.f_lineno) for f in frames)
    return summary.format()


TASKS_FROM_LOOP_WAIT = 2.0  # seconds the loop gets to describe its tasks between steps


def format_stacks(
    title: str, loop: asyncio.AbstractEventLoop | None, skip: frozenset[int | None] = frozenset()
) -> str:
    """Every thread's Python stack (innermost call last) and every asyncio task's; the
    threads in ``skip`` (the listener's own) and the calling one are left out.

    The tasks are described by the loop's own thread, between two steps, when it gets to it
    within ``TASKS_FROM_LOOP_WAIT`` seconds: a coroutine in the middle of a step has no
    ``cr_await`` to follow, so a description taken from another thread then would stop at
    its outermost frame. A loop held longer (a method blocking it) is described from here,
    its running task marked as such; the thread part above shows where it is.
    """
    names = {t.ident: t.name for t in threading.enumerate()}
    me = threading.get_ident()
    parts = [title]
    for ident, frame in sorted(sys._current_frames().items()):
        if ident == me or ident in skip:
            continue
        stack: list[FrameType] = []
        f: FrameType | None = frame
        while f is not None:
            stack.append(f)
            f = f.f_back
        label = names.get(ident, "?")
        parts.append(f"\n--- thread {label} ({ident}) ---\n" + "".join(_frame_lines(stack[::-1])))
    if loop is not None and not loop.is_closed():
        parts.append(_tasks_text(loop))
    return "".join(parts)


def _tasks_text(loop: asyncio.AbstractEventLoop) -> str:
    """The stacks of ``loop``'s tasks, described on the loop between steps where it can."""
    described: concurrent.futures.Future[str] = concurrent.futures.Future()

    def describe() -> None:
        if described.set_running_or_notify_cancel():
            try:
                described.set_result(_describe_tasks(loop))
            except BaseException as exc:  # reported to the waiting listener thread
                described.set_exception(exc)

    try:
        on_loop = asyncio.get_running_loop() is loop
    except RuntimeError:
        on_loop = False
    if loop.is_running() and not on_loop:
        try:
            loop.call_soon_threadsafe(describe)
            return described.result(TASKS_FROM_LOOP_WAIT)
        except RuntimeError:  # closed meanwhile
            pass
        except concurrent.futures.TimeoutError:
            described.cancel()  # the loop is held: describe from here
    return _describe_tasks(loop)


def _describe_tasks(loop: asyncio.AbstractEventLoop) -> str:
    tasks: list[asyncio.Task[Any]] = []
    for _ in range(10):  # from another thread, the set may change under us
        try:
            tasks = list(asyncio.all_tasks(loop))
            break
        except RuntimeError:
            continue
    parts = []
    for task in sorted(tasks, key=lambda t: t.get_name()):
        frames = list(_coroutine_frames(task))
        body = "".join(_frame_lines(frames)) if frames else "  (not started or done)\n"
        if frames and getattr(task.get_coro(), "cr_running", False):
            body += "  (running a step now: its thread's stack shows where)\n"
        parts.append(f"\n--- asyncio task {task.get_name()} ---\n{body}")
    return "".join(parts)


# -- the actor's listener ------------------------------------------------------------------


class DebugServer:
    """The listener of one actor process (see the module docstring)."""

    def __init__(
        self, name: str, token: str, host: str = "127.0.0.1", title: str | None = None
    ) -> None:
        self.name = name
        self.title = f"actor {name}" if title is None else title  # how ``stack`` names it
        self.key = protocol.as_token(token)
        self.host = host
        self.handshake_timeout = HANDSHAKE_TIMEOUT  # the module's bounds, when it starts
        self.evict_after = EVICT_AFTER
        self._slots = threading.BoundedSemaphore(MAX_HANDSHAKES)
        # the connections handshaking now (when each was accepted), and those cut for a newcomer
        self._handshaking: dict[socket.socket, float] = {}
        self._evicted: set[socket.socket] = set()
        self._ratelog = RateLimitedLog(log, LOG_INTERVAL)
        # accepted: connections; refused: closed at once (max_handshakes under way);
        # rejected: wrong proof; timed_out: past the deadline; handshaking (peak): now (most);
        # accept_failed: accept() failed for want of fds or memory (retried after a pause);
        # evicted: cut, handshaking past evict_after, to give its slot to a newcomer
        self.stats = dict.fromkeys(
            ("accepted", "refused", "rejected", "timed_out", "handshaking", "peak"), 0
        )
        self.stats.update(accept_failed=0, evicted=0)
        self.loop: asyncio.AbstractEventLoop | None = None
        self.pauses: dict[int, Pause] = {}
        self._ids = itertools.count(1)
        self._lock = threading.Lock()
        self._sock: socket.socket | None = None
        self._thread: threading.Thread | None = None
        self.address = ""

    def start(self) -> str:
        """Listen and serve from a daemon thread; returns ``tcp://host:port``."""
        family = socket.AF_INET6 if ":" in self.host else socket.AF_INET
        sock = socket.socket(family, socket.SOCK_STREAM)
        sock.bind((self.host.strip("[]"), 0))
        sock.listen(16)
        self._sock = sock
        port = sock.getsockname()[1]
        host = f"[{self.host.strip('[]')}]" if family == socket.AF_INET6 else self.host
        self.address = f"tcp://{host}:{port}"
        self._thread = threading.Thread(target=self._accept, name="rayless-debug", daemon=True)
        self._thread.start()
        _LISTENING.add(self)
        return self.address

    def _forget_in_child(self) -> None:
        """In a forked child (a driver's DataLoader worker...): close the copies of the
        listening socket and of its connections, so that the port goes with the parent."""
        sock, self._sock, self._thread = self._sock, None, None
        with self._lock:
            handshaking = list(self._handshaking)
            self._handshaking.clear()
        for each in [sock, *handshaking]:
            if each is not None:
                each.close()  # (the child's descriptor only: the parent's listens on)

    def stop(self) -> None:
        """Stop listening, and cut the connections still handshaking (their threads end)."""
        sock, self._sock = self._sock, None
        if sock is not None:
            try:
                sock.shutdown(socket.SHUT_RDWR)  # wakes the accepting thread
            except OSError:
                pass
            sock.close()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout=5)
        _LISTENING.discard(self)
        with self._lock:
            handshaking = list(self._handshaking)
        for conn in handshaking:
            try:
                conn.shutdown(socket.SHUT_RDWR)  # wakes its thread's read
            except OSError:
                pass

    def _accept(self) -> None:
        backoff = 0.0
        while self._sock is not None:
            try:
                sock, _ = self._sock.accept()
            except OSError as exc:
                if self._sock is None or exc.errno not in _RETRY_ACCEPT:
                    return  # stopped
                # out of fds or memory (strangers may hold them): wait, never give up
                self._count("accept_failed")
                self._ratelog.warning(
                    "accept", "%s: debug listener cannot accept: %s", self.title, exc
                )
                backoff = min(1.0, max(0.05, backoff * 2))
                time.sleep(backoff)
                continue
            backoff = 0.0
            self._count("accepted")
            if not self._take_slot():  # strangers cannot pile up threads
                self._count("refused")
                self._ratelog.warning(
                    "refused",
                    "%s: refused a debug connection (%d handshakes already under way)",
                    self.title,
                    self.stats["handshaking"],
                )
                _refuse(sock)
                continue
            self._count("handshaking")
            with self._lock:
                self._handshaking[sock] = time.monotonic()
            thread = threading.Thread(
                target=self._serve, args=(sock,), name="rayless-debug-handshake", daemon=True
            )
            try:
                thread.start()
            except RuntimeError:  # no more threads: give the slot back, drop the client
                self._release(sock)
                sock.close()

    def _take_slot(self) -> bool:
        """A handshake slot for a new connection: a free one, or the one of the oldest
        stranger handshaking for longer than ``evict_after`` (cut now: its thread gives the
        slot back as it wakes). False when every slot is younger (the listener is busy)."""
        if self._slots.acquire(blocking=False):
            return True
        now = time.monotonic()
        with self._lock:
            old = [
                (since, sock)
                for sock, since in self._handshaking.items()
                if sock not in self._evicted and now - since > self.evict_after
            ]
            if not old:
                return False
            _, oldest = min(old, key=lambda pair: pair[0])
            self._evicted.add(oldest)
            self.stats["evicted"] += 1
        try:
            oldest.shutdown(socket.SHUT_RDWR)  # wakes its thread's read
        except OSError:
            pass
        return self._slots.acquire(timeout=5.0)

    def _count(self, what: str, n: int = 1) -> None:
        with self._lock:
            self.stats[what] += n
            self.stats["peak"] = max(self.stats["peak"], self.stats["handshaking"])

    def _release(self, sock: socket.socket) -> None:
        with self._lock:
            self._handshaking.pop(sock, None)
            self._evicted.discard(sock)
        self._count("handshaking", -1)
        self._slots.release()

    def _was_evicted(self, sock: socket.socket) -> bool:
        with self._lock:
            return sock in self._evicted

    def _serve(self, sock: socket.socket) -> None:
        handed_off = False
        authenticated = False
        try:
            conn = LineSocket(sock, time.monotonic() + self.handshake_timeout)
            sock.settimeout(self.handshake_timeout)
            nonce_s = protocol.new_nonce()
            conn.send_line(f"{MAGIC} {nonce_s.hex()}")
            parts = conn.readline().split(maxsplit=2)
            try:
                nonce_c, proof = bytes.fromhex(parts[0]), bytes.fromhex(parts[1])
            except (IndexError, ValueError):
                nonce_c, proof = b"", b""
            expected = protocol.client_proof(self.key, nonce_s, nonce_c)
            if len(parts) != 3 or not protocol.proofs_match(expected, proof):
                if self._was_evicted(sock):
                    return  # cut for a newcomer (counted then), not a wrong token
                self._count("rejected")
                self._ratelog.warning(
                    "rejected", "%s: rejected a debug client (no valid token)", self.title
                )
                conn.send_line("ERR authentication failed")
                return
            conn.send_line(f"OK {protocol.server_proof(self.key, nonce_c, nonce_s).hex()}")
            conn.deadline = None
            sock.settimeout(None)
            authenticated = True
            self._release(sock)  # a token holder's session no longer counts as a handshake
            handed_off = self._command(conn, parts[2].strip())
        except TimeoutError:
            self._count("timed_out")
        except (OSError, ProtocolError):
            pass
        finally:
            if not authenticated:
                self._release(sock)
            if not handed_off:
                sock.close()

    def _command(self, conn: LineSocket, command: str) -> bool:
        """Answer one command; True when the connection now belongs to a pdb session."""
        if command == "stack":
            title = f"{self.title} (pid {os.getpid()})"
            skip = frozenset({self._thread.ident if self._thread is not None else None})
            text = format_stacks(title, self.loop, skip)
            conn.sock.sendall(text.encode("utf-8", "replace"))
        elif command == "list":
            with self._lock:
                pauses = [p.public() for p in self.pauses.values()]
            conn.send_line(json.dumps(pauses))
        elif command == "metrics":
            conn.sock.sendall(callstats.dump().encode("utf-8"))
        elif command == "timeline" or command.startswith("timeline "):
            conn.sock.sendall(timeline.dump(command.removeprefix("timeline")).encode("utf-8"))
        elif command.startswith("attach "):
            try:
                wanted = int(command.split()[1])
            except ValueError:
                wanted = -1
            with self._lock:
                pause = self.pauses.pop(wanted, None)
            if pause is None:
                conn.send_line("ERR no such paused breakpoint (someone else attached?)")
                return False
            conn.send_line(f"READY {self.name} {pause.where}")
            pause.attached.put(conn)
            return True
        else:
            conn.send_line(f"ERR unknown command {command!r:.40}")
        return False

    def breakpoint(self, frame: FrameType) -> None:
        """Pause the calling thread at ``frame`` until a client attaches, then run pdb."""
        code = frame.f_code
        pause = Pause(
            next(self._ids),
            f"{code.co_filename}:{frame.f_lineno}",
            code.co_name,
            threading.current_thread().name,
        )
        with self._lock:
            self.pauses[pause.id] = pause
        print(
            f"rayless: actor {self.name} paused at breakpoint() in {code.co_name} "
            f"({pause.where}): run `rayless debug` to attach",
            file=sys.stderr,
            flush=True,
        )
        conn = pause.attached.get()
        RemotePdb(_SocketIO(conn)).set_trace(frame)


_LISTENING: weakref.WeakSet[DebugServer] = weakref.WeakSet()  # started, not stopped


def _forget_listeners_in_child() -> None:
    for server in list(_LISTENING):
        server._forget_in_child()
    _LISTENING.clear()


os.register_at_fork(after_in_child=_forget_listeners_in_child)


def _refuse(sock: socket.socket) -> None:
    """Say ``BUSY`` (one line, never waiting: a fresh socket's send buffer is empty) and
    close, so that the client can tell a busy listener from something else."""
    try:
        sock.setblocking(False)
        sock.send(f"{BUSY} {MAX_HANDSHAKES} handshakes under way: try again\n".encode())
    except OSError:
        pass
    sock.close()


_server: DebugServer | None = None


def _hook(*args: Any, **kwargs: Any) -> None:
    """``sys.breakpointhook`` of an actor process."""
    if _server is None:
        return sys.__breakpointhook__(*args, **kwargs)
    announce()  # a breakpoint in the constructor or setup comes before the actor is ready
    _server.breakpoint(sys._getframe(1))


def install(
    name: str,
    actor_id: str,
    token: str,
    host: str,
    head_address: str,
    loop: asyncio.AbstractEventLoop,
) -> DebugServer | None:
    """Start this actor's listener and route ``breakpoint()`` to it (the constructor and
    ``setup`` included); :func:`announce` registers it with the head. None when
    RAYLESS_DEBUG=0."""
    global _server, _announcement
    if os.environ.get(ENV_DEBUG, "1") == "0":
        return None
    if protocol.curve_enabled(None):  # this listener is not encrypted: keep it on the host
        host = "127.0.0.1"
    server = DebugServer(name, token, host)
    server.loop = loop
    try:
        address = server.start()
    except OSError as exc:
        print(f"rayless: actor {name}: no debug listener ({exc})", file=sys.stderr)
        return None
    _server = server
    if "PYTHONBREAKPOINT" not in os.environ:
        sys.breakpointhook = _hook
    _announcement = (head_address, token, DebugRegister(actor_id, address, os.getpid()))
    return server


_announcement: tuple[str, str, DebugRegister] | None = None


def announce() -> None:
    """Register the listener with the head, from a thread (after the actor reported ready,
    so that its spawn never waits for this; ``rayless stack`` retries meanwhile)."""
    global _announcement
    announcement, _announcement = _announcement, None  # once
    if announcement is not None:
        threading.Thread(target=_register, args=announcement, daemon=True).start()


def _register(head_address: str, token: str, registration: DebugRegister) -> None:
    from rayless.transport.client import Client
    from rayless.transport.errors import RaylessError

    async def go() -> None:
        async with Client(head_address, token=token, name="debug-register") as client:
            await ask(client, registration, timeout=30)

    try:
        asyncio.run(go())
    except (RaylessError, OSError) as exc:
        print(f"rayless: debug listener not registered with the head: {exc}", file=sys.stderr)


# -- a driver's listener -------------------------------------------------------------------


def driver_wanted() -> bool:
    """Whether a driver runs a listener: when it records a timeline (unless
    ``RAYLESS_TIMELINE=0``), or ``RAYLESS_DEBUG=1`` says so; never with ``RAYLESS_DEBUG=0``."""
    flag = os.environ.get(ENV_DEBUG, "").strip()
    if flag == "0":
        return False
    return flag == "1" or timeline.enabled()


def host_toward(head_address: str) -> str:
    """This host's address on the route to the head (where the head's other clients can
    reach it too): loopback for a head on loopback or under RAYLESS_CURVE (the listener is
    not encrypted: it stays on the host, as an actor's does)."""
    host = head_address.removeprefix("tcp://").rpartition(":")[0].strip("[]")
    if protocol.curve_enabled(None) or host in ("", "localhost", "127.0.0.1", "::1"):
        return "127.0.0.1"
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    try:
        with socket.socket(family, socket.SOCK_DGRAM) as probe:
            probe.connect((host, 9))  # a UDP "connect" sends nothing: it picks the route
            local = str(probe.getsockname()[0])
    except OSError:
        return "127.0.0.1"
    return f"[{local}]" if family == socket.AF_INET6 else local


def start_driver(
    token: str, head_address: str, loop: asyncio.AbstractEventLoop
) -> DebugServer | None:
    """A driver's listener, started (``stack``, ``timeline``, ``metrics`` of this process;
    ``breakpoint()`` stays the terminal's own pdb); the driver's runtime registers it with
    the head under its session and stops it when it closes. None when not wanted
    (:func:`driver_wanted`) or when it cannot listen."""
    if not driver_wanted():
        return None
    server = DebugServer(DRIVER, token, host_toward(head_address), title=DRIVER)
    server.loop = loop
    try:
        server.start()
    except OSError as exc:
        print(f"rayless: driver: no debug listener ({exc})", file=sys.stderr)
        return None
    return server
