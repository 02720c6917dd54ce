"""What a GRPO run shows: a progress line per iteration, the closing tables, JSON and PNG.

``report.png`` holds the reward curve (training responses and held-out prompts, with the
target), the response-length curve and a timeline of the stages (rollout, reward,
reference, train, weight sync) per iteration, so a user sees where the time goes and, in
async mode, what overlaps.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import TextIO

from rayless.demo.grpo_config import GrpoConfig
from rayless.demo.grpo_pipeline import LANES, STAGES, GrpoIteration, GrpoResult
from rayless.demo.report import BAR, placement_table, pyplot, save_figure, table, write_files

COLOURS = {
    "rollout": "tab:blue",
    "reward": "tab:orange",
    "reference": "tab:purple",
    "train": "tab:green",
    "weight_sync": "tab:red",
    "eval": "tab:grey",
}


def grpo_progress_line(row: GrpoIteration, cfg: GrpoConfig) -> str:
    """One line: a bar towards the target, rewards, length, samples/s, version, stages."""
    target = cfg.algo.target_reward
    shown = row.eval_reward if row.eval_reward is not None else row.mean_reward
    filled = int(BAR * max(0.0, min(1.0, shown / target))) if target > 0 else 0
    bar = "#" * filled + "." * (BAR - filled)
    held_out = f"{row.eval_reward:.3f}" if row.eval_reward is not None else "  -  "
    stages = " ".join(f"{s[:3]} {row.stage_s.get(s, 0.0):.2f}" for s in STAGES)
    return (
        f"it {row.iteration + 1:>3}/{cfg.algo.iterations} [{bar}] reward {row.mean_reward:.3f} "
        f"held-out {held_out}/{target:g} | len {row.response_length:.2f} | "
        f"{row.samples_per_s:>5,.0f} samples/s | v{row.version} stale {row.staleness} | "
        f"kl {row.kl:.3f} | s: {stages}"
    )


def print_grpo_progress(row: GrpoIteration, cfg: GrpoConfig, out: TextIO | None = None) -> None:
    """Print the progress line (every ``run.log_interval`` iterations, and evaluations)."""
    if (row.iteration + 1) % max(1, cfg.run.log_interval) == 0 or row.eval_reward is not None:
        print(grpo_progress_line(row, cfg), file=out or sys.stdout, flush=True)


def grpo_summary_text(result: GrpoResult) -> str:
    """The tables printed at the end of a run."""
    its = result.iterations
    n = max(1, len(its))
    rows = []
    for s in STAGES:
        total = sum(it.stage_s.get(s, 0.0) for it in its)
        rows.append([s.replace("_", " "), f"{total:.1f} s", f"{total / n * 1e3:.0f} ms"])
    stages = table(["stage", "total", "per iteration"], rows)
    t = result.totals
    moved = (
        f"samples: {t.get('rollout_samples', 0):.0f} generated, {t.get('rewarded', 0):.0f} "
        f"rewarded ({t.get('rewarded_on_node', 0):.0f} on the rollout worker's node), "
        f"{t.get('referenced', 0):.0f} with reference log-probs, "
        f"{t.get('trained', 0):.0f} trained on; {t.get('weight_syncs', 0):.0f} weight syncs"
    )
    placement = placement_table(result.placement)
    verdict = "SOLVED" if result.solved else "NOT solved"
    outcome = (
        f"{verdict}: held-out mean reward {result.warm_reward:.3f} after the warm start -> "
        f"{result.final_reward:.3f} (best {result.best_reward:.3f}, target "
        f"{result.target_reward:g}) after {len(its)} iterations, {result.wall_s:.1f} s of "
        f"GRPO (+{result.warm_start_s:.1f} s warm start, +{result.setup_s:.1f} s setup), "
        f"mode {result.mode}"
    )
    return f"\nTime per stage\n{stages}\n{moved}\n\nPlacement\n{placement}\n\n{outcome}"


def write_grpo_report(result: GrpoResult, out_dir: Path, cfg: GrpoConfig) -> dict[str, Path]:
    """Write ``metrics.json`` and (with matplotlib) ``report.png`` into ``out_dir``."""
    return write_files(result, out_dir, cfg, _plot)


def _plot(result: GrpoResult, path: Path) -> bool:
    plt = pyplot()
    if plt is None:
        return False
    its = result.iterations
    x = [r.iteration + 1 for r in its]
    fig = plt.figure(figsize=(13, 8))
    grid = fig.add_gridspec(2, 2, height_ratios=[1, 1.1])
    ax1, ax2, ax3 = (
        fig.add_subplot(grid[0, 0]),
        fig.add_subplot(grid[0, 1]),
        fig.add_subplot(grid[1, :]),
    )
    ax1.plot(x, [r.mean_reward for r in its], lw=1, label="training responses")
    ev = [(0, result.warm_reward)] + [
        (r.iteration + 1, r.eval_reward) for r in its if r.eval_reward is not None
    ]
    ax1.plot([e[0] for e in ev], [e[1] for e in ev], marker="o", ms=3, label="held-out prompts")
    ax1.axhline(result.target_reward, color="grey", ls="--", label="target")
    ax1.set(xlabel="iteration", ylabel="mean reward", ylim=(0, 1.02))
    ax1.set_title(f"Reward ({result.mode} mode; iteration 0 = warm start)")
    ax1.legend(loc="lower right")
    ax2.plot(x, [r.response_length for r in its], color="tab:brown", label="responses")
    ax2.plot(x, [r.answer_length for r in its], color="grey", ls=":", label="right answers")
    ax2.legend(loc="upper right")
    ax2.set(xlabel="iteration", ylabel="tokens (incl. stop token)", title="Mean response length")
    for lane, stage in enumerate(LANES):
        bars = [(a, max(b - a, 1e-3)) for r in its for s, a, b in r.intervals if s == stage]
        ax3.broken_barh(bars, (lane - 0.4, 0.8), color=COLOURS[stage])
    starts = [min((a for _, a, _ in r.intervals), default=0.0) for r in its]
    for s in starts[:: max(1, len(starts) // 40)]:
        ax3.axvline(s, color="lightgrey", lw=0.5, zorder=0)
    names = [s.replace("_", " ") for s in STAGES] + ["held-out eval"]
    ax3.set_yticks(range(len(LANES)), names)
    ax3.invert_yaxis()
    ax3.set(xlabel="seconds since the first iteration", title="Stages per iteration (timeline)")
    fig.tight_layout()
    save_figure(fig, path)
    plt.close(fig)
    return True
