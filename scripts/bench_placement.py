"""Placement at scale (a benchmark, not a test).

Plan + pack 1,024 nodes x 8 GPUs (8,192 workers over four components) and time it; then
route 10^6 requests over 1,024 policies on 128 nodes with the min-load router (batched, as the
async rollout loop calls it) and the node-affinity router. Prints figures and PASS/FAIL.

    python scripts/bench_placement.py
"""

from __future__ import annotations

import argparse
import time

from rayless.placement import (
    ComponentScheduling,
    NodeAffinityRouter,
    ResourcePoolPlanner,
    Scheduling,
    SimpleRouter,
)

PLAN_GOAL_S = 0.5
ROUTE_GOAL_PER_S = 1_000_000


def bench_plan(nodes: int, gpus: int) -> tuple[float, int]:
    info = {
        "n_nodes": nodes,
        "node_id_to_resources": {
            f"node-{i:04d}": {"ip": f"10.{i // 256}.{i % 256}.1", "CPU": 128, "GPU": gpus}
            for i in range(nodes)
        },
    }
    total = nodes * gpus
    cs = ComponentScheduling(
        train_worker=Scheduling(total // 2, 4, 1),
        eval_worker=Scheduling(total // 4, 4, 1),
        env_worker=[Scheduling(total // 4 - nodes // 2, 2, 0.5)],
        buffer_worker=Scheduling("auto", 2, 0),
    )
    t0 = time.perf_counter()
    planner = ResourcePoolPlanner(cs, info)
    planner.plan_resource_pools("disaggregate")
    packing = planner.pack()
    return time.perf_counter() - t0, len(packing.slots)


def bench_route(requests: int, policies: int, nodes: int, batch: int) -> tuple[float, float]:
    loads = [i % 7 for i in range(policies)]
    router = SimpleRouter()
    t0 = time.perf_counter()
    done = 0
    while done < requests:
        n = min(batch, requests - done)
        router.assign(loads, n)
        done += n
    simple = requests / (time.perf_counter() - t0)
    dist = {f"n{j}": {"env": {"ids": list(range(j * 64, (j + 1) * 64))}} for j in range(nodes)}
    affinity = NodeAffinityRouter(dist, [f"n{i % nodes}" for i in range(policies)])
    env_ids = [f"env-{i % (64 * nodes)}" for i in range(min(requests, 100_000))]
    t0 = time.perf_counter()
    affinity.assign(loads, len(env_ids), env_ids)
    aff = len(env_ids) / (time.perf_counter() - t0)
    return simple, aff


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--nodes", type=int, default=1024)
    ap.add_argument("--gpus", type=int, default=8)
    ap.add_argument("--requests", type=int, default=1_000_000)
    ap.add_argument("--policies", type=int, default=1024)
    ap.add_argument("--policy-nodes", type=int, default=128)
    ap.add_argument("--batch", type=int, default=100_000, help="requests per assign() call")
    args = ap.parse_args()
    plan_s, workers = bench_plan(args.nodes, args.gpus)
    simple, aff = bench_route(args.requests, args.policies, args.policy_nodes, args.batch)
    ok_plan = plan_s < PLAN_GOAL_S
    ok_route = simple >= ROUTE_GOAL_PER_S
    print(
        f"plan+pack {args.nodes}x{args.gpus} GPUs, {workers} workers: {plan_s:.3f} s "
        f"(goal < {PLAN_GOAL_S} s) {'PASS' if ok_plan else 'FAIL'}"
    )
    print(
        f"min-load router, {args.requests} requests over {args.policies} policies "
        f"(batches of {args.batch}): {simple:,.0f} decisions/s "
        f"(goal >= {ROUTE_GOAL_PER_S:,}) {'PASS' if ok_route else 'FAIL'}"
    )
    print(
        f"node-affinity router, per-env picks over {args.policy_nodes} nodes: "
        f"{aff:,.0f} decisions/s (no goal)"
    )
    return 0 if ok_plan and ok_route else 1


if __name__ == "__main__":
    raise SystemExit(main())
