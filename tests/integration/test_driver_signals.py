"""A driver ended by SIGTERM or SIGHUP unwinds as on Ctrl-C, then dies of the signal.

Small programs in subprocesses: plain code, ``asyncio.run`` and the sync facade over a real
local cluster; one that catches the interrupt keeps its own exit status.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from rayless.actors.launch.procs import first_line
from tests import waiting

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]

PLAIN = """
import time
from rayless.actors.api import signals
signals.install()
try:
    print("READY", flush=True)
    time.sleep(120)
finally:
    print("unwound", flush=True)
"""

ASYNC = """
import asyncio
from rayless.actors.api import signals

async def main():
    signals.install()
    try:
        print("READY", flush=True)
        await asyncio.sleep(120)
    finally:
        await asyncio.sleep(0.1)  # a close that awaits still runs
        print("unwound", flush=True)

asyncio.run(main())
"""

CAUGHT = """
import sys, time
from rayless.actors.api import signals
signals.install()
try:
    print("READY", flush=True)
    time.sleep(120)
except KeyboardInterrupt:
    print("unwound", flush=True)
    sys.exit(3)
"""

SYNC_CLUSTER = """
import os, time
from rayless.actors import Cluster
with Cluster.local_sync(nodes=1) as cluster:
    print("READY", cluster.cluster._local.tmpdir, flush=True)
    time.sleep(600)
"""


def _ignore_sigint() -> None:
    """How a shell script starts a background command (``python train.py &``)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)


def _run(
    script: str, sig: int, env: dict[str, str] | None = None, sigint_ignored: bool = False
) -> tuple[int, list[str]]:
    proc = subprocess.Popen(
        [sys.executable, "-c", textwrap.dedent(script)],
        cwd=ROOT,
        env={**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})},
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        preexec_fn=_ignore_sigint if sigint_ignored else None,
    )
    try:
        ready = first_line(proc, "the program", timeout=waiting.scaled(120))
        assert ready.startswith("READY"), ready
        proc.send_signal(sig)
        code = proc.wait(waiting.scaled(60))
        assert proc.stdout is not None
        return code, [ready, *proc.stdout.read().decode().split()]
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        if proc.stdout is not None:
            proc.stdout.close()


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGHUP], ids=["SIGTERM", "SIGHUP"])
@pytest.mark.parametrize("script", [PLAIN, ASYNC], ids=["plain", "asyncio"])
def test_a_terminating_signal_unwinds_the_program_and_is_its_exit_status(
    script: str, sig: signal.Signals
) -> None:
    code, out = _run(script, sig)
    assert code == -sig and out[1:] == ["unwound"]


@pytest.mark.parametrize("script", [PLAIN, ASYNC], ids=["plain", "asyncio"])
def test_a_driver_started_with_sigint_ignored_unwinds_too(script: str) -> None:
    # a shell script's background command starts with SIGINT ignored: the driver died of
    # SIGTERM on the spot, its finally blocks (and its cluster's close) never ran
    code, out = _run(script, signal.SIGTERM, sigint_ignored=True)
    assert code == -signal.SIGTERM and out[1:] == ["unwound"]


def test_the_sync_facade_closes_its_cluster_on_sigterm_with_sigint_ignored(
    tmp_path: Path,
) -> None:
    env = {"RAYLESS_RUNTIME_DIR": str(tmp_path)}
    code, out = _run(SYNC_CLUSTER, signal.SIGTERM, env, sigint_ignored=True)
    assert code == -signal.SIGTERM
    assert not os.path.exists(out[0].split()[1])


def test_a_program_that_catches_the_interrupt_keeps_its_exit_status() -> None:
    code, out = _run(CAUGHT, signal.SIGTERM)
    assert code == 3 and out[1:] == ["unwound"]


def test_the_sync_facade_closes_its_cluster_on_sigterm(tmp_path: Path) -> None:
    code, out = _run(SYNC_CLUSTER, signal.SIGTERM, {"RAYLESS_RUNTIME_DIR": str(tmp_path)})
    assert code == -signal.SIGTERM
    tmpdir = out[0].split()[1]
    assert not os.path.exists(tmpdir)  # closed by the driver itself, before it died
    assert not list(tmp_path.glob("cluster-*"))
