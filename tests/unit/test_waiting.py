"""The suite's waiting rules: every wait has a deadline, says what it waited for, and scales.

``test_no_polling_loop_without_a_deadline`` reads every module of tests/ and fails on a loop
that polls (a ``while`` whose condition awaits, or a ``while``/``for`` loop that sleeps between
tries and leaves early) anywhere but tests/waiting.py. A loop that is not a wait (a load
generator, an actor method a test inspects) says so with ``# not a wait: <why>`` on its line.
"""

from __future__ import annotations

import ast
import asyncio
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from tests.waiting import (
    SCALE_ENV,
    WaitTimeout,
    eventually,
    eventually_sync,
    scaled,
    timeout_scale,
    wait_until,
    wait_until_sync,
)

TESTS = Path(__file__).resolve().parents[1]
EXEMPT = "# not a wait:"


def _sleeps(nodes: list[ast.stmt]) -> bool:
    """Whether ``nodes`` call a ``sleep`` (outside nested functions and classes)."""
    stack: list[ast.AST] = list(nodes)
    while stack:
        node = stack.pop()
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda, ast.ClassDef)):
            continue
        if isinstance(node, ast.Call):
            func = node.func
            name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
            if name == "sleep":
                return True
        stack.extend(ast.iter_child_nodes(node))
    return False


def _leaves_early(nodes: list[ast.stmt]) -> bool:
    """Whether ``nodes`` hold a ``break`` or ``return`` of this loop."""
    stack: list[ast.AST] = list(nodes)
    while stack:
        node = stack.pop()
        if isinstance(node, (ast.Break, ast.Return)):
            return True
        if isinstance(
            node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda, ast.ClassDef, ast.For)
        ):
            continue
        if isinstance(node, (ast.While, ast.AsyncFor)):
            continue
        stack.extend(ast.iter_child_nodes(node))
    return False


def polling_loops(source: str) -> list[int]:
    """Line numbers of the polling loops in ``source`` that do not say they are not waits."""
    lines = source.splitlines()
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.While):
            polls = any(isinstance(n, ast.Await) for n in ast.walk(node.test)) or _sleeps(node.body)
        elif isinstance(node, ast.For):
            polls = _sleeps(node.body) and _leaves_early(node.body)
        else:
            continue
        if polls and EXEMPT not in lines[node.lineno - 1]:
            found.append(node.lineno)
    return found


def test_the_loop_finder_finds_the_polling_shapes() -> None:
    src = textwrap.dedent(
        """
        async def a():
            while await rows() < 4:
                await asyncio.sleep(0.01)
        def b():
            while not os.path.exists(p):
                time.sleep(0.1)
        async def c():
            for _ in range(50):
                if done():
                    break
                await asyncio.sleep(0.1)
        async def fine():
            for k in range(3):  # rounds of work with a pause: not a wait
                await asyncio.sleep(0.1)
            while True:
                msg = await sock.recv()
                if not msg:
                    break
            while not stop.is_set():  # not a wait: a load generator
                time.sleep(0.01)
        """
    )
    assert polling_loops(src) == [3, 6, 9]


def test_no_polling_loop_without_a_deadline() -> None:
    bad = []
    for path in sorted(TESTS.rglob("*.py")):
        if path.name == "waiting.py" and path.parent == TESTS:
            continue
        for line in polling_loops(path.read_text()):
            bad.append(f"{path.relative_to(TESTS.parent)}:{line}")
    assert not bad, (
        "poll through tests.waiting.wait_until / wait_until_sync (a deadline and what it waits "
        f"for), or mark a loop that is not a wait with '{EXEMPT} <why>': {bad}"
    )


async def test_wait_until_returns_the_first_truthy_value_sync_or_async() -> None:
    seen: list[int] = []

    def count() -> int:
        seen.append(1)
        return len(seen) if len(seen) >= 3 else 0

    assert await wait_until(count, timeout=10, what="three polls", interval=0) == 3

    async def later() -> str:
        return "ready"

    assert await wait_until(later, timeout=10, what="an async value") == "ready"


async def test_wait_until_fails_with_what_it_waited_for_and_the_last_value() -> None:
    rows: list[int] = []

    def no_rows() -> list[int]:
        rows.append(len(rows))
        return [] if len(rows) < 3 else [0] * 0

    with pytest.raises(WaitTimeout, match=r"waiting for unit 0's rows; last value: \[\]"):
        await wait_until(no_rows, timeout=0.05, what="unit 0's rows", interval=0)
    values = iter(range(1000))
    with pytest.raises(WaitTimeout) as info:
        await wait_until(lambda: next(values) < 0, timeout=0.05, what="a negative number")
    assert "last value: False" in str(info.value)
    assert isinstance(info.value, AssertionError)  # a failed test, not an error


