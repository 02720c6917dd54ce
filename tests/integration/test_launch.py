"""scripts/launch.py: 2-3 "nodes" as separate launch processes on loopback.

Every launch gets a marker in its environment, which all of its descendants (head, agent,
zygote, actors, driver) inherit; "nothing left running" means no process carries the marker.
"""

from __future__ import annotations

import os
import signal
import socket
import stat
import subprocess
import sys
import time
import uuid
from pathlib import Path

import psutil
import pytest

from tests.waiting import eventually_sync, wait_until_sync

pytestmark = [pytest.mark.integration, pytest.mark.timeout(150)]

REPO = Path(__file__).resolve().parents[2]
MARK = "RAYLESS_TEST_LAUNCH_MARK"

DRIVER = """
import asyncio, os, sys, time
import rayless.actors as actors
class Where(actors.Actor):
    def node(self):
        return os.environ["RAYLESS_NODE_ID"]

async def main(mode, arg):
    cluster = await actors.connect()
    nodes = await cluster.nodes()
    print("NODES", sorted((n["rank"], n["node_id"]) for n in nodes), flush=True)
    handles = [await cluster.spawn(Where, node=n["node_id"]) for n in nodes]
    print("ACTORS", sorted([await h.node() for h in handles]), flush=True)
    print("READY", flush=True)
    if mode == "wait":  # until the test has looked at the processes
        while not os.path.exists(arg):
            await asyncio.sleep(0.05)
    elif mode == "sleep":
        await asyncio.sleep(300)
    await cluster.aclose()
    return int(os.environ.get("DRIVER_EXIT", "0"))

if __name__ == "__main__":
    sys.exit(asyncio.run(main(sys.argv[1], sys.argv[2] if len(sys.argv) > 2 else "")))
"""


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def marked(mark: str) -> list[str]:
    """Live processes that carry ``mark`` in their environment."""
    found = []
    for proc in psutil.process_iter(["pid"]):
        try:
            if proc.environ().get(MARK) == mark and proc.status() != psutil.STATUS_ZOMBIE:
                found.append(f"{proc.pid}: {' '.join(proc.cmdline())}")
        except psutil.Error:
            continue
    return found


def assert_none_left(*marks: str, timeout: float = 15.0) -> None:
    def left() -> list[str]:
        return [p for m in marks for p in marked(m)]

    if not eventually_sync(lambda: not left(), timeout=timeout, interval=0.2):
        assert left() == [], "left running:\n" + "\n".join(left())


class Node:
    """One launch process (one rank)."""

    def __init__(
        self,
        tmp: Path,
        rank: int,
        nnodes: int,
        port: int,
        *extra: str,
        env: dict | None = None,
        node_id: str | None = "",
    ) -> None:
        self.mark = uuid.uuid4().hex
        self.log = tmp / f"rank{rank}.out"
        argv = [sys.executable, str(REPO / "scripts" / "launch.py"), "--nnodes", str(nnodes)]
        argv += ["--node-rank", str(rank), "--master-addr", "127.0.0.1"]
        argv += ["--master-port", str(port), "--node-ip", "127.0.0.1"]
        if node_id is not None:  # None: the default node id
            argv += ["--node-id", node_id or f"n{rank}"]
        argv += ["--node-timeout", "5", "--grace", "5", "--log-dir", str(tmp / "logs"), *extra]
        full_env = {k: v for k, v in os.environ.items() if not k.startswith("RAYLESS_TOKEN")}
        full_env.update({MARK: self.mark, **(env or {})})
        with open(self.log, "w") as out:
            self.proc = subprocess.Popen(
                argv, stdout=out, stderr=subprocess.STDOUT, env=full_env, cwd=tmp
            )

    def output(self) -> str:
        return self.log.read_text()

    def wait_for(self, text: str, timeout: float = 90.0) -> None:
        def seen() -> bool:
            if text in self.output():
                return True
            if self.proc.poll() is not None:
                pytest.fail(f"no {text!r} from rank (exit {self.proc.poll()}):\n{self.output()}")
            return False

        if not eventually_sync(seen, timeout=timeout, interval=0.1):
            pytest.fail(f"no {text!r} from rank in {timeout} s:\n{self.output()}")

    def wait(self, timeout: float = 60.0) -> int:
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
            pytest.fail(f"the launch did not exit:\n{self.output()}")


