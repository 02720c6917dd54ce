"""What each component asks for: worker counts, CPUs and (fractional) GPUs per worker.

``Scheduling(worker_num, num_cpus, num_gpus, node_list=None)`` and
``ComponentScheduling(env_worker, train_worker, eval_worker, buffer_worker)`` are the
constructors the reference planner is fed with.

Rules and deliberate differences from the reference:

* Validation at construction (ValueError): ``worker_num`` is an int >= 0 or ``"auto"``;
  ``num_cpus >= 0``; ``num_gpus`` is in ``[0, 1]`` or a whole number (a worker never holds
  1.5 GPUs). ``"auto"`` is accepted for the buffer only (its count is the number of nodes that
  hold train workers); the reference accepted it anywhere and silently counted 0 resources.
* ``get_component_requirements`` / ``train_pool_requirements`` return the reference's figures:
  GPU fractions summed as given (3 workers of 0.25 GPU → 0.75). The planner sizes pools with
  the **packing-aware** whole-GPU figures of :meth:`ComponentScheduling.component_gpus_needed`
  / :meth:`ComponentScheduling.train_pool_gpus_needed`: ``k`` workers of ``f < 1`` GPU need
  ``ceil(k / floor(1/f))`` GPUs (3 workers of 0.6 need 3, not ``ceil(1.8) = 2``), each env
  group counted on its own GPUs (the reference truncated the raw sum while planning).
* ``node_list`` (a comma-separated string or a list of node ids) restricts where the
  component's workers are packed (see ``placement.packing``).
* ``infer_auto_buffer_worker_num`` / ``adjust_buffer_worker_num`` are kept; the packer does
  not mutate the scheduling, it resolves the buffer count itself.
"""

from __future__ import annotations

import dataclasses
import logging
import math
from collections.abc import Mapping, Sequence
from typing import Any, Literal, Union

__all__ = ["ComponentScheduling", "Scheduling"]

log = logging.getLogger(__name__)

_EPS = 1e-9
WorkerNum = Union[int, Literal["auto"]]


