"""The options of ``ray.remote(...)`` and ``.options(...)``: checked once, and turned into
where a rayless actor or task worker is spawned.

Every option Ray has that rayless cannot honour raises ValueError naming it, rather than
being ignored; the few accepted without an effect are listed in ``IGNORED``.
"""

from __future__ import annotations

import asyncio
import difflib
import shlex
import sys
from dataclasses import dataclass, field
from typing import Any

from rayless.actors import Template
from rayless.actors.ext import Package, PackageRef
from rayless.errors import PlacementError
from rayless.ray import _worker
from rayless.ray.util.placement_group import Bundle, PlacementGroup
from rayless.ray.util.scheduling_strategies import (
    STRING_STRATEGIES,
    NodeAffinitySchedulingStrategy,
    PlacementGroupSchedulingStrategy,
)

__all__ = [
    "ACTOR_OPTIONS",
    "TASK_OPTIONS",
    "Placement",
    "check",
    "check_group",
    "env_for",
    "executable_for",
    "packages_for",
    "place",
    "template_for",
]

COMMON = frozenset(
    {
        "num_cpus",
        "num_gpus",
        "resources",
        "memory",
        "runtime_env",
        "scheduling_strategy",
        "name",
        "namespace",
        "accelerator_type",
        "label_selector",
        "placement_group",
        "placement_group_bundle_index",
        "placement_group_capture_child_tasks",
        "_metadata",
    }
)
ACTOR_OPTIONS = COMMON | {
    "max_restarts",
    "max_task_retries",
    "max_concurrency",
    "lifetime",
    "get_if_exists",
    "concurrency_groups",
    "max_pending_calls",
    "allow_out_of_order_execution",
    "enable_task_events",
}
TASK_OPTIONS = COMMON | {"num_returns", "max_retries", "retry_exceptions", "max_calls"}
# accepted without an effect (documented): memory is not a scheduled resource here
IGNORED = frozenset({"memory", "max_pending_calls", "enable_task_events", "_metadata", "max_calls"})


def check(options: dict[str, Any], allowed: frozenset[str], what: str) -> dict[str, Any]:
    """``options`` checked for ``what`` ("actor" or "task").

    Raises:
        ValueError: an unknown option, or one rayless.ray cannot honour (named, with why).
    """
    unknown = sorted(set(options) - allowed)
    if unknown:
        close = {k: difflib.get_close_matches(k, allowed, n=1) for k in unknown}
        hints = [f"{k!r} (did you mean {m[0]!r}?)" for k, m in close.items() if m]
        hint = f"; {', '.join(hints)}" if hints else ""
        raise ValueError(f"unknown or unsupported {what} options: {unknown}{hint}")
    if options.get("lifetime") not in (None, "non_detached", "detached"):
        raise ValueError(
            f"lifetime must be None, 'detached' or 'non_detached', got {options['lifetime']!r}"
        )
    if options.get("get_if_exists") and not options.get("name"):
        raise ValueError("get_if_exists=True needs a name")
    groups = options.get("concurrency_groups")
    if groups is not None and not isinstance(groups, dict):
        raise ValueError(f"concurrency_groups must be a dict of name -> int, got {groups!r}")
    for key in ("accelerator_type", "label_selector"):
        if options.get(key):
            raise ValueError(f"{key} is not supported by rayless.ray")
    resources = options.get("resources") or {}
    other = sorted(k for k in resources if not k.startswith("node:"))
    if other:
        raise ValueError(
            f"custom resources {other} are not supported by rayless.ray (only 'node:<ip>' "
            "pins); use num_cpus/num_gpus or a scheduling strategy"
        )
    for key in ("num_cpus", "num_gpus"):
        value = options.get(key)
        if value is not None and (
            isinstance(value, bool) or not isinstance(value, (int, float)) or value < 0
        ):
            raise ValueError(f"{key} must be a number >= 0, got {value!r}")
    _worker.parse_runtime_env(options.get("runtime_env"))
    return dict(options)


def check_group(options: dict[str, Any]) -> None:
    """Raise ValueError at once when ``options`` schedule into a removed placement group."""
    strategy = _strategy(options)
    if isinstance(strategy, PlacementGroupSchedulingStrategy):
        pg = strategy.placement_group
        if pg.removed:
            raise ValueError(f"placement group {pg.name or pg.id.hex()} was removed")
        pg.bundle(strategy.placement_group_bundle_index)  # the index in range


@dataclass
class Placement:
    """Where to spawn: a node, exact GPUs, and the bundle the GPUs are taken from."""

    node: str | None = None
    gpu_indices: tuple[int, ...] | None = None
    group: PlacementGroup | None = None
    bundle: Bundle | None = None
    gpus: float = 0.0
    soft_node: bool = False
    key: tuple[Any, ...] = field(default_factory=tuple)

    def release(self) -> None:
        """Give the bundle's GPUs back."""
        if self.bundle is not None and self.gpu_indices:
            self.bundle.give_back(self.gpus, self.gpu_indices)
            self.gpu_indices = None


def _strategy(options: dict[str, Any]) -> Any:
    strategy = options.get("scheduling_strategy")
    if options.get("placement_group") not in (None, "default"):
        strategy = PlacementGroupSchedulingStrategy(
            options["placement_group"], options.get("placement_group_bundle_index", -1)
        )
    return strategy


