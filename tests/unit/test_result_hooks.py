"""``actors.core.result_hooks``: one registry of hooks on actor method results."""

from __future__ import annotations

from typing import Any

from rayless.actors.core import result_hooks
from rayless.actors.ext import ResultHook, add_result_hook


def test_a_hook_added_twice_runs_once(monkeypatch: Any) -> None:
    monkeypatch.setattr(result_hooks, "HOOKS", [])
    seen: list[Any] = []

    async def awaiting(result: Any) -> None:
        seen.append(result)

    hook = ResultHook(seen.append, awaiting)
    add_result_hook(hook)
    add_result_hook(hook)
    assert [hook] == result_hooks.HOOKS


def test_the_ray_layer_adds_its_hook_when_imported() -> None:
    import rayless.ray.object_ref as object_ref

    assert any(h.blocking is object_ref._settle_blocking for h in result_hooks.HOOKS)
