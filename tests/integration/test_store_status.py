"""``rayless status --store NAME`` (and ``--prometheus``) against a real local cluster."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
import torch
from tensordict import TensorDict

from rayless.actors import Cluster
from rayless.actors.launch.local import LocalProcesses
from rayless.store import Store
from tests.integration.test_status import _status, _token_file

pytestmark = pytest.mark.integration


async def test_status_prints_a_store_section_and_prometheus_text(
    local_cluster: Cluster, local_cluster_processes: LocalProcesses, tmp_path: Path
) -> None:
    st = await Store.create(local_cluster, num_units=2, name="status-store")
    await st.put(TensorDict({"x": torch.arange(4)}, [4]), partition="train")
    await st.get_meta("train", ["x"], 2, task="learner", timeout=5)
    token = _token_file(tmp_path, local_cluster_processes.token)
    base = ("--address", local_cluster_processes.address, "--token-file", token)
    out = await asyncio.to_thread(_status, *base, "--store", "status-store")
    assert out.returncode == 0, out.stderr
    assert "Nodes" in out.stdout and "store status-store" in out.stdout
    assert "status-store-unit-0" in out.stdout and "learner:2" in out.stdout
    prom = await asyncio.to_thread(_status, *base, "--store", "status-store", "--prometheus")
    assert prom.returncode == 0, prom.stderr
    assert 'rayless_store_consumed{store="' in prom.stdout and 'task="learner"} 2' in prom.stdout
