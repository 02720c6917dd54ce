"""The actor's held-loop warning says where the loop is held, and does not blame the user for
rayless' own import of a module on its first use."""

from __future__ import annotations

import asyncio
import importlib
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from rayless.actors.host.process import LoopMonitor


@pytest.fixture
def loop() -> Iterator[asyncio.AbstractEventLoop]:
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    yield loop
    loop.call_soon_threadsafe(loop.stop)
    thread.join(10)
    loop.close()


def _held(loop: asyncio.AbstractEventLoop, hold: Callable[[], None]) -> None:
    """Run ``hold`` on ``loop`` under a monitor (0.2 s threshold) and wait until it is done."""
    monitor = LoopMonitor(loop, "A", 0.2)
    loop.call_soon_threadsafe(monitor.start)
    time.sleep(0.3)
    done = threading.Event()
    loop.call_soon_threadsafe(lambda: (hold(), done.set()))
    assert done.wait(30)
    time.sleep(0.5)  # the "free again" line
    monitor.stop()


def _hold_here() -> None:
    time.sleep(1.0)


def _slow_module(tmp_path: Path, name: str) -> None:
    (tmp_path / f"{name}.py").write_text("import time\ntime.sleep(1.0)\n")
    sys.path.insert(0, str(tmp_path))


def test_a_callback_holding_the_loop_is_named_with_its_line(
    loop: asyncio.AbstractEventLoop, capsys: pytest.CaptureFixture[str]
) -> None:
    _held(loop, _hold_here)
    err = capsys.readouterr().err
    assert "event loop held for" in err and "free again" in err, err
    assert f"at {__file__}:" in err and "in _hold_here" in err, err
    assert "run long work in a `def` method" in err


def test_rayless_importing_a_module_on_first_use_is_not_the_users_hold(
    loop: asyncio.AbstractEventLoop, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    # (what a light actor's first tensor does: the codec imports torch on the loop)
    _slow_module(tmp_path, "rayless_test_slow_a")
    ours = {"__name__": "rayless.transport.fake_codec", "importlib": importlib}
    exec("def load():\n    importlib.import_module('rayless_test_slow_a')\n", ours)
    try:
        _held(loop, ours["load"])
    finally:
        sys.path.remove(str(tmp_path))
        sys.modules.pop("rayless_test_slow_a", None)
    err = capsys.readouterr().err
    assert "held for" in err and "by rayless importing rayless_test_slow_a" in err, err
    assert "run long work" not in err, err


def test_a_users_own_import_is_named_with_the_line_that_imports(
    loop: asyncio.AbstractEventLoop, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    _slow_module(tmp_path, "rayless_test_slow_b")

    def load() -> None:
        importlib.import_module("rayless_test_slow_b")

    try:
        _held(loop, load)
    finally:
        sys.path.remove(str(tmp_path))
        sys.modules.pop("rayless_test_slow_b", None)
    err = capsys.readouterr().err
    assert "importing rayless_test_slow_b at " in err and "in load" in err, err
    assert "run long work" in err, err
