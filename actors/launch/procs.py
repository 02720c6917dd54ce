"""Child processes of the runtime, one mechanism for ``Cluster.local`` and ``rayless launch``.

:func:`start_child` starts a head, node agent or zygote; :func:`first_line` waits for the
address it prints; :func:`terminate` stops a set of them (SIGTERM → grace → SIGKILL). Built on
them: :class:`NodeProcesses` (one node's launch: head on rank 0, node agent, driver; signals)
here, and ``LocalProcesses`` (an embedded cluster on this host) in ``actors.launch.local``.

Every child starts in its own session (a terminal's Ctrl-C reaches only the launch, which
decides what each child gets) and dies with its parent if that is killed outright: head and
agent through RAYLESS_DIE_WITH_PARENT, the driver through PR_SET_PDEATHSIG (SIGTERM). The
token reaches head and agent through an inherited pipe (RAYLESS_TOKEN_FD, read and closed at
their start), never their environment (which ``/proc/<pid>/environ`` keeps showing to their
descendants) nor their command lines; the driver gets RAYLESS_TOKEN_FILE (a 0600 file).
"""

from __future__ import annotations

import os
import selectors
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from types import FrameType
from typing import TYPE_CHECKING, Any

from rayless.actors.control.process_util import pdeathsig_hook
from rayless.actors.core import context
from rayless.actors.errors import LaunchError, StartError
from rayless.transport.errors import RaylessError

if TYPE_CHECKING:
    from rayless.actors.launch.config import LaunchConfig

__all__ = [
    "START_TIMEOUT",
    "LaunchError",
    "NodeProcesses",
    "StopFlag",
    "exit_code",
    "first_line",
    "read_stdin_line",
    "start_child",
    "terminate",
]

START_TIMEOUT = 120.0
Child = subprocess.Popen[bytes]


def start_child(
    args: Sequence[str], token: str | None, environ: Mapping[str, str], extra: Mapping[str, str]
) -> Child:
    """``python *args`` in its own session, stdout piped; the token (None: none, as for the
    zygote) in an inherited pipe named by RAYLESS_TOKEN_FD, never in its environment.

    Raises:
        OSError: the interpreter cannot be started.
    """
    env = {**context.without_token(environ), "RAYLESS_DIE_WITH_PARENT": "1", **extra}
    fds: tuple[int, ...] = ()
    if token is not None:
        fds = (context.token_pipe(token),)
        env[context.ENV_TOKEN_FD] = str(fds[0])
    try:
        return subprocess.Popen(
            [sys.executable, *args],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            env=env,
            pass_fds=fds,
            start_new_session=True,
        )
    finally:
        for fd in fds:
            os.close(fd)


def first_line(
    proc: Child, what: str, *, timeout: float = START_TIMEOUT, stop: StopFlag | None = None
) -> str:
    """The first line ``proc`` prints (its address), watching for its death and for ``stop``.

    Raises:
        StartError: it exited first, printed nothing within ``timeout``, or a stop was requested.
    """
    stdout = proc.stdout
    if stdout is None:  # internal invariant: stdout=PIPE
        raise StartError(f"{what}: no stdout pipe")
    deadline = time.monotonic() + timeout
    with selectors.DefaultSelector() as sel:
        sel.register(stdout, selectors.EVENT_READ)
        while True:
            if sel.select(0.2):
                text = stdout.readline().decode().strip()
                if text:
                    return text
                proc.wait(5)
            if proc.poll() is not None or time.monotonic() > deadline:
                raise StartError(
                    f"{what} did not start (exit code {proc.poll()}); see its stderr above"
                )
            if stop is not None and stop.is_set():
                raise StartError(f"stopped while {what} was starting ({stop.reason})")


def _wait(proc: Child, timeout: float, hurry: Callable[[], bool]) -> bool:
    """Whether ``proc`` exits within ``timeout`` (False at once when ``hurry()`` says so)."""
    deadline = time.monotonic() + timeout
    while proc.poll() is None:
        if time.monotonic() > deadline or hurry():
            return False
        time.sleep(0.05)
    return True


