"""Benchmark weight sync: a state dict from one publisher to 4 subscribers, side by side.

State dicts of 256 MiB (64 float32 tensors of 4 MiB) and 1 GiB (256 of them) on a 2-node local
cluster (2 subscribers per node, the publisher an actor on node 0). The time of one sync runs
from the publish until all 4 subscribers returned with the new weights in their own tensors.

* ``weightsync``: ``WeightSync.publish`` + 4 x ``pull`` (the same-host shared-memory path).
* ``weightsync-relay``: the same with ``per_node=True`` (each node its own "host": one
  transfer to the other node's relay, then shared memory there).
* ``actor-calls``: our plain broadcast (the demo before WeightSync): the driver asks the
  publisher for its state dict, then calls ``load(state)`` on every subscriber.
* ``ray``: Ray 2.60 (in a subprocess, one node): ``ray.put`` once, every actor ``ray.get`` +
  ``load_state_dict``.
* ``memcpy limit``: bytes x (1 + subscribers) / memcpy bandwidth (measured here, one thread).

``--device cuda`` (a GPU machine): one node, the publisher's tensors and the subscribers' on
the GPU (CUDA IPC buckets, one device-to-device copy per subscriber) against the
device-to-device copy bandwidth; no Ray. ``--quick``: 2 repeats instead of 5.

    python scripts/bench_weights.py [--device cpu|cuda] [--quick] [--skip-ray] [--json PATH]
                                    [--sizes 256MiB,1GiB]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import time
from typing import Any

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from rayless.actors import Actor

SIZES = {"256MiB": 64, "1GiB": 256}  # tensors of 4 MiB (1 Mi float32 each)
ELEMS = 1 << 20
SUBSCRIBERS = 4
WARMUP = 2  # rounds not timed: the sync's two segments (max_slots=2) are created in them


def make_state(n: int, device: str, fill: float = 0.0) -> dict[str, torch.Tensor]:
    """``n`` tensors of 4 MiB on ``device``, every element ``fill``."""
    return {f"layer{i}.weight": torch.full((ELEMS,), fill, device=device) for i in range(n)}


class Sub(Actor):
    """A subscriber holding its own copy of the weights."""

    def __init__(self, n: int, device: str, name: str) -> None:
        torch.set_num_threads(1)
        self.state = make_state(n, device)
        self.name = name
        self.ws: Any = None

    async def setup(self) -> None:
        from rayless.weights import WeightSync

        self.ws = await WeightSync.connect(self.name, cuda_ipc=True)

    async def pull(self, version: int) -> int:
        """WeightSync pull of ``version`` into the held tensors."""
        v = int(await self.ws.pull(self.state, version, timeout=300))
        if self.state[next(iter(self.state))].is_cuda:
            torch.cuda.synchronize()
        return v

    def load(self, state: dict[str, torch.Tensor]) -> float:
        """The plain path: copy a received state dict into the held tensors."""
        for k, v in state.items():
            self.state[k].copy_(v)
        return float(self.state[next(iter(self.state))][0])

    def check(self) -> float:
        """The value the weights hold (every element equal)."""
        return float(self.state[next(iter(self.state))][-1])

    async def teardown(self) -> None:
        await self.ws.aclose()


class Pub(Actor):
    """The trainer: holds a state dict and publishes it."""

    def __init__(self, n: int, device: str, name: str) -> None:
        torch.set_num_threads(1)
        self.state = make_state(n, device)
        self.name = name
        self.ws: Any = None

    async def setup(self) -> None:
        from rayless.weights import WeightSync

        self.ws = await WeightSync.connect(self.name, cuda_ipc=True)

    async def publish(self, version: int) -> None:
        """Fill with ``version`` (outside the timing of the sync: the caller waits), publish."""
        await self.ws.publish(self.state, version)

    def refill(self, version: int) -> None:
        """Every element = ``version``."""
        for t in self.state.values():
            t.fill_(float(version))
        if self.state[next(iter(self.state))].is_cuda:
            torch.cuda.synchronize()

    def get_state(self) -> dict[str, torch.Tensor]:
        """The state dict (the plain path sends it back over the socket)."""
        return self.state

    async def teardown(self) -> None:
        await self.ws.aclose()


def copy_gbps(nbytes: int, device: str) -> float:
    """Copy bandwidth (bytes copied per second) of one ``nbytes`` buffer, best of 3."""
    torch.set_num_threads(1)
    a = torch.ones(nbytes // 4, device=device)
    b = torch.empty_like(a)
    best = float("inf")
    for _ in range(4):
        if device == "cuda":
            torch.cuda.synchronize()
        t = time.perf_counter()
        b.copy_(a)
        if device == "cuda":
            torch.cuda.synchronize()
        best = min(best, time.perf_counter() - t)
    return nbytes / best / 1e9


async def _ours(device: str, reps: int, per_node: bool, plain: bool) -> dict[str, Any]:
    from rayless.actors import Cluster
    from rayless.weights import WeightSync

    res: dict[str, Any] = {}
    cuda = device == "cuda"
    shape = {"nodes": 1, "gpus_per_node": torch.cuda.device_count()} if cuda else {"nodes": 2}
    gpu = 1.0 / (SUBSCRIBERS + 1) if cuda else 0
    async with Cluster.local(**shape) as cluster:
        nodes = [n["node_id"] for n in await cluster.nodes()]
        for label, n in SIZES.items():
            name = f"bench-{label}-{int(per_node)}"
            async with WeightSync.create(cluster, name=name, per_node=per_node, max_slots=2):
                pub = await cluster.spawn(Pub, n, device, name, node=nodes[0], gpus=gpu, cpus=0)
                subs = [
                    await cluster.spawn(
                        Sub, n, device, name, node=nodes[i % len(nodes)], gpus=gpu, cpus=0
                    )
                    for i in range(SUBSCRIBERS)
                ]
                times, plain_times = [], []
                for v in range(1, reps + WARMUP + 1):  # warm-up: every segment allocated once
                    await pub.refill(v)
                    t = time.perf_counter()
                    pulls = [s.pull.submit(v) for s in subs]
                    await pub.publish(v)
                    got = await asyncio.gather(*pulls)
                    took = time.perf_counter() - t
                    if got != [v] * SUBSCRIBERS or {await s.check() for s in subs} != {float(v)}:
                        raise RuntimeError(f"a subscriber holds the wrong version: {got}")
                    if v > WARMUP:
                        times.append(took)
                    if plain and not cuda:
                        t = time.perf_counter()
                        state = await pub.get_state()
                        await asyncio.gather(*(s.load(state) for s in subs))
                        took = time.perf_counter() - t
                        del state
                        if v > WARMUP:
                            plain_times.append(took)
                res[label] = statistics.median(times)
                if plain_times:
                    res[f"{label}_plain"] = statistics.median(plain_times)
                for h in [pub, *subs]:
                    await cluster.kill(h)
    return res


def _ray(reps: int) -> dict[str, Any]:
    """Ray 2.60 in a subprocess: ``ray.put`` once, every actor ``ray.get`` + load_state_dict."""
    code = r"""
