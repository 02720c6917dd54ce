"""The demo RL pipeline, shortened: it learns, every stage moves data, reports are written."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from rayless.actors import Cluster
from rayless.demo.config import load_config
from rayless.demo.pipeline import Pipeline
from rayless.demo.report import summary_text, write_report

pytestmark = pytest.mark.integration


@pytest.mark.slow
@pytest.mark.xdist_group("training")  # CPU-bound: one training test at a time
@pytest.mark.local_cluster(nodes=2, gpus_per_node=2)
async def test_shortened_pipeline_learns_and_moves_data(
    local_cluster: Cluster, tmp_path: Path
) -> None:
    cfg = load_config()
    cfg.algo.iterations = 8
    cfg.algo.target_return = 10_000.0  # never "solved": run all 8 iterations
    pipeline = Pipeline(cfg, local_cluster)
    try:
        await pipeline.setup()
        result = await pipeline.run()
    finally:
        await pipeline.aclose()
    returns = [it.mean_return for it in result.iterations]
    assert len(returns) == 8
    assert returns[-1] > returns[0] + 10, returns  # the policy improves
    totals = result.totals
    for key in ("env_steps", "infer_calls", "put_bytes", "get_bytes", "train_samples"):
        assert totals[key] > 0, key
    assert totals["train_samples"] == totals["env_steps"]  # every sample trained on once
    assert all(it.staleness == 0 for it in result.iterations)  # sync mode
    assert {p["worker"] for p in result.placement} >= {"train-0", "train-1", "eval-0", "env-0"}
    paths = write_report(result, tmp_path, cfg)
    data = json.loads(paths["json"].read_text())
    assert data["mean_return"] == returns and len(data["samples_per_s"]) == 8
    assert "png" in paths and paths["png"].stat().st_size > 1000
    assert "Throughput per stage" in summary_text(result)
    # every weight broadcast went through WeightSync, and the report shows its time
    assert all(0 < it.weight_sync_s < 60 for it in result.iterations)
    assert len(data["weight_sync_s"]) == 8 and totals["weight_syncs"] == 8
    assert "weight sync: 8 syncs, median" in summary_text(result)
    assert len(pipeline.sync_s) == 9  # setup's first sync, then one per iteration


def test_demo_command_reports_bad_config(tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("algo:\n  lr: -1\n")
    out = subprocess.run(
        [sys.executable, "-m", "rayless.cli", "demo", "--config", str(bad)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 1
    assert "algo.lr" in out.stderr