@pytest.fixture
def driver(tmp_path: Path) -> Path:
    path = tmp_path / "driver.py"
    path.write_text(DRIVER)
    return path


@pytest.mark.slow
def test_three_nodes_run_a_driver_and_leave_nothing(tmp_path: Path, driver: Path) -> None:
    port, token_file, go = free_port(), tmp_path / "secret" / "token", tmp_path / "go"
    common = ["--token-file", str(token_file), "--rdzv-timeout", "90"]
    cmd = ["--", str(driver), "wait", str(go)]
    # the other ranks start first: they wait for the token file and the head
    workers = [Node(tmp_path, r, 3, port, *common, *cmd) for r in (1, 2)]
    rank0 = Node(tmp_path, 0, 3, port, *common, *cmd, env={"DRIVER_EXIT": "7"})
    nodes = [rank0, *workers]
    try:
        rank0.wait_for("READY")
        token = token_file.read_text().strip()
        assert stat.S_IMODE(token_file.stat().st_mode) == 0o600
        procs = [p for n in nodes for p in marked(n.mark)]
        assert len(procs) >= 3 * 3 + 2  # per node launch/agent/zygote, + head and driver
        assert not any(token in p for p in procs), "the token is on a command line"
        go.touch()
        assert rank0.wait() == 7, rank0.output()  # the driver's exit code
        assert [w.wait() for w in workers] == [0, 0], [w.output() for w in workers]
    finally:
        for n in nodes:
            if n.proc.poll() is None:
                n.proc.kill()
    out = rank0.output()
    assert "NODES [(0, 'n0'), (1, 'n1'), (2, 'n2')]" in out, out
    assert "ACTORS ['n0', 'n1', 'n2']" in out, out
    assert_none_left(*(n.mark for n in nodes))


@pytest.mark.slow
def test_signals_tear_down_a_rank_and_the_cluster(tmp_path: Path, driver: Path) -> None:
    port = free_port()
    token_file = tmp_path / "token"
    token_file.write_text("a-shared-secret-token\n")
    token_file.chmod(0o600)  # a token file must be private
    common = ["--token-file", str(token_file), "--", str(driver), "sleep"]
    rank1 = Node(tmp_path, 1, 2, port, *common)
    rank0 = Node(tmp_path, 0, 2, port, *common)
    try:
        rank0.wait_for("READY")
        rank1.proc.send_signal(signal.SIGINT)  # one rank: only its node goes
        assert rank1.wait() == 130, rank1.output()
        assert_none_left(rank1.mark)
        assert rank0.proc.poll() is None
        rank0.proc.send_signal(signal.SIGTERM)  # rank 0: the driver, then the cluster
        assert rank0.wait() == 128 + signal.SIGTERM, rank0.output()
    finally:
        for n in (rank0, rank1):
            if n.proc.poll() is None:
                n.proc.kill()
    assert_none_left(rank0.mark, rank1.mark)


@pytest.mark.slow
def test_rank0_signal_shuts_down_other_ranks_cleanly(tmp_path: Path, driver: Path) -> None:
    port = free_port()
    env = {"RAYLESS_TOKEN": "another-shared-token"}
    rank1 = Node(tmp_path, 1, 2, port, "--", str(driver), "sleep", env=env)
    rank0 = Node(tmp_path, 0, 2, port, "--", str(driver), "sleep", env=env)
    try:
        rank0.wait_for("READY")
        rank0.proc.send_signal(signal.SIGINT)
        assert rank0.wait() == 130, rank0.output()
        assert rank1.wait() == 0, rank1.output()  # the head shut the cluster down
    finally:
        for n in (rank0, rank1):
            if n.proc.poll() is None:
                n.proc.kill()
    assert_none_left(rank0.mark, rank1.mark)


