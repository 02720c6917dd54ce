"""The sync-mode routers: :class:`SyncSimpleRouter` (idle policies, probed with back-off) and
:class:`SyncNodeAffinityRouter` (per-node round-robin).

``select_policy(env_id)`` is plain and thread-safe; ``aselect_policy`` is its asyncio form.
A blocking caller's probes run on a private event loop thread of this module (or through
``probe=``). The contract and the deliberate differences from the reference are in
``placement.routing``.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from abc import ABC, abstractmethod
from collections import deque
from collections.abc import Callable, Coroutine, Sequence
from typing import Any, TypeVar

import anyio

from rayless.placement.errors import NodeAffinityError
from rayless.placement.policies import Distribution, env_worker_index, probe_idle
from rayless.transport.errors import Timeout

log = logging.getLogger("rayless.placement.routing")  # the routers' logger, as before the split

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


__all__ = ["SyncNodeAffinityRouter", "SyncRouter", "SyncSimpleRouter"]
