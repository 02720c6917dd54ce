"""Embedded clusters published on this host, so ``rayless status`` and ``actors.connect()``
find them without an address (as Ray's ``address="auto"`` does).

``Cluster.local()`` writes two files into a per-user runtime directory and removes them at
close (its head removes them too when it exits, so a driver killed by a signal, even SIGKILL,
leaves none behind): ``cluster-<head pid>.json`` (address, head pid and start time, driver pid)
and ``cluster-<head pid>.token`` (the token, mode 0600, usable as ``--token-file``). The
directory is ``$RAYLESS_RUNTIME_DIR``, else ``$XDG_RUNTIME_DIR/rayless``, else
``/tmp/rayless-<uid>``; it is created with mode 0700 and used only when this user owns it and
nobody else can read it. Nothing in it is trusted on its name alone:

* a directory that is a symbolic link or belongs to another user is neither written nor read;
* a directory that other users can write is refused: :func:`discover` raises ConnectError
  naming it, and :func:`publish` moves it aside (``<dir>.untrusted-<time>``, with a warning)
  and starts a fresh private one, so what someone else planted there is never listed;
* an entry is read only if it is a regular file of this user that nobody else can write, and
  its token file only if it is this user's, mode 0600, and the entry's own sibling
  (``cluster-<pid>.token``); a file of another user in the directory means it was writable
  once, and :func:`discover` refuses it (ConnectError naming the file).

Every check is made on opened descriptors (the directory opened ``O_NOFOLLOW``, the files
opened relative to it and ``fstat``-ed), so nothing can be swapped between check and use. An
entry whose head process is gone (or whose pid now belongs to another process: the start
time differs) is stale: :func:`discover` ignores it and removes its files.

Several live clusters: :func:`find_one` refuses to guess and raises ConnectError listing them
(Ray does the same with several local instances), because silently joining the wrong one
would put a job's actors on another job's GPUs.
"""

from __future__ import annotations

import errno
import fnmatch
import json
import os
import re
import stat
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from rayless.actors.core import context
from rayless.actors.errors import ConnectError
from rayless.transport.files import atomic_write

ENV_RUNTIME_DIR = "RAYLESS_RUNTIME_DIR"
_TOKEN = re.compile(r"cluster-(?P<pid>[0-9]+)\.token", re.ASCII)  # a token file's name


@dataclass(frozen=True)
class LocalCluster:
    """One published cluster."""

    address: str
    token_file: str
    head_pid: int
    head_started: float
    driver_pid: int
    path: str

    def token(self) -> str:
        """The cluster token, read from the entry's sibling token file in the checked directory.

        Raises:
            ConnectError: the token file is gone, unreadable, not this user's or not 0600, or
                the directory is no longer private.
        """
        fd = _open_dir(Path(self.path).parent, create=False)
        if fd is None:
            raise ConnectError(f"the runtime directory of {self.path} is gone")
        try:
            name = os.path.basename(self.token_file)
            return context.read_token_file(name, dir_fd=fd, shown=self.token_file)
        finally:
            os.close(fd)


def runtime_dir() -> Path:
    """This user's rayless runtime directory (not created)."""
    explicit = os.environ.get(ENV_RUNTIME_DIR)
    if explicit:
        return Path(explicit)
    xdg = os.environ.get("XDG_RUNTIME_DIR")
    if xdg and os.path.isdir(xdg):
        return Path(xdg) / "rayless"
    return Path(f"/tmp/rayless-{os.getuid()}")


class _Untrusted(Exception):
    """The runtime directory cannot be trusted: ``why`` says what is wrong with ``path``."""

    def __init__(self, path: Path, why: str, *, writable: bool) -> None:
        super().__init__(f"{path} {why}")
        self.path = path
        self.why = why
        self.writable = writable  # by others: move it aside rather than give up


