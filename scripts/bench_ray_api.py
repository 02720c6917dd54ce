"""Ray's microbenchmark shapes through ``rayless.ray``, beside Ray and beside rayless called
directly, in one run.

The same program (``rows(ray)``) runs on ``rayless.ray`` in this process and on Ray in a
child process (``--ray-part``; skipped with ``--skip-ray`` or when Ray is not installed:
``pip install -e '.[bench]'``). The direct rows call rayless' sync facade the way
docs/moving-from-ray.md translates them, so ``layer cost`` is what ``from rayless import ray``
adds (the issue's goal: ≤ 10 %).

Rows: sync actor calls (``ray.get(a.ping.remote())``), pipelined actor calls (``ray.get`` of a
list), tasks (``ray.get`` of a list of ``f.remote()``), ``ray.put`` of a 64 MiB numpy array
passed to an actor (MB/s), an 8-bundle placement group of ``{"GPU": 1}`` bundles (fake GPUs)
with one actor per bundle (seconds until every actor answered). Start-up rows, each in a
fresh process: seconds from ``ray.init()`` until a new actor answered, then until a task
answered, for a driver that imported neither torch nor numpy, one that imported torch (before
``ray.init``), and Ray.

    python scripts/bench_ray_api.py [--quick] [--skip-ray] [--json OUT]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from typing import Any

MIB = 1 << 20


class Ping:
    """The actor of every row."""

    def ping(self) -> int:
        return 1

    def take(self, a: Any) -> int:
        return int(a.nbytes)


def ping_task() -> int:
    return 1


def rows(ray: Any, n: int, tensor_iters: int) -> dict[str, float]:
    """Every row on ``ray`` (``rayless.ray`` or Ray)."""
    import numpy as np

    util = __import__(ray.__name__ + ".util", fromlist=["placement_group"])
    strategies = __import__(
        ray.__name__ + ".util.scheduling_strategies", fromlist=["PlacementGroupSchedulingStrategy"]
    )
    actor_cls = ray.remote(Ping)
    task = ray.remote(ping_task)
    a = actor_cls.remote()
    ray.get(a.ping.remote())
    out: dict[str, float] = {}
    start = time.perf_counter()
    for _ in range(n):
        ray.get(a.ping.remote())
    out["sync actor calls/s"] = n / (time.perf_counter() - start)
    start = time.perf_counter()
    ray.get([a.ping.remote() for _ in range(n)])
    out["pipelined actor calls/s"] = n / (time.perf_counter() - start)
    array = np.ones(64 * MIB, dtype=np.uint8)
    ray.get(a.take.remote(ray.put(array)))
    start = time.perf_counter()
    for _ in range(tensor_iters):
        ray.get(a.take.remote(ray.put(array)))
    out["put+get 64 MiB (MB/s)"] = tensor_iters * 64 / (time.perf_counter() - start)
    ray.get([task.remote() for _ in range(64)])  # the task workers started (after the actor rows)
    time.sleep(1.0)
    start = time.perf_counter()
    ray.get([task.remote() for _ in range(n)])
    out["tasks/s"] = n / (time.perf_counter() - start)
    start = time.perf_counter()
    pg = util.placement_group([{"GPU": 1, "CPU": 1}] * 8, strategy="PACK")
    ray.get(pg.ready())
    actors = [
        actor_cls.options(
            num_gpus=1,
            num_cpus=0,
            scheduling_strategy=strategies.PlacementGroupSchedulingStrategy(pg, i),
        ).remote()
        for i in range(8)
    ]
    ray.get([x.ping.remote() for x in actors])
    out["8-bundle placement group + 8 actors (s)"] = time.perf_counter() - start
    util.remove_placement_group(pg)
    return out


def direct_rows(n: int, tensor_iters: int) -> dict[str, float]:
    """The actor rows on rayless' sync facade, without the Ray layer."""
    import numpy as np

    from rayless.actors import Cluster

    out: dict[str, float] = {}
    with Cluster.local_sync(nodes=1, gpus_per_node=8) as cluster:
        a = cluster.spawn(Ping)
        a.ping.call()
        start = time.perf_counter()
        for _ in range(n):
            a.ping.call()
        out["sync actor calls/s"] = n / (time.perf_counter() - start)
        start = time.perf_counter()
        cluster.get([a.ping.remote() for _ in range(n)])
        out["pipelined actor calls/s"] = n / (time.perf_counter() - start)
        array = np.ones(64 * MIB, dtype=np.uint8)
        a.take.call(array)
        start = time.perf_counter()
        for _ in range(tensor_iters):
            a.take.call(array)
        out["put+get 64 MiB (MB/s)"] = tensor_iters * 64 / (time.perf_counter() - start)
    return out


