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
  The probes' coroutines run on a private event loop thread of this module, or through
  ``probe=`` — a plain callable ``probe(policies) -> list[bool]`` (e.g. one that goes through
  the sync facade of the runtime, for handles bound to another loop). Inside an event loop use
  ``await aselect_policy(env_id)`` (the probes then run on that loop); the blocking form called
  from a loop's thread raises RuntimeError rather than stall the loop.
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
"""

from __future__ import annotations

import asyncio
import bisect
import concurrent.futures
import heapq
import inspect
import logging
import threading
import time
from abc import ABC, abstractmethod
from collections import deque
from collections.abc import Callable, Coroutine, Mapping, Sequence
from typing import Any, Protocol, TypeVar, runtime_checkable

import anyio

from rayless.placement.errors import NodeAffinityError
from rayless.transport.errors import Timeout

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

log = logging.getLogger(__name__)
UNKNOWN_LOAD = 1 << 40  # a load a probe could not read: ranked after every known load

Distribution = Mapping[str, Mapping[str, Mapping[str, Any]]]


@runtime_checkable
class Policy(Protocol):
    """What a router needs from a policy: its node and two async probes."""

    @property
    def node_id(self) -> str: ...

    async def check_idle(self) -> bool: ...

    async def num_requests(self) -> int: ...


def env_worker_index(env_id: Any) -> int | None:
    """The worker index at the end of an env id (``"env-3"`` → 3), None when there is none."""
    if not isinstance(env_id, str):
        return None
    suffix = env_id.rsplit("-", 1)[-1]
    return int(suffix) if suffix.isascii() and suffix.isdigit() else None


def env_nodes(distribution: Distribution) -> dict[int, str]:
    """env worker id → node id, from a component distribution."""
    out: dict[int, str] = {}
    for node_id, comps in distribution.items():
        for wid in comps.get("env", {}).get("ids", []):
            out[int(wid)] = node_id
    return out


async def _call(policy: Any, method: str, probe_timeout: float) -> Any:
    fn = getattr(policy, method, None)
    if fn is None:
        return None
    with anyio.move_on_after(probe_timeout):
        try:
            result = fn()
            if isinstance(result, concurrent.futures.Future):
                result = asyncio.wrap_future(result)
            return await result if inspect.isawaitable(result) else result
        except Exception as exc:  # a failed probe means "unknown", never a crashed router
            log.debug("probe %s failed on %r: %s", method, policy, exc)
            return _FAILED
    return _FAILED


_FAILED = object()


async def _gather(policies: Sequence[Any], method: str, probe_timeout: float) -> list[Any]:
    results: list[Any] = [None] * len(policies)

    async def one(i: int) -> None:
        results[i] = await _call(policies[i], method, probe_timeout)

    async with anyio.create_task_group() as tg:
        for i in range(len(policies)):
            tg.start_soon(one, i)
    return results


async def probe_loads(policies: Sequence[Any], probe_timeout: float = 1.0) -> list[int]:
    """Every policy's ``num_requests()``, concurrently; unknown → ``UNKNOWN_LOAD``, none → 0."""
    out = []
    for r in await _gather(policies, "num_requests", probe_timeout):
        if r is None:
            out.append(0)
        elif r is _FAILED or isinstance(r, bool) or not isinstance(r, int):
            out.append(UNKNOWN_LOAD)
        else:
            out.append(r)
    return out


async def probe_idle(policies: Sequence[Any], probe_timeout: float = 1.0) -> list[bool]:
    """Every policy's ``check_idle()``, concurrently; no method → idle, failure → busy."""
    return [r is None or r is True for r in await _gather(policies, "check_idle", probe_timeout)]


_T = TypeVar("_T")


