"""``rayless timeline``: write the cluster's timeline as one Chrome trace-event file (see
``rayless.actors.api.trace``).

    rayless timeline                           timeline.json: every live actor's and driver's spans
    rayless timeline -o trace.json --since 60  only the last minute

The cluster is named as for ``rayless status``. A driver is in it when it runs a debug listener
(it does while it records a timeline: ``actors.control.debug.start_driver``), as ``driver (pid
P)``. Exit codes: 0 written, with every live actor's and driver's spans; 1 with a one-line
message (no head, wrong token, unwritable file); 2 written, but without the processes named
on stderr (not answering, or their debug listener busy).
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time

from rayless.actors.api import status, trace
from rayless.transport.errors import RaylessError

__all__ = ["add_arguments", "run"]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Add ``rayless timeline``'s options to ``parser``."""
    status.add_cluster_arguments(parser)
    parser.add_argument("-o", "--output", default="timeline.json", help="the trace file to write")
    parser.add_argument(
        "--since", type=float, default=None, metavar="SECONDS", help="only the last SECONDS"
    )


def run(args: argparse.Namespace) -> int:
    """Run ``rayless timeline``; returns the exit code."""
    try:
        address, token = status.resolve(args)
        since = 0 if args.since is None else time.time_ns() - int(args.since * 1e9)
        timeout = float(args.timeout)
        got = asyncio.run(trace.gather(address, token, since_ns=since, timeout=timeout))
        path = trace.write_trace(args.output, got)
    except (RaylessError, status.StatusError, OSError) as exc:
        print(f"rayless timeline: {exc}", file=sys.stderr)
        return 1
    spans = sum(len(g.spans) for g in got)
    procs = sum(1 for g in got if not g.errors)
    print(f"wrote {path}: {spans} spans of {procs} processes (open it in ui.perfetto.dev)")
    missing = [line for g in got for line in g.errors]
    for line in missing:
        print(f"rayless timeline: no spans of {line}", file=sys.stderr)
    if missing:
        print(f"rayless timeline: {len(missing)} processes missing from {path}", file=sys.stderr)
        return 2
    return 0
