"""Files a spawn ships to its node (Ray's ``runtime_env`` ``working_dir`` and ``py_modules``):
packed here into a zip named by its sha256, uploaded to the head once per cluster, fetched
and extracted by each node that starts such an actor (``actors.control.node_packages``).

* ``working_dir``: a local directory. The actor's current directory is its extract, first on
  its import path (so ``import my_module`` finds the directory's modules).
* ``py_modules``: local package directories, ``.py`` files, pure-Python wheels (``.whl``,
  extracted as they are) or imported modules; each extract is on the import path, so the
  module imports by its name.

Left out of a package: the ``excludes`` patterns (``.gitignore`` syntax, relative to the
packed directory) and what each ``.gitignore`` or ``.rayignore`` inside it names, as Ray
does. A package is packed once per process (later spawns reuse it: edits made after the
first spawn are not seen), deterministically (the same files give the same digest, so a
node extracts it once). Remote URIs (``s3://``, ``https://``) are refused: nothing is
downloaded.
"""

from __future__ import annotations

import hashlib
import io
import os
import stat
import threading
import zipfile
from collections.abc import Awaitable, Callable, Iterator, Sequence
from dataclasses import dataclass
from types import ModuleType

import pathspec

from rayless.actors.control.head_packages import MAX_PACKAGE
from rayless.actors.errors import PackageError
from rayless.actors.protocol.messages import PackageRef, PackageUpload

__all__ = ["MAX_FILES_BYTES", "Package", "pack_module", "pack_working_dir", "upload"]

MAX_FILES_BYTES = 4 * 2**30  # a directory's files before zipping: more is refused at once
IGNORE_FILES = (".gitignore", ".rayignore")
_EPOCH = (1980, 1, 1, 0, 0, 0)  # every entry's time: the same files give the same zip


@dataclass(frozen=True)
class Package:
    """A packed zip and its reference (``ref.digest`` is the zip's sha256)."""

    ref: PackageRef
    data: bytes
    source: str  # what was packed, for messages


_cache: dict[tuple[object, ...], Package] = {}
_lock = threading.Lock()


def pack_working_dir(path: str, excludes: Sequence[str] = ()) -> Package:
    """The package of directory ``path`` as a ``working_dir``.

    Raises:
        ValueError: ``path`` is a URI or not a directory.
        PackageError: its files are too big to ship.
    """
    if "://" in path:
        raise ValueError(f"working_dir {path!r}: remote URIs are not fetched by rayless")
    root = os.path.abspath(os.path.expanduser(path))
    if not os.path.isdir(root):
        raise ValueError(f"working_dir {path!r} is not a directory")
    key = ("working_dir", root, tuple(excludes))
    return _cached(key, lambda: _zip_dir(root, "", excludes, working_dir=True, source=path))


def pack_module(module: str | ModuleType, excludes: Sequence[str] = ()) -> Package:
    """The package of one ``py_modules`` entry: a package directory, a ``.py`` file, a wheel,
    or an imported module (its package directory or file).

    Raises:
        ValueError: a URI, a path that does not exist, or a module without a file.
        PackageError: its files are too big to ship.
    """
    if isinstance(module, ModuleType):
        paths = list(getattr(module, "__path__", []))
        where = paths[0] if paths else getattr(module, "__file__", None)
        if not where:
            raise ValueError(f"py_modules: module {module.__name__!r} has no file to ship")
        path = str(where)
    else:
        path = module
    if "://" in path:
        raise ValueError(f"py_modules {path!r}: remote URIs are not fetched by rayless")
    full = os.path.abspath(os.path.expanduser(path))
    key = ("py_module", full, tuple(excludes))
    if os.path.isdir(full):
        name = os.path.basename(full.rstrip(os.sep))
        return _cached(key, lambda: _zip_dir(full, name, excludes, working_dir=False, source=path))
    if os.path.isfile(full) and full.endswith(".whl"):
        return _cached(key, lambda: _whole_file(full, path))
    if os.path.isfile(full) and full.endswith(".py"):
        return _cached(key, lambda: _zip_files([(os.path.basename(full), full)], source=path))
    raise ValueError(
        f"py_modules entry {path!r} is not a directory, a .py file or a .whl file on this host"
    )


def _cached(key: tuple[object, ...], make: Callable[[], Package]) -> Package:
    with _lock:
        found = _cache.get(key)
    if found is not None:
        return found
    package: Package = make()
    with _lock:
        return _cache.setdefault(key, package)