def first_answers(kind: str) -> dict[str, float]:
    """Seconds from ``ray.init()`` to a new actor's first answer, then to a task's, in this
    (fresh) process: ``kind`` is ``rayless``, ``rayless+torch`` (torch imported first) or
    ``ray``."""
    if kind == "rayless+torch":
        import torch  # noqa: F401 (what an RL driver has done before ray.init)
    if kind == "ray":
        import ray
    else:
        from rayless import ray  # type: ignore[no-redef]
    start = time.perf_counter()
    ray.init(num_cpus=2)
    try:
        a = ray.remote(Ping).remote()
        ray.get(a.ping.remote())
        actor = time.perf_counter() - start
        ray.get(ray.remote(ping_task).remote())
        task = time.perf_counter() - start
        return {"init + first actor answer (s)": actor, "init + first task answer (s)": task}
    finally:
        ray.shutdown()


def startup_rows(kinds: list[str], repeats: int) -> dict[str, dict[str, float]]:
    """:func:`first_answers` of each kind, ``repeats`` fresh processes each (medians)."""
    runs: dict[str, list[dict[str, float]]] = {k: [] for k in kinds}
    for _ in range(repeats):
        for kind in kinds:
            child = subprocess.run(
                [sys.executable, __file__, "--first-answers", kind],
                capture_output=True,
                text=True,
                env={**os.environ, "RAY_DEDUP_LOGS": "0"},
                check=True,
            )
            runs[kind].append(json.loads(child.stdout.strip().splitlines()[-1]))
    return {
        k: {key: statistics.median(r[key] for r in rs) for key in rs[0]} for k, rs in runs.items()
    }


def ours(n: int, tensor_iters: int) -> dict[str, float]:
    from rayless import ray

    ray.init(num_cpus=8, num_gpus=8)
    try:
        return rows(ray, n, tensor_iters)
    finally:
        ray.shutdown()


def ray_part(n: int, tensor_iters: int) -> dict[str, float]:
    import ray

    ray.init(num_cpus=8, num_gpus=8, include_dashboard=False)
    try:
        return rows(ray, n, tensor_iters)
    finally:
        ray.shutdown()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="small sizes (a smoke run)")
    parser.add_argument("--skip-ray", action="store_true")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--json", help="write the results here")
    parser.add_argument("--ray-part", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--first-answers", help=argparse.SUPPRESS)
    args = parser.parse_args()
    n, iters = (200, 2) if args.quick else (5000, 10)
    if args.ray_part:
        print(json.dumps(ray_part(n, iters)))
        return
    if args.first_answers:
        print(json.dumps(first_answers(args.first_answers)))
        return
    repeats = 1 if args.quick else args.repeats
    have_ray = not args.skip_ray and __import__("importlib").util.find_spec("ray") is not None
    layer: list[dict[str, float]] = []
    direct: list[dict[str, float]] = []
    theirs: list[dict[str, float]] = []
    for _ in range(repeats):  # the three alternate, repeat by repeat
        layer.append(ours(n, iters))
        direct.append(direct_rows(n, iters))
        if have_ray:
            child = subprocess.run(
                [sys.executable, __file__, "--ray-part", *(["--quick"] if args.quick else [])],
                capture_output=True,
                text=True,
                env={**os.environ, "RAY_DEDUP_LOGS": "0"},
                check=True,
            )
            theirs.append(json.loads(child.stdout.strip().splitlines()[-1]))

    def med(runs: list[dict[str, float]], key: str) -> float | None:
        vals = [r[key] for r in runs if key in r]
        return statistics.median(vals) if vals else None

    table = []
    print("| row | rayless.ray | rayless direct | layer cost | Ray | ours/Ray |")
    print("|---|---:|---:|---:|---:|---:|")
    for key in layer[0]:
        ours_v, direct_v, ray_v = med(layer, key), med(direct, key), med(theirs, key)
        assert ours_v is not None
        seconds = key.endswith("(s)")
        cost = (
            None
            if direct_v is None
            else (ours_v / direct_v - 1 if seconds else direct_v / ours_v - 1)
        )
        ratio = None if ray_v is None else (ray_v / ours_v if seconds else ours_v / ray_v)
        table.append({"row": key, "ours": ours_v, "direct": direct_v, "ray": ray_v})
        show = lambda v, f: "" if v is None else format(v, f)  # noqa: E731
        print(
            f"| {key} | {show(ours_v, ',.2f' if seconds else ',.0f')} | "
            f"{show(direct_v, ',.0f')} | {show(None if cost is None else cost * 100, '+.1f')}"
            f"{'' if cost is None else ' %'} | {show(ray_v, ',.2f' if seconds else ',.0f')} | "
            f"{show(ratio, '.2f')}{'' if ratio is None else 'x'} |"
        )
    kinds = ["rayless", "rayless+torch", *(["ray"] if have_ray else [])]
    start = startup_rows(kinds, repeats)
    print()
    print("| start-up, a fresh process (medians) | " + " | ".join(kinds) + " |")
    print("|---|" + "---:|" * len(kinds))
    for key in start[kinds[0]]:
        print(f"| {key} | " + " | ".join(f"{start[k][key]:.2f}" for k in kinds) + " |")
        table.append({"row": key, **{k: start[k][key] for k in kinds}})
    if args.json:
        with open(args.json, "w") as f:
            json.dump(table, f, indent=1)


if __name__ == "__main__":
    main()
