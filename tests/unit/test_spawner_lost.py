"""A node agent's fork template that goes away: reported when it is a failure, not when the
agent is stopping (a driver's exit ends the template and the agent at once)."""

from __future__ import annotations

import asyncio
import logging

import pytest

from rayless.actors.control import spawner as spawners
from rayless.actors.control.spawner import ZygoteSpawner


async def test_a_lost_template_is_reported_unless_the_agent_is_stopping(
    caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(spawners, "LOST_NOTICE_DELAY", 0.05)
    caplog.set_level(logging.WARNING, logger="rayless.agent")
    lost = ZygoteSpawner()
    lost._lost()  # the template died under a running agent
    await asyncio.sleep(0.2)
    assert [r.getMessage() for r in caplog.records] == [
        "zygote connection lost; starting actors as fresh processes from now on"
    ]
    caplog.clear()
    quiet = ZygoteSpawner()
    quiet._lost()  # read before the agent's own SIGTERM...
    quiet.stopping()  # ...which comes within the delay
    await asyncio.sleep(0.2)
    assert caplog.records == []