def test_rendezvous_timeout_names_the_missing_ranks(tmp_path: Path, driver: Path) -> None:
    ran = tmp_path / "driver-ran"
    argv = [sys.executable, "-m", "rayless.cli", "launch", "--nnodes", "3", "--node-rank", "0"]
    argv += ["--master-addr", "127.0.0.1", "--master-port", str(free_port())]
    argv += ["--node-ip", "127.0.0.1", "--rdzv-timeout", "3", "--grace", "5"]
    argv += ["--token-file", str(tmp_path / "tok"), "--log-dir", str(tmp_path / "logs")]
    argv += ["--", "touch", str(ran)]
    mark = uuid.uuid4().hex
    result = subprocess.run(
        argv, capture_output=True, text=True, timeout=90, env={**os.environ, MARK: mark}
    )
    assert result.returncode == 1, result.stderr
    assert "rendezvous timed out after 3s: 1 of 3 nodes joined; missing ranks: 1, 2" in (
        result.stderr
    )
    assert not ran.exists()
    assert_none_left(mark)


def test_a_worker_without_a_head_gives_up(tmp_path: Path) -> None:
    port = free_port()
    node = Node(tmp_path, 1, 2, port, "--rdzv-timeout", "2", env={"RAYLESS_TOKEN": "t" * 16})
    assert node.wait() == 1
    assert f"the head at 127.0.0.1:{port} did not come up within 2s" in node.output()
    assert_none_left(node.mark)


def test_a_busy_port_fails_rank0_with_a_message(tmp_path: Path) -> None:
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        node = Node(tmp_path, 0, 1, port, "--", "true")
        assert node.wait() == 1
    assert "the head (on tcp://127.0.0.1:" in node.output()
    assert "did not start" in node.output()
    assert_none_left(node.mark)


def test_a_multi_node_launch_without_a_token_is_refused(tmp_path: Path) -> None:
    node = Node(tmp_path, 0, 2, free_port(), "--", "true")
    assert node.wait() == 1
    assert "a multi-node launch needs a shared token" in node.output()


def test_two_ranks_on_one_host_as_the_readme_says(tmp_path: Path, driver: Path) -> None:
    """Only --node-rank differs: the second launch on the host takes ``<id>-r<rank>``."""
    port, env = free_port(), {"RAYLESS_TOKEN": "one-host-two-ranks"}
    rank1 = Node(tmp_path, 1, 2, port, "--", str(driver), "done", env=env, node_id=None)
    rank0 = Node(tmp_path, 0, 2, port, "--", str(driver), "done", env=env, node_id=None)
    try:
        assert rank0.wait() == 0, rank0.output()
        assert rank1.wait() == 0, rank1.output()
    finally:
        for n in (rank0, rank1):
            if n.proc.poll() is None:
                n.proc.kill()
    line = next(x for x in rank0.output().splitlines() if x.startswith("ACTORS"))
    ids = eval(line.split(" ", 1)[1])  # the driver printed a list of str
    assert len(set(ids)) == 2, line
    assert any(i.endswith(("-r0", "-r1")) for i in ids), line
    assert_none_left(rank0.mark, rank1.mark)


def test_a_node_id_taken_on_this_host_fails_at_once(tmp_path: Path, driver: Path) -> None:
    port, env = free_port(), {"RAYLESS_TOKEN": "one-host-same-id"}
    rank0 = Node(tmp_path, 0, 2, port, "--", str(driver), "done", env=env, node_id="same")
    rank1: Node | None = None
    try:
        wait_until_sync(  # rank 0 holds its id once its agent runs
            lambda: "control.agent" in " ".join(marked(rank0.mark)),
            timeout=60,
            what="rank 0's node agent",
            interval=0.1,
        )
        started = time.monotonic()
        rank1 = Node(tmp_path, 1, 2, port, "--", str(driver), "done", env=env, node_id="same")
        assert rank1.wait(30) == 1, rank1.output()
        assert time.monotonic() - started < 20
        assert "node id 'same' is already used by another launch" in rank1.output()
        assert "--node-id same-1" in rank1.output()
    finally:
        rank0.proc.send_signal(signal.SIGTERM)
        rank0.wait()
    assert_none_left(rank0.mark, *([rank1.mark] if rank1 else []))
