"""Request routers: which policy (eval worker) serves the next rollout request.

**What a policy object must offer** (:class:`Policy`): a ``node_id`` attribute or property
(str, the node it runs on), and two coroutine methods — ``await check_idle() -> bool`` (no
request in flight) and ``await num_requests() -> int`` (requests in flight). Actor handles
satisfy it when ``handle.node_id`` is set and the actor class defines those two methods.
An object without ``check_idle`` is treated as always idle (a local policy), one without
``num_requests`` as load 0. The routers import no actors code.

* ``SimpleRouter`` — min-load: ``assign(loads, n)`` picks, n times, the least loaded index
  (ties: lowest index) and counts the pick; exactly the reference's heap order, computed level
  by level (fast for large n).
* ``NodeAffinityRouter`` — sends an env's request to the least-loaded policy on the env
  worker's node; falls back to the global least loaded when that node has no policy.
* ``SyncSimpleRouter`` — sync-rollout mode: ``select_policy(env_id=None)`` is a plain,
  thread-safe method (one lock, as in the reference) that hands out idle policies; when none is
  idle it probes the busy ones' ``check_idle()`` concurrently (each probe bounded by
  ``probe_timeout``) and waits with exponential back-off instead of spinning, blocking the
  calling thread; gives up with ``Timeout`` after ``timeout`` seconds (None: wait forever).
  The probes' coroutines run on a private event loop thread (``placement.sync_routers``), or
  through ``probe=`` — a plain callable ``probe(policies) -> list[bool]`` (e.g. one that goes
  through the sync facade of the runtime, for handles bound to another loop). Inside an event
  loop use ``await aselect_policy(env_id)`` (the probes then run on that loop); the blocking
  form called from a loop's thread raises RuntimeError rather than stall the loop.
* ``SyncNodeAffinityRouter`` — ``select_policy(env_id)``: per-node round-robin among the
  policies of the env's node (per-node locks), global round-robin fallback for env ids without
  a node; plain and thread-safe, never blocks on I/O (``aselect_policy`` is the same as a
  coroutine).
* ``create_router(rollout_mode, router_type, policies, global_resource_manager=None, *,
  component_distribution=None)``.
* :func:`probe_loads` — ``num_requests()`` of every policy at once, with a timeout.

**Env id rule** (:func:`env_worker_index`): the env worker index is the run of ASCII digits
after the last ``-`` (``"env-3"`` → 3, ``"walker-2-17"`` → 17). An id without one
(``"cartpole"``, ``"env-x"``, a non-str) has no node: routers fall back to the global choice.

Deliberate differences from the reference:

* One ``assign(current_loads, num_tasks, env_ids=None)`` signature for every async router (the
  reference's ``SimpleRouter.assign`` lacked ``env_ids``); the caller's list is never mutated
  (``NodeAffinityRouter`` mutated it). An empty load list raises ValueError, a negative
  ``num_tasks`` ValueError.
* Probing has per-probe timeouts, back-off and an overall timeout, instead of ``ray.wait`` in a
  busy loop; a probe that fails or times out counts as "still busy" / "unknown load" (ranked
  last). ``aselect_policy`` is the asyncio form beside the reference's plain ``select_policy``;
  ``release(policy)`` marks a policy idle without a probe.
* Policies are tracked by position, not hashed into sets (handles need not be hashable).
* ``SyncNodeAffinityRouter`` validates the distribution as the reference's ``assert``s did
  (env workers without eval workers on a node, or eval without env) but raises
  NodeAffinityError (a PlacementError, ValueError and RuntimeError); ``strict=False`` instead
  lets such an env node fall back to the global round-robin (logged). Eval ids that do not
  index ``eval_policies`` raise NodeAffinityError.
* ``create_router``: ``"node_affinity"`` in async mode gives a ``NodeAffinityRouter`` (the
  reference silently returned ``SimpleRouter``); an unknown ``router_type`` raises ValueError
  (the reference fell back to simple); the distribution may be passed directly as
  ``component_distribution``; a missing one raises ValueError instead of ``assert``.

This module holds ``create_router`` and names everything above; the code lives in
``placement.policies`` (Policy, the env id rule, probes), ``placement.async_routers`` and
``placement.sync_routers``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from rayless.placement.async_routers import AsyncRouter, NodeAffinityRouter, SimpleRouter
from rayless.placement.policies import UNKNOWN_LOAD as UNKNOWN_LOAD
from rayless.placement.policies import (
    Distribution,
    Policy,
    env_worker_index,
    probe_idle,
    probe_loads,
)
from rayless.placement.policies import env_nodes as env_nodes
from rayless.placement.sync_routers import IdleProbe as IdleProbe
from rayless.placement.sync_routers import (
    SyncNodeAffinityRouter,
    SyncRouter,
    SyncSimpleRouter,
)

__all__ = [
    "AsyncRouter",
    "NodeAffinityRouter",
    "Policy",
    "SimpleRouter",
    "SyncNodeAffinityRouter",
    "SyncRouter",
    "SyncSimpleRouter",
    "create_router",
    "env_worker_index",
    "probe_idle",
    "probe_loads",
]


def create_router(
    rollout_mode: str,
    router_type: str,
    eval_policies: Sequence[Any],
    global_resource_manager: Any = None,
    *,
    component_distribution: Distribution | None = None,
    strict: bool = True,
) -> SyncRouter | AsyncRouter:
    """A router for ``rollout_mode`` ``"sync"``/``"async"`` and ``router_type``
    ``"simple"``/``"node_affinity"``. Node affinity needs ``component_distribution`` or a
    manager with ``get_component_distribution()``; ``strict`` goes to
    :class:`SyncNodeAffinityRouter`. Raises ValueError on bad arguments."""
    if rollout_mode not in ("sync", "async"):
        raise ValueError(f"Invalid rollout mode: {rollout_mode!r} (expected 'sync' or 'async')")
    if router_type not in ("simple", "node_affinity"):
        raise ValueError(
            f"Invalid router type: {router_type!r} (expected 'simple' or 'node_affinity')"
        )
    if router_type == "node_affinity":
        dist = component_distribution
        if dist is None and global_resource_manager is not None:
            dist = global_resource_manager.get_component_distribution()
        if not dist:
            raise ValueError(
                "node_affinity router needs a non-empty component_distribution "
                "(or global_resource_manager)"
            )
        if rollout_mode == "sync":
            return SyncNodeAffinityRouter(eval_policies, dist, strict=strict)
        return NodeAffinityRouter.from_policies(dist, eval_policies)
    if rollout_mode == "sync":
        return SyncSimpleRouter(eval_policies)
    return SimpleRouter()
