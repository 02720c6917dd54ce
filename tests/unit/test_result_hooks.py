"""``actors.core.result_hooks``: one registry of hooks on actor method results."""

from __future__ import annotations

import asyncio
from typing import Any

from rayless.actors.core import result_hooks
from rayless.actors.ext import ResultHook, add_result_hook


def test_a_hook_added_twice_runs_once(monkeypatch: Any) -> None:
    monkeypatch.setattr(result_hooks, "HOOKS", [])
    seen: list[Any] = []

    def pending(result: Any) -> None:
        seen.append(result)

    hook = ResultHook(pending)
    add_result_hook(hook)
    add_result_hook(hook)
    assert [hook] == result_hooks.HOOKS
    assert result_hooks.pending_waits(5) == [] and seen == [5]


async def test_the_ray_hook_waits_only_for_refs_not_made_yet() -> None:
    import concurrent.futures

    from rayless.ray.object_ref import ObjectRef, _pending

    made: concurrent.futures.Future[Any] = concurrent.futures.Future()
    made.set_result(1)
    later: concurrent.futures.Future[Any] = concurrent.futures.Future()
    done_ref, pending_ref = ObjectRef(made, 1), ObjectRef(later, 1)
    assert _pending([1, 2]) is None and _pending(done_ref) is None
    assert _pending({"a": done_ref, "b": 3}) is None
    wait = _pending((done_ref, pending_ref))
    assert wait is not None
    task = asyncio.ensure_future(wait)
    await asyncio.sleep(0.01)
    assert not task.done()
    later.set_exception(KeyError("its error travels with the ref"))
    await asyncio.wait_for(task, 10)  # settled, without raising


def test_the_ray_layer_adds_its_hook_when_imported() -> None:
    import rayless.ray.object_ref as object_ref

    assert any(h.pending is object_ref._pending for h in result_hooks.HOOKS)
