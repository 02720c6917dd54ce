"""Fork templates shared by the local clusters one process starts, one after another.

A local cluster's two fork templates (``rayless.actors.host.zygote``: torch and light) cost
~0.3 CPU-s to start and the torch one 2 to 5 CPU-s more to import torch and tensordict. A
process that starts many clusters (a test suite: a cluster per test, ``ray.init`` /
``ray.shutdown`` per test) pays that for each. With sharing on (:func:`share`; the pytest
plugin ``rayless.actors.testing`` turns it on), :class:`~actors.launch.local.LocalProcesses`
leases its templates from this process's :class:`TemplatePool` instead: the first cluster
starts them, later ones connect their agents to the same templates, and a stopped cluster
hands them back instead of stopping them.

What a shared template changes, and why it stays correct:

* It is a child of this process started from the pool's own thread, so it dies with the
  process (``PR_SET_PDEATHSIG`` fires when the *thread* that started a child ends, and that
  thread lives as long as the process), and its actors die with it. :func:`close` (the
  plugin's session end, and ``atexit``) stops the idle ones at once.
* Each cluster's agents have their own connections to it; a connection that closes takes its
  actors along, so a stopped cluster leaves nothing in it.
* A forked actor's environment is its agent's, sent whole in every fork request, so a
  variable set or removed after the template started reaches the actors of later clusters.
* The template is started with ``--shared``: it preloads only modules of installed packages
  (the standard library, site-packages, rayless), never a module of the user's source tree,
  which may change between clusters; such a module is imported by each actor instead.
* Its torch template imports torch ahead (``eager``, :attr:`TemplatePool.preload`): the
  cost is paid once per process, whatever the cluster's ``zygote_preload``.
* Templates are keyed by what a fresh interpreter's imports depend on: the working
  directory and the ``PYTHON*`` variables. A cluster started elsewhere gets templates of
  its own; an idle template of another key is stopped then, so at most one idle pair is kept.
"""

from __future__ import annotations

import atexit
import concurrent.futures
import os
import queue
import shutil
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, TypeVar

from rayless.actors.launch.procs import START_TIMEOUT, Child, first_line, start_child, terminate
from rayless.transport import owners

__all__ = ["Lease", "TemplatePool", "close", "pool", "share", "sharing"]

T = TypeVar("T")
KINDS = ("torch", "light")


def template_key(kind: str, environ: Mapping[str, str], cwd: str) -> tuple[Any, ...]:
    """What decides whether two clusters can fork from the same ``kind`` template."""
    python = tuple(sorted((k, v) for k, v in environ.items() if k.startswith("PYTHON")))
    return (kind, cwd, python)


@dataclass
class Lease:
    """A template leased by one cluster: its process and socket path."""

    kind: str
    entry: _Entry
    pool: TemplatePool

    @property
    def proc(self) -> Child:
        """The template's process."""
        return self.entry.proc

    @property
    def path(self) -> str:
        """The template's socket path."""
        return self.entry.path

    def wait_ready(self, timeout: float = START_TIMEOUT) -> None:
        """Block until the template listens (it prints "ready" once).

        Raises:
            StartError: it exited or said nothing within ``timeout``.
        """
        self.entry.wait_ready(f"the shared {self.kind} template", timeout)

    def release(self) -> None:
        """Hand the template back to its pool (see :meth:`TemplatePool.release`)."""
        self.pool.release(self)


class _Entry:
    def __init__(self, key: tuple[Any, ...], proc: Child, path: str, tmpdir: str) -> None:
        self.key = key
        self.proc = proc
        self.path = path
        self.tmpdir = tmpdir
        self.users = 0
        self.ready = False
        self.lock = threading.Lock()

    def wait_ready(self, what: str, timeout: float) -> None:
        with self.lock:
            if not self.ready:
                first_line(self.proc, what, timeout=timeout)
                self.ready = True

    def alive(self) -> bool:
        """Running: not reaped, and not a zombie (a killed template's threads may still be
        exiting while its leader already is one; ``poll`` cannot reap it yet)."""
        if self.proc.poll() is not None:
            return False
        try:
            with open(f"/proc/{self.proc.pid}/stat", "rb") as f:
                state = f.read().rpartition(b")")[2].split()[0]
        except (OSError, IndexError):
            return True  # no procfs: poll's answer stands
        return state not in (b"Z", b"X")


