"""Run an attacker's script as a tokenless process under another uid (``nobody``).

Security tests describe an attack as a small Python script that uses only pyzmq, msgpack and
the standard library (never rayless: a stranger has no token and none of our state). As root
(CI runs the tests as root) the script runs under uid/gid 65534 through ``setpriv``, so it also
cannot read the user's token files or runtime directory; elsewhere it runs as the same uid,
tokenless (the report says which). The script gets its arguments as the JSON object ``ARGS``
and reports by assigning the JSON-able ``RESULT``.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from typing import Any

from tests.environ import without_rayless

NOBODY = 65534
_RUNNER = """
import json, sys

ARGS = json.load(open(sys.argv[1]))
RESULT = None
exec(compile(open(sys.argv[2]).read(), "attacker", "exec"))
with open(sys.argv[3], "w") as f:
    json.dump(RESULT, f)
"""


@dataclass
class StrangerRun:
    """What an attacker's script reported, and as which uid it ran."""

    result: Any
    uid: int
    stderr: str


_SETPRIV = ["setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups"]


def _prefix() -> list[str]:
    if os.geteuid() != 0 or shutil.which("setpriv") is None:
        return []
    probe = subprocess.run(
        [*_SETPRIV, sys.executable, "-c", "import zmq, msgpack"],
        capture_output=True,
        timeout=60,
        cwd="/",
    )
    if probe.returncode != 0:  # this interpreter is not readable by nobody: same uid then
        return []
    return list(_SETPRIV)


def strangers_have_another_uid() -> bool:
    """Whether :func:`run_stranger` runs its scripts under another uid (as root, with setpriv)."""
    return bool(_prefix())


def run_stranger(script: str, args: dict[str, Any], *, timeout: float = 120.0) -> StrangerRun:
    """Run ``script`` as a tokenless stranger (uid ``nobody`` when we are root).

    Raises:
        AssertionError: the script failed (its stderr is in the message).
        subprocess.TimeoutExpired: it ran longer than ``timeout`` seconds.
    """
    prefix = _prefix()
    work = tempfile.mkdtemp(prefix="rayless-stranger-")
    try:
        os.chmod(work, 0o777)
        paths = [os.path.join(work, n) for n in ("args.json", "script.py", "result.json")]
        with open(paths[0], "w") as f:
            json.dump(args, f)
        with open(paths[1], "w") as f:
            f.write(script)
        for p in paths[:2]:
            os.chmod(p, 0o644)
        env = without_rayless()
        proc = subprocess.run(
            [*prefix, sys.executable, "-c", _RUNNER, *paths],
            capture_output=True,
            text=True,
            timeout=timeout,
            env=env,
            cwd="/",
        )
        if proc.returncode != 0:
            raise AssertionError(f"the attacker's script failed:\n{proc.stderr[-4000:]}")
        with open(paths[2]) as f:
            result = json.load(f)
        return StrangerRun(result, NOBODY if prefix else os.geteuid(), proc.stderr)
    finally:
        shutil.rmtree(work, ignore_errors=True)


__all__ = ["NOBODY", "StrangerRun", "run_stranger"]
