"""Debugging inside actors on a real local cluster, driven through a pty (pexpect):
``breakpoint()`` in a method pauses it, ``rayless debug`` attaches, ``p`` shows a value, ``c``
continues and the call returns; ``rayless stack NAME`` shows the running method."""

from __future__ import annotations

import asyncio
import os
import socket
import subprocess
import sys
from pathlib import Path

import pexpect
import pytest

from rayless.actors import Cluster
from rayless.actors.api.debugger import endpoints
from rayless.actors.control import debug
from rayless.actors.launch.local import LocalProcesses
from tests.environ import without_rayless
from tests.integration.debug_classes import Debuggee, PatientListener, PausedAtStart
from tests.waiting import wait_until

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]


def _env(procs: LocalProcesses, tmp_path: Path) -> dict[str, str]:
    token_file = tmp_path / "token"
    token_file.write_text(procs.token)
    token_file.chmod(0o600)
    clean = without_rayless()
    return {**clean, "RAYLESS_ADDRESS": procs.address, "RAYLESS_TOKEN_FILE": str(token_file)}


def _debug_session(env: dict[str, str], name: str, variable: str, value: str) -> str:
    """Attach with ``rayless debug NAME``, print ``variable``, continue; the transcript."""
    child = pexpect.spawn(
        sys.executable,
        ["-m", "rayless.cli", "debug", name, "--wait", "120"],
        env=env,  # type: ignore[arg-type]
        timeout=120,
        encoding="utf-8",
    )
    try:
        child.expect(r"\(Pdb\) ")
        transcript = child.before
        child.sendline(f"p {variable}")
        child.expect(r"\(Pdb\) ")
        transcript += child.before
        assert value in child.before.splitlines()[1:], child.before  # the printed value
        child.sendline("c")
        child.expect(pexpect.EOF)
        transcript += child.before
    finally:
        child.close(force=True)
    assert child.exitstatus == 0, transcript
    return transcript


@pytest.mark.parametrize(
    ("method", "variable", "value"), [("pause", "y", "10"), ("apause", "z", "105")]
)
async def test_breakpoint_pauses_and_rayless_debug_attaches(
    local_cluster: Cluster,
    local_cluster_processes: LocalProcesses,
    tmp_path: Path,
    method: str,
    variable: str,
    value: str,
) -> None:
    name = f"debuggee-{method}"
    handle = await local_cluster.spawn(Debuggee, name=name)
    call = getattr(handle, method).submit(5)  # stops at breakpoint() (a sync / async method)
    env = _env(local_cluster_processes, tmp_path)
    transcript = await asyncio.to_thread(_debug_session, env, name, variable, value)
    assert f"in {method} at" in transcript and "debug_classes.py" in transcript
    assert await asyncio.wait_for(call, 60) == {"pause": 11, "apause": 105}[method]
    assert await handle.ping() == "pong"  # the actor goes on serving


async def test_a_breakpoint_in_the_constructor_is_reachable_before_the_actor_is_ready(
    local_cluster: Cluster, local_cluster_processes: LocalProcesses, tmp_path: Path
) -> None:
    spawn = asyncio.ensure_future(local_cluster.spawn(PausedAtStart, name="paused-at-start"))
    try:
        env = _env(local_cluster_processes, tmp_path)
        await asyncio.to_thread(_debug_session, env, "paused-at-start", "w", "7")
        handle = await asyncio.wait_for(spawn, 60)
    finally:
        spawn.cancel()
    assert await handle.value() == 7


