"""``ray.util.state.common``: the records the state API returns, with Ray's field names.

Each record is a dataclass whose fields are also read as items (``actor["state"]``), as
Ray's are.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

__all__ = ["ActorState", "NodeState", "StateSchema"]


class StateSchema:
    """What every record shares: item access to its fields and ``asdict``."""

    def __getitem__(self, key: str) -> Any:
        if key not in self.columns():
            raise KeyError(key)
        return getattr(self, key)

    def get(self, key: str, default: Any = None) -> Any:
        """The field ``key``, or ``default`` when there is no such field."""
        return getattr(self, key) if key in self.columns() else default

    def asdict(self) -> dict[str, Any]:
        """The fields as a dict."""
        return {name: getattr(self, name) for name in self.columns()}

    @classmethod
    def columns(cls) -> tuple[str, ...]:
        """The field names, in order (the columns a filter may name)."""
        return tuple(f.name for f in dataclasses.fields(cls))  # type: ignore[arg-type]


@dataclass
class ActorState(StateSchema):
    """An actor: ``state`` is ``"ALIVE"``, ``"PENDING_CREATION"`` or ``"RESTARTING"`` (the
    cluster lists live actors only), ``name`` "" when it was given none."""

    actor_id: str
    class_name: str
    state: str
    job_id: str | None
    name: str
    node_id: str
    pid: int | None
    ray_namespace: str | None
    serialized_runtime_env: str | None = None
    required_resources: dict[str, float] | None = None
    death_cause: dict[str, Any] | None = None
    is_detached: bool | None = None
    placement_group_id: str | None = None
    repr_name: str | None = None
    num_restarts: int | None = None
    num_restarts_due_to_lineage_reconstruction: int | None = None
    num_restarts_due_to_node_preemption: int | None = None
    call_site: str | None = None
    label_selector: dict[str, str] | None = None
    fallback_strategy: Any = None


@dataclass
class NodeState(StateSchema):
    """A node: ``state`` is ``"ALIVE"`` or ``"DEAD"``; ``is_head_node`` for the node of the
    cluster's head (rank 0, or a local cluster's first node)."""

    node_id: str
    node_ip: str
    is_head_node: bool
    state: str
    state_message: str | None
    node_name: str
    resources_total: dict[str, float]
    labels: dict[str, str] = field(default_factory=dict)
    start_time_ms: int | None = None
    end_time_ms: int | None = None
