"""Many store clients at once, a unit killed midway (``rayless.store.testing_stress``; the
full-size run is ``scripts/stress_store.py``): every acknowledged sample is read exactly once
or reported lost, none twice, none corrupt."""

from __future__ import annotations

import pytest

from rayless.actors import Cluster
from rayless.store import Store
from rayless.store.testing_stress import stress

pytestmark = [
    pytest.mark.slow,
    pytest.mark.integration,
    pytest.mark.local_cluster(nodes=2, gpus_per_node=0),
]


@pytest.mark.timeout(240)
async def test_clients_and_a_unit_killed_midway_lose_nothing_unreported(
    local_cluster: Cluster,
) -> None:
    st = await Store.create(local_cluster, num_units=3, name="stress-ci")
    try:
        figures, verdict = await stress(local_cluster, st, procs=2, tasks=8, seconds=8.0)
        assert verdict.acked > 0 and verdict.read > 0, figures
        assert not verdict.duplicated, figures
        assert not verdict.corrupt, figures
        assert not verdict.missing, figures  # acknowledged, never read, not reported lost
        assert verdict.read + verdict.lost >= verdict.acked
        units = await st.controller.units()
        assert not units[-1].alive and all(u.alive for u in units[:-1])
    finally:
        await st.shutdown()
