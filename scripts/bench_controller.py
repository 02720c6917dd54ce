"""Benchmark the store controller's state in process: fetch cost and bytes per sample against
the partition's size.

For each size (1k, 16k, 128k, 1M samples by default) it fills one partition with that many
ready samples (puts of 1,024 tiny rows, one field, two units), then times a fetch of 1,024
(``try_fetch``, sequential, the controller's part of ``get_meta``) plus ``check_readable``
(its part of ``get``). Between timed fetches the fetched samples are cleared and 1,024 new
ones put (``allocate`` + the units' data updates, timed apart), so the partition holds the
same number of samples throughout. Memory:
the bytes tracemalloc counts for the filled state, divided by the samples.

``--store``: the same sweep end to end instead, through a 2-unit store on a 2-node local
cluster (``get_meta`` of 1,024 + ``get`` of their rows, 4 float32 each; the partition grows
by 8,192-row puts to each size, and by 1,024 after each timed fetch).

    python scripts/bench_controller.py [--sweep 1024,16384,131072,1048576] [--repeats 20]
        [--random] [--store] [--json out.json]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import time
import tracemalloc
from typing import Any

sys.path.append(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from rayless.store.controller.state import ControllerState
from rayless.store.data.schema import DataUpdate, FieldSchema

BATCH = 1024
X = FieldSchema("dense", "int64", (), "cpu")


def put(c: ControllerState, n: int) -> None:
    """Allocate ``n`` samples in "p" and report them written, as the units do."""
    meta = c.allocate("p", n, schemas={"x": X})
    for shard, positions in meta.by_shard().items():
        idx = [meta.global_indexes[p] for p in positions]
        c.on_data_update(f"u{shard}", DataUpdate("p", idx, {"x": X}))


def filled(size: int) -> ControllerState:
    """A state with two units and partition "p" holding ``size`` ready samples."""
    c = ControllerState("bench")
    for i in range(2):
        c.register_unit(f"u{i}")
    for start in range(0, size, BATCH):
        put(c, min(BATCH, size - start))
    return c


def bytes_per_sample(size: int) -> float:
    """tracemalloc's count of the state's bytes after filling ``size`` samples, per sample."""
    tracemalloc.start()
    base = tracemalloc.get_traced_memory()[0]
    c = filled(size)
    used = tracemalloc.get_traced_memory()[0] - base
    tracemalloc.stop()
    del c
    return used / size


def fetch_ms(size: int, repeats: int, sampler: Any = None) -> dict[str, float]:
    """Median ms of a fetch of 1,024 (+ check_readable) in a partition of ``size``."""
    c = filled(size)
    times, puts, examined = [], [], []
    for _ in range(repeats):
        before = getattr(c, "positions_examined", 0)
        t = time.perf_counter()
        meta = c.try_fetch("p", ["x"], BATCH, task="train", sampler=sampler)
        if meta is None:
            raise RuntimeError("the fetch found no full batch")
        c.check_readable(meta)
        times.append(time.perf_counter() - t)
        examined.append(getattr(c, "positions_examined", 0) - before)
        c.release(c.clear(meta).indexes)
        t = time.perf_counter()
        put(c, BATCH)
        puts.append(time.perf_counter() - t)
    return {
        "ms": statistics.median(times) * 1e3,
        "put_ms": statistics.median(puts) * 1e3,
        "examined": statistics.median(examined),
    }


async def store_sweep(sizes: list[int], repeats: int) -> list[dict[str, Any]]:
    """Median ms of ``get_meta`` (1,024) + ``get`` through a real store at each size."""
    import torch
    from tensordict import TensorDict

    import rayless.actors as actors
    from rayless.store import Store

    rows = []
    async with actors.Cluster.local(nodes=2) as cluster:
        st = await Store.create(cluster, num_units=2)
        chunk = TensorDict({"x": torch.ones(8192, 4)}, [8192])
        more = TensorDict({"x": torch.ones(BATCH, 4)}, [BATCH])
        have = 0
        for size in sizes:
            while have < size:
                await st.put(chunk, partition="p")
                have += len(chunk)
            times = []
            for _ in range(repeats):
                t = time.perf_counter()
                meta = await st.get_meta("p", ["x"], BATCH, task="train", timeout=60)
                await st.get(meta)
                times.append(time.perf_counter() - t)
                await st.put(more, partition="p")
                have += BATCH
            row = {"samples": have, "store_ms": statistics.median(times) * 1e3}
            print(json.dumps(row), flush=True)
            rows.append(row)
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--sweep", default="1024,16384,131072,1048576")
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--random", action="store_true", help="also the random sampler")
    parser.add_argument("--store", action="store_true", help="end to end through a store")
    parser.add_argument("--json", help="write the results here")
    args = parser.parse_args()
    sizes = [int(s) for s in args.sweep.split(",")]
    if args.store:
        store_rows = asyncio.run(store_sweep(sizes, args.repeats))
        print("\n| samples | get_meta 1,024 + get (ms) |\n|---|---|")
        for r in store_rows:
            print(f"| {r['samples']:,} | {r['store_ms']:.2f} |")
        if args.json:
            with open(args.json, "w") as f:
                json.dump(store_rows, f, indent=1)
        return
    rows = []
    for size in sizes:
        row: dict[str, Any] = {"samples": size, **fetch_ms(size, args.repeats)}
        if args.random:
            row["random_ms"] = fetch_ms(size, args.repeats, {"name": "random", "seed": 0})["ms"]
        row["bytes_per_sample"] = bytes_per_sample(size)
        rows.append(row)
        print(json.dumps(row), flush=True)
    base = rows[0]["ms"]
    print(
        "\n| samples | fetch 1,024 + check (ms) | x smallest | positions examined |"
        f" put 1,024 (ms) |{' random (ms) |' if args.random else ''} bytes/sample |"
    )
    print(f"|---|---|---|---|---|{'---|' if args.random else ''}---|")
    for r in rows:
        extra = f" {r['random_ms']:.2f} |" if args.random else ""
        print(
            f"| {r['samples']:,} | {r['ms']:.2f} | {r['ms'] / base:.2f} | {r['examined']:,.0f} |"
            f" {r['put_ms']:.2f} |{extra} {r['bytes_per_sample']:.1f} |"
        )
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
