"""What ending an actor by its handle's scope costs a call through ``rayless.ray``.

A handle that ``.remote()`` returns is owned (``rayless/ray/_lifetime.py``): each call made
through it is tracked until answered, so that the actor's end waits for it. A named actor's
handle is not owned. Both actors run the same ``def f(x)``; each round submits ``--calls``
calls through one handle, then ``ray.get``s them all, alternating the two handles.

    python scripts/bench_ray_handles.py [--calls 2000] [--rounds 7]
"""

from __future__ import annotations

import argparse
import statistics
import time

from rayless import ray


class Echo:
    """The actor of both rows."""

    def f(self, x: int) -> int:
        return x


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=2000)
    parser.add_argument("--rounds", type=int, default=7)
    args = parser.parse_args()
    ray.init(num_cpus=2)
    echo = ray.remote(num_cpus=0)(Echo)
    handles = {
        "owned (ended by scope)": echo.remote(),
        "named (kept)": echo.options(name="kept").remote(),
    }
    ray.get([h.f.remote(0) for h in handles.values()])
    rates: dict[str, list[float]] = {label: [] for label in handles}
    for _ in range(args.rounds):
        for label, h in handles.items():
            start = time.perf_counter()
            ray.get([h.f.remote(i) for i in range(args.calls)])
            rates[label].append(args.calls / (time.perf_counter() - start))
    for label, seen in rates.items():
        print(
            f"{label}: median {statistics.median(seen):,.0f} calls/s "
            f"(min {min(seen):,.0f}, max {max(seen):,.0f})"
        )
    ray.shutdown()


if __name__ == "__main__":
    main()
