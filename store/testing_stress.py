"""Many concurrent store clients, for the stress test and ``scripts/stress_store.py``.

A :class:`StressClient` is an actor (its own process) that runs ``tasks`` asyncio clients
against one store for ``seconds``: half produce (each put is ``rows`` samples of a random
int64 payload with its CRC-32 and a unique id), half consume (``get_meta`` of a batch for the
task ``"stress"``, then ``get``, checking every payload against its CRC). It records what it
can prove: the ids whose put was acknowledged (with their global indexes), the ids it read,
payloads that did not match their CRC, the ids a ``PartialResultError`` reported lost, and
every error by type. :func:`verify` judges the whole run from every client's
:class:`Tally` and the store's own list of lost samples: each acknowledged sample read
exactly once or reported lost, none read twice, none corrupt, none read that no put wrote.
"""

from __future__ import annotations

import asyncio
import collections
import os
import time
import zlib
from dataclasses import dataclass, field
from typing import Any

import psutil
import torch
from tensordict import TensorDict

from rayless import actors
from rayless.store.client.store import Store
from rayless.store.errors import PartialResultError, StoreError, StoreTimeoutError

PARTITION = "stress"
TASK = "stress"
FIELDS = ("uid", "crc", "payload")


@dataclass
class Tally:
    """What one client process saw (plain values: it travels back to the driver)."""

    acked: list[tuple[int, int]] = field(default_factory=list)  # (uid, global index)
    read: list[int] = field(default_factory=list)  # uids, in the order read
    corrupt: list[int] = field(default_factory=list)
    lost_reported: list[int] = field(default_factory=list)  # global indexes
    puts: int = 0
    fetches: int = 0
    errors: dict[str, int] = field(default_factory=dict)

    def error(self, exc: BaseException) -> None:
        """Count an error by its type."""
        name = type(exc).__name__
        self.errors[name] = self.errors.get(name, 0) + 1


def _payload(uids: torch.Tensor, width: int) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(int(uids[0]))
    payload = torch.randint(-(2**62), 2**62, (len(uids), width), generator=gen)
    crc = torch.tensor([zlib.crc32(row.numpy().tobytes()) for row in payload])
    return payload, crc


