"""The CPU cost of the timeline's hooks per actor call (rayless.actors.core.timeline), measured
in one process: the caller's (span, flow id, reply callback) and the actor's (the method
wrapper), each as the difference to the same work without the hook.

    RAYLESS_TIMELINE=1 python scripts/bench_timeline.py [--calls 200000]
"""

from __future__ import annotations

import argparse
import asyncio
import time
from collections.abc import Callable
from typing import Any

from rayless.actors.core import timeline


def _per_call(fn: Callable[[], Any], n: int) -> float:
    start = time.process_time()
    for _ in range(n):
        fn()
    return (time.process_time() - start) / n * 1e6


async def _main(n: int) -> None:
    timeline.RECORDER.enabled = True
    loop = asyncio.get_running_loop()

    def plain() -> None:
        fut = loop.create_future()
        fut.add_done_callback(lambda f: None)
        fut.set_result(1)

    def hooked() -> None:
        span = timeline.call_span("actor", "method")
        assert span is not None
        fut = loop.create_future()
        fut.add_done_callback(span.done)
        fut.set_result(1)

    caller = []
    for fn in (plain, hooked):
        start = time.process_time()
        for _ in range(n):
            fn()
        for _ in range(3):  # run the reply callbacks inside the measured time
            await asyncio.sleep(0)
        caller.append((time.process_time() - start) / n * 1e6)
    print(f"caller: {caller[1] - caller[0]:.2f} µs per call")

    def method(x: int) -> int:
        return x

    sync = _per_call(lambda: timeline.traced_method(method, "m", 1, False)(1), n)
    base = _per_call(lambda: method(1), n)
    print(f"actor, def method: {sync - base:.2f} µs per call")

    async def amethod(x: int) -> int:
        return x

    start = time.process_time()
    for _ in range(n):
        await timeline.traced_method(amethod, "m", 1, True)(1)
    traced = (time.process_time() - start) / n * 1e6
    start = time.process_time()
    for _ in range(n):
        await amethod(1)
    bare = (time.process_time() - start) / n * 1e6
    print(f"actor, async def method: {traced - bare:.2f} µs per call")


def main() -> None:
    """Parse the arguments and print the three figures."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--calls", type=int, default=200_000)
    asyncio.run(_main(parser.parse_args().calls))


if __name__ == "__main__":
    main()
