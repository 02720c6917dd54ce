"""Benchmark weight sync: a state dict from one publisher to 4 subscribers, side by side.

State dicts of 256 MiB (64 tensors of 4 MiB, float32 or ``--dtype``) and 1 GiB (256 of them)
on a 2-node local cluster (2 subscribers per node, the publisher an actor on node 0). The time
of one sync runs from the publish until all 4 subscribers returned with the new weights in
their own tensors.

* ``weightsync``: ``WeightSync.publish`` + 4 x ``pull`` (the same-host shared-memory path).
* ``weightsync-relay``: the same with ``per_node=True`` (each node its own "host": one
  transfer to the other node's relay, then shared memory there).
* ``actor-calls``: our plain broadcast (the demo before WeightSync): the driver asks the
  publisher for its state dict, then calls ``load(state)`` on every subscriber.
* ``ray``: Ray 2.60 (in a subprocess, one node): ``ray.put`` once, every actor ``ray.get`` +
  ``load_state_dict``.
* ``memcpy limit``: bytes x (1 + subscribers) / memcpy bandwidth (measured here, one thread).

``--extras`` adds rows for the newer features, each against the memcpy limit of its bytes:

* ``delta 10%``: 256 MiB, 64 tensors of which 10% change per version, ``publish(delta=True)``
  (only those written, and copied by subscribers that hold the previous version), against the
  same run publishing in full; bytes moved per sync for each.
* ``checksums``: 256 MiB → 4 from a publisher with ``checksums=True``, pulled with
  ``verify=True`` and without, against the default (no checksums).
* ``resharded``: 256 MiB of (1024, 1024) tensors published whole, 4 engine ranks each pulling
  its quarter (``ShardSpec(0, rank, 4)``, row slices, and ``ShardSpec(1, rank, 4)``, column).
* ``10k tensors``: 256 MiB in 10,000 tensors against 64 (time per byte).
* ``limit ratios``: 256 MiB → 4 (goal ≥ 0.9 of the limit) and 1 GiB → 8 subscribers on two
  simulated hosts (``per_node=True``; goal at most 1.5 times the limit's time).

``--device cuda`` (a GPU machine): one node, the publisher's tensors and the subscribers' on
the GPU (CUDA IPC buckets, one device-to-device copy per subscriber) against the
device-to-device copy bandwidth; no Ray. Its ``--extras`` are the rows the CUDA IPC path has:
full and delta publishes with 10% changed (it carries no checksums and does not reshard).
``--quick``: 2 repeats instead of 5.

    python scripts/bench_weights.py [--device cpu|cuda] [--quick] [--skip-ray] [--json PATH]
                                    [--sizes 256MiB,1GiB] [--dtype float32|bfloat16] [--extras]
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import json
import math
import os
import statistics
import subprocess
import sys
import time
from typing import Any

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from rayless.actors import Actor

SIZES = {"256MiB": 64, "1GiB": 256}  # tensors of 4 MiB
TENSOR_BYTES = 4 << 20
ELEMS = 1 << 20  # float32 elements of a 4 MiB tensor (the extra rows)
SUBSCRIBERS = 4
WARMUP = 2  # rounds not timed: the sync's two segments (max_slots=2) are created in them


def make_state(n: int, device: str, dtype: str = "float32") -> dict[str, torch.Tensor]:
    """``n`` zero tensors of 4 MiB of ``dtype`` on ``device``."""
    dt = getattr(torch, dtype)
    elems = TENSOR_BYTES // dt.itemsize
    return {f"layer{i}.weight": torch.zeros(elems, dtype=dt, device=device) for i in range(n)}


class Sub(Actor):
    """A subscriber holding its own copy of the weights."""

    def __init__(self, n: int, device: str, name: str, dtype: str = "float32") -> None:
        torch.set_num_threads(1)
        self.state = make_state(n, device, dtype)
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

    def __init__(self, n: int, device: str, name: str, dtype: str = "float32") -> None:
        torch.set_num_threads(1)
        self.state = make_state(n, device, dtype)
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


class XSub(Actor):
    """A subscriber of the extra rows: ``n`` tensors of ``shape``, or (``shard``) its slice of
    each; pulls with or without ``verify``."""

    def __init__(
        self,
        n: int,
        shape: list[int],
        name: str,
        shard: list[int] | None = None,
        device: str = "cpu",
    ) -> None:
        torch.set_num_threads(1)
        if shard is not None:
            dim, _, world = shard
            shape = [d // world if i == dim else d for i, d in enumerate(shape)]
        self.state = {f"layer{i}.weight": torch.zeros(shape, device=device) for i in range(n)}
        self.shard = shard
        self.name = name
        self.ws: Any = None

    async def setup(self) -> None:
        from rayless.weights import WeightSync

        self.ws = await WeightSync.connect(self.name)

    async def pull(self, version: int, verify: bool = False) -> int:
        """Pull ``version`` (this rank's slices when sharded)."""
        from rayless.weights import ShardSpec

        shard = ShardSpec(*self.shard) if self.shard is not None else None
        v = int(await self.ws.pull(self.state, version, 300, verify=verify, shard=shard))
        if self.state["layer0.weight"].is_cuda:
            torch.cuda.synchronize()
        return v

    def total(self) -> float:
        """The sum of every element held (checks a whole copy)."""
        return float(sum(t.double().sum() for t in self.state.values()))

    async def teardown(self) -> None:
        await self.ws.aclose()


class XPub(Actor):
    """The publisher of the extra rows: refills a fraction of its tensors, publishes."""

    def __init__(
        self, n: int, shape: list[int], name: str, checksums: bool = False, device: str = "cpu"
    ) -> None:
        torch.set_num_threads(1)
        self.state = {f"layer{i}.weight": torch.zeros(shape, device=device) for i in range(n)}
        self.name = name
        self.checksums = checksums
        self.ws: Any = None

    async def setup(self) -> None:
        from rayless.weights import WeightSync

        self.ws = await WeightSync.connect(self.name, checksums=self.checksums)

    def refill(self, version: int, every: int = 1) -> int:
        """Fill one tensor in ``every`` (a rotating set) with ``version``; bytes changed."""
        changed = 0
        for i, t in enumerate(self.state.values()):
            if (i + version) % every == 0:
                t.fill_(float(version))
                changed += t.numel() * t.element_size()
        return changed

    async def publish(self, version: int, delta: bool = False) -> None:
        """Publish the state as ``version``."""
        await self.ws.publish(self.state, version, delta=delta)

    def total(self) -> float:
        """The sum of every element."""
        return float(sum(t.double().sum() for t in self.state.values()))

    async def teardown(self) -> None:
        await self.ws.aclose()


async def _extra_row(
    cluster: Any,
    reps: int,
    name: str,
    n: int,
    shape: list[int],
    *,
    subs: int = SUBSCRIBERS,
    per_node: bool = False,
    every: int = 1,
    delta: bool = False,
    verify: bool = False,
    checksums: bool = False,
    shard_dim: int | None = None,
    device: str = "cpu",
) -> dict[str, float]:
    """One extra row: the median seconds per sync and the bytes moved per sync (written by
    the publisher + copied by the subscribers)."""
    from rayless.weights import WeightSync

    nodes = [nd["node_id"] for nd in await cluster.nodes()]
    nbytes = n * math.prod(shape) * 4
    async with WeightSync.create(cluster, name=name, per_node=per_node, max_slots=2):
        gpu = 1.0 / (subs + 1) if device == "cuda" else 0
        pub = await cluster.spawn(
            XPub, n, shape, name, checksums, device, node=nodes[0], gpus=gpu, cpus=0
        )
        specs = [None if shard_dim is None else [shard_dim, i, subs] for i in range(subs)]
        xsubs = [
            await cluster.spawn(
                XSub, n, shape, name, specs[i], device, node=nodes[i % len(nodes)], gpus=gpu, cpus=0
            )
            for i in range(subs)
        ]
        times, moved = [], []
        for v in range(1, reps + WARMUP + 1):
            changed = await pub.refill(v, every if v > 1 else 1)
            t = time.perf_counter()
            pulls = [s.pull.submit(v, verify) for s in xsubs]
            await pub.publish(v, delta)
            got = await asyncio.gather(*pulls)
            took = time.perf_counter() - t
            if got != [v] * subs:
                raise RuntimeError(f"a subscriber holds the wrong version: {got}")
            if shard_dim is None and {await s.total() for s in xsubs} != {await pub.total()}:
                raise RuntimeError("a subscriber's copy differs from the publisher's")
            if v > WARMUP:
                times.append(took)
                per_sub = nbytes // subs if shard_dim is not None else nbytes
                moved.append(
                    (changed if delta else nbytes) + (changed if delta else per_sub) * subs
                )
        for h in [pub, *xsubs]:
            await cluster.kill(h)
    return {"s": statistics.median(times), "bytes": statistics.median(moved), "nbytes": nbytes}


async def _extras(reps: int, device: str) -> dict[str, dict[str, float]]:
    """The rows of ``--extras`` (see the module doc)."""
    from rayless.actors import Cluster

    mib4 = [ELEMS]
    out: dict[str, dict[str, float]] = {}
    if device == "cuda":  # the rows the CUDA IPC path has: full and delta publishes
        async with Cluster.local(nodes=1, gpus_per_node=torch.cuda.device_count()) as cluster:
            row = functools.partial(_extra_row, cluster, reps, device="cuda")
            out["full 64 (10% changed)"] = await row("x-full", 64, mib4, every=10)
            out["delta 64 (10% changed)"] = await row("x-delta", 64, mib4, every=10, delta=True)
        return out
    async with Cluster.local(nodes=2) as cluster:
        row = functools.partial(_extra_row, cluster, reps)
        out["full 64 (10% changed)"] = await row("x-full", 64, mib4, every=10)
        out["delta 64 (10% changed)"] = await row("x-delta", 64, mib4, every=10, delta=True)
        out["checksums, unverified"] = await row("x-voff", 64, mib4, checksums=True)
        out["checksums, verified"] = await row("x-von", 64, mib4, checksums=True, verify=True)
        out["no checksums (default)"] = await row("x-nosum", 64, mib4)
        out["resharded rows (TP4)"] = await row("x-rows", 64, [1024, 1024], shard_dim=0)
        out["resharded cols (TP4)"] = await row("x-cols", 64, [1024, 1024], shard_dim=1)
        out["64 tensors"] = await row("x-64", 64, mib4)
        out["10k tensors"] = await row("x-10k", 10_000, [(64 * ELEMS) // 10_000])
        out["1GiB -> 8, 2 hosts"] = await row("x-8", 256, mib4, subs=8, per_node=True)
    return out


def _print_extras(extras: dict[str, dict[str, float]], gbps: float) -> None:
    """The extra rows, each against the memcpy limit of the bytes it moved (and of a full
    sync of its state dict: bytes x (1 + subscribers) / memcpy bandwidth)."""
    head = f"{'extra row':<24} {'s/sync':>8} {'MiB moved':>10} {'x limit(moved)':>15}"
    head += f" {'x limit(full)':>14}"
    print(head + "\n" + "-" * len(head))
    for label, r in extras.items():
        subs = 8 if "8" in label.split("->")[-1] else SUBSCRIBERS
        full = r["nbytes"] * (1 + subs) / (gbps * 1e9)
        moved = r["bytes"] / (gbps * 1e9)
        print(f"{label:<24} {r['s']:8.3f} {r['bytes'] / 2**20:10.0f} {moved / r['s']:15.2f} "
              f"{full / r['s']:14.2f}")  # fmt: skip
    if "64 tensors" not in extras:  # the CUDA rows: full and delta alone
        return
    s64, s10k = extras["64 tensors"]["s"], extras["10k tensors"]["s"]
    big = extras["1GiB -> 8, 2 hosts"]
    limit8 = big["nbytes"] * 9 / (gbps * 1e9)
    von, voff = extras["checksums, verified"]["s"], extras["checksums, unverified"]["s"]
    plain = extras["no checksums (default)"]
    limit4 = plain["nbytes"] * 5 / (gbps * 1e9)
    print(f"goal 256MiB -> 4: {limit4 / plain['s']:.2f}x of the memcpy limit (goal >= 0.9); "
          f"with checksums {limit4 / voff:.2f}x")  # fmt: skip
    print(f"goal 1GiB -> 8 on 2 hosts: {big['s'] / limit8:.2f}x the limit's time (goal <= 1.5)")
    print(f"goal 10,000 tensors: {s10k / s64:.2f}x the time per byte of 64 (goal ~1)")
    print(f"verify: {von / voff:.2f}x the time of an unverified pull; checksums: "
          f"{voff / plain['s']:.2f}x the time of a sync without them")  # fmt: skip


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


async def _ours(
    device: str, reps: int, per_node: bool, plain: bool, dtype: str = "float32"
) -> dict[str, Any]:
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
                pub = await cluster.spawn(
                    Pub, n, device, name, dtype, node=nodes[0], gpus=gpu, cpus=0
                )
                subs = [
                    await cluster.spawn(
                        Sub, n, device, name, dtype, node=nodes[i % len(nodes)], gpus=gpu, cpus=0
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


def _ray(reps: int, dtype: str = "float32") -> dict[str, Any]:
    """Ray 2.60 in a subprocess: ``ray.put`` once, every actor ``ray.get`` + load_state_dict."""
    code = r"""
import json, statistics, sys, time, torch, ray
SIZES, SUBS, reps = json.loads(sys.argv[1]), 4, int(sys.argv[2])
DT = getattr(torch, sys.argv[3])
ELEMS = (4 << 20) // DT.itemsize
ray.init(num_cpus=8, include_dashboard=False, log_to_driver=False, logging_level="ERROR",
         object_store_memory=3 << 30)

@ray.remote(num_cpus=1)
class Sub:
    def __init__(self, n):
        torch.set_num_threads(1)
        self.model = torch.nn.ParameterDict(
            {f"layer{i}": torch.nn.Parameter(torch.zeros(ELEMS, dtype=DT)) for i in range(n)})
    def load(self, refs):
        self.model.load_state_dict(ray.get(refs[0]))
        return float(self.model["layer0"][-1])

out = {}
for label, n in SIZES.items():
    subs = [Sub.remote(n) for _ in range(SUBS)]
    warm = ray.put({f"layer{i}": torch.zeros(ELEMS, dtype=DT) for i in range(n)})
    ray.get([s.load.remote([warm]) for s in subs])
    del warm
    times = []
    for v in range(1, reps + 2):
        state = {f"layer{i}": torch.full((ELEMS,), float(v), dtype=DT) for i in range(n)}
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
        [sys.executable, "-c", code, json.dumps(SIZES), str(reps), dtype],
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
    parser.add_argument("--extras", action="store_true", help="delta, verify, reshard, 10k rows")
    parser.add_argument(
        "--dtype", choices=["float32", "bfloat16"], default="float32", help="of the state dicts"
    )
    args = parser.parse_args()
    for label in [k for k in SIZES if k not in args.sizes.split(",")]:
        del SIZES[label]
    reps = 2 if args.quick else 5
    cuda = args.device == "cuda"
    if cuda and not torch.cuda.is_available():
        sys.exit("--device cuda needs a CUDA GPU")
    load = os.getloadavg()[0]
    res: dict[str, Any] = {"device": args.device, "repeats": reps, "load_1min": load}
    res["dtype"] = dt = args.dtype
    res["copy_GBps"] = copy_gbps(256 << 20, args.device)
    res["weightsync"] = asyncio.run(_ours(args.device, reps, per_node=False, plain=True, dtype=dt))
    if not cuda:
        res["weightsync_relay"] = asyncio.run(
            _ours(args.device, reps, per_node=True, plain=False, dtype=dt)
        )
        if not args.skip_ray:
            try:
                res["ray"] = _ray(reps, dt)
            except Exception as exc:
                res["ray_error"] = str(exc)[-500:]
    print(f"device {args.device}, {dt}, {reps} repeats (median), load {load:.2f} at start; "
          f"{'device-to-device' if cuda else 'memcpy'} {res['copy_GBps']:.1f} GB/s")  # fmt: skip
    head = f"{'state dict':<10} {'path':<22} {'s/sync':>8} {'GB/s*':>7} {'x limit':>8} {'ray/x':>6}"
    print(head + "\n" + "-" * len(head))
    for label, n in SIZES.items():
        nbytes = n * TENSOR_BYTES
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
        nbytes = n * TENSOR_BYTES
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
    if args.extras and not cuda:
        res["extras"] = asyncio.run(_extras(reps, args.device))
        _print_extras(res["extras"], res["copy_GBps"])
    if args.json:
        with open(args.json, "w") as f:
            json.dump(res, f, indent=2)


if __name__ == "__main__":
    main()
