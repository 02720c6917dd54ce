"""Spawns' files (Ray's ``working_dir`` and ``py_modules``): packing on the driver, the head's
package store, a node's fetch and extraction, and what an archive may not do."""

from __future__ import annotations

import asyncio
import hashlib
import io
import os
import stat
import zipfile
from pathlib import Path
from types import SimpleNamespace

import pytest

from rayless.actors.api import packages as packing
from rayless.actors.api.packages import pack_module, pack_working_dir, upload
from rayless.actors.control import head_packages, node_packages
from rayless.actors.control.head_packages import HeadPackages
from rayless.actors.control.node_packages import NodePackages, extract
from rayless.actors.errors import PackageError
from rayless.actors.protocol.messages import PackageFetch, PackageRef, PackageUpload
from rayless.transport.errors import ProtocolError


@pytest.fixture(autouse=True)
def _fresh_cache() -> None:
    packing._cache.clear()


def _names(data: bytes) -> list[str]:
    return zipfile.ZipFile(io.BytesIO(data)).namelist()


def _tree(root: Path) -> None:
    (root / "sub" / "deep").mkdir(parents=True)
    (root / "build").mkdir()
    (root / "main.py").write_text("X = 1\n")
    (root / "run.sh").write_text("#!/bin/sh\n")
    (root / "run.sh").chmod(0o755)
    (root / "big.ckpt").write_bytes(b"0" * 100)
    (root / "build" / "out.o").write_bytes(b"o")
    (root / "sub" / "keep.txt").write_text("k")
    (root / "sub" / "cache.tmp").write_text("t")
    (root / "sub" / "deep" / "notes.md").write_text("n")
    (root / "sub" / ".gitignore").write_text("*.tmp\n")  # applies below sub/ only
    (root / ".rayignore").write_text("/build/\n")
    (root / "elsewhere.tmp").write_text("kept: the *.tmp rule is sub/'s")


def test_a_working_dir_leaves_out_excludes_and_ignore_files(tmp_path: Path) -> None:
    _tree(tmp_path)
    os.symlink(tmp_path, tmp_path / "sub" / "loop")  # a directory link is not followed
    pkg = pack_working_dir(str(tmp_path), excludes=["*.ckpt", "deep/"])
    assert sorted(_names(pkg.data)) == [
        ".rayignore",
        "elsewhere.tmp",
        "main.py",
        "run.sh",
        "sub/.gitignore",
        "sub/keep.txt",
    ]
    assert pkg.ref.working_dir and pkg.ref.size == len(pkg.data)
    assert pkg.ref.digest == hashlib.sha256(pkg.data).hexdigest()
    infos = zipfile.ZipFile(io.BytesIO(pkg.data)).infolist()
    modes = {i.filename: i.external_attr >> 16 for i in infos}
    assert modes["run.sh"] & 0o111 and not modes["main.py"] & 0o111
    # the same files give the same package (a node extracts it once); a change, another
    packing._cache.clear()
    os.utime(tmp_path / "main.py", (1, 1))
    assert pack_working_dir(str(tmp_path), excludes=["*.ckpt", "deep/"]).ref == pkg.ref
    packing._cache.clear()
    (tmp_path / "main.py").write_text("X = 2\n")
    assert pack_working_dir(str(tmp_path), excludes=["*.ckpt", "deep/"]).ref != pkg.ref


def test_bad_sources_are_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(ValueError, match="remote URIs"):
        pack_working_dir("s3://bucket/code.zip")
    with pytest.raises(ValueError, match="not a directory"):
        pack_working_dir(str(tmp_path / "missing"))
    with pytest.raises(ValueError, match="remote URIs"):
        pack_module("https://x/y.whl")
    with pytest.raises(ValueError, match=r"not a directory, a \.py file or a \.whl"):
        pack_module(str(tmp_path / "missing.py"))
    (tmp_path / "w").mkdir()
    (tmp_path / "w" / "blob").write_bytes(os.urandom(4096))
    monkeypatch.setattr(packing, "MAX_PACKAGE", 1024)
    with pytest.raises(PackageError, match="zips to more than"):
        pack_working_dir(str(tmp_path / "w"))
    monkeypatch.setattr(packing, "MAX_FILES_BYTES", 1024)
    with pytest.raises(PackageError, match="excludes"):
        pack_working_dir(str(tmp_path / "w"))


def test_py_modules_keep_their_names(tmp_path: Path) -> None:
    (tmp_path / "mylib").mkdir()
    (tmp_path / "mylib" / "__init__.py").write_text("X = 1\n")
    (tmp_path / "single.py").write_text("Y = 2\n")
    with zipfile.ZipFile(tmp_path / "w-1.0-py3-none-any.whl", "w") as wheel:
        wheel.writestr("wlib/__init__.py", "Z = 3\n")
    assert _names(pack_module(str(tmp_path / "mylib")).data) == ["mylib/__init__.py"]
    assert _names(pack_module(str(tmp_path / "single.py")).data) == ["single.py"]
    whl = pack_module(str(tmp_path / "w-1.0-py3-none-any.whl"))
    assert whl.data == (tmp_path / "w-1.0-py3-none-any.whl").read_bytes()
    assert not whl.ref.working_dir
    module = pack_module(packing)  # an imported module: its file
    assert _names(module.data) == ["packages.py"]


def _zip(entries: list[tuple[str, bytes, int]]) -> bytes:
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as z:
        for name, data, mode in entries:
            info = zipfile.ZipInfo(name)
            info.external_attr = mode << 16
            z.writestr(info, data)
    return buffer.getvalue()


