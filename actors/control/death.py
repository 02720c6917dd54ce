"""Why an actor process ended, as its node agent can tell: the exit code or signal, the
kernel's OOM killer, and the last lines the process wrote to its log.

The agent reaps its actors, so it knows each exit code; a SIGKILL nobody on the cluster sent
is most often the kernel's OOM killer. Two witnesses say so:

* the memory cgroup's ``oom_kill`` counter (cgroup v2 ``memory.events``, v1
  ``memory.oom_control``) of the cgroup the actor ran in: :class:`OomWatch` remembers the
  count it last saw per cgroup and calls a SIGKILL an OOM kill when the count rose since;
* the kernel log (``/dev/kmsg``, where it is readable): an ``oom-kill`` or
  ``Killed process PID`` record that names the pid.

Everything here reads files under paths it is given (``proc_root``, ``cgroup_root``,
``kmsg``), so tests point it at a directory of their own. Nothing raises: a file that is not
there or not readable means "no evidence".
"""

from __future__ import annotations

import errno
import os
import re
import signal
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

__all__ = [
    "LOG_TAIL_LINES",
    "ExitCause",
    "OomWatch",
    "cgroup_dir",
    "death_details",
    "describe_exit",
    "kernel_log_oom",
    "log_tail",
    "oom_kill_count",
]

LOG_TAIL_LINES = 20
_TAIL_BYTES = 64 * 1024  # read at most this much of the log's end
_LINE_CHARS = 400  # each line of the tail is cut to this
_KMSG_MAX_BYTES = 4 * 1024 * 1024  # the kernel ring buffer is far smaller; a bound anyway
OOM_CAUSE = "killed by the kernel's OOM killer"


def describe_exit(code: int) -> str:
    """``code`` as words: ``with exit code 3`` or ``killed by SIGKILL`` (negative: a signal)."""
    if code < 0:
        try:
            return f"killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"killed by signal {-code}"
    return f"with exit code {code}"


def cgroup_dir(pid: int, *, proc_root: str = "/proc", cgroup_root: str = "/sys/fs/cgroup") -> str:
    """The directory of the memory cgroup ``pid`` runs in, or ``""`` when it is not known.

    cgroup v2 (``0::/path``) maps to ``cgroup_root/path``; v1 to ``cgroup_root/memory/path``.
    """
    try:
        with open(os.path.join(proc_root, str(pid), "cgroup"), encoding="utf-8") as f:
            lines = f.read().splitlines()
    except OSError:
        return ""
    for line in lines:
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        hier, controllers, path = parts
        rel = path.lstrip("/")
        if hier == "0" and controllers == "":
            return os.path.join(cgroup_root, rel) if rel else cgroup_root
        if "memory" in controllers.split(","):
            return os.path.join(cgroup_root, "memory", rel)
    return ""


def oom_kill_count(directory: str) -> int | None:
    """The ``oom_kill`` counter of the memory cgroup at ``directory`` (None: not readable).

    Reads cgroup v2's ``memory.events`` (which counts the cgroup's descendants too), else
    cgroup v1's ``memory.oom_control``.
    """
    if not directory:
        return None
    for name in ("memory.events", "memory.oom_control"):
        try:
            with open(os.path.join(directory, name), encoding="utf-8") as f:
                text = f.read()
        except OSError:
            continue
        for line in text.splitlines():
            key, _, value = line.partition(" ")
            if key == "oom_kill":
                try:
                    return int(value.strip())
                except ValueError:
                    return None
    return None


def kernel_log_oom(pid: int, kmsg: str = "/dev/kmsg") -> bool | None:
    """Whether the kernel log says the OOM killer killed ``pid`` (None: log not readable).

    Reads ``kmsg`` without blocking (``/dev/kmsg`` gives one record per read and starts at
    the oldest record it still holds), at most a few MiB.
    """
    try:
        fd = os.open(kmsg, os.O_RDONLY | os.O_NONBLOCK)
    except OSError:
        return None
    chunks: list[bytes] = []
    total = 0
    try:
        while total < _KMSG_MAX_BYTES:
            try:
                data = os.read(fd, 8192)
            except BlockingIOError:
                break
            except OSError as exc:
                if exc.errno == errno.EPIPE:  # records overwritten while we read: go on
                    continue
                if not chunks:
                    return None
                break
            if not data:
                break
            chunks.append(data)
            total += len(data)
    finally:
        os.close(fd)
    text = b"".join(chunks).decode("utf-8", "replace")
    pattern = re.compile(rf"(Killed process {pid}\b|oom-kill:.*\bpid={pid}\b)")
    return any(pattern.search(line) for line in text.splitlines())


