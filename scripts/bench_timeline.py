"""What recording the timeline (rayless.actors.core.timeline) costs an actor call, end to end.

One driver submits DEPTH calls at once to one actor's ``def`` method, gathers them, again and
again (the shape of ``bench_actors.py --depths``), with recording on and off in turn in both
processes of one cluster (on, off, on, off...: each round's neighbours ran under the same
load; each pair's order alternates), and prints the CPU µs per call of each side (the
processes' own clocks) in each mode: the mean of the rounds and its 95% margin (2 standard
errors: one round's CPU per call moves by several µs as the machine drifts), and what
recording adds as a share of the call's CPU: the mean of each round on minus its neighbour
off, which cancels the drift. Both rings are full before the first
round (a long job's steady state: each record in pushes the oldest out).

    python scripts/bench_timeline.py [--depth 3000] [--calls 15000] [--rounds 30] [--load N]
"""

from __future__ import annotations

import argparse
import asyncio
import math
import os
import statistics
import time
from typing import Any

from bench_actors import cpu_load

from rayless.actors.api import runtime
from rayless.actors.core import timeline


class Traced:
    """The callee: a trivial ``def`` method, its process's CPU clock, and the switch."""

    def ping(self) -> int:
        """A plain method: runs in the actor's worker thread."""
        return 1

    def cpu(self) -> float:
        """This actor process's CPU seconds so far."""
        return time.process_time()

    def record(self, on: bool) -> int:
        """Turn this process's recording on or off; the records its ring holds."""
        timeline.RECORDER.enabled = on
        return len(timeline.RECORDER.spans)


def _record_here(target: Any, on: bool) -> None:
    """Turn the driver's recording on or off, the ends its client records too (the bench's
    reach into the runtime: a process chooses once, at start, through RAYLESS_TIMELINE)."""
    timeline.RECORDER.enabled = on
    conn = runtime._RUNTIMES[asyncio.get_running_loop()].conns[target.actor_id]
    assert conn.client is not None
    conn.client.trace = timeline.RECORDER.spans if on else None


async def _calls(target: Any, depth: int, total: int) -> None:
    done = 0
    while done < total:
        await asyncio.gather(*[target.ping() for _ in range(depth)])
        done += depth


async def _round(target: Any, depth: int, total: int) -> tuple[float, float]:
    actor0, driver0 = await target.cpu(), time.process_time()
    await _calls(target, depth, total)
    driver = time.process_time() - driver0
    actor = await target.cpu() - actor0
    return driver / total * 1e6, actor / total * 1e6


async def _main(depth: int, calls: int, rounds: int) -> None:
    from rayless.actors import Cluster

    async with Cluster.local(nodes=1) as cluster:
        target = await cluster.spawn(Traced, cpus=0)
        await target.ping()  # connected: the client exists
        _record_here(target, True)
        await target.record(True)
        while await target.record(True) < timeline.RECORDER.spans.maxlen:  # type: ignore[operator]
            await _calls(target, depth, calls)  # fill both rings
        res: dict[bool, list[tuple[float, float]]] = {True: [], False: []}
        for i in range(rounds):
            for on in (True, False) if i % 2 == 0 else (False, True):
                _record_here(target, on)
                await target.record(on)
                res[on].append(await _round(target, depth, calls))
        _record_here(target, True)
        await target.record(True)
    one, five, fifteen = os.getloadavg()
    print(
        f"{calls:,} calls a round, {depth:,} submitted at once, {rounds} rounds each way "
        f"(load average {one:.2f}, {five:.2f}, {fifteen:.2f})"
    )
    print(f"{'CPU µs per call':<18}{'driver':>15}{'actor':>15}{'both':>15}")
    cols = {
        on: [[r[0] for r in res[on]], [r[1] for r in res[on]], [sum(r) for r in res[on]]]
        for on in res
    }
    for on, name in ((False, "recording off"), (True, "recording on")):
        print(f"{name:<18}" + "".join(f"{_mean(c):>15}" for c in cols[on]))
    # paired: each round on minus its neighbour off (the machine's slow drift cancels)
    extra = []
    for a, b in zip(cols[True], cols[False], strict=True):
        diffs = [x - y for x, y in zip(a, b, strict=True)]
        extra.append((statistics.fmean(diffs), _margin(diffs)))
    print(f"{'recording adds':<18}" + "".join(f"{f'{d:.2f} ± {m:.2f}':>15}" for d, m in extra))
    off = statistics.fmean(cols[False][2])
    d, m = extra[2]
    print(f"= {d / off:+.1%} ± {m / off:.1%} of a call's CPU ({off:.2f} µs off)")


def _margin(xs: list[float]) -> float:
    return 2 * statistics.stdev(xs) / math.sqrt(len(xs))


def _mean(xs: list[float]) -> str:
    return f"{statistics.fmean(xs):.2f} ± {_margin(xs):.2f}"


def main() -> None:
    """Parse the arguments, run the rounds (beside ``--load`` burners) and print the table."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--depth", type=int, default=3000)
    parser.add_argument("--calls", type=int, default=15_000, help="calls a round")
    parser.add_argument("--rounds", type=int, default=30, help="rounds each way")
    parser.add_argument("--load", type=int, default=0, help="CPU burners beside it")
    a = parser.parse_args()
    with cpu_load(a.load, print):
        asyncio.run(_main(a.depth, a.calls, a.rounds))


if __name__ == "__main__":
    main()