async def test_wait_until_lets_the_predicates_error_through() -> None:
    def broken() -> bool:
        raise KeyError("rows")

    with pytest.raises(KeyError):
        await wait_until(broken, timeout=10, what="never")


async def test_eventually_answers_instead_of_raising() -> None:
    assert await eventually(lambda: True, timeout=1)
    assert not await eventually(lambda: False, timeout=0.05)
    assert eventually_sync(lambda: True, timeout=1)
    assert not eventually_sync(lambda: False, timeout=0.05, interval=0.01)
    with pytest.raises(WaitTimeout, match="a file"):
        wait_until_sync(lambda: None, timeout=0.05, what="a file", interval=0.01)


def test_timeouts_scale_with_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(SCALE_ENV, raising=False)
    assert timeout_scale() == 1 and scaled(2) == 2
    monkeypatch.setenv(SCALE_ENV, "3")
    assert scaled(2) == 6
    for bad in ("zero", "0", "-1"):
        monkeypatch.setenv(SCALE_ENV, bad)
        with pytest.raises(ValueError, match=SCALE_ENV):
            timeout_scale()


async def test_a_scaled_wait_reports_the_scaled_timeout(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(SCALE_ENV, "2")
    with pytest.raises(WaitTimeout, match=r"after 0\.1 s"):
        await wait_until(lambda: asyncio.sleep(0, result=0), timeout=0.05, what="x")


def _run_pytest(tmp_path: Path, body: str, *args: str, scale: str = "1") -> str:
    """Run pytest in a subprocess on one test module, with this repository's ini and
    tests/conftest.py (loaded as a plugin: the module lies outside tests/)."""
    mod = tmp_path / "test_probe.py"
    mod.write_text(textwrap.dedent(body))
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_")}
    env.update({SCALE_ENV: scale, "PYTHONPATH": str(TESTS.parent)})
    ini = str(TESTS.parent / "pyproject.toml")
    cmd = [sys.executable, "-m", "pytest", "-q", "-c", ini, "-p", "tests.conftest"]
    cmd += ["-p", "no:cacheprovider", str(mod), *args]
    done = subprocess.run(
        cmd,
        cwd=TESTS.parent,
        env=env,
        capture_output=True,
        text=True,
        timeout=scaled(120),
        check=False,
    )
    return done.stdout + done.stderr


PROBE = """
    import os
    import time

    import pytest


    @pytest.mark.timeout(1)
    def test_stuck() -> None:
        time.sleep(4)


    @pytest.mark.parametrize("k", range(6))
    def test_fine(k: int, worker_id: str) -> None:
        with open(os.environ["PROBE_RECORD"], "a") as f:
            f.write(f"{worker_id} {os.environ['RAYLESS_RUNTIME_DIR']}\\n")
"""


@pytest.mark.slow  # the suite's own machinery: a pytest run in a subprocess
def test_pytest_timeout_applies_per_test_under_xdist_and_workers_own_their_runtime_dir(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    record = tmp_path / "record.txt"
    monkeypatch.setenv("PROBE_RECORD", str(record))
    out = _run_pytest(tmp_path, PROBE, "-n", "2")
    assert "1 failed, 6 passed" in out, out
    assert "Timeout (>1.0s)" in out, out
    seen = {tuple(line.split(" ", 1)) for line in record.read_text().splitlines()}
    workers = {w for w, _ in seen}
    dirs = {d for _, d in seen}
    assert workers <= {"gw0", "gw1"} and len(dirs) == len(workers), seen  # one dir per worker
    assert os.environ.get("RAYLESS_RUNTIME_DIR") not in dirs
    assert not any(os.path.exists(d) for d in dirs), dirs  # removed at the end


@pytest.mark.slow  # the suite's own machinery: a pytest run in a subprocess
def test_the_scale_stretches_pytest_timeouts(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PROBE_RECORD", str(tmp_path / "record.txt"))
    out = _run_pytest(tmp_path, PROBE, "-n", "0", scale="5")
    assert "7 passed" in out, out  # 1 s x 5 outlasts the 4 s sleep
