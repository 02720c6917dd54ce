"""How drivers end (signals, kill -9, a launch without one), threaded slots under timeouts,
classes shipped by value and the CLI's imports, on real processes.

Each test is one defect a Ray user hit, with what Ray does: ``max_concurrency`` holds while
timed-out ``def`` calls still run; a driver killed by SIGTERM, SIGHUP or SIGKILL leaves no
process and no published file behind; ...
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

import pytest

from rayless.actors import Cluster
from rayless.actors.launch.local import LocalProcesses
from rayless.actors.launch.procs import first_line
from rayless.errors import Timeout
from rayless.store import Store
from tests import waiting
from tests.drivers import run_driver
from tests.environ import without_rayless
from tests.integration.friction_classes import Slow

pytestmark = pytest.mark.integration


async def wait_until(
    pred: Callable[[], Awaitable[bool]], timeout: float = 30.0, what: str = "condition"
) -> None:
    """Poll the async ``pred`` until it is true; fail naming ``what`` after ``timeout`` s."""
    await waiting.wait_until(pred, timeout, what)


async def test_timed_out_def_calls_keep_their_slots_until_they_return(
    local_cluster: Cluster,
) -> None:
    h = await local_cluster.spawn(Slow, max_concurrency=2)
    work = h.work.options(timeout=0.2)
    for _ in range(4):
        with pytest.raises(Timeout, match="def method cannot be cancelled"):
            await work(2.0)

    async def idle() -> bool:
        counts = await h.counts()
        return counts["now"] == 0 and counts["finished"] >= 2

    await wait_until(idle, timeout=60, what="the two started calls to return")
    counts = await h.counts()
    # Ray: two at a time (here, before: all four ran at once); the two that timed out while
    # queued were dropped without running
    assert counts["peak"] == 2 and counts["finished"] == 2
    assert await h.work(0.0) == "done"


DRIVER = """
import asyncio, os, sys
from rayless.actors import Cluster
from rayless.actors.launch.local import LocalProcesses
from rayless.actors.launch.procs import first_line
from tests.integration.friction_classes import Parent

async def main():
    async with Cluster.local(nodes=1) as cluster:
        h = await cluster.spawn(Parent)
        print("READY", await h.child_pid(), flush=True)
        await asyncio.sleep(600)

