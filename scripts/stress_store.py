"""Many store clients at once, with a unit killed midway: nothing acknowledged is lost
unreported, duplicated or corrupt.

Starts ``Cluster.local(nodes=2)`` and a store of ``--units`` units, then ``--procs`` client
processes (``rayless.store.testing_stress.StressClient`` actors) running ``--tasks`` asyncio
clients each (half put, half fetch) for ``--seconds``; at half time one unit is killed.
After the clients stop, what is still ready is drained, and the run is judged
(``testing_stress.verify``): every acknowledged sample read exactly once or reported lost
(by a ``PartialResultError`` or ``Store.lost_samples``), none read twice, no payload whose
CRC does not match. Prints puts and fetches per second and the controller's CPU per
operation (its process's CPU time / (puts + fetches)).

    python scripts/stress_store.py                       # 4 x 64 clients, 60 s
    python scripts/stress_store.py --seconds 10 --json out.json

Exit code 1 if the verdict is not ok.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from typing import Any

from rayless import actors
from rayless.store import Store
from rayless.store.testing_stress import stress


async def run(args: argparse.Namespace) -> dict[str, Any]:
    """One stress run; returns its figures and verdict."""
    async with actors.Cluster.local(nodes=2, gpus_per_node=0) as cluster:
        st = await Store.create(cluster, num_units=args.units, name="stress")
        figures, _ = await stress(
            cluster,
            st,
            procs=args.procs,
            tasks=args.tasks,
            seconds=args.seconds,
            rows=args.rows,
            width=args.width,
            batch=args.batch,
        )
        return figures


def main(argv: list[str] | None = None) -> int:
    """Run the stress test; print the figures (and write --json)."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--procs", type=int, default=4, help="client processes")
    parser.add_argument("--tasks", type=int, default=64, help="asyncio clients per process")
    parser.add_argument("--units", type=int, default=4)
    parser.add_argument("--seconds", type=float, default=60.0)
    parser.add_argument("--rows", type=int, default=16, help="samples per put")
    parser.add_argument("--width", type=int, default=8, help="int64s per sample's payload")
    parser.add_argument("--batch", type=int, default=32, help="samples per fetch")
    parser.add_argument("--json", help="write the figures here")
    args = parser.parse_args(argv)
    out = asyncio.run(run(args))
    print(json.dumps(out, indent=2))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=2)
    return 0 if out["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