async def place(s: _worker.Session, options: dict[str, Any]) -> Placement:
    """Where ``options`` put an actor or task, its bundle GPUs reserved.

    Raises:
        ValueError: an unknown strategy or bundle index, a removed group.
        PlacementError: the bundle has no room for the GPUs asked for; no node has the IP of
            a ``node:<ip>`` resource.
    """
    gpus = float(options.get("num_gpus") or 0)
    strategy = _strategy(options)
    out = Placement(gpus=gpus)
    if isinstance(strategy, PlacementGroupSchedulingStrategy):
        pg = strategy.placement_group
        index = strategy.placement_group_bundle_index
        if index == -1:
            errors = []
            for i, b in enumerate(pg.bundles):
                try:
                    return _in_bundle(pg, i, b, gpus)
                except PlacementError as exc:
                    errors.append(str(exc))
            raise PlacementError(f"no bundle of {pg!r} has room: {'; '.join(errors)}")
        return _in_bundle(pg, index, pg.bundle(index), gpus)
    if isinstance(strategy, NodeAffinitySchedulingStrategy):
        out.node = strategy.node_id
        out.soft_node = strategy.soft
    elif strategy is not None and strategy not in STRING_STRATEGIES:
        raise ValueError(f"unknown scheduling_strategy {strategy!r}")
    pins = [k[len("node:") :] for k in options.get("resources") or {}]
    if pins:
        cluster = await s.cluster()
        nodes = await cluster.nodes(actors=False)
        match = [n["node_id"] for n in nodes if n.get("ip") == pins[0] and n.get("alive", True)]
        if not match:
            raise PlacementError(f"no live node has the IP {pins[0]} (resources={{'node:...'}})")
        out.node = match[0]
    out.key = (out.node,)
    return out


def _in_bundle(pg: PlacementGroup, index: int, bundle: Bundle, gpus: float) -> Placement:
    if pg.removed:
        raise ValueError(f"placement group {pg.name or pg.id.hex()} was removed")
    indices = bundle.take(gpus, index)
    return Placement(
        node=bundle.node_id,
        gpu_indices=indices or None,
        group=pg,
        bundle=bundle,
        gpus=gpus,
        key=(bundle.node_id, indices),
    )


def env_for(
    s: _worker.Session,
    options: dict[str, Any],
    packages: tuple[Package | PackageRef, ...] = (),
) -> dict[str, str]:
    """The environment of a spawned actor or worker: the session's and the options'
    ``runtime_env`` variables, the namespace and job id its ``ray`` calls use, and what its
    own actors and tasks inherit (its ``py_executable`` and ``packages``)."""
    env = {**s.env_vars, **_worker.check_runtime_env(options.get("runtime_env"))}
    env[_worker.ENV_JOB_ID] = s.job_id
    ns = options.get("namespace") if options.get("namespace") is not None else s.namespace
    if ns is not None:
        env[_worker.ENV_NAMESPACE] = ns
    env[_worker.ENV_ANONYMOUS_NAMESPACE] = s.anonymous_namespace
    if s.env_vars:
        env[_worker.ENV_ENV_VARS] = ",".join(sorted(s.env_vars))
    executable = executable_for(s, options)
    if executable:  # its own actors and tasks run under it too, as Ray's inherit it
        env[_worker.ENV_PY_EXECUTABLE] = shlex.join(executable)
    if packages:
        env[_worker.ENV_PACKAGES] = _worker.encode_packages(tuple(_ref(p) for p in packages))
    return env


async def packages_for(
    s: _worker.Session, options: dict[str, Any]
) -> tuple[Package | PackageRef, ...]:
    """The files a spawned actor or worker gets: the options' ``runtime_env``
    ``working_dir`` and ``py_modules``, each in place of the session's (packed in a thread:
    it reads them).

    Raises:
        ValueError: a path that is not there, a URI.
        PackageError: files too big to ship.
    """
    renv = _worker.parse_runtime_env(options.get("runtime_env"))
    if not renv.ships:
        return s.packages
    own = await asyncio.to_thread(renv.packages)
    if renv.working_dir is not None:
        wd: tuple[Package | PackageRef, ...] = own[:1]
    else:
        wd = tuple(p for p in s.packages if _ref(p).working_dir)
    if renv.py_modules is not None:
        mods: tuple[Package | PackageRef, ...] = own[len(wd) if renv.working_dir else 0 :]
    else:
        mods = tuple(p for p in s.packages if not _ref(p).working_dir)
    return wd + mods


def _ref(package: Package | PackageRef) -> PackageRef:
    return package.ref if isinstance(package, Package) else package


def executable_for(s: _worker.Session, options: dict[str, Any]) -> tuple[str, ...]:
    """The command that runs a spawned actor's or worker's Python: the options'
    ``runtime_env`` ``py_executable``, else the session's (empty: the node's own)."""
    own = _worker.parse_runtime_env(options.get("runtime_env")).py_executable
    return own or s.py_executable


def template_for() -> Template:
    """The fork template a new actor or task worker starts from: the torch template when
    this process has imported torch or numpy (rayless' codec imports torch for either, so
    their values would make a light actor import it), else the light one. A Ray program
    that uses neither then starts its actors and task workers at once instead of waiting
    (~2 s) for the torch template's warm-up; one of them that imports torch later pays that
    import itself (~2 s, its own memory), as a Ray worker does."""
    modules = sys.modules
    return Template.TORCH if "torch" in modules or "numpy" in modules else Template.LIGHT
