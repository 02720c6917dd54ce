"""How a node agent starts actor processes: forked by the zygote, or as fresh interpreters.

Both report every exit as ``on_exit(pid, code)`` (code < 0: killed by signal -code).
:class:`ZygoteSpawner` falls back to :class:`ProcessSpawner` if its zygote goes away.

Neither puts the cluster token in an actor's environment (``/proc/<pid>/environ`` would show
it to the actor's children for the process's life): the zygote hands it to the forked child
in memory (from the fork request, over its private socket); a fresh interpreter reads it from
an inherited pipe (RAYLESS_TOKEN_FD).
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import os
import shutil
import signal
import sys
from collections.abc import Callable
from typing import Protocol

from rayless.actors.control.process_util import kill_group
from rayless.actors.core import context
from rayless.actors.errors import StartError
from rayless.actors.protocol.messages import Template
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
from rayless.transport import owners
from rayless.transport.errors import ProtocolError
from rayless.transport.files import open_append

log = logging.getLogger("rayless.agent")
LOST_NOTICE_DELAY = 1.0  # seconds before a lost template is reported (see ZygoteSpawner._lost)
OnExit = Callable[[int, int], None]


class Spawner(Protocol):
    """Starts actor processes and reports their exits."""

    async def start(self, on_exit: OnExit) -> None:
        """Get ready; ``on_exit(pid, code)`` will be called for every exit."""

    async def spawn(self, env: dict[str, str], log_path: str, cwd: str | None) -> int:
        """Start an actor process with ``env`` (added to ours); returns its pid."""

    async def preload(self, module: str) -> None:
        """Import ``module`` ahead of forks, where that is possible (best effort)."""

    def stopping(self) -> None:
        """The agent is stopping: a template that goes away now is no failure."""

    async def aclose(self) -> None:
        """Stop; processes still running are killed."""


class ProcessSpawner:
    """Starts ``python -m rayless.actors.host.process`` per actor (slower: imports anew).

    ``argv`` is the command that starts the Python: this process's interpreter by default,
    or another one (an actor's ``executable``: a venv's ``python``, ``uv run --extra x``),
    which must be able to import rayless.
    """

    def __init__(self, token: str = "", argv: tuple[str, ...] = ()) -> None:
        self._token = token
        self._argv = argv or (sys.executable,)
        self._on_exit: OnExit = lambda pid, code: None
        self._procs: dict[int, asyncio.subprocess.Process] = {}
        self._waiters: set[asyncio.Task[None]] = set()

    async def start(self, on_exit: OnExit) -> None:
        self._on_exit = on_exit

    async def spawn(self, env: dict[str, str], log_path: str, cwd: str | None) -> int:
        child_env = {**context.without_token({**os.environ, **env}), "RAYLESS_DIE_WITH_PARENT": "1"}
        fd = context.token_pipe(self._token)
        child_env[context.ENV_TOKEN_FD] = str(fd)
        try:
            with open(open_append(log_path), "ab") as out:
                proc = await asyncio.create_subprocess_exec(
                    *self._argv,
                    "-m",
                    "rayless.actors.host.process",
                    env=child_env,
                    stdin=asyncio.subprocess.DEVNULL,
                    stdout=out,
                    stderr=asyncio.subprocess.STDOUT,
                    cwd=cwd if cwd and os.path.isdir(cwd) else None,
                    pass_fds=(fd,),
                    start_new_session=True,  # its own process group: its children die with it
                )
        finally:
            os.close(fd)
        self._procs[proc.pid] = proc
        task = asyncio.ensure_future(self._wait(proc))
        self._waiters.add(task)
        task.add_done_callback(self._waiters.discard)
        return proc.pid

    async def _wait(self, proc: asyncio.subprocess.Process) -> None:
        code = await proc.wait()
        kill_group(proc.pid)
        self._procs.pop(proc.pid, None)
        self._on_exit(proc.pid, code)

    async def preload(self, module: str) -> None:
        return None

    def stopping(self) -> None:
        return None

    async def aclose(self) -> None:
        for proc in list(self._procs.values()):
            try:
                proc.kill()
            except ProcessLookupError:
                pass
        if self._waiters:
            await asyncio.wait(list(self._waiters), timeout=5)


class ZygoteSpawner:
    """Forks actors from a zygote: ``path`` of a running one, or ``"auto"`` to start our own
    (a ``template`` one: ``Template.LIGHT`` never imports torch)."""

    def __init__(
        self,
        path: str = "auto",
        *,
        start_timeout: float = 120.0,
        token: str = "",
        template: Template = Template.TORCH,
    ) -> None:
        self._path = path
        self._template = template
        self._token = token
        self._start_timeout = start_timeout
        self._own: asyncio.subprocess.Process | None = None
        self._tmpdir: str | None = None
        self._reader: asyncio.StreamReader | None = None
        self._writer: asyncio.StreamWriter | None = None
        self._waiting: dict[int, asyncio.Future[Forked | ForkFailed]] = {}
        self._tags = itertools.count(1)
        self._preloaded: dict[str, asyncio.Future[Preloaded]] = {}
        self._pids: set[int] = set()
        self._on_exit: OnExit = lambda pid, code: None
        self._task: asyncio.Task[None] | None = None
        self._fallback: ProcessSpawner | None = None
        self._closing = False
        self._replies: Handlers[None] = Handlers("zygote client")
        self._replies.on(Forked, self._on_fork)
        self._replies.on(ForkFailed, self._on_fork)
        self._replies.on(Exited, self._on_exited)
        self._replies.on(Preloaded, self._on_preloaded)

    async def start(self, on_exit: OnExit) -> None:
        self._on_exit = on_exit
        path = self._path
        if path == "auto":
            path = await self._start_own()
        try:
            self._reader, self._writer = await asyncio.open_unix_connection(path)
        except OSError as exc:
            raise StartError(f"cannot reach the zygote at {path}: {exc}") from None
        self._task = asyncio.ensure_future(self._read())

    async def _start_own(self) -> str:
        self._tmpdir = owners.mkdtemp("rayless-zygote-")
        path = os.path.join(self._tmpdir, "zygote.sock")
        self._own = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "rayless.actors.host.zygote",
            path,
            "--template",
            self._template.value,
            stdout=asyncio.subprocess.PIPE,
            env={**context.without_token(os.environ), "RAYLESS_DIE_WITH_PARENT": "1"},
        )
        assert self._own.stdout is not None  # internal invariant: stdout=PIPE
        try:
            line = await asyncio.wait_for(self._own.stdout.readline(), self._start_timeout)
        except asyncio.TimeoutError:
            line = b""
        if line.strip() != b"ready":
            self._own.kill()
            await self._own.wait()
            raise StartError("the zygote did not start (see the agent's stderr)")
        return path

    async def _read(self) -> None:
        assert self._reader is not None  # internal invariant: set by start()
        try:
            while True:
                header = await self._reader.readexactly(4)
                (size,) = LENGTH.unpack(header)
                if size > MAX_FRAME:
                    raise ProtocolError(f"a zygote frame of {size} bytes")
                self._replies.handle(None, unpack(await self._reader.readexactly(size)))
        except ProtocolError as exc:
            log.error("the zygote sent what this agent cannot read (%s)", exc)
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            self._lost()

    def _notice_lost(self) -> None:
        if not self._closing:
            log.warning("zygote connection lost; starting actors as fresh processes from now on")

    def stopping(self) -> None:
        self._closing = True

    def _on_fork(self, _: None, msg: Forked | ForkFailed) -> None:
        fut = self._waiting.pop(msg.tag, None)
        if fut is not None and not fut.done():
            fut.set_result(msg)

    def _on_exited(self, _: None, msg: Exited) -> None:
        self._pids.discard(msg.pid)
        self._on_exit(msg.pid, msg.code)

    def _on_preloaded(self, _: None, msg: Preloaded) -> None:
        fut = self._preloaded.get(msg.module)
        if fut is not None and not fut.done():
            fut.set_result(msg)

    def _lost(self) -> None:
        """The zygote is gone: its children died with it; report them, fall back. Said a
        second later, unless the agent is stopping by then: a driver that exits without
        closing its local cluster ends the template and the agent at once (the kernel's
        parent-death signal), and the agent may read the template's end before its own
        SIGTERM."""
        if not self._closing:
            asyncio.get_running_loop().call_later(LOST_NOTICE_DELAY, self._notice_lost)
        for fut in self._waiting.values():
            if not fut.done():
                fut.set_exception(StartError("the zygote went away"))
        for pid in list(self._pids):
            self._pids.discard(pid)
            self._on_exit(pid, -signal.SIGKILL)
        self._writer = None

    def _send(self, msg: ZygoteMessage) -> None:
        if self._writer is None:
            raise StartError("no zygote")
        self._writer.write(pack(msg))

    async def spawn(self, env: dict[str, str], log_path: str, cwd: str | None) -> int:
        if self._writer is None:
            if self._fallback is None:
                self._fallback = ProcessSpawner(self._token)
                await self._fallback.start(self._on_exit)
            return await self._fallback.spawn(env, log_path, cwd)
        tag = next(self._tags)
        fut: asyncio.Future[Forked | ForkFailed] = asyncio.get_running_loop().create_future()
        self._waiting[tag] = fut
        whole = {**context.without_token(os.environ), **env}  # the child's whole environment
        self._send(Fork(tag, whole, log_path, cwd, self._token))  # over the private socket
        # the first fork may wait for the zygote's warm-up (torch imports): allow for it
        reply = await asyncio.wait_for(fut, max(30.0, self._start_timeout))
        if isinstance(reply, ForkFailed):
            raise StartError(f"the zygote could not fork: {reply.error}")
        pid = reply.pid
        self._pids.add(pid)
        return pid

    async def preload(self, module: str) -> None:
        if self._writer is None or os.environ.get("RAYLESS_PRELOAD_USER_MODULES") == "0":
            return
        fut = self._preloaded.get(module)
        if fut is None:
            fut = asyncio.get_running_loop().create_future()
            self._preloaded[module] = fut
            self._send(Preload(module))
        try:
            reply = await asyncio.wait_for(asyncio.shield(fut), 60)
        except asyncio.TimeoutError:
            return
        if not reply.ok:
            log.info("zygote could not preload %s: %s", module, reply.error)

    async def aclose(self) -> None:
        self._closing = True
        if self._writer is not None:
            self._writer.close()  # the zygote kills this connection's children
        if self._task is not None:
            try:
                await asyncio.wait_for(self._task, 5)
            except (asyncio.TimeoutError, asyncio.CancelledError):
                self._task.cancel()
        if self._fallback is not None:
            await self._fallback.aclose()
        if self._own is not None and self._own.returncode is None:
            self._own.terminate()
            try:
                await asyncio.wait_for(self._own.wait(), 5)
            except asyncio.TimeoutError:
                self._own.kill()
                await self._own.wait()
        if self._tmpdir is not None:
            shutil.rmtree(self._tmpdir, ignore_errors=True)


def same_interpreter(argv: tuple[str, ...]) -> bool:
    """Whether ``argv`` is this process's own interpreter: the same binary in the same
    directory (a venv's ``python3`` beside its ``python``; not the base interpreter a venv's
    link points to, whose packages differ), with no arguments."""
    if len(argv) != 1:
        return False
    found = shutil.which(argv[0])
    if found is None:
        return False
    mine, theirs = os.path.abspath(sys.executable), os.path.abspath(found)
    return os.path.dirname(mine) == os.path.dirname(theirs) and os.path.realpath(
        mine
    ) == os.path.realpath(theirs)


class Spawners:
    """A node agent's spawners: one per fork template, and a :class:`ProcessSpawner` per
    other interpreter an actor asks for (its ``executable``), made at its first use."""

    def __init__(self, by_template: dict[Template, Spawner], token: str) -> None:
        self._by_template = by_template
        self._token = token
        self._by_argv: dict[tuple[str, ...], ProcessSpawner] = {}
        self._on_exit: OnExit = lambda pid, code: None

    def distinct(self) -> list[Spawner]:
        """Every spawner, each once (a template's may be another's)."""
        out: list[Spawner] = []
        for spawner in [*self._by_template.values(), *self._by_argv.values()]:
            if all(spawner is not s for s in out):
                out.append(spawner)
        return out

    async def start(self, on_exit: OnExit) -> None:
        """Start the templates' spawners; ``on_exit`` hears every spawner's exits."""
        self._on_exit = on_exit
        for spawner in self.distinct():
            await spawner.start(on_exit)

    async def get(self, template: Template, executable: tuple[str, ...]) -> Spawner:
        """The spawner of an actor of ``template`` run by ``executable`` (empty: ours).

        Raises:
            StartError: ``executable``'s command is not found on this node.
        """
        if not executable or same_interpreter(executable):  # forked from the template
            return self._by_template[template]
        spawner = self._by_argv.get(executable)
        if spawner is None:
            if shutil.which(executable[0]) is None:
                raise StartError(
                    f"py_executable {' '.join(executable)!r}: {executable[0]!r} is not an "
                    "executable file on this node"
                )
            spawner = self._by_argv[executable] = ProcessSpawner(self._token, executable)
            await spawner.start(self._on_exit)
        return spawner

    def stopping(self) -> None:
        """The agent is stopping (see :meth:`Spawner.stopping`)."""
        for spawner in self.distinct():
            spawner.stopping()

    async def aclose(self) -> None:
        """Close every spawner (processes still running are killed)."""
        for spawner in self.distinct():
            await spawner.aclose()
