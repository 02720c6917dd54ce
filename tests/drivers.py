"""Run code in a fresh interpreter: a newcomer's driver script, in an environment that finds
no cluster of the suite's (``tests.environ.without_rayless``), or a probe of what a process
imports (nothing the test process imported counts)."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

from tests.environ import without_rayless

ROOT = Path(__file__).resolve().parents[1]


def run_driver(script: str, tmp_path: Path, stderr: list[str] | None = None) -> list[str]:
    """The stdout lines of ``script`` (dedented) run as ``tmp_path/driver.py`` from the
    repository root; its stderr lines are added to ``stderr`` when given. Fails the test
    when the script exits non-zero (its stderr's tail in the message)."""
    path = tmp_path / "driver.py"
    path.write_text(textwrap.dedent(script))
    proc = subprocess.run(
        [sys.executable, str(path)],
        cwd=ROOT,
        env=without_rayless(),
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    if stderr is not None:
        stderr.extend(proc.stderr.splitlines())
    return proc.stdout.splitlines()


def run_fresh(code: str) -> str:
    """The stdout of ``code`` (dedented) run with ``python -c``. Fails the test when it exits
    non-zero (its stderr in the message)."""
    proc = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    return proc.stdout