class StressClient(actors.Actor):
    """One process of stress clients (see the module docstring)."""

    def __init__(self, store_name: str, client: int) -> None:
        self.store_name = store_name
        self.client = client

    async def run(
        self, seconds: float, tasks: int, rows: int, width: int, batch: int
    ) -> dict[str, Any]:
        """Run ``tasks`` clients for ``seconds``; return the :class:`Tally` as a dict."""
        st = await Store.connect(self.store_name)
        tally = Tally()
        deadline = time.monotonic() + seconds
        producers = max(1, tasks // 2)

        async def produce(worker: int) -> None:
            seq = 0
            while time.monotonic() < deadline:
                base = ((self.client * 4096 + worker) << 32) | seq
                uids = torch.arange(base, base + rows, dtype=torch.int64)
                seq += rows
                payload, crc = _payload(uids, width)
                td = TensorDict({"uid": uids, "crc": crc, "payload": payload}, [rows])
                try:
                    meta = await st.put(td, PARTITION, timeout=5.0)
                except StoreError as exc:  # a unit lost mid-put, or full: not acknowledged
                    tally.error(exc)
                    continue
                tally.puts += 1
                tally.acked += zip(uids.tolist(), meta.global_indexes, strict=True)

        def check(data: Any) -> None:
            uids = data["uid"].tolist()
            tally.read += uids
            for uid, crc, row in zip(uids, data["crc"].tolist(), data["payload"], strict=True):
                if zlib.crc32(row.numpy().tobytes()) != crc:
                    tally.corrupt.append(uid)

        async def consume() -> None:
            while time.monotonic() < deadline:
                try:
                    meta = await st.get_meta(PARTITION, list(FIELDS), batch, task=TASK, timeout=1)
                except StoreTimeoutError:
                    continue
                except StoreError as exc:
                    tally.error(exc)
                    continue
                tally.fetches += 1
                try:
                    check(await st.get(meta))
                except PartialResultError as exc:  # the live part came back; the rest is lost
                    tally.error(exc)
                    check(exc.data)
                    tally.lost_reported += list(exc.lost.global_indexes)
                except StoreError as exc:
                    tally.error(exc)

        await asyncio.gather(
            *(produce(w) for w in range(producers)), *(consume() for _ in range(tasks - producers))
        )
        return tally.__dict__

    async def drain(self) -> dict[str, Any]:
        """Read whatever is still ready and unconsumed (after every client stopped)."""
        st = await Store.connect(self.store_name)
        tally = Tally()
        while True:
            meta = await st.get_meta(PARTITION, list(FIELDS), None, task=TASK, timeout=0)
            if len(meta) == 0:
                return tally.__dict__
            try:
                data = await st.get(meta)
            except PartialResultError as exc:
                tally.lost_reported += list(exc.lost.global_indexes)
                data = exc.data
            tally.read += data["uid"].tolist()
            tally.fetches += 1


@dataclass
class Verdict:
    """The judgement of a stress run."""

    acked: int
    read: int
    lost: int
    duplicated: list[int]
    corrupt: list[int]
    phantom: list[int]  # read, but no put of it was acknowledged
    missing: list[int]  # acknowledged, never read, not reported lost
    errors: dict[str, int]
    puts: int
    fetches: int

    @property
    def ok(self) -> bool:
        """Nothing duplicated, corrupt, missing (phantoms are counted, not failed: a put
        whose acknowledgement was lost to a unit's death may still have landed whole)."""
        return not (self.duplicated or self.corrupt or self.missing)


def verify(tallies: list[dict[str, Any]], lost_indexes: list[int]) -> Verdict:
    """Judge the run from every client's tally and the store's ``lost_samples``."""
    acked: dict[int, int] = {}
    read: collections.Counter[int] = collections.Counter()
    corrupt: list[int] = []
    lost_idx = set(lost_indexes)
    errors: dict[str, int] = {}
    puts = fetches = 0
    for t in tallies:
        acked.update((int(uid), int(index)) for uid, index in t["acked"])
        read.update(t["read"])
        corrupt += t["corrupt"]
        lost_idx.update(t["lost_reported"])
        puts += t["puts"]
        fetches += t["fetches"]
        for name, n in t["errors"].items():
            errors[name] = errors.get(name, 0) + n
    lost = {uid for uid, index in acked.items() if index in lost_idx and uid not in read}
    return Verdict(
        acked=len(acked),
        read=len(read),
        lost=len(lost),
        duplicated=sorted(uid for uid, n in read.items() if n > 1),
        corrupt=sorted(corrupt),
        phantom=sorted(uid for uid in read if uid not in acked),
        missing=sorted(uid for uid in acked if uid not in read and uid not in lost),
        errors=errors,
        puts=puts,
        fetches=fetches,
    )


async def _pid_of(cluster: actors.Cluster, actor_id: str) -> int:
    page = await cluster.list_actors(limit=None)
    return next(int(a.pid) for a in page.actors if a.actor_id == actor_id and a.pid)


async def stress(
    cluster: actors.Cluster,
    st: Store,
    *,
    procs: int,
    tasks: int,
    seconds: float,
    rows: int = 16,
    width: int = 8,
    batch: int = 32,
    kill_unit: bool = True,
) -> tuple[dict[str, Any], Verdict]:
    """Run ``procs`` StressClient processes of ``tasks`` clients each against ``st`` for
    ``seconds`` (killing its last unit at half time), drain, and judge: the figures and the
    verdict.

    Raises:
        RaylessError: a client process died, or the cluster failed.
    """
    controller = psutil.Process(await _pid_of(cluster, st.controller.actor_id))
    name = st.controller.name  # the store's name
    clients = [
        await cluster.spawn(StressClient, name, i, name=f"{name}-client-{i}") for i in range(procs)
    ]
    try:
        cpu0, t0 = sum(controller.cpu_times()[:2]), time.monotonic()
        runs = asyncio.gather(*(c.run(seconds, tasks, rows, width, batch) for c in clients))
        if kill_unit:
            await asyncio.sleep(seconds / 2)
            await cluster.kill(st.units[-1]["handle"])
        tallies = list(await runs)
        wall = time.monotonic() - t0
        cpu = sum(controller.cpu_times()[:2]) - cpu0
        tallies.append(await clients[0].drain())
    finally:
        for c in clients:
            await cluster.kill(c)
    lost = await st.lost_samples(PARTITION)
    verdict = verify(tallies, list(lost.global_indexes))
    ops = verdict.puts + verdict.fetches
    figures = {
        "procs": procs,
        "tasks_per_proc": tasks,
        "clients": procs * tasks,
        "units": len(st.units),
        "seconds": round(wall, 1),
        "load": round(os.getloadavg()[0], 1),
        "puts_per_s": round(verdict.puts / wall, 1),
        "fetches_per_s": round(verdict.fetches / wall, 1),
        "samples_acked": verdict.acked,
        "samples_read": verdict.read,
        "samples_lost": verdict.lost,
        "duplicated": len(verdict.duplicated),
        "corrupt": len(verdict.corrupt),
        "missing": len(verdict.missing),
        "phantom": len(verdict.phantom),
        "errors": verdict.errors,
        "controller_cpu_us_per_op": round(cpu / max(ops, 1) * 1e6, 1),
        "controller_cpu_share": round(cpu / wall, 3),
        "ok": verdict.ok,
    }
    return figures, verdict
