"""Which tests were running when a run was stopped from outside (a CI tier's ``timeout``).

With ``RAYLESS_TEST_PROGRESS=DIR`` set, every pytest process of a run (the controller and each
xdist worker) appends ``start``/``end`` lines with the test's node id to its own file in DIR
(``tests/conftest.py`` calls :func:`record`). A run that hangs — a crashed xdist worker's
deadlock, a test past every deadline — is ended by its ``timeout``; then

    python -m tests.progress DIR

prints the tests that started and never ended, each with the seconds it had run.
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

ENV = "RAYLESS_TEST_PROGRESS"


def record(event: str, nodeid: str) -> None:
    """Append ``event`` (start or end) of ``nodeid`` to this process's file, if enabled."""
    folder = os.environ.get(ENV)
    if not folder:
        return
    name = os.environ.get("PYTEST_XDIST_WORKER", "main")
    try:
        with open(os.path.join(folder, f"{name}.log"), "a", encoding="utf-8") as f:
            f.write(f"{event}\t{time.time():.3f}\t{nodeid}\n")
    except OSError:
        pass  # the record is a diagnostic: never fail a test for it


def still_running(folder: str | Path) -> list[tuple[str, str, float]]:
    """(worker, node id, seconds running) of every test that started and did not end (an
    xdist controller relays its workers' events: a test is named once, by its worker)."""
    now = time.time()
    started: dict[str, tuple[str, float]] = {}
    ended: set[str] = set()
    for path in sorted(Path(folder).glob("*.log"), key=lambda p: p.stem != "main"):
        for line in path.read_text(encoding="utf-8", errors="replace").splitlines():
            event, _, rest = line.partition("\t")
            stamp, _, nodeid = rest.partition("\t")
            try:
                when = float(stamp)
            except ValueError:
                continue
            if event == "start":
                started[nodeid] = (path.stem, when)  # a worker's record wins over main's
            else:
                ended.add(nodeid)
    return [(w, n, now - t) for n, (w, t) in started.items() if n not in ended]


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print("usage: python -m tests.progress DIR", file=sys.stderr)
        return 2
    running = still_running(argv[0])
    if not running:
        print("no test was running (the run hung between tests, or in collection)")
    for worker, nodeid, seconds in running:
        print(f"  still running on {worker} for {seconds:.0f} s: {nodeid}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
