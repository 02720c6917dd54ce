"""``rayless.ray``: deaths, kills, retries and the session's lifecycle (each test on a
cluster of its own where it kills something, or in a driver subprocess)."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from rayless import ray
from rayless.ray.exceptions import (
    ActorDiedError,
    RayActorError,
    RayTaskError,
    TaskCancelledError,
    WorkerCrashedError,
)
from tests.integration.ray_api_classes import (
    AppError,
    Counter,
    Restartable,
    die_always,
    die_once,
    flaky,
    sleepy,
)

pytestmark = [pytest.mark.integration, pytest.mark.xdist_group("rayless_ray_failures")]

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def session() -> Iterator[None]:
    ray.init(num_cpus=2)
    yield
    ray.shutdown()


def test_kill_fails_pending_and_later_calls(session: None) -> None:
    # test_actor_failures.py::test_kill (ray.kill → RayActorError on every call)
    c = Counter.remote()
    assert ray.get(c.get.remote()) == 0
    pending = c.sleep.remote(30)
    ray.kill(c)
    for ref in (pending, c.incr.remote()):
        with pytest.raises(RayActorError) as info:
            ray.get(ref, timeout=30)
        assert isinstance(info.value, ActorDiedError)
    with pytest.raises(ValueError):
        ray.kill("not an actor")  # type: ignore[arg-type]


def test_actor_exit_names_the_cause(session: None) -> None:
    # test_actor_failures.py::test_actor_dead (the process exits: ActorDiedError, and the
    # exit code rayless records, beside Ray's message)
    c = Counter.remote()
    with pytest.raises(ActorDiedError) as info:
        ray.get(c.exit.remote(), timeout=60)
    assert info.value.exitcode == 3 and "exit code 3" in str(info.value)
    with pytest.raises(ActorDiedError):
        ray.get(c.get.remote(), timeout=30)


def test_actor_restarts_and_retries_the_call(session: None, tmp_path: Path) -> None:
    # test_actor_failures.py::test_actor_restart / max_task_retries (the call that died with
    # the actor runs again on the restarted one)
    a = Restartable.remote()
    first = ray.get(a.pid.remote())
    again = ray.get(a.die_first_time.remote(str(tmp_path / "r")), timeout=120)
    assert again != first
    assert ray.get(a.pid.remote()) == again


def test_task_retried_when_its_worker_dies(session: None, tmp_path: Path) -> None:
    # test_failure.py::test_worker_dying / max_retries (the task runs again on a new worker)
    assert ray.get(die_once.remote(str(tmp_path / "m")), timeout=120) == "survived"
    with pytest.raises(WorkerCrashedError):
        ray.get(die_always.remote(), timeout=120)


def test_retry_exceptions(session: None, tmp_path: Path) -> None:
    # test_task_retries / test_failure.py: retry_exceptions=True retries the task's own error
    assert ray.get(flaky.remote(str(tmp_path / "n")), timeout=120) == "ok after 2"
    no_retry = flaky.options(retry_exceptions=False)
    with pytest.raises(RayTaskError) as info:
        ray.get(no_retry.remote(str(tmp_path / "o")), timeout=120)
    assert isinstance(info.value, AppError)


def test_force_cancel_kills_the_task_worker(session: None) -> None:
    # test_cancel.py::test_cancel_force (force=True kills the worker; no retry)
    ref = sleepy.remote(60)
    import time

    time.sleep(0.5)  # running, not queued
    ray.cancel(ref, force=True)
    with pytest.raises(TaskCancelledError):
        ray.get(ref, timeout=60)
    assert ray.get(sleepy.remote(0), timeout=60) == 0  # the pool goes on


def _run(
    script: str, timeout: float = 120, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    env = env or {**os.environ, "PYTHONPATH": str(REPO)}
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(script)],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=env,
        cwd=str(REPO),
    )


def test_a_script_that_forgets_shutdown_leaves_nothing_behind() -> None:
    # test_basic.py: a driver that exits without ray.shutdown(); a class of __main__ too
    proc = _run(
        """
        from rayless import ray
        ray.init(num_cpus=2)

        @ray.remote
        class A:
            def pid(self):
                import os
                return os.getpid()

        @ray.remote
        def f(x):
            import os
            return os.getpid()

        a = A.remote()
        print(ray.get(a.pid.remote()), ray.get(f.remote(1)), flush=True)
        """
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    # the session closed itself at exit (its close once failed there: the thread pools had
    # stopped, and the cluster only died with its driver, its agent warning about the zygote)
    assert proc.stderr == "", proc.stderr[-2000:]
    pids = [int(p) for p in proc.stdout.split()]
    for pid in pids:
        try:
            p = psutil.Process(pid)
            p.wait(timeout=30)
        except psutil.NoSuchProcess:
            pass
        assert not psutil.pid_exists(pid) or psutil.Process(pid).status() == "zombie"


def test_refs_of_a_shut_down_session_are_lost() -> None:
    # Ray's ObjectLostError: a ref whose owner (the session) is gone
    proc = _run(
        """
        from rayless import ray
        from rayless.ray.exceptions import ObjectLostError
        from tests.integration.ray_api_classes import sleepy
        ray.init(num_cpus=1)
        ref = sleepy.remote(30)
        ray.shutdown()
        assert not ray.is_initialized()
        try:
            ray.get(ref, timeout=5)
        except ObjectLostError as e:
            print("lost", e)
        """
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.startswith("lost")


def test_init_auto_joins_a_running_cluster(tmp_path: Path) -> None:
    # test_basic.py / ray.init(address="auto"): a driver joins the cluster another process
    # runs (here a rayless local cluster published on this host); shutdown leaves it running.
    # A runtime directory of their own: "auto" finds exactly the holder's cluster.
    env = {**os.environ, "PYTHONPATH": str(REPO), "RAYLESS_RUNTIME_DIR": str(tmp_path)}
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import sys, time\n"
            "from rayless.actors import Cluster\n"
            "c = Cluster.local_sync(nodes=1)\n"
            "print(c.address, flush=True)\n"
            "sys.stdin.read()\n"
            "c.close()\n",
        ],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        env=env,
        cwd=str(REPO),
    )
    try:
        assert holder.stdout is not None
        address = holder.stdout.readline().strip()
        assert address
        for how in ('"auto"', repr(address)):
            proc = _run(
                f"""
                from rayless import ray
                from tests.integration.ray_api_classes import add
                ctx = ray.init(address={how})
                print(ctx["address"], ray.get(add.remote(2, 3)))
                ray.shutdown()
                """,
                env=env,
            )
            assert proc.returncode == 0, proc.stderr[-2000:]
            assert proc.stdout.split() == [address, "5"]
        assert holder.poll() is None  # the joined cluster still runs
    finally:
        assert holder.stdin is not None
        holder.stdin.close()
        holder.wait(timeout=60)


def test_import_is_cheap_and_all_spellings_work() -> None:
    # the one-import move: every spelling, and no torch at import
    proc = _run(
        """
        import sys
        from rayless import ray
        import rayless.ray as ray2
        from rayless.ray.util import placement_group
        from rayless.ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy
        from rayless.ray.exceptions import RayTaskError
        assert ray is ray2 and ray.actor.ActorHandle and ray.util.placement_group
        assert ray.exceptions.RayTaskError is RayTaskError
        assert not ray.is_initialized()
        print("torch" in sys.modules)
        """
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.strip() == "False"


def test_idle_task_workers_hold_no_cpus_in_available_resources() -> None:
    # test_basic.py::test_available_resources: once its tasks are done, a session's CPUs
    # are free again (rayless keeps the idle task workers; Ray counts them as holding nothing)
    proc = _run(
        """
        from rayless import ray
        ray.init(num_cpus=2)

        @ray.remote
        def f(x):
            return x

        assert ray.get([f.remote(i) for i in range(6)]) == list(range(6))
        print(ray.available_resources().get("CPU"), ray.cluster_resources()["CPU"])
        ray.shutdown()
        """
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.split() == ["2.0", "2.0"]


def test_a_task_error_names_the_function_and_shows_the_drivers_lines(tmp_path: Path) -> None:
    # test_failure.py: Ray's message names the task (ray::parse()) and its traceback shows the
    # driver's file and line; here the task's function went by value without its file name
    # ("<dynamic-code>", no source lines) and the message named only the worker
    script = tmp_path / "newcomer.py"
    script.write_text(
        textwrap.dedent(
            """
            from rayless import ray
            ray.init(num_cpus=1)

            @ray.remote
            def parse(s):
                return int(s)

            try:
                ray.get(parse.remote("x1"))
            except ValueError as e:
                print(e)
            """
        )
    )
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    proc = subprocess.run(
        [sys.executable, str(script)], capture_output=True, text=True, timeout=120, env=env
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "builtins.ValueError in task 'ray::parse() on TaskWorker-" in proc.stdout, proc.stdout
    assert f'File "{script}", line 7, in parse' in proc.stdout, proc.stdout
    assert "return int(s)" in proc.stdout and "<dynamic-code>" not in proc.stdout