async def _stack(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return await asyncio.to_thread(
        subprocess.run,
        [sys.executable, "-m", "rayless.cli", "stack", *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


async def _wait_for(path: Path) -> None:
    # the method says it started by creating the file
    await wait_until(path.exists, timeout=120, what=f"{path} to appear", interval=0.02)


async def test_rayless_stack_shows_the_running_method(
    local_cluster: Cluster, local_cluster_processes: LocalProcesses, tmp_path: Path
) -> None:
    handle = await local_cluster.spawn(Debuggee, name="stacked")
    started, go = tmp_path / "started", tmp_path / "go"
    sync_call = handle.spin_until.submit(str(started), str(go))  # a `def` method, in a thread
    await _wait_for(started)
    started.unlink()
    async_call = handle.await_until.submit(str(started), str(go))  # an async one, on the loop
    await _wait_for(started)
    out = await _stack(_env(local_cluster_processes, tmp_path), "stacked")
    go.touch()
    assert out.returncode == 0, out.stderr
    text = out.stdout
    assert text.startswith("actor stacked (pid ")
    assert "--- thread MainThread" in text
    thread_part = text.split("--- asyncio task")[0]
    assert "in spin_until" in thread_part and "time.sleep(0.01)" in thread_part
    task_parts = text.split("--- asyncio task")[1:]
    assert any("in await_until" in part for part in task_parts), text
    assert await sync_call == "done" and await async_call == "done"


async def test_rayless_stack_refuses_a_wrong_token_and_an_unknown_name(
    local_cluster: Cluster, local_cluster_processes: LocalProcesses, tmp_path: Path
) -> None:
    await local_cluster.spawn(Debuggee, name="stacked-2")
    env = _env(local_cluster_processes, tmp_path)
    missing = await _stack(env, "no-such-actor", "--timeout", "1")
    assert missing.returncode == 1 and "no live actor named 'no-such-actor'" in missing.stderr
    wrong = await _stack({**env, "RAYLESS_TOKEN_FILE": "", "RAYLESS_TOKEN": "x" * 32}, "stacked-2")
    assert wrong.returncode == 1 and "rejected the token" in wrong.stderr


async def test_rayless_stack_and_timeline_name_an_actor_whose_debug_listener_is_busy(
    local_cluster: Cluster, local_cluster_processes: LocalProcesses, tmp_path: Path
) -> None:
    await local_cluster.spawn(PatientListener, name="crowded")
    await local_cluster.spawn(Debuggee, name="roomy")
    procs = local_cluster_processes

    async def registered() -> dict[str, dict[str, object]] | None:
        records = {r["name"]: r for r in await endpoints(procs.address, procs.token, 30)}
        return records if {"crowded", "roomy"} <= set(records) else None

    records = await wait_until(registered, timeout=60, what="both debug listeners registered")
    host, _, port = str(records["crowded"]["debug_address"]).removeprefix("tcp://").rpartition(":")
    idle = []  # strangers that connect and say nothing: they hold every handshake slot
    try:
        for _ in range(debug.MAX_HANDSHAKES):
            sock = socket.create_connection((host, int(port)), timeout=30)
            idle.append(sock)
            assert sock.recv(64).startswith(b"RAYLESS-DEBUG 1 ")  # it got a slot
        # without py-spy on the PATH: where it is installed, `rayless stack` reads a busy local
        # actor's stacks through it instead (its fallback), and this test is about the refusal
        env = {**_env(procs, tmp_path), "PATH": "/usr/bin:/bin"}
        stack = await _stack(env, "--timeout", "10")
        assert stack.returncode == 2, stack.stderr
        assert "actor roomy (pid " in stack.stdout  # what could be gathered is printed
        assert "no stack of crowded: the debug listener is busy" in stack.stderr, stack.stderr
        assert "not a rayless debug endpoint" not in stack.stderr
        out = tmp_path / "trace.json"
        cmd = [sys.executable, "-m", "rayless.cli", "timeline", "-o", str(out)]
        timeline = await asyncio.to_thread(
            subprocess.run, cmd, env=env, capture_output=True, text=True, timeout=120
        )
        assert timeline.returncode == 2, timeline.stderr
        assert "no spans of crowded: the debug listener is busy" in timeline.stderr
        assert "1 processes missing" in timeline.stderr and out.exists()
    finally:
        for sock in idle:
            sock.close()


FORKING = """
import asyncio, os, sys, time
from rayless.actors.control import debug

server = debug.start_driver("d" * 32, "tcp://127.0.0.1:1", asyncio.new_event_loop())
if os.fork() == 0:  # a DataLoader worker, say, that outlives its driver a while
    os.write(1, b"child\\n")  # past its fork hooks; one write (< PIPE_BUF): never interleaved
    sys.stdin.read()
    os._exit(0)
os.write(1, f"{server.address}\\n".encode())  # one write: print may write the newline apart
os._exit(0)  # the driver dies (no stop): only the child could keep the port
"""


def test_a_forked_child_does_not_keep_the_port() -> None:
    """A driver's forked children close their copy of the listening socket: when the driver
    dies, its port is closed although a child lives on."""
    env = {**os.environ, debug.ENV_DEBUG: "1"}
    child = subprocess.Popen(
        [sys.executable, "-c", FORKING], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
        text=True, env=env,
    )  # fmt: skip
    try:
        assert child.stdout is not None and child.stdin is not None
        # the child runs its fork hooks when it is first scheduled: wait until it has
        lines = {child.stdout.readline().strip(), child.stdout.readline().strip()}
        assert "child" in lines, lines
        (address,) = lines - {"child"}
        assert child.wait(timeout=30) == 0  # the driver is gone; its forked child is not
        host, _, port = address.removeprefix("tcp://").rpartition(":")
        with pytest.raises(ConnectionRefusedError):
            socket.create_connection((host, int(port)), timeout=10).close()
    finally:
        if child.stdin is not None:
            child.stdin.close()  # the forked child ends