class _PrivateLoop:
    """One daemon thread running an asyncio loop, for blocking callers' probes (lazy)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._loop: asyncio.AbstractEventLoop | None = None

    def _start(self) -> asyncio.AbstractEventLoop:
        with self._lock:
            if self._loop is None:
                loop = asyncio.new_event_loop()
                threading.Thread(
                    target=loop.run_forever, name="rayless-placement-probes", daemon=True
                ).start()
                self._loop = loop
            return self._loop

    def run(self, coro: Coroutine[Any, Any, _T]) -> _T:
        """Run ``coro`` on the private loop and wait for it in the calling thread."""
        return asyncio.run_coroutine_threadsafe(coro, self._start()).result()


_PROBE_LOOP = _PrivateLoop()


def _in_event_loop() -> bool:
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return False
    return True


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


class SyncRouter(ABC):
    """Picks one policy per env request (sync rollout mode), from plain threads."""

    @abstractmethod
    def select_policy(self, env_id: str | None = None) -> Any:
        """The policy to serve ``env_id`` (plain, thread-safe)."""

    async def aselect_policy(self, env_id: str | None = None) -> Any:
        """:meth:`select_policy` for asyncio code."""
        return self.select_policy(env_id)


IdleProbe = Callable[[Sequence[Any]], Sequence[bool]]


class SyncSimpleRouter(SyncRouter):
    """Hands out idle policies; probes busy ones (with timeouts and back-off) when none is."""

    def __init__(
        self,
        eval_policies: Sequence[Any],
        *,
        probe: IdleProbe | None = None,
        probe_timeout: float = 0.05,
        poll_interval: float = 0.001,
        max_poll_interval: float = 0.05,
        timeout: float | None = None,
    ) -> None:
        if not eval_policies:
            raise ValueError("SyncSimpleRouter needs at least one policy")
        self._eval_policies = list(eval_policies)
        self._idle: deque[int] = deque(range(len(self._eval_policies)))
        self._state = threading.Lock()  # the idle deque
        self._turn = threading.Lock()  # blocking callers, one at a time (the reference's lock)
        self._aturn = asyncio.Lock()  # asyncio callers, one at a time
        self.probe = probe
        self.probe_timeout = probe_timeout
        self.poll_interval = poll_interval
        self.max_poll_interval = max_poll_interval
        self.timeout = timeout

    def _busy(self) -> list[int]:
        with self._state:
            idle = set(self._idle)
        return [i for i in range(len(self._eval_policies)) if i not in idle]

    def _mark_idle(self, busy: Sequence[int], flags: Sequence[bool]) -> None:
        with self._state:
            present = set(self._idle)
            self._idle.extend(
                i for i, ok in zip(busy, flags, strict=True) if ok and i not in present
            )

    def _pop(self) -> Any:
        with self._state:
            if self._idle:
                return self._eval_policies[self._idle.popleft()]
        return _NONE

    def _flush_idle_blocking(self) -> None:
        busy = self._busy()
        if not busy:
            return
        policies = [self._eval_policies[i] for i in busy]
        if self.probe is not None:
            flags = list(self.probe(policies))
            if len(flags) != len(busy):
                raise ValueError(f"probe returned {len(flags)} flags for {len(busy)} policies")
        else:
            flags = _PROBE_LOOP.run(probe_idle(policies, self.probe_timeout))
        self._mark_idle(busy, flags)

    async def _flush_idle(self) -> None:
        busy = self._busy()
        if not busy:
            return
        policies = [self._eval_policies[i] for i in busy]
        if self.probe is not None:
            flags = list(await anyio.to_thread.run_sync(self.probe, policies))
        else:
            flags = await probe_idle(policies, self.probe_timeout)
        self._mark_idle(busy, flags)

    def release(self, policy: Any) -> None:
        """Mark a policy idle again without waiting for a probe."""
        with self._state:
            for i, p in enumerate(self._eval_policies):
                if p is policy and i not in self._idle:
                    self._idle.append(i)
                    return

    def _needs_loop(self) -> bool:
        return self.probe is None and any(
            getattr(p, "check_idle", None) is not None for p in self._eval_policies
        )

    def select_policy(self, env_id: str | None = None) -> Any:
        """The next idle policy, blocking the calling thread while none is; thread-safe.

        Raises Timeout when none turns idle within ``timeout``, RuntimeError when called from
        a running event loop's thread with policies that need async probes (use
        :meth:`aselect_policy` there).
        """
        if self._needs_loop() and _in_event_loop():
            raise RuntimeError(
                "SyncSimpleRouter.select_policy blocks its thread; inside an event loop use "
                "'await router.aselect_policy(env_id)'"
            )
        with self._turn:
            deadline = None if self.timeout is None else time.monotonic() + self.timeout
            delay = self.poll_interval
            while True:
                got = self._pop()
                if got is not _NONE:
                    return got
                self._flush_idle_blocking()
                got = self._pop()
                if got is not _NONE:
                    return got
                if deadline is not None and time.monotonic() >= deadline:
                    raise Timeout(f"no policy became idle within {self.timeout} s")
                time.sleep(delay)
                delay = min(delay * 2, self.max_poll_interval)

    async def aselect_policy(self, env_id: str | None = None) -> Any:
        """:meth:`select_policy` for asyncio code: probes and back-off on the caller's loop."""
        async with self._aturn:
            deadline = None if self.timeout is None else time.monotonic() + self.timeout
            delay = self.poll_interval
            while True:
                got = self._pop()
                if got is not _NONE:
                    return got
                await self._flush_idle()
                got = self._pop()
                if got is not _NONE:
                    return got
                if deadline is not None and time.monotonic() >= deadline:
                    raise Timeout(f"no policy became idle within {self.timeout} s")
                await anyio.sleep(delay)
                delay = min(delay * 2, self.max_poll_interval)


