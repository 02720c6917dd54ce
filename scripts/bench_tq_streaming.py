"""TransferQueue's streaming loader in verl's step pattern through ``rayless.transfer_queue``,
beside TransferQueue 0.1.x over Ray, in one run.

The same program (``rows(ray, tq)``) runs in a child process per side: ``rayless`` and ``tq``
(Ray and TransferQueue: ``pip install -e '.[bench]'``; skipped with ``--skip-tq`` or when they
are not installed). The store runs ``RankAwareSampler`` in polling mode. Each step takes a new
partition: ``client.put`` of ``--rows`` samples (input ids of ``--seq`` tokens and a reward),
then ``--groups`` data-parallel groups of ``--ranks`` ranks each read the whole partition
through their ``StreamingDataset`` (``batch_size`` ``--batch``, micro-batches of half of it,
``should_check_consumption_status=True``), taking turns as ranks stepping together do; then
``clear_partition``. The ranks' datasets move to the next partition with ``step()``, as
TransferQueue's relax recipe does. Rows: ``ray.init()`` + ``tq.init()`` (s), and the median
over ``--steps`` steps (after one warm-up step) of the put and of the read (ms); every rank
of a group reads its group's share, so a step reads ``--ranks`` times the put's bytes (the
row ``read / put MB``: less where a rank missed one of its group's batches).

    python scripts/bench_tq_streaming.py [--rows 1024] [--seq 1024] [--batch 128]
        [--groups 2] [--ranks 2] [--steps 5] [--skip-tq]
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import statistics
import subprocess
import sys
import time
from typing import Any


def rows(ray: Any, tq: Any, args: argparse.Namespace) -> dict[str, float]:
    """Every row on one side."""
    import torch
    from tensordict import TensorDict

    conf: Any = {
        "controller": {"sampler": tq.RankAwareSampler, "polling_mode": True},
        "backend": {"SimpleStorage": {"num_data_storage_units": 2}},
    }
    if not tq.__name__.startswith("rayless"):
        from omegaconf import OmegaConf

        conf = OmegaConf.create(conf, flags={"allow_objects": True})
    t0 = time.perf_counter()
    ray.init(num_cpus=4)
    tq.init(conf)
    out: dict[str, float] = {"init (s)": time.perf_counter() - t0}
    client = tq.get_client()
    controller = ray.get_actor("TransferQueueController", namespace="transfer_queue")
    config = ray.get(controller.get_config.remote())
    n = args.rows
    td = TensorDict(
        {"input_ids": torch.randint(0, 32000, (n, args.seq)), "reward": torch.rand(n)},
        batch_size=n,
    )
    ranks = [
        tq.StreamingDataset(
            config=config,
            batch_size=args.batch,
            micro_batch_size=max(1, args.batch // 2),
            data_fields=["input_ids", "reward"],
            partition_id="step0",
            task_name="train",
            dp_rank=group,
            should_check_consumption_status=True,
        )
        for group in range(args.groups)
        for _ in range(args.ranks)
    ]
    times: dict[str, list[float]] = {"put": [], "read": [], "samples read": []}
    for step in range(args.steps + 1):
        part = f"step{step}"
        for ds in ranks:
            ds.step(part)
        t = time.perf_counter()
        client.put(td, partition_id=part)
        put = time.perf_counter() - t
        t = time.perf_counter()
        read = 0
        live = [iter(ds) for ds in ranks]
        while live:  # the ranks in turn
            for it in list(live):
                try:
                    batch, _meta = next(it)
                except StopIteration:
                    live.remove(it)
                    continue
                read += batch.batch_size[0]
        took = time.perf_counter() - t
        client.clear_partition(part)
        if step:  # the first step warms up
            times["put"].append(put)
            times["read"].append(took)
            times["samples read"].append(read)
    for name in ("put", "read"):
        out[f"{name} (ms)"] = statistics.median(times[name]) * 1e3
    out["read / put MB"] = min(times["samples read"]) / n  # --ranks if no rank missed a batch
    out["MB per put"] = sum(v.nbytes for v in td.values()) / 1e6
    tq.close()
    ray.shutdown()
    return out


def _part(side: str, argv: list[str]) -> dict[str, float]:
    """Run one side in a child process; its rows."""
    cmd = [sys.executable, __file__, "--part", side, *argv]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
    if proc.returncode != 0:
        raise SystemExit(f"the {side} part failed:\n{proc.stderr[-3000:]}")
    result: dict[str, float] = json.loads(proc.stdout.strip().splitlines()[-1])
    return result


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rows", type=int, default=1024)
    p.add_argument("--seq", type=int, default=1024)
    p.add_argument("--batch", type=int, default=128)
    p.add_argument("--groups", type=int, default=2)
    p.add_argument("--ranks", type=int, default=2)
    p.add_argument("--steps", type=int, default=5)
    p.add_argument("--skip-tq", action="store_true")
    p.add_argument("--part", choices=["rayless", "tq"], help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.part == "rayless":
        import rayless.transfer_queue as tq
        from rayless import ray

        print(json.dumps(rows(ray, tq, args)))
        return
    if args.part == "tq":
        import ray  # type: ignore[import-not-found,no-redef]
        import transfer_queue as tq  # type: ignore[import-not-found,no-redef]

        print(json.dumps(rows(ray, tq, args)))
        return
    argv = [a for a in sys.argv[1:] if a != "--skip-tq"]
    have_tq = all(importlib.util.find_spec(m) for m in ("ray", "transfer_queue", "omegaconf"))
    ours = _part("rayless", argv)
    theirs = _part("tq", argv) if have_tq and not args.skip_tq else {}
    print(f"{'row':<14} {'rayless':>10} {'TQ 0.1.x':>10} {'TQ / rayless':>13}")
    for name, value in ours.items():
        other = theirs.get(name)
        ratio = f"{other / value:.1f}x" if other and ("ms" in name or "(s)" in name) else ""
        shown = "" if other is None else f"{other:10.2f}"
        print(f"{name:<14} {value:10.2f} {shown:>10} {ratio:>13}")


if __name__ == "__main__":
    main()