def log_tail(path: str, start: int = 0, lines: int = LOG_TAIL_LINES) -> list[str]:
    """The last ``lines`` lines of the log at ``path`` written from byte ``start`` on (the
    current process's part of a file restarts append to); ``[]`` when unreadable."""
    try:
        with open(path, "rb") as f:
            size = f.seek(0, os.SEEK_END)
            begin = max(start, size - _TAIL_BYTES, 0)
            f.seek(begin)
            data = f.read(size - begin)
    except OSError:
        return []
    text = data.decode("utf-8", "replace").splitlines()
    if begin > start and text:
        text = text[1:]  # the first line read is cut at its start
    return [line[:_LINE_CHARS] for line in text[-lines:]]


@dataclass
class ExitCause:
    """What the agent saw of one exit: ``text`` says it in words (for the error's message)."""

    text: str
    oom: bool = False


class OomWatch:
    """Tells whether a SIGKILL was the kernel's OOM killer, per memory cgroup.

    ``started(pid)`` notes the cgroup of a new actor process and its counter the first time
    that cgroup is seen; ``cause(pid, code)`` explains an exit. Costs a few small file
    reads per spawn and per SIGKILL, whatever the number of actors.
    """

    def __init__(
        self,
        *,
        proc_root: str = "/proc",
        cgroup_root: str = "/sys/fs/cgroup",
        kmsg: str = "/dev/kmsg",
    ) -> None:
        self.proc_root = proc_root
        self.cgroup_root = cgroup_root
        self.kmsg = kmsg
        self._seen: dict[str, int | None] = {}  # cgroup dir -> oom_kill count last read
        self._cgroup_of: dict[int, str] = {}  # live pid -> its cgroup dir

    def started(self, pid: int) -> None:
        """Note the cgroup of the new process ``pid`` (call while it runs)."""
        directory = cgroup_dir(pid, proc_root=self.proc_root, cgroup_root=self.cgroup_root)
        self._cgroup_of[pid] = directory
        if directory not in self._seen:
            self._seen[directory] = oom_kill_count(directory)

    def forget(self, pid: int) -> None:
        """Drop what was noted of ``pid`` (its exit was explained, or it never ran)."""
        self._cgroup_of.pop(pid, None)

    def cause(self, pid: int, code: int) -> ExitCause:
        """Explain the exit of ``pid`` with ``code`` (negative: a signal); forgets ``pid``."""
        directory = self._cgroup_of.pop(pid, "")
        text = describe_exit(code)
        if code != -signal.SIGKILL:
            return ExitCause(text)
        evidence = []
        before = self._seen.get(directory)
        now = oom_kill_count(directory)
        if directory in self._seen:
            self._seen[directory] = now
        if before is not None and now is not None and now > before:
            evidence.append(f"its cgroup's oom_kill count rose from {before} to {now}")
        if kernel_log_oom(pid, self.kmsg):
            evidence.append(f"the kernel log names pid {pid}")
        if not evidence:
            return ExitCause(text)
        return ExitCause(f"{text}, {OOM_CAUSE} ({'; '.join(evidence)})", oom=True)


def death_details(ev: Any) -> dict[str, Any]:
    """The ``cause``, ``log_tail`` and ``log`` of a death event (the agent's ``died`` or
    ``restarting``: a mapping, or a message object with those attributes), checked, as
    keyword arguments of :class:`ActorDiedError`."""

    def get(key: str) -> Any:
        return ev.get(key) if isinstance(ev, Mapping) else getattr(ev, key, None)

    tail = get("log_tail")
    lines = [str(line) for line in tail[-LOG_TAIL_LINES:]] if isinstance(tail, list) else []
    return {"cause": str(get("cause") or ""), "log_tail": lines, "log": str(get("log") or "")}