_NONE = object()


class SyncNodeAffinityRouter(SyncRouter):
    """Round-robin among the policies on the env's node (per-node locks), else globally."""

    def __init__(
        self,
        eval_policies: Sequence[Any],
        component_distribution: Distribution,
        *,
        strict: bool = True,
    ) -> None:
        if not eval_policies:
            raise ValueError("SyncNodeAffinityRouter needs at least one policy")
        self._eval_policies = list(eval_policies)
        self._env_worker_to_node: dict[int, str] = {}
        self._node_to_eval_policies: dict[str, list[Any]] = {}
        self.env_worker_num = 0
        for node_id, comps in component_distribution.items():
            env_ids = list(comps.get("env", {}).get("ids", []))
            eval_ids = list(comps.get("eval", {}).get("ids", []))
            if strict and bool(env_ids) != bool(eval_ids):
                raise NodeAffinityError(
                    f"node {node_id} has {len(env_ids)} env and {len(eval_ids)} eval workers; "
                    "node affinity needs both on the same nodes"
                )
            if env_ids and not eval_ids:
                log.warning("node %s has env workers but no policy: global fallback", node_id)
            self.env_worker_num += len(env_ids)
            for wid in env_ids:
                self._env_worker_to_node[int(wid)] = node_id
            if eval_ids:
                bad = [w for w in eval_ids if not 0 <= int(w) < len(self._eval_policies)]
                if bad:
                    raise NodeAffinityError(
                        f"node {node_id}: eval ids {bad} do not index the "
                        f"{len(self._eval_policies)} eval policies"
                    )
                self._node_to_eval_policies[node_id] = [
                    self._eval_policies[int(w)] for w in eval_ids
                ]
        self._rr_counters = dict.fromkeys(self._node_to_eval_policies, 0)
        self._node_locks = {n: threading.Lock() for n in self._node_to_eval_policies}
        self._global_rr_counter = 0
        self._global_lock = threading.Lock()

    @property
    def num_nodes(self) -> int:
        """Nodes with policies."""
        return len(self._node_locks)

    def select_policy(self, env_id: str | None = None) -> Any:
        """Round-robin on the env's node; global round-robin when it has no policy.

        Plain and thread-safe (per-node locks); never blocks on I/O."""
        idx = env_worker_index(env_id)
        node = self._env_worker_to_node.get(idx) if idx is not None else None
        if node is not None and node in self._node_to_eval_policies:
            policies = self._node_to_eval_policies[node]
            with self._node_locks[node]:
                i = self._rr_counters[node] % len(policies)
                self._rr_counters[node] += 1
            return policies[i]
        with self._global_lock:
            i = self._global_rr_counter % len(self._eval_policies)
            self._global_rr_counter += 1
        return self._eval_policies[i]


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
