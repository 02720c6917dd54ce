"""Chaos at a larger scale: kill -9 workers, storage units, node agents and the head, for minutes.

Rounds until ``--minutes`` pass, each on a fresh local cluster:

* pipeline: the demo pipeline (``--iterations``) with env/eval workers restarted up to
  ``--max-restarts`` times; ``--kills`` random env/eval workers are killed, then a storage unit
  of a side store that takes acknowledged puts, then one of the pipeline's own units.
* node: a 3-node cluster loses a node agent while calls are pending on every node.
* head: the head of a 3-node cluster is killed; agents and actors must exit.

Prints every kill, detection times (p50/max) per fault and what was lost; exits 1 when a round
hung, left a process behind, lost an acknowledged put whose unit lived, or failed with an error
that does not name the lost unit. The scenarios are tests/chaos/scenarios.py (the tests run
them at small sizes).

    python scripts/chaos.py [--minutes 5] [--kills 6] [--iterations 12] [--seed 0]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import time
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from rayless.actors import ActorDiedError, Cluster
from rayless.actors.core import context
from rayless.actors.launch.local import LocalProcesses
from rayless.demo.config import load_config
from rayless.store import UnitLostError
from tests.chaos.scenarios import (
    descendants,
    head_loss,
    node_loss,
    pipeline_chaos,
    summary,
    until,
)


async def _pipeline_round(args: argparse.Namespace, seed: int, out: dict[str, Any]) -> bool:
    cfg = load_config()
    cfg.algo.iterations = args.iterations
    cfg.algo.target_return = 10_000.0
    async with Cluster.local(nodes=2, gpus_per_node=2) as cluster:
        report = await pipeline_chaos(
            cluster,
            cfg,
            seed=seed,
            actor_kills=args.kills,
            kill_every=args.kill_every,
            max_restarts=args.max_restarts,
            run_timeout=args.run_timeout,
            log=lambda m: print(f"  {m}", flush=True),
        )
    for kill in report.kills:
        if kill.detected_s is not None:
            out.setdefault(kill.what, []).append(kill.detected_s)
    out["acked"] = out.get("acked", 0) + report.acked_puts
    out["acked_lost_with_unit"] = out.get("acked_lost_with_unit", 0) + report.acked_lost_with_unit
    ok = not report.acked_unreadable and not report.leftover_pids
    if report.error is not None:
        named = isinstance(report.error, UnitLostError) and report.error.unit == report.killed_unit
        ok &= named
        outcome = f"failed: {type(report.error).__name__}: {report.error}"
    else:
        assert report.result is not None
        outcome = f"completed {len(report.result.iterations)} iterations"
    print(
        f"pipeline round (seed {seed}): {outcome}; restarts {report.restarts}; "
        f"acked puts {report.acked_puts}, lost with their unit {report.acked_lost_with_unit}, "
        f"unreadable {report.acked_unreadable}; leftover pids {report.leftover_pids}; "
        f"{report.wall_s:.1f}s",
        flush=True,
    )
    return ok


async def _node_round(out: dict[str, Any], node_timeout: float) -> bool:
    procs = LocalProcesses(3, 0, node_timeout)
    await asyncio.to_thread(procs.start)
    cluster = Cluster(_info(procs))
    try:
        report = await node_loss(cluster, procs, victim=2, per_node=2)
    finally:
        await cluster.aclose()
        await asyncio.to_thread(procs.stop)
    out.setdefault("node", []).append(report.detected_s)
    ok = isinstance(report.error, ActorDiedError) and report.victim_pids_gone
    ok &= report.survivors_ok
    print(
        f"node round: agent of node-2 killed; pending calls failed after "
        f"{report.detected_s:.2f}s with {type(report.error).__name__}; its actors gone: "
        f"{report.victim_pids_gone}; other nodes fine: {report.survivors_ok}",
        flush=True,
    )
    return ok


async def _head_round(out: dict[str, Any], node_timeout: float) -> bool:
    procs = LocalProcesses(3, 0, node_timeout)
    await asyncio.to_thread(procs.start)
    cluster = Cluster(_info(procs))
    try:
        took = await head_loss(cluster, procs, per_node=2)
    finally:
        await cluster.aclose()
        await asyncio.to_thread(procs.stop)
    print(f"head round: head killed; all agents and actors exited after {took:.2f}s", flush=True)
    if took >= 0:
        out.setdefault("head", []).append(took)
    return took >= 0


def _info(procs: LocalProcesses) -> Any:
    """Make ``procs`` this process's current cluster (as the local_cluster fixture does)."""
    info = context.ClusterInfo(procs.address, procs.token)
    context.set_current(info)
    return info


async def main(args: argparse.Namespace) -> int:
    before = descendants()
    deadline = time.monotonic() + args.minutes * 60
    figures: dict[str, Any] = {}
    ok, rounds = True, 0
    while rounds == 0 or time.monotonic() < deadline:
        seed = args.seed + rounds
        ok &= await _pipeline_round(args, seed, figures)
        ok &= await _node_round(figures, args.node_timeout)
        ok &= await _head_round(figures, args.node_timeout)
        rounds += 1
        if rounds >= args.max_rounds:
            break
    leftover = await until(lambda: descendants() <= before, 30)
    print(f"\n{rounds} rounds; processes left behind: {sorted(descendants() - before)}")
    print(f"{'fault':<10} {'n':>4} {'p50 s':>8} {'max s':>8}")
    for what in ("env", "eval", "unit", "node", "head"):
        s = summary(figures.get(what, []))
        print(f"{what:<10} {s['n']:>4} {s['p50']:>8.3f} {s['max']:>8.3f}")
    print(
        f"acknowledged puts: {figures.get('acked', 0)}, lost with their killed unit: "
        f"{figures.get('acked_lost_with_unit', 0)}, lost otherwise: 0 unless reported above"
    )
    return 0 if ok and leftover else 1


def _args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--minutes", type=float, default=5.0)
    p.add_argument("--max-rounds", type=int, default=1000)
    p.add_argument("--kills", type=int, default=6, help="env/eval kills per pipeline round")
    p.add_argument("--kill-every", type=float, default=1.0)
    p.add_argument("--iterations", type=int, default=12)
    p.add_argument("--max-restarts", type=int, default=8)
    p.add_argument("--run-timeout", type=float, default=300.0)
    p.add_argument("--node-timeout", type=float, default=1.0)
    p.add_argument("--seed", type=int, default=0)
    return p.parse_args()


if __name__ == "__main__":
    sys.exit(asyncio.run(main(_args())))
