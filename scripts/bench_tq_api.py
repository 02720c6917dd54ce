"""verl's TransferQueue KV pattern through ``rayless.transfer_queue``, beside TransferQueue
0.1.x over Ray, in one run.

The same program (``rows(ray, tq)``) runs in a child process per side: ``rayless`` (``from
rayless import ray``, ``import rayless.transfer_queue as tq``) and ``tq`` (Ray and
TransferQueue: ``pip install -e '.[bench]'``; skipped with ``--skip-tq`` or when they are not
installed). Each step takes a new partition, as verl's trainer does: ``kv_batch_put`` of
``--rows`` keys (input ids and an attention mask of ``--seq`` tokens, a reward, one tag dict
per key), ``kv_batch_get`` of every key, a small ``kv_batch_get`` (8 keys, one field), then
``kv_clear``. Rows: ``ray.init()`` + ``tq.init()`` (s), and the median over ``--steps``
steps (after one warm-up step) of each operation (ms).

    python scripts/bench_tq_api.py [--rows 4096] [--seq 1024] [--steps 5] [--skip-tq]
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


def rows(ray: Any, tq: Any, n: int, seq: int, steps: int) -> dict[str, float]:
    """Every row on one side."""
    import torch
    from tensordict import TensorDict

    t0 = time.perf_counter()
    ray.init(num_cpus=4)
    tq.init({"backend": {"SimpleStorage": {"num_data_storage_units": 2}}})
    out: dict[str, float] = {"init (s)": time.perf_counter() - t0}
    td = TensorDict(
        {
            "input_ids": torch.randint(0, 32000, (n, seq)),
            "attention_mask": torch.ones(n, seq, dtype=torch.int8),
            "reward": torch.rand(n),
        },
        batch_size=n,
    )
    tags = [{"uid": i, "group": i // 8} for i in range(n)]
    times: dict[str, list[float]] = {"kv_batch_put": [], "kv_batch_get": [], "small get": []}
    for step in range(steps + 1):
        keys = [f"s{step}-{i}" for i in range(n)]
        part = f"step{step}"
        t = time.perf_counter()
        tq.kv_batch_put(keys=keys, partition_id=part, fields=td, tags=tags)
        put = time.perf_counter() - t
        t = time.perf_counter()
        tq.kv_batch_get(keys=keys, partition_id=part)
        get = time.perf_counter() - t
        t = time.perf_counter()
        tq.kv_batch_get(keys=keys[:8], partition_id=part, select_fields="reward")
        small = time.perf_counter() - t
        tq.kv_clear(keys=keys, partition_id=part)
        if step:  # the first step warms up
            times["kv_batch_put"].append(put)
            times["kv_batch_get"].append(get)
            times["small get"].append(small)
    for name, values in times.items():
        out[f"{name} (ms)"] = statistics.median(values) * 1e3
    out["MB per step"] = sum(v.nbytes for v in td.values()) / 1e6
    tq.close()
    ray.shutdown()
    return out


def _part(side: str, args: argparse.Namespace) -> dict[str, float]:
    """Run one side in a child process; its rows."""
    cmd = [sys.executable, __file__, "--part", side, "--rows", str(args.rows)]
    cmd += ["--seq", str(args.seq), "--steps", str(args.steps)]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
    if proc.returncode != 0:
        raise SystemExit(f"the {side} part failed:\n{proc.stderr[-3000:]}")
    result: dict[str, float] = json.loads(proc.stdout.strip().splitlines()[-1])
    return result


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rows", type=int, default=4096)
    p.add_argument("--seq", type=int, default=1024)
    p.add_argument("--steps", type=int, default=5)
    p.add_argument("--skip-tq", action="store_true")
    p.add_argument("--part", choices=["rayless", "tq"], help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.part == "rayless":
        import rayless.transfer_queue as tq
        from rayless import ray

        print(json.dumps(rows(ray, tq, args.rows, args.seq, args.steps)))
        return
    if args.part == "tq":
        import ray  # type: ignore[import-not-found,no-redef]
        import transfer_queue as tq  # type: ignore[import-not-found,no-redef]

        print(json.dumps(rows(ray, tq, args.rows, args.seq, args.steps)))
        return
    have_tq = all(importlib.util.find_spec(m) for m in ("ray", "transfer_queue"))
    ours = _part("rayless", args)
    theirs = _part("tq", args) if have_tq and not args.skip_tq else {}
    print(f"{'row':<22} {'rayless':>10} {'TQ 0.1.x':>10} {'TQ / rayless':>13}")
    for name, value in ours.items():
        other = theirs.get(name)
        ratio = f"{other / value:.1f}x" if other and "MB" not in name else ""
        shown = "" if other is None else f"{other:10.2f}"
        print(f"{name:<22} {value:10.2f} {shown:>10} {ratio:>13}")


if __name__ == "__main__":
    main()
