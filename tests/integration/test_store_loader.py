"""The streaming loader when a rank dies: its unread share of each step goes back to the task
once the step's lease expires, and a replacement rank can join and read it."""

from __future__ import annotations

import os
import signal
from collections.abc import Awaitable, Callable

import pytest
import torch
from tensordict import TensorDict

import rayless.actors as actors
from rayless.actors import Cluster
from rayless.store import Store
from rayless.store.client.loader import StreamingLoader
from tests.waiting import wait_until as _wait_until

pytestmark = [pytest.mark.integration, pytest.mark.local_cluster(nodes=1)]

N = 64  # samples; 2 per rank and step, 2 ranks: 16 steps


async def wait_until(
    pred: Callable[[], Awaitable[bool]], timeout: float = 60.0, what: str = "a condition"
) -> None:
    """``tests.waiting.wait_until`` with this module's defaults."""
    await _wait_until(pred, timeout, what, interval=0.05)


def loader(st: Store, dp_rank: int, start_step: int = 0) -> StreamingLoader:
    return StreamingLoader(
        st, "p", ["x"], 2, task="train", dp_rank=dp_rank, dp_size=2, start_step=start_step,
        timeout=20,
    )  # fmt: skip


class Rank(actors.Actor):
    """A trainer rank in its own process: reads steps through a StreamingLoader."""

    def __init__(self, store_name: str, dp_rank: int) -> None:
        self.store_name = store_name
        self.dp_rank = dp_rank
        self.loader: StreamingLoader | None = None

    async def pid(self) -> int:
        return os.getpid()

    async def read(self, steps: int) -> list[int]:
        """Read ``steps`` steps (fetch, get, ack) and return the samples' x."""
        if self.loader is None:
            self.loader = loader(await Store.connect(self.store_name), self.dp_rank)
        out: list[int] = []
        for _ in range(steps):
            td, _meta = await self.loader.__anext__()
            out += td["x"].tolist()
        return out

    async def fetch_only(self, step: int) -> int:
        """Fetch this rank's part of ``step`` and never read or ack it (dies holding it)."""
        if self.loader is None:
            raise RuntimeError("read a step first")
        return (await self.loader.fetch(step)).size


async def test_a_dead_ranks_share_goes_back_and_a_replacement_rank_reads_it(
    local_cluster: Cluster,
) -> None:
    st = await Store.create(local_cluster, num_units=2, name="ld-dead", lease_after=1.0)
    await st.put(TensorDict({"x": torch.arange(N)}, [N]), "p")
    rank1 = await local_cluster.spawn(Rank, "ld-dead", 1)
    rank0 = loader(st, 0)
    read0: list[int] = []
    read1 = rank1.read.submit(2)
    for _ in range(2):  # steps 0 and 1 in lockstep
        read0 += (await rank0.__anext__())[0]["x"].tolist()
    read1_got = await read1
    assert await rank1.fetch_only(2) == 2  # rank 1 holds its part of step 2, unread
    os.kill(await rank1.pid(), signal.SIGKILL)
    async for td, _meta in rank0:  # rank 0 goes on alone through step 15
        read0 += td["x"].tolist()
        if len(read0) == N // 2:
            break
    # every sample was fetched; rank 1's parts of steps 2..15 (28 samples) were never read
    unread = 28
    assert len(read0) + len(read1_got) == N - unread

    async def handed_back() -> bool:
        return (await st.consumption_status("p", "train"))["consumed"] == N - unread

    # before: consumed stayed at 64 (all of it), the 28 samples were lost to the task
    await wait_until(handed_back, what="the dead rank's unread parts to go back to the task")
    replacement = loader(st, 1)  # a new rank 1, from step 0 (before: StoreTimeoutError)
    read_new: list[int] = []
    for _ in range(7):  # 7 new batches of 4 hold the 28; its part of each is 2
        read_new += (await replacement.__anext__())[0]["x"].tolist()
    assert len(read_new) == 14

    async def rest_back() -> bool:  # the parts of those batches no rank 0 asked for
        return (await st.consumption_status("p", "train"))["consumed"] == N - 14

    await wait_until(rest_back, what="the new batches' rank-0 parts to go back")
    rest = await st.get_meta("p", ["x"], None, task="train")
    drained = (await st.get(rest))["x"].tolist()
    everything = read0 + read1_got + read_new + drained
    assert sorted(everything) == list(range(N))  # each sample read once: none lost, no repeat


async def test_a_rank_that_asks_again_for_its_step_gets_the_same_part(
    local_cluster: Cluster,
) -> None:
    st = await Store.create(local_cluster, num_units=1, name="ld-again", lease_after=60.0)
    await st.put(TensorDict({"x": torch.arange(8)}, [8]), "p")
    first = loader(st, 1)
    part = await first.fetch(0)  # fetched, then the rank restarts before reading
    again = loader(st, 1)  # its replacement asks for step 0 again within the lease
    td, meta = await again.__anext__()
    assert meta.global_indexes == part.global_indexes
    td0, _ = await loader(st, 0).__anext__()
    assert sorted(td0["x"].tolist() + td["x"].tolist()) == [0, 1, 2, 3]
    assert (await st.consumption_status("p", "train"))["consumed"] == 4


async def test_a_kept_batch_outlives_its_lease_until_one_of_its_samples_is_cleared(
    local_cluster: Cluster,
) -> None:
    # TransferQueue's rank-aware sampling: a group's ranks (however many, however late)
    # read one batch per (dp_rank, batch_index) key
    st = await Store.create(local_cluster, num_units=1, name="ld-kept", lease_after=0.3)
    await st.put(TensorDict({"x": torch.arange(8)}, [8]), "p")
    first = await st.get_meta("p", ["x"], 2, task="t", share=("g0#0", 1, True))
    plain = await st.get_meta("p", ["x"], 2, task="t", share=("g1#0", 1))

    async def plain_forgotten() -> bool:  # an unkept share is forgotten after its lease
        again = await st.get_meta("p", ["x"], 2, task="t", share=("g1#0", 1), timeout=0)
        return again.global_indexes != plain.global_indexes

    await wait_until(plain_forgotten, what="the unkept share's lease to end")
    late = await st.get_meta("p", ["x"], 2, task="t", share=("g0#0", 1, True))
    assert late.global_indexes == first.global_indexes  # before: a new batch after the lease
    await st.clear(first.select([1]))  # one of its samples: its index may be reused
    fresh = await st.get_meta("p", ["x"], 2, task="t", share=("g0#0", 1, True), timeout=0)
    assert not set(fresh.global_indexes) & set(first.global_indexes)
    await st.aclose()
