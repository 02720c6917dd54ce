"""What the routers know of a policy: the :class:`Policy` protocol, the env id rule, and probes.

:func:`probe_loads` and :func:`probe_idle` ask every policy at once (``num_requests()``,
``check_idle()``), each probe bounded by a timeout; a probe that fails or times out counts as
"unknown load" / "still busy". :func:`env_worker_index` is the env id rule and
:func:`env_nodes` the env worker → node map of a component distribution. The routers
themselves, and the contract as a whole, are in ``placement.routing``.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import inspect
import logging
from collections.abc import Mapping, Sequence
from typing import Any, Protocol, runtime_checkable

import anyio

log = logging.getLogger("rayless.placement.routing")  # the routers' logger, as before the split
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


__all__ = [
    "UNKNOWN_LOAD",
    "Distribution",
    "Policy",
    "env_nodes",
    "env_worker_index",
    "probe_idle",
    "probe_loads",
]
