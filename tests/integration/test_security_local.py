"""Attacks by other users of the same host: a planted runtime directory entry, the debug
listener flooded by strangers, the token read from /proc/<pid>/environ.

The attacker runs as another uid (``nobody``, through ``setpriv``); these tests need root and
``setpriv`` and are skipped without them.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import socket
import stat
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from rayless.actors import Cluster
from rayless.actors.control import debug
from rayless.actors.control.debug import DebugServer, client_handshake
from rayless.actors.core import context, published
from rayless.actors.launch.local import LocalProcesses
from rayless.errors import AuthError, ConnectError
from tests.environ import without_rayless
from tests.integration.edge_classes import Holder
from tests.waiting import wait_until_sync

pytestmark = pytest.mark.integration

NOBODY = 65534
_SETPRIV = shutil.which("setpriv")
needs_other_uid = pytest.mark.skipif(
    os.geteuid() != 0 or _SETPRIV is None,
    reason="attacks run as another uid: needs root and setpriv",
)


def wait_until(pred: Callable[[], bool], timeout: float = 30.0, what: str = "condition") -> None:
    """``tests.waiting.wait_until_sync`` with this module's defaults."""
    wait_until_sync(pred, timeout, what, interval=0.05)


def as_nobody(code: str, *args: str) -> subprocess.CompletedProcess[str]:
    """Run ``python3 -c code args`` as uid/gid 65534 (the system interpreter: no rayless)."""
    assert _SETPRIV is not None
    cmd = [_SETPRIV, f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups"]
    return subprocess.run(
        [*cmd, "/usr/bin/python3", "-c", code, *args],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )


# -- 10: a planted runtime directory entry -------------------------------------------------

PLANT = """
import json, os, sys
d, pid, started = sys.argv[1], int(sys.argv[2]), float(sys.argv[3])
tok = os.path.join(d, f"cluster-{pid}.token")
with open(tok, "w") as f:
    f.write("n" * 32 + "\\n")
os.chmod(tok, 0o600)
entry = {"address": "tcp://127.0.0.1:9", "token_file": tok, "head_pid": pid,
         "head_started": started, "driver_pid": pid}
with open(os.path.join(d, f"cluster-{pid}.json"), "w") as f:
    json.dump(entry, f)
"""


@pytest.fixture
def open_runtime_dir(
    monkeypatch: pytest.MonkeyPatch,
) -> Iterator[tuple[Path, subprocess.Popen[bytes]]]:
    """A runtime directory of ours with mode 0777 in which ``nobody`` planted a live-looking
    entry (its "head" is a process of nobody's that runs), as the auditor did."""
    base = Path(tempfile.mkdtemp(prefix="rayless-sec-"))
    base.chmod(0o755)
    rt = base / "rayless"
    rt.mkdir()
    rt.chmod(0o777)
    monkeypatch.setenv("RAYLESS_RUNTIME_DIR", str(rt))
    assert _SETPRIV is not None
    head = subprocess.Popen(
        [_SETPRIV, f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups", "sleep", "300"]
    )
    try:
        started = published._started(head.pid)
        assert started is not None
        as_nobody(PLANT, str(rt), str(head.pid), str(started))
        assert (rt / f"cluster-{head.pid}.json").stat().st_uid == NOBODY
        yield rt, head
    finally:
        head.kill()
        head.wait()
        shutil.rmtree(base, ignore_errors=True)


@needs_other_uid
def test_a_directory_others_can_write_is_refused_and_moved_aside(
    open_runtime_dir: tuple[Path, subprocess.Popen[bytes]],
) -> None:
    rt, head = open_runtime_dir
    with pytest.raises(ConnectError, match=rf"{rt} is writable by other users \(mode 0777\)"):
        published.discover()
    with pytest.raises(ConnectError, match="writable by other users"):
        published.find_one()  # what actors.connect() and `rayless status` use
    ours = published.publish("tcp://127.0.0.1:4242", "o" * 32, os.getpid())
    assert ours is not None and ours.startswith(str(rt))
    assert stat.S_IMODE(rt.stat().st_mode) == 0o700
    assert sorted(p.name for p in rt.iterdir()) == [
        f"cluster-{os.getpid()}.json",
        f"cluster-{os.getpid()}.token",
    ]  # nobody's entry went with the old directory
    aside = [p for p in rt.parent.iterdir() if p.name.startswith("rayless.untrusted-")]
    assert len(aside) == 1 and (aside[0] / f"cluster-{head.pid}.json").exists()
    found = published.find_one()
    assert found.address == "tcp://127.0.0.1:4242" and found.token() == "o" * 32
    published.unpublish(ours)


@needs_other_uid
def test_a_directory_that_was_writable_is_refused_by_its_planted_entry(
    open_runtime_dir: tuple[Path, subprocess.Popen[bytes]],
) -> None:
    rt, head = open_runtime_dir
    rt.chmod(0o700)  # what rayless used to do: chmod, then trust what was planted
    planted = rt / f"cluster-{head.pid}.json"
    with pytest.raises(ConnectError, match=rf"{planted} belongs to uid {NOBODY}"):
        published.discover()
    env = without_rayless()
    env["RAYLESS_RUNTIME_DIR"] = str(rt)
    out = subprocess.run(
        [sys.executable, "-m", "rayless.cli", "status"],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
    )
    assert out.returncode != 0 and f"belongs to uid {NOBODY}" in out.stderr, out
    assert "tcp://127.0.0.1:9" not in out.stdout


def test_a_token_file_that_is_a_link_or_not_private_is_refused(tmp_path: Path) -> None:
    real = tmp_path / "real"
    real.write_text("r" * 32 + "\n")
    real.chmod(0o600)
    assert context.read_token_file(str(real)) == "r" * 32
    link = tmp_path / "link"
    link.symlink_to(real)
    with pytest.raises(ConnectError, match=rf"{link} is a symbolic link"):
        context.read_token_file(str(link))
    real.chmod(0o640)
    with pytest.raises(ConnectError, match=r"read or written by other users \(mode 0640"):
        context.read_token_file(str(real))


def test_an_entry_naming_another_token_file_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    rt = tmp_path / "rt"
    monkeypatch.setenv("RAYLESS_RUNTIME_DIR", str(rt))
    entry = published.publish("tcp://127.0.0.1:5", "e" * 32, os.getpid())
    assert entry is not None
    raw = json.loads(Path(entry).read_text())
    raw["token_file"] = str(tmp_path / "elsewhere.token")
    Path(entry).write_text(json.dumps(raw))
    with pytest.raises(ConnectError, match="not its own"):
        published.discover()
    published.unpublish(entry)


@needs_other_uid
def test_a_runtime_directory_of_another_user_is_not_written(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    rt = tmp_path / "rt"
    rt.mkdir(mode=0o700)
    os.chown(rt, NOBODY, NOBODY)
    monkeypatch.setenv("RAYLESS_RUNTIME_DIR", str(rt))
    assert published.publish("tcp://127.0.0.1:6", "x" * 32, os.getpid()) is None
    assert list(rt.iterdir()) == []
    with pytest.raises(ConnectError, match=rf"{rt} belongs to uid {NOBODY}"):
        published.discover()


# -- 11: the debug listener against strangers ----------------------------------------------

TOKEN = "d" * 32
CAP = 8  # debug.MAX_HANDSHAKES: strangers handshaking at once


def _debug_server(
    monkeypatch: pytest.MonkeyPatch, handshake_timeout: float, evict_after: float = 3600.0
) -> DebugServer:
    """An actor's debug listener with this handshake deadline, cutting a stranger for a
    newcomer after ``evict_after`` (and an hour between log lines about strangers)."""
    monkeypatch.setattr(debug, "HANDSHAKE_TIMEOUT", handshake_timeout)
    monkeypatch.setattr(debug, "EVICT_AFTER", evict_after, raising=False)
    monkeypatch.setattr(debug, "LOG_INTERVAL", 3600.0, raising=False)
    server = DebugServer("sec", TOKEN)
    server.start()
    return server


def _dial(server: DebugServer) -> socket.socket:
    host, _, port = server.address.removeprefix("tcp://").rpartition(":")
    return socket.create_connection((host, int(port)), timeout=30)


def test_strangers_hold_at_most_a_few_handshakes(monkeypatch: pytest.MonkeyPatch) -> None:
    server = _debug_server(monkeypatch, handshake_timeout=60.0)  # none ends while we look
    silent = [_dial(server) for _ in range(60)]
    try:
        greeted = sum(sock.recv(64).startswith(b"RAYLESS-DEBUG 1 ") for sock in silent)
        assert greeted == CAP  # the others were closed unread (the auditor saw 382 threads)
        assert server.stats["refused"] == 60 - CAP and server.stats["peak"] == CAP
    finally:
        for sock in silent:
            sock.close()
    try:
        wait_until(lambda: server.stats["handshaking"] == 0, what="the handshakes to end")
        with _dial(server) as sock:  # the slots are free again for a token holder
            conn = client_handshake(sock, TOKEN, "list")
            assert conn.readline() == "[]"
    finally:
        server.stop()


def test_idle_strangers_give_their_slots_to_a_token_holder(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    server = _debug_server(monkeypatch, handshake_timeout=60.0, evict_after=0.5)
    idle = [_dial(server) for _ in range(CAP)]
    try:
        assert all(sock.recv(64).startswith(b"RAYLESS-DEBUG 1 ") for sock in idle)
        greeted = time.monotonic()  # each was accepted before it was greeted
        wait_until(lambda: time.monotonic() - greeted > 0.6, what="evict_after to pass")
        with _dial(server) as sock:  # every slot is held, by strangers past evict_after
            conn = client_handshake(sock, TOKEN, "list")
            assert conn.readline() == "[]"
        assert server.stats["evicted"] == 1 and server.stats["rejected"] == 0
        idle[0].settimeout(30)
        while idle[0].recv(4096):  # the rest of its greeting, then the end: it was cut
            pass
    finally:
        for sock in idle:
            sock.close()
        server.stop()


def test_a_client_dripping_bytes_is_cut_at_the_handshake_deadline(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    server = _debug_server(monkeypatch, handshake_timeout=2.0)
    sock = _dial(server)
    closed = threading.Event()

    def drip() -> None:  # a byte every half second, never a whole line
        try:
            while not closed.is_set():
                sock.sendall(b"a")
                closed.wait(0.5)
        except OSError:
            pass

    dripper = threading.Thread(target=drip)
    dripper.start()
    try:
        sock.settimeout(60)  # a deadline per read would keep this client forever
        received = b""
        try:
            while chunk := sock.recv(4096):  # the greeting, then the end of the stream
                received += chunk
        except ConnectionResetError:
            pass  # the cut connection had unread drip bytes: the kernel ends it with a reset
        assert received.startswith(b"RAYLESS-DEBUG 1 ")
        assert server.stats["timed_out"] == 1
    finally:
        closed.set()
        dripper.join()
        sock.close()
        server.stop()


def test_rejected_clients_are_logged_at_a_bounded_rate(
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
    capfd: pytest.CaptureFixture[str],
) -> None:
    caplog.set_level(logging.WARNING, logger="rayless.debug")
    server = _debug_server(monkeypatch, handshake_timeout=10.0)
    try:
        for _ in range(100):
            with _dial(server) as sock, pytest.raises(AuthError):
                client_handshake(sock, "w" * 32, "stack")
    finally:
        server.stop()
    logged = [r.getMessage() for r in caplog.records] + capfd.readouterr().err.splitlines()
    lines = [text for text in logged if "rejected a debug client" in text]
    assert len(lines) == 1  # one per interval (an hour here), however many strangers
    assert server.stats["rejected"] == 100


# -- 12: the token in /proc/<pid>/environ ----------------------------------------------------


def _environ(pid: int) -> bytes:
    return Path(f"/proc/{pid}/environ").read_bytes()


@pytest.mark.local_cluster(nodes=2, gpus_per_node=0, isolated=True)
async def test_no_process_of_a_local_cluster_has_the_token_in_its_environ(
    local_cluster: Cluster, local_cluster_processes: LocalProcesses
) -> None:
    holder = await local_cluster.spawn(Holder)
    actor = await holder.pid()
    children = await holder.start_children()  # a child, and a grandchild that left the group
    token = local_cluster_processes.token.encode()
    pids = {"actor": actor, "child": children[0], "escaped child": children[1]}
    head, zygote, light_zygote, *agents = local_cluster_processes.pids
    pids.update({"head": head, "zygote": zygote, "light zygote": light_zygote})
    pids.update({f"agent {i}": pid for i, pid in enumerate(agents)})
    assert len(agents) == 2
    seen = {what: token in _environ(pid) for what, pid in pids.items()}
    assert seen == dict.fromkeys(pids, False)
    for pid in pids.values():  # (RAYLESS_TOKEN_FD names a pipe, closed once read)
        assert b"\x00RAYLESS_TOKEN=" not in b"\x00" + _environ(pid)
    assert await holder.token_seen() == {"actor": None, "child": "<none>"}


LAUNCH_DRIVER = """
import asyncio, json, os, subprocess
import psutil
import rayless.actors as actors

class Parent(actors.Actor):
    def start_child(self):
        return subprocess.Popen(["sleep", "300"]).pid

async def main():
    cluster = await actors.connect()
    child = await (await cluster.spawn(Parent)).start_child()
    with open(os.environ["RAYLESS_TOKEN_FILE"]) as f:
        token = f.read().strip().encode()
    found = {}
    for proc in psutil.Process(os.getppid()).children(recursive=True):
        with open(f"/proc/{proc.pid}/environ", "rb") as f:
            found[proc.pid] = [" ".join(proc.cmdline()), token in f.read()]
    print("FOUND", json.dumps({"child": child, "procs": found, "env": sorted(
        k for k in os.environ if k.startswith("RAYLESS_TOKEN"))}), flush=True)
    await cluster.aclose()

asyncio.run(main())
"""


@pytest.mark.timeout(300)
def test_no_process_of_a_launch_has_the_token_in_its_environ(tmp_path: Path) -> None:
    driver = tmp_path / "driver.py"
    driver.write_text(LAUNCH_DRIVER)
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    env = without_rayless()
    argv = [sys.executable, "-m", "rayless.actors.launch.node", "--nnodes", "1"]
    argv += ["--master-addr", "127.0.0.1", "--master-port", str(port), "--fake-gpus", "0"]
    argv += ["--log-dir", str(tmp_path / "logs"), "--", str(driver)]
    out = subprocess.run(argv, capture_output=True, text=True, timeout=240, env=env, cwd=tmp_path)
    assert out.returncode == 0, out.stderr[-3000:]
    line = next(x for x in out.stdout.splitlines() if x.startswith("FOUND "))
    found = json.loads(line.removeprefix("FOUND "))
    assert found["env"] == ["RAYLESS_TOKEN_FILE"]  # the driver's: a file, not the token
    procs = found["procs"]
    assert str(found["child"]) in procs  # the actor's child is among what was read
    roles = " ".join(cmd for cmd, _ in procs.values())
    for role in ("control.head", "control.agent", "host.zygote", "driver.py"):
        assert role in roles
    assert [cmd for cmd, holds in procs.values() if holds] == []


async def test_an_actor_started_as_a_fresh_interpreter_has_no_token_in_its_environ() -> None:
    async with await Cluster.local(nodes=1, zygote=False) as cluster:  # agents' ProcessSpawner
        holder = await cluster.spawn(Holder)
        actor = await holder.pid()
        child = (await holder.start_children())[0]
        token = cluster.token.encode()
        assert [pid for pid in (actor, child) if token in _environ(pid)] == []
        assert await holder.token_seen() == {"actor": None, "child": "<none>"}


FD_HOG = """
import os, resource, sys, time
from rayless.actors.control import debug
debug.LOG_INTERVAL = 3600.0
server = debug.DebugServer("fds", "d" * 32)
print(server.start(), flush=True)
resource.setrlimit(resource.RLIMIT_NOFILE, (128, resource.getrlimit(resource.RLIMIT_NOFILE)[1]))
hog = []
try:
    while True:  # every fd the process may have: as strangers' connections would
        hog.append(os.open("/dev/null", os.O_RDONLY))
except OSError:
    pass
print("full", flush=True)
sys.stdin.readline()  # a client connected: the listener tries to accept it and cannot
end = time.monotonic() + 30
while server.stats.get("accept_failed", 0) == 0 and server._thread.is_alive():
    assert time.monotonic() < end, "the listener never tried to accept"
    time.sleep(0.01)
for fd in hog:
    os.close(fd)
print("freed", flush=True)
sys.stdin.readline()
"""


def test_the_debug_listener_survives_running_out_of_fds(tmp_path: Path) -> None:
    err = tmp_path / "stderr"
    with open(err, "w") as stderr:
        proc = subprocess.Popen(
            [sys.executable, "-c", FD_HOG],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=stderr,
            text=True,
        )
    assert proc.stdin is not None and proc.stdout is not None
    try:
        address = proc.stdout.readline().strip()
        assert proc.stdout.readline().strip() == "full", err.read_text()
        host, _, port = address.removeprefix("tcp://").rpartition(":")
        # the first gets the fd the listener's blocked accept() had reserved; the second
        # finds none: its accept() fails with EMFILE
        socks = [socket.create_connection((host, int(port)), timeout=30) for _ in range(2)]
        try:
            proc.stdin.write("\n")
            proc.stdin.flush()
            assert proc.stdout.readline().startswith("freed"), err.read_text()
            for sock in socks:  # the accept is retried once fds are back
                assert sock.recv(64).startswith(b"RAYLESS-DEBUG 1 ")
        finally:
            for sock in socks:
                sock.close()
        lines = err.read_text().splitlines()
        assert len(lines) < 5, lines  # one line per interval, no traceback
    finally:
        proc.kill()
        proc.wait(timeout=30)
