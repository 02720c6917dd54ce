"""``ray.util.state``: list and get the cluster's actors and nodes (``list_actors``,
``list_nodes``, ``get_actor``, ``get_node``), with Ray's arguments, filters and records.

Filters are ``(column, "=" | "!=", value)`` triples, all of which must hold; values compare
as strings, ``state`` without regard to case. The records come from the head, the cluster's
one table: live actors only (a dead actor's record is gone; Ray keeps it for a while),
``job_id`` None (the head does not record which driver spawned an actor).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, TypeVar

from rayless.ray.util.state.common import ActorState, NodeState, StateSchema
from rayless.ray.util.state.exception import RayStateApiException

__all__ = [
    "ActorState",
    "NodeState",
    "RayStateApiException",
    "get_actor",
    "get_node",
    "list_actors",
    "list_nodes",
]

S = TypeVar("S", bound=StateSchema)
_PREDICATES = ("=", "!=")
_STATES = {"pending": "PENDING_CREATION", "alive": "ALIVE", "restarting": "RESTARTING"}
_TASK_WORKER = "TaskWorker"  # rayless.ray's task workers: its own, not the user's actors


def _check_filters(filters: Sequence[tuple[str, str, Any]] | None, cls: type[S]) -> None:
    for entry in filters or ():
        if len(entry) != 3:
            raise ValueError(f"a filter is (column, predicate, value), got {entry!r}")
        column, predicate, _ = entry
        if predicate not in _PREDICATES:
            raise ValueError(
                f"Unsupported filter predicate {predicate} is given. Available predicates: "
                f"{', '.join(_PREDICATES)}."
            )
        if column not in cls.columns():
            raise RayStateApiException(f"The given filter column {column} is not supported.")


def _matches(record: StateSchema, filters: Sequence[tuple[str, str, Any]] | None) -> bool:
    for column, predicate, value in filters or ():
        have, want = str(record[column]), str(value)
        if column == "state":
            have, want = have.upper(), want.upper()
        if (have == want) != (predicate == "="):
            return False
    return True


def _select(
    records: list[S], filters: Sequence[tuple[str, str, Any]] | None, limit: int | None
) -> list[S]:
    found = [r for r in records if _matches(r, filters)]
    return found if limit is None else found[: max(int(limit), 0)]


def _actors() -> list[ActorState]:
    from rayless.ray import _worker

    s = _worker.session()

    async def views() -> list[Any]:
        cluster = await s.cluster()
        return list((await cluster.list_actors(limit=None)).actors)

    out = []
    for view in _worker.run(s, views()):
        if view.cls == _TASK_WORKER and not view.named:
            continue
        namespace, name = None, ""
        if view.named:
            ns, _, name = view.name.rpartition("/")
            namespace = ns or None
        resources = {"CPU": float(view.cpus)}
        if view.gpus:
            resources["GPU"] = float(len(view.gpus.split(",")))
        out.append(
            ActorState(
                actor_id=view.actor_id,
                class_name=view.cls,
                state=_STATES.get(view.state.value, view.state.value.upper()),
                job_id=None,
                name=name,
                node_id=view.node_id,
                pid=view.pid,
                ray_namespace=namespace,
                required_resources=resources,
                num_restarts=view.restarts,
                repr_name="",
            )
        )
    return out


def _nodes() -> list[NodeState]:
    from rayless import ray

    out = []
    for i, row in enumerate(ray.nodes()):
        raw = row["_raw"]
        rank = raw.get("rank")
        out.append(
            NodeState(
                node_id=row["NodeID"],
                node_ip=row["NodeManagerAddress"],
                is_head_node=rank == 0 or (rank is None and i == 0),
                state="ALIVE" if row["Alive"] else "DEAD",
                state_message=None,
                node_name=row["NodeName"],
                resources_total=dict(row["Resources"]),
                labels={"ray.io/node-id": row["NodeID"]},
            )
        )
    return out


def list_actors(
    address: str | None = None,
    filters: Sequence[tuple[str, str, Any]] | None = None,
    limit: int = 100,
    timeout: int = 30,
    detail: bool = False,
    raise_on_missing_output: bool = True,
    _explain: bool = False,
) -> list[ActorState]:
    """The live actors that pass ``filters``, at most ``limit`` of them.

    Raises ValueError for a malformed filter or predicate, RayStateApiException for a
    column that does not exist.
    """
    _check_filters(filters, ActorState)
    return _select(_actors(), filters, limit)


def list_nodes(
    address: str | None = None,
    filters: Sequence[tuple[str, str, Any]] | None = None,
    limit: int = 100,
    timeout: int = 30,
    detail: bool = False,
    raise_on_missing_output: bool = True,
    _explain: bool = False,
) -> list[NodeState]:
    """The cluster's nodes that pass ``filters``, at most ``limit`` of them (errors as
    :func:`list_actors`)."""
    _check_filters(filters, NodeState)
    return _select(_nodes(), filters, limit)


def get_actor(
    id: str, address: str | None = None, timeout: int = 30, _explain: bool = False
) -> ActorState | None:
    """The live actor whose id is ``id`` (``handle._actor_id.hex()``), or None."""
    found = [a for a in _actors() if a.actor_id == id]
    return found[0] if found else None


def get_node(
    id: str, address: str | None = None, timeout: int = 30, _explain: bool = False
) -> NodeState | None:
    """The node whose id is ``id``, or None."""
    found = [n for n in _nodes() if n.node_id == id]
    return found[0] if found else None
