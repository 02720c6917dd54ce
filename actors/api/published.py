"""Embedded clusters published on this host, so ``rayless status`` and ``actors.connect()``
find them without an address (as Ray's ``address="auto"`` does).

``Cluster.local()`` writes two files into a per-user runtime directory and removes them at
close: ``cluster-<head pid>.json`` (address, head pid and start time, driver pid) and
``cluster-<head pid>.token`` (the token, mode 0600, usable as ``--token-file``). The directory
is ``$RAYLESS_RUNTIME_DIR``, else ``$XDG_RUNTIME_DIR/rayless``, else ``/tmp/rayless-<uid>``;
it is created with mode 0700 and used only when this user owns it and nobody else can read
it (a directory another user planted is never written to nor trusted). An entry whose head
process is gone (or whose pid now belongs to another process: the start time differs) is
stale: :func:`discover` ignores it and removes its files.

Several live clusters: :func:`find_one` refuses to guess and raises ConnectError listing them
(Ray does the same with several local instances), because silently joining the wrong one
would put a job's actors on another job's GPUs.
"""

from __future__ import annotations

import json
import os
import stat
import time
from dataclasses import dataclass
from pathlib import Path

from rayless.actors.errors import ConnectError

ENV_RUNTIME_DIR = "RAYLESS_RUNTIME_DIR"


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
        """The cluster token.

        Raises:
            ConnectError: the token file is gone or unreadable.
        """
        from rayless.actors.api.context import read_token_file

        return read_token_file(self.token_file)


def runtime_dir() -> Path:
    """This user's rayless runtime directory (not created)."""
    explicit = os.environ.get(ENV_RUNTIME_DIR)
    if explicit:
        return Path(explicit)
    xdg = os.environ.get("XDG_RUNTIME_DIR")
    if xdg and os.path.isdir(xdg):
        return Path(xdg) / "rayless"
    return Path(f"/tmp/rayless-{os.getuid()}")


def _private_dir(create: bool) -> Path | None:
    """The runtime directory if it is this user's and private (made so when ``create``)."""
    path = runtime_dir()
    if create:
        try:
            path.mkdir(mode=0o700, parents=True, exist_ok=True)
        except OSError:
            return None
    try:
        info = path.lstat()
    except OSError:
        return None
    if not stat.S_ISDIR(info.st_mode) or info.st_uid != os.getuid():
        return None
    if info.st_mode & 0o077:
        if not create:
            return None
        try:
            path.chmod(0o700)
        except OSError:
            return None
    return path


def _started(pid: int) -> float | None:
    """The start time of process ``pid``, or None when there is no such process."""
    import psutil

    try:
        return float(psutil.Process(pid).create_time())
    except (psutil.Error, OSError):
        return None


def publish(address: str, token: str, head_pid: int) -> str | None:
    """Publish a cluster; returns the entry's path (pass it to :func:`unpublish`), or None
    when there is no usable runtime directory (the cluster then simply stays unlisted)."""
    directory = _private_dir(create=True)
    started = _started(head_pid)
    if directory is None or started is None:
        return None
    base = directory / f"cluster-{head_pid}"
    token_path = str(base) + ".token"
    entry = {
        "address": address,
        "token_file": token_path,
        "head_pid": head_pid,
        "head_started": started,
        "driver_pid": os.getpid(),
        "published": time.time(),
    }
    try:
        _write_private(token_path, token + "\n")
        _write_private(str(base) + ".json", json.dumps(entry))
    except OSError:
        unpublish(str(base) + ".json")
        return None
    return str(base) + ".json"


def _write_private(path: str, text: str) -> None:
    """Write ``text`` to ``path`` atomically, readable by this user only."""
    tmp = f"{path}.{os.getpid()}.tmp"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
    try:
        os.write(fd, text.encode())
    finally:
        os.close(fd)
    os.replace(tmp, path)


def unpublish(path: str) -> None:
    """Remove a published entry and its token file. Idempotent."""
    for p in (path, path.removesuffix(".json") + ".token"):
        try:
            os.unlink(p)
        except OSError:
            pass


def discover() -> list[LocalCluster]:
    """The live published clusters of this user on this host, oldest first; stale entries are
    removed."""
    directory = _private_dir(create=False)
    if directory is None:
        return []
    found = []
    for path in sorted(directory.glob("cluster-*.json")):
        try:
            raw = json.loads(path.read_text())
            entry = LocalCluster(
                str(raw["address"]),
                str(raw["token_file"]),
                int(raw["head_pid"]),
                float(raw["head_started"]),
                int(raw.get("driver_pid", 0)),
                str(path),
            )
        except (OSError, ValueError, KeyError, TypeError):
            continue  # being written, or not ours to judge: leave it
        started = _started(entry.head_pid)
        if started is None or abs(started - entry.head_started) > 1.0:
            unpublish(str(path))  # its head is gone (or the pid was reused)
            continue
        found.append(entry)
    return sorted(found, key=lambda e: e.head_started)


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