asyncio.run(main())
"""


def _tree(pid: int) -> list[int]:
    """``pid`` and every descendant it has now."""
    import psutil

    try:
        proc = psutil.Process(pid)
        return [pid, *(p.pid for p in proc.children(recursive=True))]
    except psutil.Error:
        return []


def _alive(pid: int) -> bool:
    import psutil

    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def wait_until_sync(
    pred: Callable[[], bool], timeout: float = 30.0, what: str = "condition"
) -> None:
    """Poll ``pred`` until it is true; fail naming ``what`` after ``timeout`` seconds."""
    waiting.wait_until_sync(pred, timeout, what)


@pytest.mark.parametrize(
    "sig",
    [
        signal.SIGINT,
        signal.SIGTERM,
        # the same ends through test_leftovers.py's default cases too
        pytest.param(signal.SIGHUP, marks=pytest.mark.slow),
        pytest.param(signal.SIGKILL, marks=pytest.mark.slow),
    ],
)
def test_a_signalled_driver_leaves_no_process_and_no_published_file(
    sig: signal.Signals, tmp_path: Path
) -> None:
    run_dir = tmp_path / "run"
    env = {**os.environ, "RAYLESS_RUNTIME_DIR": str(run_dir), "PYTHONUNBUFFERED": "1"}
    root = Path(__file__).resolve().parents[2]
    driver = subprocess.Popen(
        [sys.executable, "-c", DRIVER],
        cwd=root,
        env=env,
        stdout=subprocess.PIPE,
        start_new_session=True,
    )
    pids: list[int] = []
    try:
        line = first_line(driver, "the driver", timeout=180)
        assert line.startswith("READY"), f"driver printed {line!r}"
        sleeper = int(line.split()[1])
        pids = sorted({*_tree(driver.pid), sleeper})
        assert len(pids) >= 6  # driver, head, zygote, agent, actor, its sleep
        assert sorted(p.name for p in run_dir.iterdir())  # published while it runs
        driver.send_signal(sig)
        driver.wait(120)
        wait_until_sync(
            lambda: not [p for p in pids if _alive(p)],
            timeout=60,
            what=f"every process of the tree to exit after {sig.name}: "
            f"{[p for p in pids if _alive(p)]}",
        )
        wait_until_sync(
            lambda: not list(run_dir.glob("cluster-*")),
            timeout=30,
            what=f"the published files to go after {sig.name}",
        )
    finally:
        for pid in pids:
            if _alive(pid):
                os.kill(pid, signal.SIGKILL)
        if driver.poll() is None:
            driver.kill()
            driver.wait()
        if driver.stdout is not None:
            driver.stdout.close()


def test_a_launch_without_a_driver_exits_128_plus_signal_and_writes_no_logs_here(
    tmp_path: Path,
) -> None:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    run_dir = tmp_path / "run"
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAYLESS_TOKEN")}
    env.update(RAYLESS_RUNTIME_DIR=str(run_dir), PYTHONUNBUFFERED="1")
    argv = [sys.executable, "-m", "rayless.cli", "launch", "--nnodes", "1", "--node-rank", "0"]
    argv += ["--master-addr", "127.0.0.1", "--master-port", str(port), "--node-ip", "127.0.0.1"]
    argv += ["--fake-gpus", "0", "--grace", "5"]
    launch = subprocess.Popen(argv, cwd=tmp_path, env=env, stdout=subprocess.PIPE)
    try:
        first = first_line(launch, "the launch", timeout=60)
        assert first.startswith("[rayless launch] rank 0: actor logs in ")
        log_dir = Path(first.rsplit(" ", 1)[1])
        assert log_dir.parent == run_dir / "logs" and log_dir.is_dir()
        assert "all 1 nodes joined" in first_line(launch, "the launch", timeout=120)
        launch.send_signal(signal.SIGINT)
        assert launch.wait(60) == 128 + signal.SIGINT  # as with a driver (before: 0)
    finally:
        if launch.poll() is None:
            launch.kill()
            launch.wait()
        if launch.stdout is not None:
            launch.stdout.close()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["run"]  # no ./rayless-logs
    assert not log_dir.exists()  # nothing was logged: removed


BY_VALUE_DRIVER = """
import asyncio, os
from rayless.actors import Cluster

class Faulty:
    def boom(self):
        raise ValueError("boom")  # the line a traceback should show

async def main():
    async with Cluster.local(nodes=1) as cluster:
        h = await cluster.spawn(Faulty)
        os.unlink(__file__)  # from now on the actor has the source only as shipped
        try:
            await h.boom()
        except ValueError as exc:
            print(exc.remote_traceback, flush=True)

asyncio.run(main())
"""


def test_a_class_shipped_by_value_keeps_its_file_and_lines(tmp_path: Path) -> None:
    script = tmp_path / "driver.py"
    script.write_text(BY_VALUE_DRIVER)
    env = {**os.environ, "RAYLESS_RUNTIME_DIR": str(tmp_path / "run")}
    done = subprocess.run(
        [sys.executable, str(script)], env=env, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr
    assert f'File "{script}", line 7, in boom' in done.stdout, done.stdout  # not <dynamic-code>
    assert 'raise ValueError("boom")  # the line a traceback should show' in done.stdout


CLI_IMPORTS = """
import sys
import rayless.cli
code = rayless.cli.main(sys.argv[1:])
heavy = sorted(m for m in ("torch", "tensordict", "numpy") if m in sys.modules)
print("HEAVY", heavy, file=sys.stderr)
sys.exit(code)
"""


def _cli(*args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    """``rayless ARGS`` in a fresh interpreter that reports the heavy modules it imported."""
    clean = without_rayless()
    return subprocess.run(
        [sys.executable, "-c", CLI_IMPORTS, *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=clean,
    )


async def test_cli_paths_import_only_what_they_use_and_a_missing_actor_fails_at_once(
    local_cluster: Cluster, local_cluster_processes: LocalProcesses, tmp_path: Path
) -> None:
    await Store.create(local_cluster, num_units=1, name="w2-store")
    token = tmp_path / "token"
    token.write_text(local_cluster_processes.token + "\n")
    token.chmod(0o600)
    base = ("--address", local_cluster_processes.address, "--token-file", str(token))
    out = await asyncio.to_thread(_cli, "status", *base, "--store", "w2-store")
    assert out.returncode == 0, out.stderr
    assert "store w2-store" in out.stdout and "w2-store-unit-0" in out.stdout
    assert "HEAVY []" in out.stderr  # before: torch and tensordict, ~5 s of imports
    # --timeout 600 is how long a starting actor may take to show up; one the head does not
    # know fails at once (before: only after the whole timeout, past this call's 120 s)
    out = await asyncio.to_thread(_cli, "stack", *base, "--timeout", "600", "nope")
    assert out.returncode == 1 and "no live actor named 'nope'" in out.stderr, out.stderr
    assert "HEAVY []" in out.stderr


SIGNALLED_LOOP = """
import asyncio, signal
from rayless.transport import loop

