"""``rayless status`` against a real local cluster: tables, JSON, wrong token, no head."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from rayless.actors import ActorDiedError, Cluster
from rayless.actors.launch.local import LocalProcesses
from tests.environ import without_rayless
from tests.integration.actor_classes import Counter

pytestmark = pytest.mark.integration


def _status(
    *args: str, env: dict[str, str] | None = None, timeout: float = 60
) -> subprocess.CompletedProcess[str]:
    """Run ``rayless status ARGS`` in a fresh interpreter."""
    clean = without_rayless()
    return subprocess.run(
        [sys.executable, "-m", "rayless.cli", "status", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**clean, **(env or {})},
    )


def _token_file(tmp_path: Path, token: str) -> str:
    path = tmp_path / "token"
    path.write_text(token + "\n")
    path.chmod(0o600)
    return str(path)


async def test_status_lists_nodes_and_actors_and_kills_nothing(
    local_cluster: Cluster, local_cluster_processes: LocalProcesses, tmp_path: Path
) -> None:
    counter = await local_cluster.spawn(Counter, 3, name="status-counter", gpus=0.5, node="node-1")
    pid = await counter.pid()
    token_file = _token_file(tmp_path, local_cluster_processes.token)
    out = _status("--address", local_cluster_processes.address, "--token-file", token_file)
    assert out.returncode == 0, out.stderr
    text = out.stdout
    assert "node-0" in text and "node-1" in text
    line = next(ln for ln in text.splitlines() if ln.startswith("status-counter"))
    assert "Counter" in line and "node-1" in line and "alive" in line and str(pid) in line
    assert "0(0.5)" in line  # half of GPU 0
    node1 = next(ln for ln in text.splitlines() if ln.startswith("node-1"))
    assert "0:0.5" in node1  # the per-GPU share on the node line
    # the status session ended without touching our actor
    assert await counter.add(1) == 4

    env = {"RAYLESS_ADDRESS": local_cluster_processes.address, "RAYLESS_TOKEN_FILE": token_file}
    raw = _status("--json", env=env)
    assert raw.returncode == 0, raw.stderr
    nodes = json.loads(raw.stdout)
    names = {a["name"] for n in nodes for a in n["actors"]}
    assert {n["node_id"] for n in nodes} >= {"node-0", "node-1"}
    assert "status-counter" in names
    assert await counter.add(1) == 5


async def test_status_lists_a_page_of_the_actors_and_says_how_many_more(
    local_cluster: Cluster, local_cluster_processes: LocalProcesses, tmp_path: Path
) -> None:
    counters = [await local_cluster.spawn(Counter, i, gpus=0) for i in range(3)]
    try:
        total = (await local_cluster.list_actors(limit=0)).total
        assert total >= 3
        token_file = _token_file(tmp_path, local_cluster_processes.token)
        args = ("--address", local_cluster_processes.address, "--token-file", token_file)
        out = _status(*args, "--limit", "1")
        assert out.returncode == 0, out.stderr
        lines = out.stdout.splitlines()
        assert f"{total} actors" in lines[0] and "GPUs" in lines[0]
        nodes_table = lines[lines.index("Nodes") + 1 : lines.index("Actors") - 1]
        assert len(nodes_table) == 3  # the header, one node, the note (of 2 nodes)
        assert nodes_table[-1] == "... and 1 more nodes (--limit 0 lists them all)"
        end = (
            lines.index("Died (most recent first)") - 1
            if "Died (most recent first)" in lines
            else None
        )
        actors_table = lines[lines.index("Actors") + 1 : end]
        assert len(actors_table) == 3  # the header, one actor, the note
        assert actors_table[-1] == f"... and {total - 1} more actors (--limit 0 lists them all)"
        every = _status(*args, "--limit", "0")
        assert every.returncode == 0 and "more actors" not in every.stdout
        bad = _status(*args, "--limit", "-1")
        assert bad.returncode == 1 and "--limit" in bad.stderr
    finally:
        for c in counters:
            await local_cluster.kill(c)


async def test_status_orders_a_nodes_actors_by_name_and_shows_what_died_and_why(
    local_cluster: Cluster, local_cluster_processes: LocalProcesses, tmp_path: Path
) -> None:
    names = ["order-c", "order-a", "order-b"]
    made = [await local_cluster.spawn(Counter, name=n, gpus=0, node="node-0") for n in names]
    victim = await local_cluster.spawn(Counter, name="order-victim", gpus=0, node="node-0")
    os.kill(await victim.pid(), signal.SIGKILL)
    with pytest.raises(ActorDiedError):
        await victim.add(1)  # the head knows of the death once the call says so
    try:
        token_file = _token_file(tmp_path, local_cluster_processes.token)
        out = _status("--address", local_cluster_processes.address, "--token-file", token_file)
        assert out.returncode == 0, out.stderr
        lines = out.stdout.splitlines()
        actors = lines[lines.index("Actors") + 1 : lines.index("Died (most recent first)") - 1]
        on_node0 = [ln.split()[0] for ln in actors if " node-0 " in ln]
        assert on_node0 == sorted(on_node0), on_node0  # by name within a node
        assert [n for n in on_node0 if n.startswith("order-")] == sorted(names)
        died = lines[lines.index("Died (most recent first)") + 1 :]
        row = next(ln for ln in died if ln.startswith("order-victim"))
        assert "SIGKILL" in row and "Counter" in row, row
    finally:
        for c in made:
            await local_cluster.kill(c)


async def test_the_last_error_of_an_actors_calls_is_in_its_stats(local_cluster: Cluster) -> None:
    from rayless.observe import actor_stats

    counter = await local_cluster.spawn(Counter, name="status-errors", gpus=0)
    for i in range(3):
        with pytest.raises(ValueError):
            await counter.fail(f"bad input {i}")
    try:
        stats = (await actor_stats(local_cluster))[counter.actor_id]
        assert stats["errors"] == {"fail": 3}
        assert (
            stats["last_error"].startswith("fail: ValueError")
            and "bad input 2" in stats["last_error"]
        )
    finally:
        await local_cluster.kill(counter)


async def test_wrong_token_exits_1_with_a_message(
    local_cluster_processes: LocalProcesses, tmp_path: Path
) -> None:
    token_file = _token_file(tmp_path, "x" * 32)
    out = _status("--address", local_cluster_processes.address, "--token-file", token_file)
    assert out.returncode == 1
    assert "rejected the token" in out.stderr
    assert len(out.stderr.strip().splitlines()) == 1


def test_unreachable_head_exits_1_after_its_timeout(tmp_path: Path) -> None:
    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    out = _status("--address", f"tcp://127.0.0.1:{port}", "--token", "y" * 32, "--timeout", "1")
    assert out.returncode == 1
    assert "no answer from the head" in out.stderr
    assert len(out.stderr.strip().splitlines()) == 1


def test_missing_token_exits_1() -> None:
    out = _status("--address", "tcp://127.0.0.1:1")
    assert out.returncode == 1
    assert "no cluster token" in out.stderr