import json, statistics, sys, time, torch, ray
SIZES, ELEMS, SUBS, reps = json.loads(sys.argv[1]), 1 << 20, 4, int(sys.argv[2])
ray.init(num_cpus=8, include_dashboard=False, log_to_driver=False, logging_level="ERROR",
         object_store_memory=3 << 30)

@ray.remote(num_cpus=1)
class Sub:
    def __init__(self, n):
        torch.set_num_threads(1)
        self.model = torch.nn.ParameterDict(
            {f"layer{i}": torch.nn.Parameter(torch.zeros(ELEMS)) for i in range(n)})
    def load(self, refs):
        self.model.load_state_dict(ray.get(refs[0]))
        return float(self.model["layer0"][-1])

out = {}
for label, n in SIZES.items():
    subs = [Sub.remote(n) for _ in range(SUBS)]
    warm = ray.put({f"layer{i}": torch.zeros(ELEMS) for i in range(n)})
    ray.get([s.load.remote([warm]) for s in subs])
    del warm
    times = []
    for v in range(1, reps + 2):
        state = {f"layer{i}": torch.full((ELEMS,), float(v)) for i in range(n)}
        t = time.perf_counter()
        ref = ray.put(state)
        got = ray.get([s.load.remote([ref]) for s in subs])
        took = time.perf_counter() - t
        assert got == [float(v)] * SUBS, got
        if v > 1:
            times.append(took)
        del ref, state
    out[label] = statistics.median(times)
    for s in subs:
        ray.kill(s)