def _zip_dir(
    root: str, prefix: str, excludes: Sequence[str], *, working_dir: bool, source: str
) -> Package:
    files = sorted(_walk(root, excludes))
    total = sum(os.path.getsize(full) for _, full in files)
    if total > MAX_FILES_BYTES:
        raise PackageError(
            f"{source!r} holds {total / 2**20:.0f} MiB of files: leave the big ones out with "
            f"runtime_env 'excludes' (at most {MAX_PACKAGE // 2**20} MiB zipped ship)"
        )
    named = [(f"{prefix}/{rel}" if prefix else rel, full) for rel, full in files]
    return _zip_files(named, source=source, working_dir=working_dir)


def _walk(root: str, excludes: Sequence[str]) -> Iterator[tuple[str, str]]:
    """``(relative name, path)`` of the files under ``root`` that are not excluded."""
    top = pathspec.GitIgnoreSpec.from_lines(excludes)
    # each directory's ignore files apply below it, as git's do
    specs: list[tuple[str, pathspec.GitIgnoreSpec]] = [("", top)]
    for here, dirs, names in os.walk(root):
        rel_here = os.path.relpath(here, root)
        rel_here = "" if rel_here == "." else rel_here.replace(os.sep, "/")
        while specs and specs[-1][0] and not _under(rel_here, specs[-1][0]):
            specs.pop()  # out of the directory whose ignore files these were
        for ignore in IGNORE_FILES:
            lines = _lines(os.path.join(here, ignore))
            if lines:
                specs.append((rel_here, pathspec.GitIgnoreSpec.from_lines(lines)))
        kept = []
        for d in sorted(dirs):
            rel = f"{rel_here}/{d}" if rel_here else d
            if not os.path.islink(os.path.join(here, d)) and not _excluded(rel + "/", specs):
                kept.append(d)
        dirs[:] = kept
        for n in names:
            rel = f"{rel_here}/{n}" if rel_here else n
            full = os.path.join(here, n)
            if os.path.isfile(full) and not _excluded(rel, specs):
                yield rel, full


def _under(rel: str, base: str) -> bool:
    return rel == base or rel.startswith(base + "/")


def _excluded(rel: str, specs: list[tuple[str, pathspec.GitIgnoreSpec]]) -> bool:
    for base, spec in specs:
        if base and not _under(rel.rstrip("/"), base):
            continue
        if spec.match_file(rel[len(base) + 1 :] if base else rel):
            return True
    return False


def _lines(path: str) -> list[str]:
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            return f.read().splitlines()
    except OSError:
        return []


def _zip_files(named: list[tuple[str, str]], *, source: str, working_dir: bool = False) -> Package:
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", zipfile.ZIP_DEFLATED, compresslevel=1) as archive:
        for name, full in named:
            info = zipfile.ZipInfo(name, _EPOCH)
            mode = os.stat(full).st_mode
            info.external_attr = (stat.S_IFREG | (0o755 if mode & 0o111 else 0o644)) << 16
            info.compress_type = zipfile.ZIP_DEFLATED
            with open(full, "rb") as src, archive.open(info, "w") as dst:
                while chunk := src.read(2**20):
                    dst.write(chunk)
            if buffer.tell() > MAX_PACKAGE:
                raise PackageError(
                    f"{source!r} zips to more than {MAX_PACKAGE // 2**20} MiB: leave big files "
                    "out with runtime_env 'excludes'"
                )
    data = buffer.getvalue()
    ref = PackageRef(hashlib.sha256(data).hexdigest(), len(data), working_dir)
    return Package(ref, data, source)


def _whole_file(full: str, source: str) -> Package:
    if os.path.getsize(full) > MAX_PACKAGE:
        raise PackageError(f"{source!r} is bigger than {MAX_PACKAGE // 2**20} MiB")
    with open(full, "rb") as f:
        data = f.read()
    return Package(PackageRef(hashlib.sha256(data).hexdigest(), len(data)), data, source)


UPLOAD_PART = 4 * 2**20  # bytes travel in the message header (16 MiB at most)


async def upload(request: Callable[..., Awaitable[bool]], package: Package) -> None:
    """Send ``package`` to the head in parts, unless it holds it already; ``request`` is the
    runtime's ``head_request``.

    Raises:
        PackageError: the head refused it (too big, its store full).
    """
    data, digest, size = package.data, package.ref.digest, package.ref.size
    offset = 0
    while True:
        part = data[offset : offset + UPLOAD_PART]
        if await request(PackageUpload(digest, size, offset, part), timeout=120):
            return
        offset += len(part)
        if offset >= size:
            raise PackageError(f"the head did not keep package {package.source!r}")
