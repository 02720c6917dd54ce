"""What the user sees: a progress line per iteration, the final tables, a JSON and a PNG."""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any, TextIO

from rayless.demo.config import PipelineConfig
from rayless.demo.pipeline import IterationStats, RunResult
from rayless.transport.ext import atomic_file, atomic_write

BAR = 24


def progress_line(row: IterationStats, cfg: PipelineConfig) -> str:
    """One line: a bar towards the target return, samples/s, return, version, staleness."""
    target = cfg.algo.target_return
    filled = int(BAR * max(0.0, min(1.0, row.mean_return / target))) if target > 0 else 0
    bar = "#" * filled + "." * (BAR - filled)
    return (
        f"it {row.iteration + 1:>3}/{cfg.algo.iterations} [{bar}] "
        f"return {row.mean_return:6.1f}/{target:g} | {row.samples_per_s:>8,.0f} samples/s | "
        f"policy v{row.version} | staleness {row.staleness} | loss {row.loss:7.3f} | "
        f"sync {row.weight_sync_s * 1e3:.1f} ms"
    )


def print_progress(row: IterationStats, cfg: PipelineConfig, out: TextIO | None = None) -> None:
    """Print the progress line of an iteration (every ``run.log_interval`` iterations)."""
    if (row.iteration + 1) % max(1, cfg.run.log_interval) == 0:
        print(progress_line(row, cfg), file=out or sys.stdout, flush=True)


def table(headers: list[str], rows: list[list[str]]) -> str:
    widths = [
        max(len(h), *(len(r[i]) for r in rows)) if rows else len(h) for i, h in enumerate(headers)
    ]
    line = "  ".join(h.ljust(w) for h, w in zip(headers, widths, strict=True))
    sep = "  ".join("-" * w for w in widths)
    body = ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)) for r in rows]
    return "\n".join([line, sep, *body])


def summary_text(result: RunResult) -> str:
    """The tables printed at the end of a run."""
    s = result.stages
    stages = table(
        ["stage", "throughput"],
        [
            ["env steps", f"{s['env_steps_per_s']:,.0f} steps/s"],
            ["inference", f"{s['inference_per_s']:,.0f} calls/s"],
            ["store put", f"{s['store_put_mb_s']:,.1f} MB/s"],
            ["store get", f"{s['store_get_mb_s']:,.1f} MB/s"],
            ["train", f"{s['train_samples_per_s']:,.0f} samples/s"],
        ],
    )
    syncs = sorted(r.weight_sync_s for r in result.iterations)
    if syncs:
        mid = syncs[len(syncs) // 2]
        sync_line = (
            f"weight sync: {len(syncs)} syncs, median {mid * 1e3:.1f} ms, "
            f"max {syncs[-1] * 1e3:.1f} ms (publish until every eval worker pulled)"
        )
    else:
        sync_line = "weight sync: none"
    placement = placement_table(result.placement)
    verdict = "SOLVED" if result.solved else "NOT solved"
    outcome = (
        f"{verdict}: mean return {result.final_return:.1f} (target {result.target_return:g}) "
        f"after {len(result.iterations)} iterations, {result.wall_s:.1f} s of training "
        f"(+{result.setup_s:.1f} s setup), mode {result.mode}"
    )
    return f"\nThroughput per stage\n{stages}\n{sync_line}\n\nPlacement\n{placement}\n\n{outcome}"


def placement_table(placement: list[dict[str, Any]]) -> str:
    """The placement of a run's workers as a text table (both demos' summaries)."""
    return table(
        ["worker", "node", "GPUs", "GPU share", "CPUs"],
        [
            [p["worker"], p["node"], p["gpus"], f"{p['gpu_share']:g}", f"{p['cpus']:g}"]
            for p in placement
        ],
    )


def write_files(
    result: Any, out_dir: Path, cfg: Any, plot: Callable[[Any, Path], bool]
) -> dict[str, Path]:
    """Write ``metrics.json`` (``result.to_dict()`` with ``cfg.to_dict()``) and, when ``plot``
    draws one (matplotlib installed), ``report.png`` into ``out_dir``."""
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = {"json": out_dir / "metrics.json"}
    data: dict[str, Any] = result.to_dict()
    data["config"] = cfg.to_dict()
    atomic_write(paths["json"], json.dumps(data, indent=2))
    png = out_dir / "report.png"
    if plot(result, png):
        paths["png"] = png
    return paths


def pyplot() -> Any:
    """matplotlib's pyplot on the Agg backend, or None (with a note) when it is missing."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib is not installed: no PNG (pip install matplotlib)", file=sys.stderr)
        return None
    return plt


def write_report(result: RunResult, out_dir: Path, cfg: PipelineConfig) -> dict[str, Path]:
    """Write ``metrics.json`` and (with matplotlib) ``report.png`` into ``out_dir``."""
    return write_files(result, out_dir, cfg, _plot)


def _plot(result: RunResult, path: Path) -> bool:
    plt = pyplot()
    if plt is None:
        return False
    its = [r.iteration + 1 for r in result.iterations]
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 4))
    ax1.plot(its, [r.mean_return for r in result.iterations], marker="o", ms=3)
    ax1.axhline(result.target_return, color="grey", ls="--", label="target")
    ax1.set(
        xlabel="iteration",
        ylabel="mean return (last 100 episodes)",
        title=f"Learning curve ({result.mode} mode)",
    )
    ax1.legend()
    ax2.plot(its, [r.samples_per_s for r in result.iterations], color="tab:green")
    ax2.set(xlabel="iteration", ylabel="samples/s", title="Throughput per iteration")
    fig.tight_layout()
    save_figure(fig, path)
    plt.close(fig)
    return True


def save_figure(fig: Any, path: Path) -> None:
    """Write ``fig`` as a PNG to ``path`` (atomically: ``transport.files``)."""
    with atomic_file(path, "wb") as f:
        fig.savefig(f, format="png", dpi=100)


def default_out_dir(cfg: PipelineConfig) -> Path:
    """``./runs/<timestamp>`` under the current directory (or the config's output_dir)."""
    import time

    base = Path(os.getcwd()) / "runs"
    if cfg.run.output_dir and cfg.run.output_dir != "runs/demo":
        base = Path(cfg.run.output_dir)
    return base / time.strftime("%Y%m%d-%H%M%S")