async def main():
    running = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):  # as head, agents and actors do
        running.add_signal_handler(sig, lambda: None)
    print("up", flush=True)
    await asyncio.sleep(0.05)

loop.run(main())
"""


def test_a_signal_while_a_loop_closes_writes_to_no_closed_wakeup_fd() -> None:
    """A head told to shut down also gets the SIGTERM of ``LocalProcesses.stop``; asyncio's
    ``close()`` closes its self-pipe before it resets the wakeup fd, so a signal in between
    printed "Exception ignored ... signal wakeup fd ... [Errno 9]" (1 in 18 cycles)."""
    printed = []
    for _ in range(20):
        proc = subprocess.Popen(
            [sys.executable, "-c", SIGNALLED_LOOP],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
        try:
            assert first_line(proc, "the loop", timeout=60) == "up"
            deadline = time.monotonic() + 30
            while proc.poll() is None and time.monotonic() < deadline:  # not a wait: signals
                try:  # signals all through the loop's end (a few hundred)
                    os.kill(proc.pid, signal.SIGINT)
                except ProcessLookupError:
                    break
                time.sleep(0.0002)
            proc.wait(30)
            assert proc.stderr is not None
            err = proc.stderr.read().decode()
            if "wakeup fd" in err and "Bad file descriptor" in err:
                printed.append(err)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
            for pipe in (proc.stdout, proc.stderr):
                if pipe is not None:
                    pipe.close()
    assert printed == []  # before: in 35 of 40 runs


def test_a_script_ending_on_an_actors_start_ends_quietly(tmp_path: Path) -> None:
    # `a = Echo.remote()` as a script's last line: the cluster shuts down while the actor
    # starts; the node's agent takes the starting process with it
    stderr: list[str] = []
    run_driver(
        """
        from rayless import ray

        @ray.remote
        class Echo:
            def ping(self):
                return 1

        a = Echo.remote()
        """,
        tmp_path,
        stderr,
    )
    # before: "WARNING rayless.head: could not stop Echo-... after its spawn failed"
    assert not [line for line in stderr if "WARNING" in line or "Traceback" in line], stderr


def test_a_script_that_never_closes_its_local_cluster_ends_without_a_warning(
    tmp_path: Path,
) -> None:
    # the actor API's habit: `cluster = Cluster.local_sync()` and no close: at exit the
    # kernel's parent-death signal ends the fork templates and the node agent at once
    script = """
        from rayless.actors import Actor, Cluster

        class A(Actor):
            def f(self):
                return 1

        cluster = Cluster.local_sync()
        print(cluster.spawn(A).f.call())
        """
    warned: list[str] = []
    for _ in range(3):
        stderr: list[str] = []
        assert run_driver(script, tmp_path, stderr) == ["1"]
        warned += [line for line in stderr if "WARNING" in line or "Traceback" in line]
    # before: "WARNING rayless.agent: zygote connection lost; starting actors as fresh
    # processes from now on" in most runs
    assert warned == []
