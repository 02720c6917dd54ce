"""The fork template ("zygote") of a host: forks actor processes with heavy modules imported.

Importing torch and tensordict costs ~2 s and ~300 MB per process on these machines; forking a
process that already imported them costs milliseconds, and the children share those pages.
One zygote serves every node agent on its host over a private UNIX socket (in a 0700
directory). It never creates a ZeroMQ context, threads or a CUDA context, so forking it is
safe; each child sets its own environment (CUDA_VISIBLE_DEVICES first) before touching CUDA.

Protocol: length-prefixed (4 bytes, big endian) codec headers of the typed messages of
``actors.protocol.zygote_messages``:
    agent → zygote  Fork(tag, env, log, cwd, token) / Preload(module)
    zygote → agent  Forked(tag, pid) / ForkFailed(tag, error)
                    Exited(pid, code)   (code < 0: killed by signal -code)
                    Preloaded(module, ok, error)
A frame that does not decode, or a message of another type, closes the connection (the
socket is private to the host's agents: such a peer is broken, not hostile). A connection
that closes takes its children with it (SIGKILL). The zygote itself is started
without the token (its environment, inherited by every fork, never holds one); a forked child
gets the token of its fork request in memory, never in its environment.

An actor's own children die with it: each forked actor leads its own process group (its
children inherit it), and the zygote is a child subreaper (PR_SET_CHILD_SUBREAPER), so
descendants that escaped the group (``setsid``) are reparented here. When an actor exits
(kill -9 included), the zygote SIGKILLs its group and every orphan reparented to it.

A forked child's environment is the one its fork request carries (the agent's, whole), not
the template's, so a template can outlive the environment it started in. ``--shared``
marks a template that serves the local clusters of one process in turn
(``rayless.actors.launch.templates``). It preloads only modules of installed packages
(:func:`installed`), because a module of the user's tree may change between those clusters.
A preload that fails removes what it imported, so that a package of the same name found
on the template's path does not shadow the actor's own.

Run as ``python -m rayless.actors.host.zygote SOCKET_PATH [--template torch|light]
[--shared]``; prints "ready" once it listens.

Two templates per host. The *torch* template (the default, ``--template torch``) holds torch
and tensordict; the *light* one (``--template light``) never imports them, only the runtime's
own modules (:data:`LIGHT_PRELOAD`, ~0.3 s), so it can fork at once while the torch template
is still warming up. A spawn picks one with ``SpawnSpec.template``
(``rayless.actors.protocol.messages.Template``): user actors get the torch template unless
they ask otherwise; rayless's own torch-free actors (the store's controller) ask for the
light one. A light child that imports torch works, only slower (the import, ~2 s,
and its memory are its own). One template that forked light children during its torch
warm-up was the other design: it would have to import torch in a thread and fork beside it,
which leaves a half-imported torch and a held import lock in the child.

The torch template's default, ``RAYLESS_ZYGOTE_PRELOAD=eager``, warms up in the background:
it listens and prints "ready" first (so a cluster is up without waiting for torch), then
imports the heavy modules before it serves its first request; a fork asked for meanwhile
waits in the socket's queue until they are in (only if the warm-up has not finished).
``lazy`` defers the imports to the first fork: an idle cluster then costs ~30 MB per host
instead of ~300 MB, and the first torch actor on a host waits ~2 s for them (later ones fork
as fast as ever). ``demand`` never imports them of its own: the template holds what the light
one holds plus the modules of the actor classes it was asked to fork (each spawn's module is
imported in the template first, as in every mode), so torch enters it with the first actor
whose module imports torch, and a cluster whose actors never do never pays for it (~3 CPU-s
per host; the test suite runs this way). An actor that imports torch only inside a method
then pays the import in its own process. Measured on the 2-core machine:
docs/performance.md ("Start-up").
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import importlib.util
import os
import selectors
import signal
import socket
import sys
import sysconfig
import time
import traceback
from typing import Any

from rayless.actors.control.process_util import (
    become_subreaper,
    die_with_parent,
    kill_group,
    kill_orphans,
)
from rayless.actors.core.preload import preload_mode
from rayless.actors.protocol.wire import Handlers
from rayless.actors.protocol.zygote_messages import (
    LENGTH,
    MAX_FRAME,
    Exited,
    Fork,
    Forked,
    ForkFailed,
    Preload,
    Preloaded,
    ZygoteMessage,
    pack,
    unpack,
)
from rayless.transport.errors import ProtocolError
from rayless.transport.files import open_append

PRELOAD = ("torch", "tensordict", "rayless.transport.codec", "rayless.actors.host.process")
LIGHT_PRELOAD = ("rayless.transport.codec", "rayless.actors.host.process")


class _Conn:
    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.buf = bytearray()
        self.children: set[int] = set()

    def send(self, msg: ZygoteMessage) -> None:
        try:
            self.sock.sendall(pack(msg))
        except OSError:
            pass

    def messages(self) -> list[object]:
        """The whole messages received so far.

        Raises:
            ProtocolError: a frame too large, or one that does not decode.
        """
        out = []
        while len(self.buf) >= 4:
            (size,) = LENGTH.unpack_from(self.buf)
            if size > MAX_FRAME:
                raise ProtocolError("frame too large")
            if len(self.buf) < 4 + size:
                break
            out.append(unpack(bytes(self.buf[4 : 4 + size])))
            del self.buf[: 4 + size]
        return out


class Zygote:
    """The fork server's loop; ``modules``: what it imports before its first fork."""

    def __init__(
        self, path: str, modules: tuple[str, ...] = PRELOAD, *, shared: bool = False
    ) -> None:
        self.path = path
        self.modules = modules
        self.shared = shared
        self.sel = selectors.DefaultSelector()
        self.listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.conns: dict[int, _Conn] = {}
        self.owner: dict[int, _Conn] = {}
        self.wake_r, self.wake_w = os.pipe()
        self.running = True
        self.preloaded = False
        self.warming = False
        self.requests: Handlers[_Conn] = Handlers("zygote")
        self.requests.on(Fork, self._fork)
        self.requests.on(Preload, self._preload)

    def start(self) -> None:
        """Bind the socket and handle signals (the heavy imports come later: :meth:`warm_up`,
        or the first fork)."""
        if os.path.exists(self.path):
            os.unlink(self.path)
        self.listener.bind(self.path)
        os.chmod(self.path, 0o600)
        self.listener.listen(64)
        self.sel.register(self.listener, selectors.EVENT_READ, "accept")
        os.set_blocking(self.wake_w, False)
        os.set_blocking(self.wake_r, False)
        signal.set_wakeup_fd(self.wake_w)
        signal.signal(signal.SIGCHLD, lambda *_: None)
        signal.signal(signal.SIGTERM, self._stop)
        signal.signal(signal.SIGINT, self._stop)
        signal.signal(signal.SIGHUP, self._stop)
        self.sel.register(self.wake_r, selectors.EVENT_READ, "wake")
        become_subreaper()

    def warm_up(self) -> None:
        """Import the heavy modules now (after "ready": requests queue in the socket's backlog
        meanwhile). A SIGTERM during it ends the process at once (``os._exit``, its socket
        removed first): nothing was forked yet."""
        self.warming = True
        try:
            self._preload_all()
        finally:
            self.warming = False

    def _preload_all(self) -> None:
        for name in self.modules:
            importlib.import_module(name)
        self.preloaded = True

    def _stop(self, *_: Any) -> None:
        self.running = False
        if self.warming:  # no children yet; do not finish importing torch to exit
            # at once: an exception raised here would unwind through torch's C++ import code
            # (pybind11 aborts on it), and nothing but the socket needs cleaning up
            with contextlib.suppress(OSError):
                os.unlink(self.path)
            os._exit(0)

    def run(self) -> None:
        """Serve until SIGTERM; then kill every child."""
        while self.running:
            for key, _ in self.sel.select(timeout=1.0):
                if key.data == "accept":
                    sock, _addr = self.listener.accept()
                    conn = _Conn(sock)
                    self.conns[sock.fileno()] = conn
                    self.sel.register(sock, selectors.EVENT_READ, "conn")
                elif key.data == "wake":
                    try:
                        os.read(self.wake_r, 4096)
                    except BlockingIOError:
                        pass
                    self._reap()
                else:
                    self._on_readable(self.conns[key.fd])
            self._reap()
        for pid in list(self.owner):
            kill_group(pid)
        deadline = time.monotonic() + 2.0  # reap them; kill what they leave reparented here
        while self.owner and time.monotonic() < deadline:
            self._reap()
            time.sleep(0.01)
        self._reap()
        kill_orphans(set())
        try:
            os.unlink(self.path)
        except OSError:
            pass

    def _on_readable(self, conn: _Conn) -> None:
        try:
            data = conn.sock.recv(65536)
        except OSError:
            data = b""
        if not data:
            return self._drop(conn)
        conn.buf += data
        try:
            messages = conn.messages()
        except Exception:
            return self._drop(conn)
        for msg in messages:
            try:
                self.requests.handle(conn, msg)
            except ProtocolError as exc:
                print(f"rayless zygote: {exc}; closing the connection", file=sys.stderr)
                return self._drop(conn)

    def _drop(self, conn: _Conn) -> None:
        self.sel.unregister(conn.sock)
        self.conns.pop(conn.sock.fileno(), None)
        conn.sock.close()
        for pid in conn.children:  # an agent that goes takes its actors along
            kill_group(pid)

    def _preload(self, conn: _Conn, msg: Preload) -> None:
        if self.shared and not installed(msg.module):
            conn.send(Preloaded(msg.module, False, "not a module of an installed package"))
            return
        before = set(sys.modules)
        try:
            importlib.import_module(msg.module)
            ok, error = True, ""
        except BaseException as exc:  # a user module may raise anything, even SystemExit
            ok, error = False, f"{type(exc).__name__}: {exc}"
            # what the failed import left (a parent package found elsewhere on this path, a
            # namespace package of another project's ``tests``) would shadow the actor's own
            for name in set(sys.modules) - before:
                del sys.modules[name]
        conn.send(Preloaded(msg.module, ok, error))

    def _fork(self, conn: _Conn, msg: Fork) -> None:
        tag = msg.tag
        if not self.preloaded:  # lazy mode: the first fork pays for the imports
            self._preload_all()
        try:
            pid = os.fork()
        except OSError as exc:
            conn.send(ForkFailed(tag, str(exc)))
            return
        if pid == 0:  # the child: never returns
            code = 1
            try:
                self._become_child(msg)
                from rayless.actors.host.process import child_main

                code = child_main(msg.token or None)
            except BaseException:
                traceback.print_exc()
            finally:
                sys.stdout.flush()
                sys.stderr.flush()
                os._exit(code)
        conn.children.add(pid)
        self.owner[pid] = conn
        conn.send(Forked(tag, pid))

    def _become_child(self, msg: Fork) -> None:
        os.setpgid(0, 0)  # lead a process group: the actor's children join it
        signal.set_wakeup_fd(-1)
        for sig in (signal.SIGCHLD, signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
            signal.signal(sig, signal.SIG_DFL)
        self.sel.close()
        self.listener.close()
        for c in self.conns.values():
            c.sock.close()
        os.close(self.wake_r)
        os.close(self.wake_w)
        die_with_parent(signal.SIGKILL)
        log = msg.log
        if log:
            fd = open_append(log)
            os.dup2(fd, 1)
            os.dup2(fd, 2)
            os.close(fd)
        sys.stdout = os.fdopen(1, "w", buffering=1, closefd=False)
        sys.stderr = os.fdopen(2, "w", buffering=1, closefd=False)
        os.environ.clear()  # the agent's environment, whenever the template started
        os.environ.update(msg.env)
        for name in ("RAYLESS_TOKEN", "RAYLESS_TOKEN_FILE", "RAYLESS_TOKEN_FD"):
            os.environ.pop(name, None)  # the token comes in the fork request only
        cwd = msg.cwd
        if cwd is not None and os.path.isdir(cwd):
            os.chdir(cwd)

    def _reap(self) -> None:
        while True:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            conn = self.owner.pop(pid, None)
            if conn is not None:  # an actor: what it started goes with it
                kill_group(pid)
            kill_orphans(set(self.owner))  # (an orphan's own children are orphans too)
            if conn is not None:
                conn.children.discard(pid)
                conn.send(Exited(pid, os.waitstatus_to_exitcode(status)))


def installed(module: str) -> bool:
    """Whether ``module`` belongs to an installed package (the standard library,
    site-packages, rayless): what a template shared by several clusters may import ahead.
    A module of the user's source tree may change between those clusters; it is not."""
    top = module.partition(".")[0]
    if top == "rayless" or top in sys.builtin_module_names:
        return True
    try:
        spec = importlib.util.find_spec(top)  # a top-level name: imports nothing
    except (ImportError, ValueError):
        return False
    if spec is None:
        return False
    where = spec.origin if spec.origin not in (None, "built-in", "frozen") else None
    if where is None and spec.submodule_search_locations:
        where = next(iter(spec.submodule_search_locations), None)
    if where is None:
        return spec.origin in ("built-in", "frozen")
    roots = {sysconfig.get_path(name) for name in ("stdlib", "platstdlib", "purelib", "platlib")}
    real = os.path.realpath(where)
    return any(r and real.startswith(os.path.realpath(r) + os.sep) for r in roots)


def main() -> None:
    """Entry point of ``python -m rayless.actors.host.zygote SOCKET_PATH [--template T]``."""
    parser = argparse.ArgumentParser(prog="python -m rayless.actors.host.zygote")
    parser.add_argument("socket_path")
    parser.add_argument("--template", choices=("torch", "light"), default="torch")
    parser.add_argument(
        "--shared",
        action="store_true",
        help="serve the clusters of one process in turn (actors.launch.templates): "
        "preload only modules of installed packages",
    )
    args = parser.parse_args()
    light = args.template == "light"
    if os.environ.get("RAYLESS_DIE_WITH_PARENT"):
        die_with_parent()
    for name in ("RAYLESS_TOKEN", "RAYLESS_TOKEN_FILE", "RAYLESS_TOKEN_FD"):
        os.environ.pop(name, None)  # the fork template never needs the cluster token
    mode = "eager" if light else preload_mode()
    modules = LIGHT_PRELOAD if light or mode == "demand" else PRELOAD
    zygote = Zygote(args.socket_path, modules, shared=args.shared)
    zygote.start()
    print("ready", flush=True)
    if mode != "lazy":
        zygote.warm_up()
    zygote.run()


if __name__ == "__main__":
    main()
