"""Writing files in directories that someone else may also write (``/tmp``, a shared output
directory): no name we create can be one they planted.

* :func:`atomic_file` / :func:`atomic_write`: the content goes to a fresh temporary file in
  the target's directory, created with ``O_CREAT|O_EXCL|O_NOFOLLOW`` under a random name (a
  planted file or symbolic link of that name makes the create fail, and it is tried again
  under another name: it is never opened, let alone followed), then ``os.replace`` puts it
  in place in one step (a reader sees the old file or the whole new one). If the target name
  itself is a symbolic link, the link is replaced, never the file it points to. On any error
  the temporary is removed and the target is untouched. Not fsynced: a crash of the machine
  may leave the old content, never a mix.
* :func:`open_append`: a log file opened for appending with ``O_NOFOLLOW`` that must be this
  user's regular file (a link, a fifo or another user's file is refused with an OSError).

Every layer writes its files through these (trace files, published cluster entries and
tokens, checkpoints, demo reports, actor logs); the transport is the bottom layer, so any may
import it.
"""

from __future__ import annotations

import contextlib
import errno
import os
import secrets
import stat
from collections.abc import Iterator
from typing import IO, Any

__all__ = ["atomic_file", "atomic_write", "open_append"]

_CREATE = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
_TRIES = 100


def _create_temp(directory: str, base: str, perms: int, dir_fd: int | None) -> tuple[int, str]:
    """A new file beside the target: its fd and its name (relative to ``dir_fd`` if given).

    Raises:
        OSError: it cannot be created (FileExistsError only after ``_TRIES`` taken names).
    """
    for _ in range(_TRIES):
        name = f".{base}.{secrets.token_hex(8)}.tmp"
        path = name if dir_fd is not None else os.path.join(directory, name)
        try:
            return os.open(path, _CREATE, perms, dir_fd=dir_fd), path
        except FileExistsError:
            continue  # taken (planted, or a rare clash): another random name
    raise FileExistsError(errno.EEXIST, f"no free temporary name in {directory or '.'!r}")


@contextlib.contextmanager
def atomic_file(
    path: str | os.PathLike[str],
    mode: str = "w",
    *,
    perms: int = 0o666,
    encoding: str | None = "utf-8",
    dir_fd: int | None = None,
) -> Iterator[IO[Any]]:
    """A file object to write ``path``'s new content to; on a clean exit it replaces ``path``
    at once (see the module docstring). ``mode`` is ``"w"`` or ``"wb"``; ``perms`` the new
    file's mode before the umask (``0o600`` for secrets); with ``dir_fd``, ``path`` is a
    name in that (already opened and checked) directory.

    Raises:
        OSError: the temporary cannot be created or written, or the replace fails.
    """
    if mode not in ("w", "wb"):
        raise ValueError(f"atomic_file writes with mode 'w' or 'wb', not {mode!r}")
    target = os.fspath(path)
    directory, base = os.path.split(target)
    if dir_fd is not None and directory:
        raise ValueError(f"with dir_fd, {target!r} must be a plain name")
    fd, tmp = _create_temp(directory, base, perms, dir_fd)
    try:
        with open(fd, mode, encoding=None if mode == "wb" else encoding) as f:
            yield f
        os.replace(
            tmp, base if dir_fd is not None else target, src_dir_fd=dir_fd, dst_dir_fd=dir_fd
        )
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp, dir_fd=dir_fd)
        raise


def atomic_write(
    path: str | os.PathLike[str],
    data: str | bytes,
    *,
    perms: int = 0o666,
    dir_fd: int | None = None,
) -> str:
    """Write ``data`` (text as UTF-8) to ``path`` with :func:`atomic_file`; returns the path.

    Raises:
        OSError: as :func:`atomic_file`.
    """
    mode = "wb" if isinstance(data, bytes) else "w"
    with atomic_file(path, mode, perms=perms, dir_fd=dir_fd) as f:
        f.write(data)
    return os.fspath(path)


def open_append(path: str | os.PathLike[str], perms: int = 0o644) -> int:
    """An fd appending to ``path`` (created if missing), which must be this user's regular
    file, not a symbolic link.

    Raises:
        OSError: it cannot be opened, is a link (ELOOP), or is not this user's regular file.
    """
    flags = os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_NOFOLLOW | os.O_CLOEXEC
    fd = os.open(path, flags | os.O_NONBLOCK, perms)  # a planted fifo must not block us
    info = os.fstat(fd)
    if not stat.S_ISREG(info.st_mode) or info.st_uid != os.geteuid():
        os.close(fd)
        raise PermissionError(errno.EPERM, "not a regular file of this user: refused", path)
    os.set_blocking(fd, True)
    return fd