def _open_dir(path: Path, create: bool) -> int | None:
    """A descriptor of the runtime directory ``path`` once checked (this user's, nobody else
    can write it; made 0700 when ``create`` and only others' read bits are set); None when it
    does not exist (and is not created).

    Raises:
        _Untrusted: a link, not a directory, another user's, or writable by others.
    """
    if create:
        try:
            path.mkdir(mode=0o700, parents=True, exist_ok=True)
        except OSError:
            return None
    try:
        fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except FileNotFoundError:
        return None
    except OSError as exc:
        if exc.errno in (errno.ELOOP, errno.ENOTDIR):
            raise _Untrusted(
                path, "is a symbolic link or not a directory", writable=False
            ) from None
        return None
    try:
        info = os.fstat(fd)
        mode = stat.S_IMODE(info.st_mode)
        if info.st_uid != os.getuid():
            raise _Untrusted(
                path, f"belongs to uid {info.st_uid}, not to this user", writable=False
            )
        if mode & 0o022:
            raise _Untrusted(path, f"is writable by other users (mode {mode:04o})", writable=True)
        if mode & 0o077:
            if not create:
                raise _Untrusted(path, f"is readable by others (mode {mode:04o})", writable=False)
            os.fchmod(fd, 0o700)  # nobody else could write it: only its listing was visible
    except BaseException:
        os.close(fd)
        raise
    return fd


def _quarantine(directory: Path, problem: _Untrusted) -> int | None:
    """Move a runtime directory others could write aside, warn, and make a fresh one."""
    aside = directory.with_name(f"{directory.name}.untrusted-{int(time.time())}-{os.getpid()}")
    try:
        os.rename(directory, aside)
    except OSError as exc:
        _warn(f"rayless: {problem}: not publishing there (cannot move it aside: {exc})")
        return None
    _warn(
        f"rayless: {problem}: its entries are not trusted; moved it to {aside} and made a new "
        "private directory (remove the old one once you have looked at it)"
    )
    try:
        return _open_dir(directory, create=True)
    except _Untrusted as again:
        _warn(f"rayless: {again}: not publishing there")
        return None


