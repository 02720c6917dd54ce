"""``rayless status --prometheus``: one Prometheus text exposition of the whole cluster
(nodes, GPUs, actors by state, restarts, calls and errors per method, queue depth, stores,
weights), checked with prometheus_client's parser where it is installed and always with a
strict line-format check."""

from __future__ import annotations

import asyncio
import re
from pathlib import Path

import pytest
import torch
from tensordict import TensorDict

from rayless.actors import Cluster
from rayless.actors.launch.local import LocalProcesses
from rayless.store import Store
from tests.integration.test_status import _status, _token_file
from tests.integration.timeline_classes import Peer

pytestmark = pytest.mark.integration

_SAMPLE = re.compile(
    r'^[a-zA-Z_:][a-zA-Z0-9_:]*(\{[a-zA-Z_][a-zA-Z0-9_]*="(?:[^"\\\n]|\\.)*"'
    r'(?:,[a-zA-Z_][a-zA-Z0-9_]*="(?:[^"\\\n]|\\.)*")*\})? '
    r"(?:[-+]?(?:[0-9]+(?:\.[0-9]*)?(?:[eE][-+]?[0-9]+)?|Inf|NaN))$"
)


def strict_check(text: str) -> dict[str, dict[str, float]]:
    """Fail unless ``text`` is well-formed exposition text: HELP then TYPE before each
    family's samples, each family once, every sample line well formed. Returns
    {family: {sample line's name and labels: value}}."""
    assert text.endswith("\n")
    families: dict[str, dict[str, float]] = {}
    current = None
    seen_type: set[str] = set()
    for line in text.splitlines():
        if line.startswith("# HELP "):
            name = line.split()[2]
            assert name not in families, f"family {name} appears twice"
            families[name] = {}
            current = name
        elif line.startswith("# TYPE "):
            _, _, name, kind = line.split()
            assert name == current and kind in ("gauge", "counter"), line
            seen_type.add(name)
        else:
            assert _SAMPLE.match(line), f"bad sample line {line!r}"
            key, _, value = line.rpartition(" ")
            assert current is not None and current in seen_type, line
            assert key.startswith(current), (current, line)
            families[current][key] = float(value)
    return families


def parse_with_prometheus_client(text: str) -> None:
    """Parse with prometheus_client when it is installed (it is not a dependency)."""
    try:
        from prometheus_client.parser import text_string_to_metric_families
    except ImportError:
        return
    names = [f.name for f in text_string_to_metric_families(text)]
    assert "rayless_actors" in names and "rayless_actor_calls" in names  # _total stripped


async def test_status_prometheus_covers_the_whole_cluster(
    local_cluster: Cluster, local_cluster_processes: LocalProcesses, tmp_path: Path
) -> None:
    peer = await local_cluster.spawn(Peer, name="prom-peer", node="node-1", gpus=0.5)
    for i in range(3):
        assert await peer.square(i) == i * i
    with pytest.raises(ValueError):
        await peer.fail()
    st = await Store.create(local_cluster, num_units=1, name="prom-store")
    try:
        await st.put(TensorDict({"x": torch.arange(4)}, [4]), partition="train")
        token = _token_file(tmp_path, local_cluster_processes.token)
        base = ("--address", local_cluster_processes.address, "--token-file", token)
        out = await asyncio.to_thread(_status, *base, "--prometheus")
    finally:
        await st.shutdown()
    assert out.returncode == 0, out.stderr
    text = out.stdout
    families = strict_check(text)
    parse_with_prometheus_client(text)
    calls = families["rayless_actor_calls_total"]
    assert calls['rayless_actor_calls_total{actor="prom-peer",node="node-1",method="square"}'] == 3
    errors = families["rayless_actor_errors_total"]
    assert errors['rayless_actor_errors_total{actor="prom-peer",node="node-1",method="fail"}'] == 1
    assert (
        errors['rayless_actor_errors_total{actor="prom-peer",node="node-1",method="square"}'] == 0
    )
    assert families["rayless_actors"]['rayless_actors{state="alive"}'] >= 3  # peer + the store's
    assert families["rayless_nodes"]['rayless_nodes{state="alive"}'] == 2
    assert (
        'rayless_actor_queue_depth{actor="prom-peer",node="node-1"}'
        in families["rayless_actor_queue_depth"]
    )
    assert (
        families["rayless_actor_restarts_total"][
            'rayless_actor_restarts_total{actor="prom-peer",node="node-1"}'
        ]
        == 0
    )
    shares = families["rayless_gpu_used_share"]
    assert any('node="node-1"' in k and v == 0.5 for k, v in shares.items()), shares
    # the store found by itself (its controller's class), no --store needed
    samples = families["rayless_store_samples"]
    assert any('partition="train"' in k and v == 4 for k, v in samples.items()), samples