print("RESULT " + json.dumps(out))
"""
    proc = subprocess.run(
        [sys.executable, "-c", code, json.dumps(SIZES), str(reps)],
        capture_output=True,
        text=True,
        timeout=900,
    )
    for line in proc.stdout.splitlines():
        if line.startswith("RESULT "):
            return dict(json.loads(line[7:]))
    raise RuntimeError(f"the Ray benchmark failed:\n{proc.stdout[-2000:]}\n{proc.stderr[-4000:]}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    parser.add_argument("--quick", action="store_true", help="2 repeats instead of 5")
    parser.add_argument("--skip-ray", action="store_true")
    parser.add_argument("--json", help="write the figures here")
    parser.add_argument("--sizes", default=",".join(SIZES), help="a subset of " + ",".join(SIZES))
    args = parser.parse_args()
    for label in [k for k in SIZES if k not in args.sizes.split(",")]:
        del SIZES[label]
    reps = 2 if args.quick else 5
    cuda = args.device == "cuda"
    if cuda and not torch.cuda.is_available():
        sys.exit("--device cuda needs a CUDA GPU")
    load = os.getloadavg()[0]
    res: dict[str, Any] = {"device": args.device, "repeats": reps, "load_1min": load}
    res["copy_GBps"] = copy_gbps(256 << 20, args.device)
    res["weightsync"] = asyncio.run(_ours(args.device, reps, per_node=False, plain=True))
    if not cuda:
        res["weightsync_relay"] = asyncio.run(_ours(args.device, reps, per_node=True, plain=False))
        if not args.skip_ray:
            try:
                res["ray"] = _ray(reps)
            except Exception as exc:
                res["ray_error"] = str(exc)[-500:]
    print(f"device {args.device}, {reps} repeats (median), load {load:.2f} at start; "
          f"{'device-to-device' if cuda else 'memcpy'} {res['copy_GBps']:.1f} GB/s")  # fmt: skip
    head = f"{'state dict':<10} {'path':<22} {'s/sync':>8} {'GB/s*':>7} {'x limit':>8} {'ray/x':>6}"
    print(head + "\n" + "-" * len(head))
    for label, n in SIZES.items():
        nbytes = n * ELEMS * 4
        limit = nbytes * (1 + SUBSCRIBERS) / (res["copy_GBps"] * 1e9)
        rows = [("weightsync", res["weightsync"].get(label))]
        rows.append(("actor-calls", res["weightsync"].get(f"{label}_plain")))
        rows.append(("weightsync-relay", res.get("weightsync_relay", {}).get(label)))
        rows.append(("ray 2.60", res.get("ray", {}).get(label)))
        rows.append(("memcpy limit" if not cuda else "d2d copy limit", limit))
        ray_s = res.get("ray", {}).get(label)
        for path, s in rows:
            if s is None:
                continue
            speed = nbytes * SUBSCRIBERS / s / 1e9
            vs_ray = f"{ray_s / s:6.2f}" if ray_s else "     -"
            print(f"{label:<10} {path:<22} {s:8.3f} {speed:7.2f} {limit / s:8.2f} {vs_ray}")
    print("GB/s*: bytes delivered (state dict x subscribers) per second; x limit: limit / time")
    for label, n in SIZES.items():
        s = res["weightsync"].get(label)
        if not s:
            continue
        nbytes = n * ELEMS * 4
        limit = nbytes * (1 + SUBSCRIBERS) / (res["copy_GBps"] * 1e9)
        if cuda:
            share = nbytes * SUBSCRIBERS / s / 1e9 / res["copy_GBps"]
            print(f"goal {label}: CUDA IPC delivers {share:.0%} of the device-to-device copy "
                  f"bandwidth (goal >= 50%)")  # fmt: skip
        else:
            ray_s = res.get("ray", {}).get(label)
            vs = f"{ray_s / s:.2f}x faster than Ray (goal >= 2x), " if ray_s else ""
            print(f"goal {label}: {vs}{limit / s:.2f}x of the memcpy limit (goal >= 0.5x)")
    if "ray_error" in res:
        print("ray:", res["ray_error"])
    if args.json:
        with open(args.json, "w") as f:
            json.dump(res, f, indent=2)


if __name__ == "__main__":
    main()