def _warn(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


def _started(pid: int) -> float | None:
    """The start time of process ``pid``, or None when there is no such process (or it has
    exited)."""
    import psutil

    try:
        proc = psutil.Process(pid)
        if proc.status() == psutil.STATUS_ZOMBIE:  # exited, not reaped yet by its parent
            return None
        return float(proc.create_time())
    except (psutil.Error, OSError):
        return None


def publish(address: str, token: str, head_pid: int) -> str | None:
    """Publish a cluster; returns the entry's path (pass it to :func:`unpublish`), or None
    when there is no usable runtime directory (the cluster then simply stays unlisted; a
    directory other users could write is moved aside first, with a warning on stderr)."""
    directory = runtime_dir()
    try:
        fd = _open_dir(directory, create=True)
    except _Untrusted as problem:
        fd = _quarantine(directory, problem) if problem.writable else None
        if fd is None and not problem.writable:
            _warn(f"rayless: {problem}: not publishing there")
    started = _started(head_pid)
    if fd is None:
        return None
    base = f"cluster-{head_pid}"
    entry = {
        "address": address,
        "token_file": str(directory / f"{base}.token"),
        "head_pid": head_pid,
        "head_started": started,
        "driver_pid": os.getpid(),
        "published": time.time(),
    }
    try:
        if started is None:
            return None
        _write_private(fd, f"{base}.token", token + "\n")
        _write_private(fd, f"{base}.json", json.dumps(entry))
    except OSError:
        unpublish(str(directory / f"{base}.json"))
        return None
    finally:
        os.close(fd)
    return str(directory / f"{base}.json")


def _write_private(dir_fd: int, name: str, text: str) -> None:
    """Write ``text`` to ``name`` in the directory ``dir_fd`` atomically, mode 0600."""
    atomic_write(name, text, perms=0o600, dir_fd=dir_fd)


def unpublish(path: str) -> None:
    """Remove a published entry and its token file. Idempotent.

    The token goes first: a process killed between the two unlinks (a head that began its
    SIGTERM shutdown and got a SIGKILL) leaves the entry, which :func:`discover` lists and
    removes with its head gone, rather than a token no listing names."""
    for p in (path.removesuffix(".json") + ".token", path):
        try:
            os.unlink(p)
        except OSError:
            pass


def discover() -> list[LocalCluster]:
    """The live published clusters of this user on this host, oldest first; stale entries are
    removed.

    Raises:
        ConnectError: the runtime directory, or an entry in it, cannot be trusted (the message
            names the path and what is wrong with it).
    """
    directory = runtime_dir()
    try:
        fd = _open_dir(directory, create=False)
    except _Untrusted as problem:
        if not problem.writable and "readable" in problem.why:
            return []  # never read an open directory (publish makes it private)
        raise ConnectError(
            f"{problem}: rayless does not trust what is in it (anyone could have planted an "
            f"entry); remove it (rm -r {directory}) or set {ENV_RUNTIME_DIR}"
        ) from None
    if fd is None:
        return []
    try:
        listed = [e.name for e in os.scandir(fd)]
        names = sorted(n for n in listed if fnmatch.fnmatch(n, "cluster-*.json"))
        found = [e for e in (_read_entry(directory, fd, n) for n in names) if e is not None]
        _remove_lone_tokens(fd, listed)
    finally:
        os.close(fd)
    return sorted(found, key=lambda e: e.head_started)


def _remove_lone_tokens(dir_fd: int, listed: list[str]) -> None:
    """Remove the token files whose entry is gone and whose head pid is dead (what a head
    killed between the two unlinks of an older :func:`unpublish` left). A token whose head
    lives stays: :func:`publish` writes the token before the entry."""
    names = set(listed)
    for name in listed:
        match = _TOKEN.fullmatch(name)
        if match is None or f"cluster-{match['pid']}.json" in names:
            continue
        if _started(int(match["pid"])) is None:
            try:
                os.unlink(name, dir_fd=dir_fd)
            except OSError:
                pass


def _read_entry(directory: Path, dir_fd: int, name: str) -> LocalCluster | None:
    """The entry ``name`` if its head is alive (a stale one is removed).

    Raises:
        ConnectError: it is not this user's file, nobody else may write it, or it names a
            token file other than its own sibling.
    """
    path = directory / name
    try:
        text = context.read_private(
            name, "cluster entry", secret=False, dir_fd=dir_fd, shown=str(path)
        )
    except ConnectError as exc:
        if not os.path.lexists(path):
            return None  # removed meanwhile
        raise ConnectError(
            f"{exc}: {directory} was writable by another user once, so none of its entries is "
            f"trusted; remove it (rm -r {directory})"
        ) from None
    try:
        raw = json.loads(text)
        entry = LocalCluster(
            str(raw["address"]),
            str(raw["token_file"]),
            int(raw["head_pid"]),
            float(raw["head_started"]),
            int(raw.get("driver_pid", 0)),
            str(path),
        )
    except (ValueError, KeyError, TypeError):
        return None  # being written: leave it
    sibling = str(path)[: -len(".json")] + ".token"
    if entry.token_file != sibling:
        raise ConnectError(
            f"the cluster entry {path} names the token file {entry.token_file}, not its own "
            f"{sibling}: refused"
        )
    started = _started(entry.head_pid)
    if started is None or abs(started - entry.head_started) > 1.0:
        unpublish(str(path))  # its head is gone (or the pid was reused)
        return None
    return entry


def find_one() -> LocalCluster:
    """The one live published cluster.

    Raises:
        ConnectError: none is published, or several are (the message lists them).
    """
    found = discover()
    if len(found) == 1:
        return found[0]
    if not found:
        raise ConnectError(
            f"no local rayless cluster found in {runtime_dir()} (Cluster.local() publishes "
            "there while it runs): pass an address and a token, or set RAYLESS_ADDRESS and "
            "RAYLESS_TOKEN[_FILE]"
        )
    listing = "; ".join(f"{e.address} (driver pid {e.driver_pid})" for e in found)
    raise ConnectError(
        f"{len(found)} local rayless clusters are running: {listing}. Pass the address of "
        "the one you mean (its token is found for you)"
    )


def find_address(address: str) -> LocalCluster | None:
    """The live published cluster at ``address`` (normalised), if any."""
    for entry in discover():
        if entry.address == address:
            return entry
    return None