def _never() -> bool:
    return False


def terminate(
    procs: Iterable[Child],
    grace: float,
    *,
    natural: float = 0.0,
    hurry: Callable[[], bool] = _never,
) -> None:
    """Stop ``procs``: ``natural`` seconds to exit on their own (after a shutdown request),
    then SIGTERM, ``grace``, and SIGKILL with what each left in its session; closes their
    stdout pipes. Idempotent.
    """
    procs = list(procs)
    deadline = time.monotonic() + natural
    for proc in procs:
        _wait(proc, max(0.0, deadline - time.monotonic()), hurry)
    for proc in procs:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
    for proc in procs:
        if not _wait(proc, grace, hurry):
            proc.kill()
            try:
                os.killpg(proc.pid, signal.SIGKILL)  # what it left in its session
            except (ProcessLookupError, PermissionError):
                pass
            proc.wait()
        if proc.stdout is not None:
            proc.stdout.close()


_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


class StopFlag:
    """Set by SIGINT/SIGTERM/SIGHUP (or EOF on a watched stdin); a second signal hurries."""

    def __init__(self) -> None:
        self._event = threading.Event()
        self.signum = int(signal.SIGTERM)
        self.reason = ""
        self.hurry = False
        self._previous: dict[int, Any] = {}

    def install(self) -> None:
        """Handle the stop signals (main thread only; elsewhere a no-op)."""
        if threading.current_thread() is not threading.main_thread():
            return
        for sig in _SIGNALS:
            self._previous[sig] = signal.signal(sig, self._on_signal)

    def uninstall(self) -> None:
        """Restore the handlers :meth:`install` replaced."""
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)
        self._previous.clear()

    def _on_signal(self, signum: int, frame: FrameType | None) -> None:
        self.set(signum, signal.Signals(signum).name)

    def set(self, signum: int, reason: str) -> None:
        """Request a stop; a second request asks for no more grace."""
        if self._event.is_set():
            self.hurry = True
            return
        self.signum, self.reason = int(signum), reason
        self._event.set()

    def is_set(self) -> bool:
        """Whether a stop was requested."""
        return self._event.is_set()

    def wait(self, timeout: float | None = None) -> bool:
        """Block until a stop is requested (short waits, so signal handlers run)."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while not self._event.wait(0.2):
            if deadline is not None and time.monotonic() > deadline:
                return False
        return True

    def watch_stdin(self) -> None:
        """Read stdin (fd 0, unbuffered) to its end, then request a stop: the SSH launcher
        went away. Meant for a daemon thread."""
        try:
            while os.read(0, 4096):
                pass
        except OSError:
            pass
        self.set(signal.SIGTERM, "stdin closed (the launcher went away)")


def read_stdin_line(limit: int = 4096) -> str:
    """One line from fd 0, read byte by byte so nothing past it is consumed or buffered."""
    data = bytearray()
    while len(data) < limit:
        byte = os.read(0, 1)
        if not byte or byte == b"\n":
            break
        data += byte
    return data.decode(errors="replace").strip()


def exit_code(returncode: int) -> int:
    """A shell-style exit code: a death by signal N becomes 128 + N."""
    return 128 - returncode if returncode < 0 else returncode


class NodeProcesses:
    """Starts, watches and stops this node's head, agent and driver."""

    def __init__(
        self, cfg: LaunchConfig, token: str, stop: StopFlag, environ: Mapping[str, str]
    ) -> None:
        self.cfg = cfg
        self.token = token
        self.stop = stop
        self.environ = context.without_token(environ)
        self.head: subprocess.Popen[bytes] | None = None
        self.agent: subprocess.Popen[bytes] | None = None
        self.driver: subprocess.Popen[bytes] | None = None

    def start_head(self, bind: str) -> None:
        """Start the head on ``bind`` and wait until it listens.

        Raises:
            StartError: it exited first (a port in use?) or a stop was requested.
        """
        args = ["-m", "rayless.actors.control.head", bind, str(self.cfg.node_timeout)]
        self.head = start_child(args, self.token, self.environ, {})
        first_line(self.head, f"the head (on {bind}; is the port free?)", stop=self.stop)

    def start_agent(self) -> None:
        """Start this node's agent (with its own zygote) and wait until it registered.

        Raises:
            StartError: it exited first or a stop was requested.
        """
        cfg = self.cfg
        args = ["-m", "rayless.actors.control.agent", cfg.address, "--rank", str(cfg.node_rank)]
        log_dir = os.path.abspath(cfg.log_dir or ".")  # launch() always sets one
        args += ["--zygote", "auto", "--log-dir", log_dir]
        args += ["--head-timeout", str(cfg.node_timeout)]
        if cfg.node_ip:
            args += ["--ip", cfg.node_ip]
        if cfg.node_id:
            args += ["--node-id", cfg.node_id]
        if cfg.fake_gpus is not None:
            args += ["--fake-gpus", str(cfg.fake_gpus)]
        extra = {"CUDA_VISIBLE_DEVICES": cfg.gpus} if cfg.gpus is not None else {}
        self.agent = start_child(args, self.token, self.environ, extra)
        first_line(self.agent, f"the node agent of rank {cfg.node_rank}", stop=self.stop)

    def head_alive(self) -> bool:
        """Whether our head process runs."""
        return self.head is not None and self.head.poll() is None

    def check_alive(self) -> None:
        """Raise LaunchError if our head or agent exited."""
        for proc, what in ((self.head, "the head"), (self.agent, "this node's agent")):
            if proc is not None and proc.poll() is not None:
                raise LaunchError(f"{what} exited unexpectedly (exit code {proc.returncode})")

    def run_driver(
        self, argv: list[str], env: Mapping[str, str], *, stdin_free: bool
    ) -> int | None:
        """Run the driver to its end; None when a stop signal ended it.

        Raises:
            LaunchError: the head or this node's agent died meanwhile (the driver is stopped).
        """
        self.driver = subprocess.Popen(
            argv,
            env={**self.environ, **env},
            stdin=None if stdin_free else subprocess.DEVNULL,
            start_new_session=True,
            # forked from the main thread; one prctl call
            preexec_fn=pdeathsig_hook(signal.SIGTERM),
        )
        while True:
            code = self.driver.poll()
            if code is not None:
                return exit_code(code)
            if self.stop.is_set():
                sig = signal.SIGINT if self.stop.signum == signal.SIGINT else signal.SIGTERM
                self._stop_group(self.driver, sig)
                return None
            try:
                self.check_alive()
            except RaylessError:
                self._stop_group(self.driver, signal.SIGTERM)
                raise
            time.sleep(0.1)

    def wait_agent(self) -> int | None:
        """Wait for the agent to exit: its exit code, or None when a stop was requested."""
        if self.agent is None:
            return None
        while True:
            code = self.agent.poll()
            if code is not None:
                return code
            if self.stop.wait(0.2):
                return None

    def _stop_group(self, proc: subprocess.Popen[bytes], sig: int) -> None:
        """``sig`` to the process group of ``proc`` (its own session), grace, SIGKILL."""
        for s in (sig, signal.SIGKILL):
            if proc.poll() is not None:
                return
            try:
                os.killpg(proc.pid, s)
            except (ProcessLookupError, PermissionError):
                pass
            if s != signal.SIGKILL and _wait(proc, self.cfg.grace, self._hurry):
                return
        proc.wait()

    def stop_all(self, natural: float = 0.0) -> None:
        """Stop everything of ours on this node; idempotent.

        The driver goes first; then head and agent get ``natural`` seconds to exit on their
        own (after a shutdown request), then SIGTERM, the grace period, and SIGKILL.
        """
        if self.driver is not None:
            self._stop_group(self.driver, signal.SIGTERM)
        procs = [p for p in (self.agent, self.head) if p is not None]
        terminate(procs, self.cfg.grace, natural=natural, hurry=self._hurry)

    def _hurry(self) -> bool:
        return self.stop.hurry
