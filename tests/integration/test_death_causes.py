"""A dead actor's ActorDiedError says why: the exit code or signal the node agent reaped, and
the last lines of the actor's log (the OOM-killer detection is in tests/unit/test_death.py)."""

from __future__ import annotations

import asyncio
import os
import signal
from pathlib import Path
from typing import Any

import pytest

from rayless.actors import ActorDiedError, Cluster
from tests.integration.death_classes import Dies
from tests.waiting import wait_until

pytestmark = pytest.mark.integration

LOG_TAIL_LINES = 20  # rayless.actors.control.death's


async def test_os_exit_names_the_code_and_the_last_log_lines(local_cluster: Cluster) -> None:
    dies = await local_cluster.spawn(Dies, name="exits-3")
    await dies.chatter(30)
    with pytest.raises(ActorDiedError) as info:
        await asyncio.wait_for(dies.exit_with(3), 60)
    err = info.value
    assert err.exitcode == 3 and err.cause == "with exit code 3"
    assert len(err.log_tail) == LOG_TAIL_LINES
    assert err.log_tail[-1] == "about to os._exit(3)"
    assert "a line on stderr" in err.log_tail and "line 29 of 30" in err.log_tail
    assert "line 0 of 30" not in err.log_tail  # only the last 20
    text = str(err)
    assert "with exit code 3" in text and "about to os._exit(3)" in text
    assert f"last {LOG_TAIL_LINES} lines of its log" in text and err.log in text
    with pytest.raises(ActorDiedError) as later:  # a later call learns the same, via the head
        await asyncio.wait_for(dies.pid(), 60)
    assert "about to os._exit(3)" in str(later.value)


async def test_sigkill_names_the_signal(local_cluster: Cluster) -> None:
    dies = await local_cluster.spawn(Dies, name="killed-9")
    await dies.chatter(2)
    pid = await dies.pid()
    os.kill(pid, signal.SIGKILL)
    with pytest.raises(ActorDiedError) as info:
        await asyncio.wait_for(dies.chatter(1), 60)
    err = info.value
    assert err.exitcode == -signal.SIGKILL and err.pid == pid
    assert "killed by SIGKILL" in str(err)
    assert err.log_tail[-2:] == ["line 1 of 2", "a line on stderr"]
    assert "a line on stderr" in str(err)


async def _death_mentioning(handle: Any, text: str) -> ActorDiedError | None:
    """Call ``handle.pid()``; the ActorDiedError it raises if its message has ``text``."""
    try:
        await asyncio.wait_for(handle.pid(), 60)
    except ActorDiedError as exc:
        return exc if text in str(exc) else None
    return None


async def test_import_error_on_restart_names_the_traceback(tmp_path: Path) -> None:
    flag = tmp_path / "boom"
    env = {"BOOM_FILE": str(flag)}
    # fresh interpreters: a restart imports the class's module again (a fork would not)
    async with Cluster.local(nodes=1, zygote=False) as cluster:
        dies = await cluster.spawn(Dies, name="boom-on-restart", max_restarts=1, env=env)
        pid = await dies.pid()
        flag.write_text("")
        os.kill(pid, signal.SIGKILL)
        err = await wait_until(
            lambda: _death_mentioning(dies, "RuntimeError: boom at import"),
            timeout=60,
            what="a call failing with the restart's import error",
        )
        assert isinstance(err, ActorDiedError)
        assert any("RuntimeError: boom at import" in line for line in err.log_tail)
        assert err.log_tail[-1].startswith("RuntimeError: boom at import"), err.log_tail
        assert err.exitcode == 1 and "with exit code 1" in str(err)
