"""Sessions and addresses: ``connect()`` from the launch environment owns its session, both
address forms work, and an embedded cluster is found without an address (``address="auto"``)."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from pathlib import Path

import pytest

from rayless import actors
from rayless.actors.core import context
from rayless.actors.launch.local import LocalProcesses
from tests.environ import without_rayless
from tests.integration.actor_classes import Counter

pytestmark = pytest.mark.integration


@pytest.mark.local_cluster(nodes=1, gpus_per_node=1, isolated=True)
async def test_connect_from_the_launch_environment_owns_its_session(
    local_cluster_processes: LocalProcesses, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    token_file = tmp_path / "token"
    token_file.write_text(local_cluster_processes.token)
    token_file.chmod(0o600)  # a token file must be private
    host_port = local_cluster_processes.address.removeprefix("tcp://")
    monkeypatch.setenv("RAYLESS_ADDRESS", host_port)  # no tcp://, as users type it
    monkeypatch.setenv("RAYLESS_TOKEN_FILE", str(token_file))
    monkeypatch.delenv("RAYLESS_TOKEN", raising=False)
    context.set_current(None)
    for _job in range(2):  # the second job gets the GPU the first one's actor held, at once
        cluster = await actors.connect()
        learner = await cluster.spawn(Counter, 1, gpus=1)
        assert await learner.add(1) == 2
        await cluster.aclose()
    assert context._current is None


async def test_a_malformed_address_is_a_value_error_naming_the_forms() -> None:
    with pytest.raises(ValueError, match=r"bad cluster address 'http://h:1'.*'host:port'"):
        await actors.connect("http://h:1", token="t" * 32)


async def _run(code: str, env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    argv = [sys.executable, "-c", code] if code else [sys.executable, *args]
    return await asyncio.to_thread(
        subprocess.run, argv, env=env, capture_output=True, text=True, timeout=120
    )


JOINER = """
import asyncio
from rayless import actors
async def main():
    async with actors.connect() as cluster:
        print(len(await cluster.nodes()))
asyncio.run(main())
"""


async def test_an_embedded_cluster_is_found_without_an_address(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    runtime = tmp_path / "rt"
    clean = without_rayless()
    env = {**clean, "RAYLESS_RUNTIME_DIR": str(runtime), "PYTHONPATH": os.getcwd()}
    monkeypatch.setenv("RAYLESS_RUNTIME_DIR", str(runtime))
    async with actors.Cluster.local(nodes=2) as cluster:
        assert len(list(runtime.glob("cluster-*.json"))) == 1
        joined = await _run(JOINER, env)
        assert joined.returncode == 0, joined.stderr
        assert joined.stdout.split() == ["2"]
        status = await _run("", env, "-m", "rayless.cli", "status")
        assert status.returncode == 0, status.stderr
        assert f"cluster {cluster.address}: 2/2 nodes alive" in status.stdout
    assert list(runtime.iterdir()) == []  # removed at close
    gone = await _run("", env, "-m", "rayless.cli", "status")
    assert gone.returncode == 1 and "no local rayless cluster found" in gone.stderr


@pytest.mark.local_cluster(nodes=1, gpus_per_node=0, isolated=True)
async def test_a_connect_to_a_cluster_the_process_left_does_not_hold_up_its_new_one(
    local_cluster_processes: LocalProcesses,
) -> None:
    # A leftover call of a cluster this process left (its address still current, its head
    # gone) starts connecting; the process then makes another cluster its own: the new
    # cluster's first call connects to it, not waits for the stale handshake's 10 s timeout.
    import socket

    from rayless.actors.api.runtime import close_runtimes, get_runtime

    await close_runtimes()
    held = socket.socket()  # bound, never listening, held to the end: no handshake ever comes
    held.bind(("127.0.0.1", 0))
    dead = f"tcp://127.0.0.1:{held.getsockname()[1]}"
    ours = context.ClusterInfo(local_cluster_processes.address, local_cluster_processes.token)
    context.set_current(context.ClusterInfo(dead, local_cluster_processes.token))
    stale = asyncio.ensure_future(get_runtime())
    try:
        await asyncio.sleep(0.2)  # the stale start is waiting for its handshake
        assert not stale.done()
        context.set_current(ours)
        runtime = await asyncio.wait_for(get_runtime(), 8)
        assert runtime.info.address == ours.address
        cluster = actors.Cluster(ours)
        assert len(await asyncio.wait_for(cluster.nodes(), 8)) == 1
    finally:
        stale.cancel()
        with pytest.raises((asyncio.CancelledError, actors.RaylessError)):
            await stale
        await close_runtimes()
        context.set_current(ours)
        held.close()
