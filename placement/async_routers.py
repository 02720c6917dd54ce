"""The async-mode routers: min-load (:class:`SimpleRouter`) and :class:`NodeAffinityRouter`.

Each ``assign(current_loads, num_tasks, env_ids=None)`` turns the policies' loads into a
policy index per request, never mutating the caller's list; ``route`` probes the loads first
(``placement.policies.probe_loads``). The contract and the deliberate differences from the
reference are in ``placement.routing``.
"""

from __future__ import annotations

import bisect
import heapq
from abc import ABC, abstractmethod
from collections.abc import Sequence
from typing import Any

from rayless.placement.policies import Distribution, env_nodes, env_worker_index, probe_loads


def _min_load_order(loads: Sequence[int], num_tasks: int) -> list[int]:
    """The reference heap's pick sequence, built level by level."""
    if num_tasks <= 64 or len(loads) * 4 > num_tasks:
        heap = [(int(v), i) for i, v in enumerate(loads)]
        heapq.heapify(heap)
        out = []
        for _ in range(num_tasks):
            load, idx = heap[0]
            out.append(idx)
            heapq.heapreplace(heap, (load + 1, idx))
        return out
    order = sorted(range(len(loads)), key=lambda i: (int(loads[i]), i))
    out = []
    active: list[int] = []
    pos = 0
    level = int(loads[order[0]])
    while len(out) < num_tasks:
        while pos < len(order) and int(loads[order[pos]]) <= level:
            bisect.insort(active, order[pos])
            pos += 1
        need = num_tasks - len(out)
        if pos == len(order):  # everyone active: whole rounds at once
            rounds, rest = divmod(need, len(active))
            out.extend(active * rounds)
            out.extend(active[:rest])
            break
        nxt = int(loads[order[pos]])
        span = nxt - level
        if span * len(active) <= need:
            out.extend(active * span)
            level = nxt
        else:
            rounds, rest = divmod(need, len(active))
            out.extend(active * rounds)
            out.extend(active[:rest])
    return out


class AsyncRouter(ABC):
    """Routes a batch of requests given the policies' current loads (async rollout mode)."""

    @abstractmethod
    def assign(
        self, current_loads: Sequence[int], num_tasks: int, env_ids: Sequence[str] | None = None
    ) -> list[int]:
        """Policy index for each of ``num_tasks`` requests. Never mutates ``current_loads``."""

    async def route(
        self,
        policies: Sequence[Any],
        num_tasks: int,
        env_ids: Sequence[str] | None = None,
        *,
        probe_timeout: float = 1.0,
    ) -> list[int]:
        """Probe the policies' loads (:func:`probe_loads`) and :meth:`assign`."""
        if not policies:
            raise ValueError("No policies available for routing")
        return self.assign(await probe_loads(policies, probe_timeout), num_tasks, env_ids)


def _check(loads: Sequence[int], num_tasks: int) -> None:
    if not len(loads):
        raise ValueError("No policies available for routing")
    if num_tasks < 0:
        raise ValueError(f"num_tasks must be >= 0, got {num_tasks}")


class SimpleRouter(AsyncRouter):
    """Min-load router: each request goes to the least-loaded policy (ties: lowest index)."""

    def assign(
        self, current_loads: Sequence[int], num_tasks: int, env_ids: Sequence[str] | None = None
    ) -> list[int]:
        """The reference's min-heap order; ``env_ids`` is ignored."""
        _check(current_loads, num_tasks)
        return _min_load_order(current_loads, num_tasks) if num_tasks else []


class NodeAffinityRouter(AsyncRouter):
    """Sends each env's request to the least-loaded policy on the env worker's node."""

    def __init__(
        self, component_distribution: Distribution, policy_node_ids: Sequence[str] | None = None
    ) -> None:
        self._env_worker_to_node = env_nodes(component_distribution)
        self._policy_node_ids = list(policy_node_ids or [])
        self._by_node: dict[str, list[int]] = {}
        for i, nid in enumerate(self._policy_node_ids):
            self._by_node.setdefault(nid, []).append(i)

    @classmethod
    def from_policies(
        cls, component_distribution: Distribution, policies: Sequence[Any]
    ) -> NodeAffinityRouter:
        """Take the policies' node ids from their ``node_id`` attribute."""
        return cls(component_distribution, [str(p.node_id) for p in policies])

    def target_node(self, env_id: Any) -> str | None:
        """The node of the env's worker (None: unknown, see the env id rule)."""
        idx = env_worker_index(env_id)
        return self._env_worker_to_node.get(idx) if idx is not None else None

    def assign(
        self, current_loads: Sequence[int], num_tasks: int, env_ids: Sequence[str] | None = None
    ) -> list[int]:
        """One pick per env id (``num_tasks`` is then ignored); without env ids or policy
        nodes, min-load over all policies."""
        _check(current_loads, num_tasks)
        if not self._policy_node_ids or not env_ids:
            return SimpleRouter().assign(current_loads, num_tasks)
        if len(self._policy_node_ids) != len(current_loads):
            raise ValueError(
                f"{len(current_loads)} loads for {len(self._policy_node_ids)} policy node ids"
            )
        loads = list(current_loads)
        heaps: dict[str | None, list[tuple[int, int]]] = {}
        out = []
        for env_id in env_ids:
            node = self.target_node(env_id)
            key = node if node in self._by_node else None
            heap = heaps.get(key)
            if heap is None:
                members = self._by_node[key] if key is not None else range(len(loads))
                heap = [(loads[i], i) for i in members]
                heapq.heapify(heap)
                heaps[key] = heap
            while True:  # entries go stale when another heap picked the same policy
                load, idx = heap[0]
                if load == loads[idx]:
                    break
                heapq.heapreplace(heap, (loads[idx], idx))
            out.append(idx)
            loads[idx] += 1
            heapq.heapreplace(heap, (loads[idx], idx))
        return out


__all__ = ["AsyncRouter", "NodeAffinityRouter", "SimpleRouter"]