@dataclasses.dataclass
class Scheduling:
    """Resources for one worker type: ``worker_num`` workers of ``num_cpus``/``num_gpus`` each."""

    worker_num: WorkerNum
    num_cpus: float
    num_gpus: float
    node_list: str | Sequence[str] | None = None

    def __post_init__(self) -> None:
        if self.worker_num != "auto" and (
            isinstance(self.worker_num, bool)
            or not isinstance(self.worker_num, int)
            or self.worker_num < 0
        ):
            raise ValueError(f"worker_num must be an int >= 0 or 'auto', got {self.worker_num!r}")
        for name in ("num_cpus", "num_gpus"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or value < 0:
                raise ValueError(f"{name} must be a number >= 0, got {value!r}")
            if not math.isfinite(value):
                raise ValueError(f"{name} must be finite, got {value!r}")
        g = float(self.num_gpus)
        if g > 1 and abs(g - round(g)) > _EPS:
            raise ValueError(
                f"num_gpus={g}: a worker takes a fraction of one GPU or a whole number of GPUs"
            )

    @property
    def count(self) -> int:
        """``worker_num`` with ``"auto"`` read as 0 (not yet resolved)."""
        return 0 if self.worker_num == "auto" else int(self.worker_num)

    @property
    def nodes(self) -> tuple[str, ...] | None:
        """``node_list`` as a tuple of node ids, or None when unrestricted."""
        if self.node_list is None:
            return None
        items = self.node_list.split(",") if isinstance(self.node_list, str) else self.node_list
        nodes = tuple(str(n).strip() for n in items if str(n).strip())
        return nodes or None

    @property
    def workers_per_gpu(self) -> int:
        """How many workers share one GPU (1 for whole-GPU workers, 0 for CPU-only)."""
        g = float(self.num_gpus)
        if g <= _EPS:
            return 0
        if g >= 1 - _EPS:
            return 1
        return math.floor(1.0 / g + _EPS)

    @property
    def gpus_per_worker(self) -> int:
        """Whole GPUs one worker holds (1 for a fraction, 0 for CPU-only)."""
        g = float(self.num_gpus)
        if g <= _EPS:
            return 0
        return max(1, round(g))

    def total_gpus(self) -> float:
        """Raw sum of GPU fractions (the reference's figure; ``"auto"`` counts 0)."""
        return self.count * float(self.num_gpus)

    def total_cpus(self) -> float:
        """CPUs of all workers (``"auto"`` counts 0)."""
        return self.count * self.num_cpus

    def gpus_needed(self, count: int | None = None) -> int:
        """Whole GPUs that ``count`` (default: all) workers occupy once packed."""
        n = self.count if count is None else count
        per = self.workers_per_gpu
        if per == 0 or n == 0:
            return 0
        if float(self.num_gpus) >= 1 - _EPS:
            return n * self.gpus_per_worker
        return -(-n // per)

    def to_dict(self) -> dict[str, Any]:
        """Plain values."""
        return {
            "worker_num": self.worker_num,
            "num_cpus": self.num_cpus,
            "num_gpus": self.num_gpus,
            "node_list": self.node_list
            if not isinstance(self.node_list, tuple)
            else list(self.node_list),
        }


@dataclasses.dataclass
class ComponentScheduling:
    """Requirements of every component: env groups, train, eval (rollout policy), buffer."""

    env_worker: list[Scheduling] | None = None
    train_worker: Scheduling | None = None
    eval_worker: Scheduling | None = None
    buffer_worker: Scheduling | None = None

    def __post_init__(self) -> None:
        if self.env_worker is not None and not isinstance(self.env_worker, (list, tuple)):
            raise ValueError("env_worker must be a list of Scheduling (one per env group)")
        self.env_worker = list(self.env_worker) if self.env_worker is not None else None
        named = [("train_worker", self.train_worker), ("eval_worker", self.eval_worker)]
        named += [(f"env_worker[{i}]", s) for i, s in enumerate(self.env_worker or [])]
        for name, sched in [*named, ("buffer_worker", self.buffer_worker)]:
            if sched is not None and not isinstance(sched, Scheduling):
                raise ValueError(f"{name} must be a Scheduling, got {type(sched).__name__}")
        for name, sched in named:
            if sched is not None and sched.worker_num == "auto":
                raise ValueError(
                    f"{name}.worker_num='auto' is only supported for buffer_worker; "
                    "give an explicit count"
                )
        if self.buffer_worker is not None and self.buffer_worker.num_gpus > 1:
            raise ValueError("buffer_worker.num_gpus must be <= 1")

    def groups(self, component_type: str) -> list[Scheduling]:
        """The Scheduling entries of a component (env may have several). ValueError if unknown."""
        if component_type == "env":
            return list(self.env_worker or [])
        if component_type not in ("train", "eval", "buffer"):
            raise ValueError(
                f"Invalid component type: {component_type!r} (expected train, eval, env, buffer)"
            )
        sched = getattr(self, f"{component_type}_worker")
        return [sched] if sched is not None else []

    def worker_count(self, component_type: str) -> int:
        """Workers of a component (``"auto"`` buffer counts 0 until resolved)."""
        return sum(s.count for s in self.groups(component_type))

    def get_component_requirements(self, component_type: str) -> tuple[float, float]:
        """``(GPUs, CPUs)`` of one component, summed as given (the reference's figures: 3
        workers of 0.25 GPU → 0.75). ValueError for an unknown component."""
        groups = self.groups(component_type)
        return sum(s.count * s.num_gpus for s in groups), sum(s.total_cpus() for s in groups)

    def train_pool_requirements(self) -> tuple[float, float]:
        """``(GPUs, CPUs)`` of the train pool: train + buffer, summed as given."""
        tg, tc = self.get_component_requirements("train")
        bg, bc = self.get_component_requirements("buffer")
        return tg + bg, tc + bc

    def rollout_pool_requirements(self) -> tuple[float, float]:
        """``(GPUs, CPUs)`` of the rollout pool: eval + env (no device sharing), as given."""
        eg, ec = self.get_component_requirements("eval")
        vg, vc = self.get_component_requirements("env")
        return eg + vg, ec + vc

    def component_gpus_needed(self, component_type: str) -> int:
        """Whole GPUs the component's workers occupy once packed (what pools are sized with)."""
        return sum(s.gpus_needed() for s in self.groups(component_type))

    def train_pool_gpus_needed(self) -> int:
        """Whole GPUs of the train pool once packed: train + buffer."""
        return self.component_gpus_needed("train") + self.component_gpus_needed("buffer")

    def infer_auto_buffer_worker_num(self, cluster_info: Mapping[str, Any]) -> None:
        """Estimate an ``"auto"`` buffer count as ceil(train GPUs / GPUs per node) (mutates)."""
        if self.buffer_worker is None or self.buffer_worker.worker_num != "auto":
            return
        if self.train_worker is None:
            raise ValueError("train_worker must be configured when buffer_worker is 'auto'")
        nodes = list(cluster_info.get("node_id_to_resources", {}).values())
        per_node = max((int(n.get("GPU", 0)) for n in nodes), default=0)
        if per_node <= 0:
            raise ValueError("cannot infer the buffer count: the cluster has no GPUs")
        self.buffer_worker.worker_num = math.ceil(self.train_worker.gpus_needed() / per_node)

    def adjust_buffer_worker_num(self, train_node_count: int) -> None:
        """Set the buffer count to ``train_node_count`` (one per train node; mutates)."""
        if self.buffer_worker is None:
            raise ValueError("buffer_worker must be configured")
        wn = self.buffer_worker.worker_num
        if wn != "auto" and wn != train_node_count:
            log.warning("Buffer worker number is set to %s, which will be ignored", wn)
        self.buffer_worker.worker_num = train_node_count

    def to_dict(self) -> dict[str, Any]:
        """Plain values."""
        return {
            "env": [e.to_dict() for e in self.env_worker] if self.env_worker else None,
            "train": self.train_worker.to_dict() if self.train_worker else None,
            "eval": self.eval_worker.to_dict() if self.eval_worker else None,
            "buffer": self.buffer_worker.to_dict() if self.buffer_worker else None,
        }

    def summary(self) -> str:
        """A human-readable summary."""
        lines = ["Component Scheduling Summary:"]
        for comp in ("train", "eval", "buffer"):
            for s in self.groups(comp):
                lines.append(
                    f"  {comp.capitalize()}: {s.worker_num} workers, {s.num_gpus} GPU/worker"
                )
        if self.env_worker:
            total = sum(e.count for e in self.env_worker)
            lines.append(f"  Env: {total} total workers across {len(self.env_worker)} groups")
        tg, tc = self.train_pool_requirements()
        rg, rc = self.rollout_pool_requirements()
        lines.append(f"  Train Pool: {tg} GPUs, {tc} CPUs")
        lines.append(f"  Rollout Pool: {rg} GPUs, {rc} CPUs")
        return "\n".join(lines)
