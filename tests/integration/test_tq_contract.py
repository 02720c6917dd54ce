"""TransferQueue's contract, re-expressed against rayless.store: the scenarios of TQ's own
tests (controller, samplers, streaming dataset, KV and checkpoint end-to-end) that a TQ user
brings with them, on a real local cluster."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable

import pytest
import torch
from tensordict import TensorDict

import rayless.actors as actors
from rayless.actors import Cluster
from rayless.store import Store, SyncStore
from rayless.store.loader import StreamingLoader

pytestmark = [pytest.mark.integration, pytest.mark.local_cluster(nodes=1)]


async def wait_until(
    pred: Callable[[], Awaitable[bool]], timeout: float = 60.0, what: str = "a condition"
) -> None:
    """Poll ``pred`` until it is true; AssertionError naming ``what`` after ``timeout`` s."""
    deadline = time.monotonic() + timeout
    while not await pred():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        await asyncio.sleep(0.05)


def td(n: int, start: int = 0) -> TensorDict:
    return TensorDict({"x": torch.arange(start, start + n)}, [n])


async def test_a_rank_asking_for_its_step_twice_gets_its_part_and_loses_nothing(
    local_cluster: Cluster,
) -> None:
    # TQ's SeqlenBalancedSampler caches (partition, task, batch_index): each dp_rank asks any
    # number of times and gets its own part of the same step.
    st = await Store.create(local_cluster, num_units=2, name="tq-again", lease_after=60.0)
    lengths = [90, 1, 1, 1, 40, 40, 2, 1]
    await st.put(td(8), "p", custom_meta=[{"total_lengths": v} for v in lengths])

    def rank(r: int) -> StreamingLoader:
        return StreamingLoader(
            st, "p", ["x"], 2, task="train", dp_rank=r, dp_size=2,
            sampler={"name": "seqlen_balanced", "dp_size": 2}, timeout=10,
        )  # fmt: skip

    first, _ = await rank(0).__anext__()
    again, _ = await rank(0).__anext__()  # rank 0 restarts and asks for step 0 again
    assert again["x"].tolist() == first["x"].tolist()
    other, _ = await rank(1).__anext__()
    step0 = sorted(first["x"].tolist() + other["x"].tolist())
    assert step0 == [0, 1, 2, 3]  # before: rank 1 got part of the next batch, 2 samples lost
    assert (await st.consumption_status("p", "train"))["consumed"] == 4
    later = [rank(r) for r in range(2)]
    for r in range(2):
        later[r].step = 1
    rest = [x for r in range(2) for x in (await later[r].__anext__())[0]["x"].tolist()]
    assert sorted(step0 + rest) == list(range(8))  # every sample delivered to a rank, once


class Reconnects(actors.Actor):
    """An actor that opens, closes and opens again clients of a store."""

    async def twice(self, name: str) -> list[int]:
        sizes = []
        for _ in range(2):
            st = await Store.connect(name)
            sizes.append(len(st.units))
            await st.aclose()
        return sizes

    def twice_sync(self, name: str) -> list[int]:
        sizes = []
        for _ in range(2):
            with SyncStore.connect(name) as st:
                sizes.append(len(st.units))
        return sizes


async def test_connect_after_a_closed_client_inside_an_actor(local_cluster: Cluster) -> None:
    st = await Store.create(local_cluster, num_units=2, name="tq-reconnect")
    actor = await local_cluster.spawn(Reconnects)
    assert await actor.twice("tq-reconnect") == [2, 2]  # before: ConnectError the 2nd time
    assert await actor.twice_sync("tq-reconnect") == [2, 2]
    await st.aclose()
