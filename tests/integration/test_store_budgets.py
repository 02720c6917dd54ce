"""Machine-independent budgets of the store's operations: the control messages each costs,
counted by the controller's and the units' own call counters (``actors.core.callstats``, read
through their debug listeners, which no store method sees) while a real local cluster serves
N same-host puts, fetches and gets of dense rows. The budgets are the ones docs/store.md
states ("Round trips"); no timing is asserted."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from tensordict import TensorDict

from rayless.actors import Cluster
from rayless.observe import actor_stats
from rayless.store import Store
from tests.waiting import wait_until

pytestmark = pytest.mark.integration

N = 10
UNITS = 2
ROWS = 64

# messages per operation, by receiving actor class and method (docs/store.md, "Round trips")
# (a put of the client's usual shape takes the allocation and the reservations leased after
# its previous put, and leases the next: only the commits and data updates are on its path)
PUT = {
    "StoreController.allocate": 1,  # where the samples go: the next put's, leased ahead
    "StorageUnit.reserve": UNITS,  # room for the rows in each unit's segments (ahead too)
    "StorageUnit.commit": UNITS,  # the rows are written: the unit takes them
    "StoreController.on_data_update": UNITS,  # each unit tells the controller, which ACKs
}
GET_META = {"StoreController.get_meta": 1, "StoreController.ack_fetch": 1}
GET = {"StorageUnit.locate": UNITS, "StoreController.lost_positions": 1}


async def _store_calls(cluster: Cluster) -> dict[str, int]:
    """Calls so far per ``Class.method`` of the store's actors."""
    nodes = await cluster.nodes()
    cls = {a["actor_id"]: a["cls"] for n in nodes for a in n["actors"]}
    out: dict[str, int] = {}
    for actor_id, stats in (await actor_stats(cluster)).items():
        name = cls.get(actor_id, "")
        if name not in ("StoreController", "StorageUnit"):
            continue
        for method, count in stats.get("calls", {}).items():
            key = f"{name}.{method}"
            out[key] = out.get(key, 0) + int(count)
    return out


async def _per_op(cluster: Cluster, run: Any) -> dict[str, float]:
    before = await _store_calls(cluster)
    await run()
    after = await _store_calls(cluster)
    keys = set(before) | set(after)
    return {
        k: (after.get(k, 0) - before.get(k, 0)) / N
        for k in keys
        if after.get(k, 0) > before.get(k, 0)
    }


@pytest.mark.local_cluster(nodes=1, gpus_per_node=0)
async def test_a_put_a_fetch_and_a_get_stay_within_their_message_budgets(
    local_cluster: Cluster,
) -> None:
    st = await Store.create(local_cluster, num_units=UNITS, name="budget-store")
    td = TensorDict({"x": torch.randn(ROWS, 256)}, [ROWS])
    warm = await st.put(td, "warm")  # first use: schemas, segment maps
    await st.get(warm)

    await st.put(td, "p")  # the first put of "p" goes the usual way and leases the next

    async def leased() -> bool:  # the lease of "warm" given back (its indexes free), "p"'s made
        stats = await st.stats()
        return bool(stats["leased"] == ROWS and stats["free"] == ROWS)

    await wait_until(leased, 30, "the lease to follow the put's shape")

    async def puts() -> None:
        taken = st._leases.taken
        for _ in range(N):
            await st.put(td, "p")
        # every put took its lease: it asked nothing before its commits
        assert st._leases.taken - taken == N and st._leases.retried == 0

    metas = []

    async def fetches() -> None:
        for _ in range(N):
            metas.append(await st.get_meta("p", ["x"], ROWS, task="t", timeout=30))

    async def gets() -> None:
        for meta in metas:
            got = await st.get(meta)
            assert got["x"].shape == (ROWS, 256)

    for name, run, budget in (
        ("put", puts, PUT),
        ("get_meta", fetches, GET_META),
        ("get", gets, GET),
    ):
        used = await _per_op(local_cluster, run)
        # the counters of what it did must be there (a broken count would pass any budget);
        # the fetch's ack is one-way, so it may still be on its way
        assert set(budget) - {"StoreController.ack_fetch"} <= set(used), (name, used)
        over = {k: v for k, v in used.items() if v > budget.get(k, 0)}
        assert not over, f"{name} sent more than its budget: {over} (budget {budget})"