@pytest.mark.parametrize(
    ("name", "mode", "words"),
    [
        ("../evil.py", stat.S_IFREG | 0o644, "leave its directory"),
        ("/etc/evil", stat.S_IFREG | 0o644, "leave its directory"),
        ("a/../../evil", stat.S_IFREG | 0o644, "leave its directory"),
        ("link", stat.S_IFLNK | 0o777, "not a file or directory"),
    ],
)
def test_an_archive_cannot_write_outside_its_directory(
    tmp_path: Path, name: str, mode: int, words: str
) -> None:
    path = tmp_path / "p.zip"
    path.write_bytes(_zip([("ok.py", b"1", stat.S_IFREG | 0o644), (name, b"/etc/passwd", mode)]))
    with pytest.raises(PackageError, match=words):
        extract(str(path), str(tmp_path / "out"))
    assert not (tmp_path / "out").exists() and not (tmp_path / "out.partial").exists()
    assert not (tmp_path / "evil.py").exists()


def test_an_archive_that_extracts_too_big_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "bomb.zip"
    path.write_bytes(_zip([("zeros", b"\0" * 10_000, stat.S_IFREG | 0o644)]))
    monkeypatch.setattr(node_packages, "MAX_EXTRACTED", 5_000)
    with pytest.raises(PackageError, match="extracts to more than"):
        extract(str(path), str(tmp_path / "out"))


def _peer(rid: bytes = b"p1") -> SimpleNamespace:
    return SimpleNamespace(routing_id=rid)


def test_the_head_keeps_a_package_sent_in_parts(monkeypatch: pytest.MonkeyPatch) -> None:
    data = os.urandom(1000)
    digest = hashlib.sha256(data).hexdigest()
    head = HeadPackages()

    async def run() -> None:
        peer = _peer()
        up = head.op_package_upload
        assert not await up(peer, PackageUpload(digest, 1000, 0, data[:400]))  # type: ignore[arg-type]
        with pytest.raises(ProtocolError, match="out of order"):
            await up(peer, PackageUpload(digest, 1000, 100, data[100:200]))  # type: ignore[arg-type]
        assert await up(peer, PackageUpload(digest, 1000, 400, data[400:]))  # type: ignore[arg-type]
        # held now: another sender is answered at once, before sending its bytes
        assert await up(_peer(b"p2"), PackageUpload(digest, 1000, 0, data[:10]))  # type: ignore[arg-type]
        fetch = head.op_package_fetch
        got = await fetch(peer, PackageFetch(digest, 0, 600))  # type: ignore[arg-type]
        got += await fetch(peer, PackageFetch(digest, 600, 600))  # type: ignore[arg-type]
        assert got == data
        with pytest.raises(PackageError, match="holds no package"):
            await fetch(peer, PackageFetch("cd" * 32, 0, 10))  # type: ignore[arg-type]
        with pytest.raises(ProtocolError, match="64 hex"):
            await fetch(peer, PackageFetch("../x", 0, 10))  # type: ignore[arg-type]
        # bytes that are not the digest's are not kept
        other = "ef" * 32
        with pytest.raises(PackageError, match="do not have its digest"):
            await up(peer, PackageUpload(other, 3, 0, b"abc"))  # type: ignore[arg-type]
        with pytest.raises(PackageError, match="holds no package"):
            await fetch(peer, PackageFetch(other, 0, 3))  # type: ignore[arg-type]
        # too big; the store full; a connection that goes drops what it was sending
        with pytest.raises(PackageError, match="at most"):
            await up(peer, PackageUpload(other, head_packages.MAX_PACKAGE + 1, 0, b""))  # type: ignore[arg-type]
        monkeypatch.setattr(head_packages, "MAX_STORE", 1500)
        with pytest.raises(PackageError, match="store is full"):
            await up(peer, PackageUpload(other, 600, 0, b"x"))  # type: ignore[arg-type]
        assert not await up(peer, PackageUpload(other, 400, 0, b"x"))  # type: ignore[arg-type]
        head.peer_gone(b"p1")
        assert not head._partials

    asyncio.run(run())
    directory = head._dir
    assert directory is not None and os.path.isdir(directory)
    assert stat.S_IMODE(os.stat(directory).st_mode) == 0o700
    head.close()
    assert not os.path.exists(directory)


def test_a_node_fetches_and_extracts_a_package_once(tmp_path: Path) -> None:
    (tmp_path / "code").mkdir()
    (tmp_path / "code" / "helper.py").write_text("VALUE = 'shipped'\n")
    pkg = pack_working_dir(str(tmp_path / "code"))
    head = HeadPackages()
    calls = []

    async def request(msg: PackageUpload, timeout: float) -> bool:
        return await head.op_package_upload(_peer(), msg)  # type: ignore[arg-type]

    async def fetch(msg: PackageFetch) -> bytes:
        calls.append(msg.offset)
        return await head.op_package_fetch(_peer(b"agent"), msg)  # type: ignore[arg-type]

    node = NodePackages(fetch)

    async def run() -> None:
        await upload(request, pkg)
        first, second = await asyncio.gather(node.path(pkg.ref), node.path(pkg.ref))
        assert first == second and calls == [0]
        assert (Path(first) / "helper.py").read_text() == "VALUE = 'shipped'\n"
        missing = PackageRef("cd" * 32, 5, True)
        for _ in range(2):  # a failure is not remembered: the next spawn tries again
            with pytest.raises(PackageError, match="holds no package"):
                await node.path(missing)

    try:
        asyncio.run(run())
    finally:
        node.close()
        head.close()
