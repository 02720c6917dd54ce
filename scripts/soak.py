"""Soak: minutes of mixed actor calls and store traffic, or many cluster start/stop cycles.

    python scripts/soak.py --minutes 5          # mixed traffic on one local cluster
    python scripts/soak.py --cycles 200         # start/stop cycles (the leak check)

Traffic mode prints, every ``--interval`` seconds, the calls and puts done and the RSS and
open file descriptors of the driver and of the whole cluster (head, agents, zygote, actors);
it fails (exit 1) when, after the first sample, RSS grew by more than ``--max-rss-growth-mb``
or descriptors by more than ``--max-fd-growth`` between the first and the last quarter of the
run. Cycle mode prints the driver's children, fds, threads and /dev/shm/rayless-* files after
every ``--interval`` cycles and fails on any growth. The measurements are
tests/chaos/scenarios.py's (tests/integration/test_soak.py runs a few cycles).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import time

import psutil
import torch
from tensordict import TensorDict

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from rayless.actors import Cluster
from rayless.store import Store
from tests.chaos.scenarios import Snapshot, descendants, growth, start_stop_cycle, until
from tests.integration.actor_classes import Counter


def _cluster_usage() -> tuple[float, int]:
    """RSS (MiB) and open fds summed over this process's descendants."""
    rss, fds = 0.0, 0
    for pid in descendants():
        try:
            p = psutil.Process(pid)
            rss += p.memory_info().rss / 2**20
            fds += p.num_fds()
        except psutil.Error:
            continue
    return rss, fds


async def _traffic(args: argparse.Namespace) -> int:
    async with Cluster.local(nodes=2, gpus_per_node=0) as cluster:
        counters = [await cluster.spawn(Counter) for _ in range(4)]
        st = await Store.create(cluster, num_units=2, name="soak")
        me = psutil.Process()
        samples: list[tuple[float, float, int, float, int]] = []
        calls = puts = 0
        start = time.monotonic()
        deadline = start + args.minutes * 60
        next_report = start
        print(
            f"{'t s':>7} {'calls':>8} {'puts':>7} {'drv MiB':>8} {'drv fd':>6} "
            f"{'clu MiB':>8} {'clu fd':>6}",
            flush=True,
        )
        while time.monotonic() < deadline:
            await asyncio.gather(*(c.add(1) for c in counters for _ in range(8)))
            calls += 8 * len(counters)
            await asyncio.gather(*(c.tensor_sum(torch.ones(4096)) for c in counters))
            calls += len(counters)
            meta = await st.put(TensorDict({"x": torch.randn(256, 64)}, [256]), "soak")
            got = await st.get_meta("soak", ["x"], 256, task="t", timeout=10)
            await st.get(got)
            await st.clear(meta)
            puts += 1
            now = time.monotonic()
            if now >= next_report:
                rss, fds = _cluster_usage()
                row = (now - start, me.memory_info().rss / 2**20, me.num_fds(), rss, fds)
                samples.append(row)
                print(
                    f"{row[0]:>7.0f} {calls:>8} {puts:>7} {row[1]:>8.1f} {row[2]:>6} "
                    f"{row[3]:>8.1f} {row[4]:>6}",
                    flush=True,
                )
                next_report = now + args.interval
    if len(samples) < 5:
        print("too short to judge growth (need 5 samples)")
        return 0
    body = samples[1:]  # the first sample is the warm-up
    q = max(1, len(body) // 4)
    first, last = body[:q], body[-q:]
    grew_rss = statistics.mean(s[1] + s[3] for s in last) - statistics.mean(
        s[1] + s[3] for s in first
    )
    grew_fd = statistics.mean(s[2] + s[4] for s in last) - statistics.mean(
        s[2] + s[4] for s in first
    )
    print(f"growth first→last quarter: RSS {grew_rss:+.1f} MiB, fds {grew_fd:+.1f}")
    ok = grew_rss <= args.max_rss_growth_mb and grew_fd <= args.max_fd_growth
    print("OK" if ok else "FAIL: growth")
    return 0 if ok else 1


async def _cycles(args: argparse.Namespace) -> int:
    await start_stop_cycle()
    await until(lambda: not descendants(), 20)
    first = Snapshot.take()
    print(f"{'cycle':>6} {'children':>8} {'fds':>5} {'threads':>7} {'shm':>4} {'RSS MiB':>8}")
    print(
        f"{0:>6} {first.children:>8} {first.fds:>5} {first.threads:>7} "
        f"{first.shm_files:>4} {first.rss_mb:>8.1f}",
        flush=True,
    )
    last = first
    t0 = time.monotonic()
    for i in range(1, args.cycles + 1):
        await start_stop_cycle()
        if not await until(lambda: not descendants(), 20):
            print(f"cycle {i}: processes left behind: {sorted(descendants())}")
            return 1
        if i % args.interval == 0 or i == args.cycles:
            last = Snapshot.take()
            print(
                f"{i:>6} {last.children:>8} {last.fds:>5} {last.threads:>7} "
                f"{last.shm_files:>4} {last.rss_mb:>8.1f}",
                flush=True,
            )
    grew = growth(first, last)
    per = (time.monotonic() - t0) / max(1, args.cycles)
    print(f"{args.cycles} cycles, {per:.2f}s each; growth: {grew}")
    ok = all(grew[k] <= 0 for k in ("children", "fds", "threads", "shm_files"))
    ok &= grew["rss_mb"] <= args.max_rss_growth_mb
    print("OK" if ok else "FAIL: growth")
    return 0 if ok else 1


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--minutes", type=float, default=None, help="traffic mode: how long")
    p.add_argument("--cycles", type=int, default=None, help="cycle mode: how many (e.g. 200)")
    p.add_argument("--interval", type=float, default=None, help="seconds / cycles per report")
    p.add_argument("--max-rss-growth-mb", type=float, default=64.0)
    p.add_argument("--max-fd-growth", type=float, default=8.0)
    args = p.parse_args()
    if (args.minutes is None) == (args.cycles is None):
        p.error("give exactly one of --minutes or --cycles")
    if args.cycles is not None:
        args.interval = int(args.interval or 10)
        return asyncio.run(_cycles(args))
    args.interval = float(args.interval or 10.0)
    return asyncio.run(_traffic(args))


if __name__ == "__main__":
    sys.exit(main())