class _Starter:
    """One thread that starts every template, alive as long as the process (see above)."""

    def __init__(self) -> None:
        self._jobs: queue.SimpleQueue[tuple[Callable[[], Any], concurrent.futures.Future[Any]]]
        self._jobs = queue.SimpleQueue()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()

    def call(self, fn: Callable[[], T]) -> T:
        with self._lock:
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(
                    target=self._run, name="rayless-template-starter", daemon=True
                )
                self._thread.start()
        fut: concurrent.futures.Future[T] = concurrent.futures.Future()
        self._jobs.put((fn, fut))
        return fut.result()

    def _run(self) -> None:
        while True:
            fn, fut = self._jobs.get()
            try:
                fut.set_result(fn())
            except BaseException as exc:
                fut.set_exception(exc)


class TemplatePool:
    """The fork templates this process's local clusters share (thread-safe)."""

    def __init__(self, preload: str = "eager") -> None:
        self.enabled = False
        self.preload = preload  # the torch templates' RAYLESS_ZYGOTE_PRELOAD mode
        self._entries: dict[tuple[Any, ...], _Entry] = {}
        self._lock = threading.Lock()
        self._starter = _Starter()
        self._pid = os.getpid()

    def acquire(self, kind: str, environ: Mapping[str, str], cwd: str | None = None) -> Lease:
        """A running ``kind`` template (``"torch"`` or ``"light"``) for a cluster started with
        ``environ`` in ``cwd`` (default: this process's); started here if there is none.
        :meth:`release` it when the cluster stops.

        Raises:
            ValueError: an unknown kind.
            OSError: the interpreter cannot be started.
        """
        if kind not in KINDS:
            raise ValueError(f"kind must be one of {KINDS}, got {kind!r}")
        self._forget_after_fork()
        key = template_key(kind, environ, cwd or os.getcwd())
        with self._lock:
            entry = self._entries.get(key)
            if entry is not None and not entry.alive():
                self._drop(entry)
                entry = None
            if entry is None:
                self._stop_idle(kind)
                entry = self._starter.call(lambda: self._start(key, kind, environ))
                self._entries[key] = entry
            entry.users += 1
            return Lease(kind, entry, self)

    def release(self, lease: Lease) -> None:
        """Hand a template back; it keeps running for the next cluster (a dead one goes)."""
        with self._lock:
            entry = lease.entry
            entry.users = max(0, entry.users - 1)
            if not entry.alive() and self._entries.get(entry.key) is entry:
                self._drop(entry)

    def close(self) -> None:
        """Stop every template of the pool (their actors die with them). Idempotent."""
        self._forget_after_fork()
        with self._lock:
            entries = list(self._entries.values())
            self._entries.clear()
        terminate([e.proc for e in entries], 5.0)
        for entry in entries:
            shutil.rmtree(entry.tmpdir, ignore_errors=True)

    def pids(self) -> list[int]:
        """The pids of the pool's templates."""
        with self._lock:
            return [e.proc.pid for e in self._entries.values()]

    def _start(self, key: tuple[Any, ...], kind: str, environ: Mapping[str, str]) -> _Entry:
        tmpdir = owners.mkdtemp("rayless-zygote-")
        path = os.path.join(tmpdir, f"{kind}.sock")
        args = ["-m", "rayless.actors.host.zygote", path, "--template", kind, "--shared"]
        try:
            proc = start_child(args, None, environ, {"RAYLESS_ZYGOTE_PRELOAD": self.preload})
        except BaseException:
            shutil.rmtree(tmpdir, ignore_errors=True)
            raise
        return _Entry(key, proc, path, tmpdir)

    def _stop_idle(self, kind: str) -> None:
        """Stop the idle templates of ``kind`` (another key is about to start one)."""
        idle = [e for e in self._entries.values() if e.key[0] == kind and e.users == 0]
        for entry in idle:
            del self._entries[entry.key]
        terminate([e.proc for e in idle], 5.0)
        for entry in idle:
            shutil.rmtree(entry.tmpdir, ignore_errors=True)

    def _drop(self, entry: _Entry) -> None:
        self._entries.pop(entry.key, None)
        terminate([entry.proc], 1.0)
        shutil.rmtree(entry.tmpdir, ignore_errors=True)

    def _forget_after_fork(self) -> None:
        """In a forked child of this process, the parent's templates are not ours."""
        if os.getpid() != self._pid:
            self._pid = os.getpid()
            self._entries = {}
            self._lock = threading.Lock()
            self._starter = _Starter()


_POOL = TemplatePool()


def pool() -> TemplatePool | None:
    """This process's pool when sharing is on, else None."""
    return _POOL if _POOL.enabled else None


def share(enabled: bool = True) -> None:
    """Turn sharing on (or off: clusters started from now on start their own templates; the
    pool keeps serving the clusters that leased from it)."""
    _POOL.enabled = enabled


def sharing() -> bool:
    """Whether the clusters this process starts share fork templates."""
    return _POOL.enabled


def close() -> None:
    """Stop this process's shared templates (see :meth:`TemplatePool.close`)."""
    _POOL.close()


atexit.register(close)
