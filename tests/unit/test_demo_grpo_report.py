"""The GRPO driver's helpers and report on made-up results (no processes)."""

from __future__ import annotations

import asyncio
import io
import json
from pathlib import Path

import pytest

from rayless.demo.grpo_config import GrpoConfig
from rayless.demo.grpo_pipeline import STAGES, GrpoIteration, GrpoResult
from rayless.demo.grpo_report import (
    grpo_progress_line,
    grpo_summary_text,
    print_grpo_progress,
    write_grpo_report,
)
from rayless.demo.tasks import first_error


def _row(i: int, evaluated: float | None) -> GrpoIteration:
    t = i * 0.1
    return GrpoIteration(
        iteration=i,
        wall_s=0.1,
        mean_reward=0.4 + 0.01 * i,
        eval_reward=evaluated,
        response_length=5.0,
        answer_length=5.0,
        samples=128,
        samples_per_s=1280.0,
        version=i + 1,
        staleness=0,
        loss=0.01,
        kl=0.1,
        groups=16,
        group_sizes=[8],
        stage_s=dict.fromkeys(STAGES, 0.01),
        intervals=[(s, t + k * 0.01, t + (k + 1) * 0.01) for k, s in enumerate(STAGES)]
        + ([("eval", t + 0.06, t + 0.08)] if evaluated is not None else []),
    )


def _result(solved: bool) -> GrpoResult:
    rows = [_row(i, 0.5 + 0.1 * i if i % 2 else None) for i in range(4)]
    return GrpoResult(
        solved=solved,
        iterations=rows,
        placement=[
            {"worker": "train-0", "node": "node-0", "gpus": "0", "gpu_share": 1.0, "cpus": 0.25}
        ],
        wall_s=0.4,
        setup_s=1.0,
        warm_start_s=5.0,
        mode="sync",
        target_reward=0.8,
        warm_reward=0.4,
        final_reward=0.8,
        best_reward=0.8,
        totals={"rollout_samples": 512.0, "rewarded": 512.0, "rewarded_on_node": 512.0},
    )


def test_progress_lines_and_summary() -> None:
    cfg = GrpoConfig()
    line = grpo_progress_line(_row(1, 0.6), cfg)
    assert "held-out 0.600/0.8" in line and "v2" in line and "wei 0.01" in line
    assert "held-out   -  " in grpo_progress_line(_row(0, None), cfg)
    out = io.StringIO()
    cfg.run.log_interval = 10
    print_grpo_progress(_row(0, None), cfg, out)  # neither logged nor evaluated
    print_grpo_progress(_row(2, 0.7), cfg, out)  # an evaluation is always shown
    assert out.getvalue().count("\n") == 1
    text = grpo_summary_text(_result(True))
    assert "SOLVED: held-out mean reward 0.400 after the warm start -> 0.800" in text
    assert "weight sync" in text and "512 rewarded (512 on the rollout worker's node)" in text
    assert "NOT solved" in grpo_summary_text(_result(False))


def test_report_files(tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    paths = write_grpo_report(_result(True), tmp_path, GrpoConfig())
    data = json.loads(paths["json"].read_text())
    assert [e is None for e in data["eval_reward"]] == [True, False, True, False]
    assert data["eval_reward"][3] == pytest.approx(0.8)
    assert set(data["stage_s"]) == set(STAGES) and data["config"]["algo"]["group_size"] == 8
    assert paths["png"].stat().st_size > 1000


async def test_first_error_raises_the_first_failure_and_cancels_the_rest() -> None:
    cancelled = asyncio.Event()

    async def slow() -> None:
        try:
            await asyncio.sleep(30)
        except asyncio.CancelledError:
            cancelled.set()
            raise

    async def fail() -> None:
        await asyncio.sleep(0.01)
        raise KeyError("boom")

    with pytest.raises(KeyError, match="boom"):
        await first_error(slow(), fail())
    assert cancelled.is_set()

    async def value(v: int) -> int:
        return v

    assert await first_error(value(1), value(2)) == [1, 2]
    assert await first_error() == []  # a stage without workers (no eval workers)
