"""Benchmark the rayless store against TransferQueue 0.1.11, side by side in one run.

Both with 2 storage units; batches: ``dense`` (x: 1024 x 4096 float32, 16 MiB) and ``mixed``
(ids: int64 1024 x 8192, ragged responses of 1..1024 int64 tokens, a string per sample).
Rows: init time (ours: ``Store.create``, which returns before its units serve; "first put
after create" adds the first put, which waits for them), put GB/s, get GB/s (payload bytes /
median latency), get_meta latency (a fetch of 1024 ready samples), idle put latency and the
latency of a put issued while another client's fetch waits. TransferQueue runs in a
subprocess (its own Ray) after ours. Each measured round follows ``WARMUP`` rounds (both
stores). CPU only, ours only: a plain copy of the dense batch's bytes in the same run, the
faster of torch's default threads and one thread (and put, get, put + get, put + zero-copy get
against it), 1 GiB batches (``--no-big`` skips them), and 8 producers + 8 consumers (separate
clients; aggregate GB/s and a check that every sample arrived exactly once). The "step" rows
use the store as verl uses TransferQueue: a new partition per step (put the dense batch,
``get_meta`` of its 1,024 samples, get them, ``clear_partition``), both stores.
Same-host clients use the units' shared-memory columns (``RAYLESS_STORE_LOCAL=0``: the socket).

    python scripts/bench_store.py [--device cpu|cuda] [--quick] [--skip-tq] [--repeats 5]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

import torch
from tensordict import NonTensorStack, TensorDict

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

N = 1024
WARMUP = 4  # rounds of put, get, clear before the measured ones (ours and TransferQueue's)


def make_batches(device: str) -> dict[str, TensorDict]:
    """The dense and the mixed batch (tensors on ``device``)."""
    gen = torch.Generator().manual_seed(0)
    dense = TensorDict({"x": torch.randn(N, 4096, generator=gen)}, [N])
    lengths = torch.randint(1, 1025, (N,), generator=gen).tolist()
    responses = [torch.randint(0, 50000, (n,), generator=gen) for n in lengths]
    mixed = TensorDict(
        {
            "ids": torch.randint(0, 50000, (N, 8192), generator=gen),
            "responses": torch.nested.as_nested_tensor(responses, layout=torch.jagged),
            "text": NonTensorStack.from_list([f"sample-{i}-" + "x" * (i % 64) for i in range(N)]),
        },
        [N],
    )
    return {"dense": dense.to(device), "mixed": mixed.to(device)}


def payload_bytes(td: TensorDict) -> int:
    """Bytes of the tensors (nested: their values) plus the strings."""
    total = 0
    for key in td.keys(True, True):
        v = td.get(key)
        if isinstance(v, torch.Tensor):
            t = v.values() if v.is_nested else v
            total += t.numel() * t.element_size()
        else:
            total += sum(len(s) for s in v.tolist())
    return total


def median_time(fn: Callable[[], Any], reps: int) -> float:
    times = []
    for _ in range(reps):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return statistics.median(times)


# -- ours ---------------------------------------------------------------------------------


async def run_ours(device: str, reps: int, big: bool = True) -> dict[str, Any]:
    """Every row for the rayless store."""
    import rayless.actors as actors
    from rayless.store import Store

    res: dict[str, Any] = {}
    gpus = torch.cuda.device_count() if device == "cuda" else 0
    shape = {"nodes": 1, "gpus_per_node": gpus} if device == "cuda" else {"nodes": 2}
    t = time.perf_counter()
    async with actors.Cluster.local(**shape) as cluster:
        res["cluster_s"] = time.perf_counter() - t
        t = time.perf_counter()
        st = await Store.create(
            cluster, num_units=2, device=device, gpus_per_unit=1.0 if gpus >= 2 else 0.5
        )
        res["create_s"] = time.perf_counter() - t
        res["init_s"] = res["cluster_s"] + res["create_s"]  # as TransferQueue's: ray.init too
        # create returns before its units serve: the first operation waits for them
        first = await st.put(TensorDict({"x": torch.arange(N)}, [N]), partition="first")
        res["first_put_s"] = time.perf_counter() - t
        res["ready_s"] = res["cluster_s"] + res["first_put_s"]
        await st.clear(first)
        other = await Store.connect(cluster=cluster)
        batches = make_batches(device)
        for name, td in batches.items():
            size = payload_bytes(td)
            puts, gets, views = [], [], []
            for i in range(WARMUP + reps):  # steady state: put, get, clear in one partition
                t = time.perf_counter()
                meta = await st.put(td, partition=name)
                put_s = time.perf_counter() - t
                t = time.perf_counter()
                out = await st.get(meta)
                if device == "cuda":
                    torch.cuda.synchronize()
                get_s = time.perf_counter() - t
                del out
                t = time.perf_counter()
                out = await st.get(meta, zero_copy=True)
                view_s = time.perf_counter() - t
                del out
                await st.clear(meta)
                if i >= WARMUP:  # the first rounds warm up (columns, mappings, slots)
                    puts.append(put_s)
                    gets.append(get_s)
                    views.append(view_s)
            res[f"{name}_put_GBps"] = size / statistics.median(puts) / 1e9
            res[f"{name}_get_GBps"] = size / statistics.median(gets) / 1e9
            res[f"{name}_put_ms"] = statistics.median(puts) * 1e3
            res[f"{name}_get_ms"] = statistics.median(gets) * 1e3
            res[f"{name}_view_ms"] = statistics.median(views) * 1e3
        if device == "cpu":
            res.update(_memcpy_rows(batches["dense"]["x"], reps, res))
        else:
            res.update(_d2d_rows(batches["dense"]["x"], reps, res))
            res["ipc_columns_opened"] = sum(
                1 for m in st._plane._maps.values() if m.tensor is not None
            )
        res.update(await _step_rows(st, batches["dense"], reps))
        small = TensorDict({"x": torch.ones(N, 4)}, [N])
        lat = []
        for i in range(reps):
            await st.put(small, partition="meta")
            t = time.perf_counter()
            await st.get_meta("meta", ["x"], N, task=f"t{i}", timeout=10)
            lat.append(time.perf_counter() - t)
            await st.clear_partition("meta")
        res["get_meta_ms"] = statistics.median(lat) * 1e3
        res["tiny_put_ms"] = await _put_ms(st, TensorDict({"x": torch.arange(N)}, [N]), reps)
        dense = batches["dense"]
        res["idle_put_ms"] = await _put_ms(st, dense, reps)
        waiting = asyncio.ensure_future(other.get_meta("wait", ["x"], 4, task="w", timeout=120))
        deadline = time.monotonic() + 60
        while (await st.stats())["waiting_fetches"] < 1:
            if time.monotonic() > deadline:
                raise TimeoutError("the waiting fetch never reached the controller in 60 s")
            await asyncio.sleep(0.01)
        res["put_during_fetch_ms"] = await _put_ms(st, dense, reps)
        res["fetch_still_waiting"] = not waiting.done()
        await st.put(TensorDict({"x": torch.ones(4)}, [4]), partition="wait")
        await waiting
        if device == "cpu" and big:
            res.update(await _big_rows(st, max(2, reps // 2)))
        if device == "cpu":
            res.update(await _concurrent_rows(cluster))
    return res


def _memcpy_rows(x: torch.Tensor, reps: int, res: dict[str, Any]) -> dict[str, Any]:
    """A plain copy of the dense batch's bytes: into 8 rotating, pre-touched destinations
    (128 MiB: out of the 32 MiB L3, like the store's memory), into one warm destination (in
    cache) and into a fresh tensor (page faults, like a get's result)."""
    size = x.numel() * x.element_size()
    dsts = [torch.empty_like(x) for _ in range(8)]
    for d in dsts:
        d.copy_(x)
    turn = iter(range(10**9))
    t_default = median_time(lambda: dsts[next(turn) % 8].copy_(x), reps * 8)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # on a loaded machine torch's copy threads wait for each other
    try:
        t_one = median_time(lambda: dsts[next(turn) % 8].copy_(x), reps * 8)
    finally:
        torch.set_num_threads(threads)
    t_dram = min(t_default, t_one)  # the faster plain copy: the anchor a user could have
    t_warm = median_time(lambda: dsts[0].copy_(x), reps * 4)
    t_fresh = median_time(lambda: torch.empty_like(x).copy_(x), reps * 4)
    put_s = size / res["dense_put_GBps"] / 1e9
    get_s = size / res["dense_get_GBps"] / 1e9
    view_s = res["dense_view_ms"] / 1e3
    return {
        "memcpy_GBps": size / t_dram / 1e9,
        "memcpy_threads_GBps": size / t_default / 1e9,
        "memcpy_one_thread_GBps": size / t_one / 1e9,
        "roundtrip_view_vs_memcpy": t_dram / (put_s + view_s),
        "memcpy_warm_GBps": size / t_warm / 1e9,
        "memcpy_fresh_GBps": size / t_fresh / 1e9,
        "roundtrip_vs_memcpy": t_dram / (put_s + get_s),
        "put_vs_memcpy": t_dram / put_s,
        "get_vs_memcpy": t_dram / get_s,
    }


def _d2d_rows(x: torch.Tensor, reps: int, res: dict[str, Any]) -> dict[str, Any]:
    """A device-to-device copy of the dense batch's bytes on its GPU (the CUDA anchor): a
    CUDA unit's put or get on the same host is at best one such copy."""
    size = x.numel() * x.element_size()
    dst = torch.empty_like(x)

    def copy() -> None:
        dst.copy_(x)
        torch.cuda.synchronize(x.device)

    for _ in range(3):
        copy()
    t_copy = median_time(copy, reps * 8)
    put_s = size / res["dense_put_GBps"] / 1e9
    get_s = size / res["dense_get_GBps"] / 1e9
    return {
        "d2d_GBps": size / t_copy / 1e9,
        "put_vs_d2d": t_copy / put_s,
        "get_vs_d2d": t_copy / get_s,
        "roundtrip_vs_d2d": t_copy / (put_s + get_s),
    }


async def _big_rows(st: Any, reps: int) -> dict[str, Any]:
    """1 GiB dense batches (16384 rows of 64 KiB)."""
    td = TensorDict({"x": torch.randn(16384, 16384)}, [16384])
    size = payload_bytes(td)
    puts, gets = [], []
    for i in range(reps + 1):
        t = time.perf_counter()
        meta = await st.put(td, partition="big")
        put_s = time.perf_counter() - t
        t = time.perf_counter()
        out = await st.get(meta)
        get_s = time.perf_counter() - t
        if i == 0:
            assert torch.equal(out["x"], td["x"])
        del out
        await st.clear(meta)
        if i:
            puts.append(put_s)
            gets.append(get_s)
    await st.clear_partition("big")
    return {
        "big_put_GBps": size / statistics.median(puts) / 1e9,
        "big_get_GBps": size / statistics.median(gets) / 1e9,
    }


async def _concurrent_rows(cluster: Any, clients: int = 8, batches: int = 16) -> dict[str, Any]:
    """``clients`` producers and ``clients`` consumers, each its own client: aggregate GB/s
    of put + get bytes, and a check that every sample arrived exactly once."""
    from rayless.store import Store

    rows = 256
    row = 4096  # float32: 4 MiB per batch
    prods = [await Store.connect(cluster=cluster) for _ in range(clients)]
    cons = [await Store.connect(cluster=cluster) for _ in range(clients)]
    total = clients * batches
    seen: list[int] = []

    async def produce(k: int, st: Any) -> None:
        for b in range(batches):
            base = (k * batches + b) * rows
            ids = torch.arange(base, base + rows)
            x = ids[:, None].float().expand(rows, row).contiguous()
            await st.put(TensorDict({"id": ids, "x": x}, [rows]), partition="conc")

    async def consume(st: Any) -> None:
        while True:
            meta = await st.get_meta("conc", ["id", "x"], rows, task="train", timeout=60)
            if meta.size == 0:
                return
            got = await st.get(meta)
            ids = got["id"].tolist()
            assert torch.equal(got["x"][:, 0], got["id"].float()), "rows mixed up"
            seen.extend(ids)

    t = time.perf_counter()
    done = asyncio.gather(*(consume(st) for st in cons))
    await asyncio.gather(*(produce(k, st) for k, st in enumerate(prods)))
    while len(seen) < total * rows:  # noqa: ASYNC110 (consumers run on this loop)
        await asyncio.sleep(0.005)
    wall = time.perf_counter() - t
    done.cancel()
    with contextlib.suppress(BaseException):
        await done
    moved = 2 * total * rows * (row * 4 + 8)  # put + get
    return {
        "concurrent_GBps": moved / wall / 1e9,
        "concurrent_samples_ok": sorted(seen) == list(range(total * rows)),
    }


async def _step_rows(st: Any, td: TensorDict, reps: int) -> dict[str, Any]:
    """verl's pattern: a fresh partition per step (put, get_meta, get, clear_partition)."""
    size = payload_bytes(td)
    puts, gets, steps = [], [], []
    for i in range(WARMUP + reps):
        partition = f"step-{i}"
        t0 = time.perf_counter()
        await st.put(td, partition=partition)
        t1 = time.perf_counter()
        meta = await st.get_meta(partition, ["x"], N, task="train", timeout=60)
        out = await st.get(meta)
        t2 = time.perf_counter()
        del out
        await st.clear_partition(partition)
        if i >= WARMUP:
            puts.append(t1 - t0)
            gets.append(t2 - t1)
            steps.append(time.perf_counter() - t0)
    return {
        "step_put_GBps": size / statistics.median(puts) / 1e9,
        "step_get_GBps": size / statistics.median(gets) / 1e9,
        "step_ms": statistics.median(steps) * 1e3,
    }


async def _put_ms(st: Any, td: TensorDict, reps: int) -> float:
    times = []
    for i in range(WARMUP + reps):
        t = time.perf_counter()
        meta = await st.put(td, partition="lat")
        if i >= WARMUP:
            times.append(time.perf_counter() - t)
        await st.clear(meta)
    return statistics.median(times) * 1e3


# -- TransferQueue (subprocess) -----------------------------------------------------------


def run_tq(reps: int) -> dict[str, Any]:
    """Every row for TransferQueue 0.1.11 (SimpleStorage, 2 units) on its own Ray."""
    import ray
    import transfer_queue as tq
    from omegaconf import OmegaConf
    from transfer_queue import TransferQueueClient

    res: dict[str, Any] = {}
    t = time.perf_counter()
    ray.init(num_cpus=8, include_dashboard=False, log_to_driver=False, logging_level="ERROR")
    t_ray = time.perf_counter()
    conf = tq.init(OmegaConf.create({"backend": {"SimpleStorage": {"num_data_storage_units": 2}}}))
    res["init_s"] = time.perf_counter() - t
    res["init_tq_only_s"] = time.perf_counter() - t_ray
    client = tq.get_client()
    try:
        first = client.put(TensorDict({"x": torch.arange(N)}, [N]), partition_id="first")
        res["ready_s"] = time.perf_counter() - t
        client.clear_samples(first)
        for name, td in make_batches("cpu").items():
            size = payload_bytes(td)
            puts, gets = [], []
            for i in range(WARMUP + reps):
                try:
                    t = time.perf_counter()
                    meta = client.put(td, partition_id=name)
                    put_s = time.perf_counter() - t
                    t = time.perf_counter()
                    client.get_data(meta)
                    get_s = time.perf_counter() - t
                    client.clear_samples(meta)
                except Exception as exc:  # TQ may refuse a field type: report, go on
                    res[f"{name}_error"] = f"{type(exc).__name__}: {exc}"[:200]
                    break
                if i >= WARMUP:
                    puts.append(put_s)
                    gets.append(get_s)
            if puts:
                res[f"{name}_put_GBps"] = size / statistics.median(puts) / 1e9
                res[f"{name}_get_GBps"] = size / statistics.median(gets) / 1e9
                res[f"{name}_put_ms"] = statistics.median(puts) * 1e3
        dense_td = make_batches("cpu")["dense"]
        puts, gets, steps = [], [], []
        for i in range(WARMUP + reps):  # verl's pattern: a fresh partition per step
            partition = f"step-{i}"
            t0 = time.perf_counter()
            client.put(dense_td, partition_id=partition)
            t1 = time.perf_counter()
            meta = client.get_meta(["x"], N, partition, mode="fetch", task_name="train")
            client.get_data(meta)
            t2 = time.perf_counter()
            client.clear_partition(partition)
            if i >= WARMUP:
                puts.append(t1 - t0)
                gets.append(t2 - t1)
                steps.append(time.perf_counter() - t0)
        size = payload_bytes(dense_td)
        res["step_put_GBps"] = size / statistics.median(puts) / 1e9
        res["step_get_GBps"] = size / statistics.median(gets) / 1e9
        res["step_ms"] = statistics.median(steps) * 1e3
        small = TensorDict({"x": torch.ones(N, 4)}, [N])
        lat = []
        for i in range(reps):
            client.put(small, partition_id="meta")
            t = time.perf_counter()
            client.get_meta(["x"], N, "meta", mode="fetch", task_name=f"t{i}")
            lat.append(time.perf_counter() - t)
            client.clear_partition("meta")
        res["get_meta_ms"] = statistics.median(lat) * 1e3
        dense = make_batches("cpu")["dense"]

        def put_once() -> None:
            client.clear_samples(client.put(dense, partition_id="lat"))

        res["idle_put_ms"] = median_time(put_once, reps) * 1e3
        other = TransferQueueClient(
            client_id="bench-waiter", controller_info=conf.controller.zmq_info
        )
        other.initialize_storage_manager(
            manager_type="SimpleStorage", config=conf.backend["SimpleStorage"]
        )
        waiter = threading.Thread(
            target=lambda: other.get_meta(["x"], 4, "wait", mode="fetch", task_name="w"),
            daemon=True,
        )
        waiter.start()
        time.sleep(1.0)
        t = time.perf_counter()
        put_once()
        res["put_during_fetch_ms"] = (time.perf_counter() - t) * 1e3
        res["fetch_still_waiting"] = waiter.is_alive()
        client.put(TensorDict({"x": torch.ones(4)}, [4]), partition_id="wait")
        waiter.join(60)
    finally:
        tq.close()
        ray.shutdown()
    return res


# -- report -------------------------------------------------------------------------------

ROWS = [
    ("init_s", "init: Cluster.local + Store.create / ray.init + tq.init (s)", "lower"),
    ("ready_s", "init + the first put of 1,024 tiny rows (s)", "lower"),
    ("dense_put_GBps", "put 16 MiB dense (GB/s)", "higher"),
    ("dense_get_GBps", "get 16 MiB dense (GB/s)", "higher"),
    ("mixed_put_GBps", "put mixed (GB/s)", "higher"),
    ("mixed_get_GBps", "get mixed (GB/s)", "higher"),
    ("step_put_GBps", "put 16 MiB, a new partition per step (GB/s)", "higher"),
    ("step_get_GBps", "get_meta + get 16 MiB, a new partition per step (GB/s)", "higher"),
    ("step_ms", "a step: put, get_meta, get, clear_partition (ms)", "lower"),
    ("get_meta_ms", "get_meta fetch 1024 (ms)", "lower"),
    ("idle_put_ms", "put 16 MiB, idle (ms)", "lower"),
    ("put_during_fetch_ms", "put 16 MiB while a fetch waits (ms)", "lower"),
]
OURS_ONLY = [
    ("cluster_s", "  of which Cluster.local (s)"),
    ("create_s", "  of which Store.create (s; returns before its units serve)"),
    ("first_put_s", "Store.create + the first put (s; the put waits for the units)"),
    ("tiny_put_ms", "put of 1,024 tiny rows (one int64 each; ms)"),
    ("memcpy_GBps", "plain copy of the 16 MiB (destinations out of cache, GB/s; the anchor)"),
    ("memcpy_threads_GBps", "  … with torch's default threads (GB/s)"),
    ("memcpy_one_thread_GBps", "  … with one thread (GB/s)"),
    ("memcpy_warm_GBps", "plain copy of the 16 MiB (one destination, in L3, GB/s)"),
    ("memcpy_fresh_GBps", "plain copy of the 16 MiB into a fresh tensor (GB/s)"),
    ("put_vs_memcpy", "dense put vs the plain copy (x)"),
    ("get_vs_memcpy", "dense get vs the plain copy (x)"),
    ("roundtrip_vs_memcpy", "dense put + get vs one plain copy (x)"),
    ("dense_view_ms", "zero-copy get of the 16 MiB (ms)"),
    ("roundtrip_view_vs_memcpy", "dense put + zero-copy get vs one plain copy (x)"),
    ("d2d_GBps", "device-to-device copy of the 16 MiB (GB/s)"),
    ("put_vs_d2d", "CUDA dense put vs the device copy (x; goal >= 0.5)"),
    ("get_vs_d2d", "CUDA dense get vs the device copy (x; goal >= 0.5)"),
    ("roundtrip_vs_d2d", "CUDA dense put + get vs one device copy (x)"),
    ("ipc_columns_opened", "CUDA columns the client opened by IPC"),
    ("big_put_GBps", "put 1 GiB dense (GB/s)"),
    ("big_get_GBps", "get 1 GiB dense (GB/s)"),
    ("concurrent_GBps", "8 producers + 8 consumers, put+get bytes (GB/s)"),
    ("concurrent_samples_ok", "every sample consumed exactly once"),
]


def table(ours: dict[str, Any], tq: dict[str, Any] | None) -> str:
    """A markdown table: ours, TransferQueue, ratio (how many times better ours is)."""
    lines = ["| metric | rayless | TransferQueue | ours vs TQ |", "|---|---|---|---|"]
    for key, label, better in ROWS:
        a = ours.get(key)
        b = (tq or {}).get(key)
        ratio = ""
        if isinstance(a, float) and isinstance(b, float) and a and b:
            ratio = f"{(a / b if better == 'higher' else b / a):.1f}x"
        fa = f"{a:.3f}" if isinstance(a, float) else "-"
        fb = f"{b:.3f}" if isinstance(b, float) else "-"
        lines.append(f"| {label} | {fa} | {fb} | {ratio} |")
    for key, label in OURS_ONLY:
        if key in ours:
            v = ours[key]
            lines.append(
                f"| {label} | {v:.3f} | - | |"
                if isinstance(v, float)
                else f"| {label} | {v} | - | |"
            )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    parser.add_argument("--quick", action="store_true", help="3 repeats, no TransferQueue")
    parser.add_argument("--skip-tq", action="store_true")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--json", help="write the results here")
    parser.add_argument("--no-big", action="store_true", help="skip the 1 GiB batches")
    parser.add_argument("--tq-part", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    reps = 3 if args.quick else args.repeats
    if args.tq_part:
        print("RESULT " + json.dumps(run_tq(reps)), flush=True)
        return
    ours = asyncio.run(run_ours(args.device, reps, big=not args.no_big))
    tq: dict[str, Any] | None = None
    if not (args.quick or args.skip_tq):
        proc = subprocess.run(
            [sys.executable, os.path.abspath(__file__), "--tq-part", "--repeats", str(reps)],
            capture_output=True,
            text=True,
            timeout=900,
        )
        found = [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")]
        if found:
            tq = json.loads(found[-1][len("RESULT ") :])
        else:
            print("TransferQueue failed:\n" + proc.stderr[-3000:], file=sys.stderr)
    print(f"device={args.device} repeats={reps} units=2 batch={N}")
    print(table(ours, tq))
    print(
        f"fetch still waiting during the put: ours={ours.get('fetch_still_waiting')}, "
        f"TQ={(tq or {}).get('fetch_still_waiting')}"
    )
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"ours": ours, "transferqueue": tq, "device": args.device}, f, indent=1)


if __name__ == "__main__":
    main()
