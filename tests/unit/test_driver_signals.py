"""Where a driver's SIGTERM/SIGHUP handler is installed, and where it is not."""

from __future__ import annotations

import multiprocessing
import os
import signal
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest

from rayless.actors.api import signals


@pytest.fixture
def restored() -> Iterator[None]:
    saved = {sig: signal.getsignal(sig) for sig in signals.TERMINATING}
    try:
        yield
    finally:
        for sig, handler in saved.items():
            signal.signal(sig, handler)


def _own(signum: int, frame: object) -> None:
    """A trainer's own handler."""


@pytest.mark.usefixtures("restored")
def test_a_handler_of_the_program_and_an_ignored_sighup_are_kept() -> None:
    signal.signal(signal.SIGTERM, _own)
    signal.signal(signal.SIGHUP, signal.SIG_IGN)  # started under nohup
    assert signals.install() == []
    assert signal.getsignal(signal.SIGTERM) is _own
    assert signal.getsignal(signal.SIGHUP) is signal.SIG_IGN


@pytest.mark.usefixtures("restored")
def test_default_dispositions_are_handled_once_and_only_from_the_main_thread() -> None:
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    signal.signal(signal.SIGHUP, signal.SIG_DFL)
    got: list[list[int]] = []
    thread = threading.Thread(target=lambda: got.append(signals.install()))
    thread.start()
    thread.join()
    assert got == [[]] and signal.getsignal(signal.SIGTERM) is signal.SIG_DFL
    assert sorted(signals.install()) == sorted([signal.SIGTERM, signal.SIGHUP])
    assert sorted(signals.install()) == sorted([signal.SIGTERM, signal.SIGHUP])  # idempotent
    assert signals.received() is None


@pytest.mark.usefixtures("restored")
def test_a_child_forked_from_the_driver_dies_of_sigterm() -> None:
    # before: the child inherited the driver's handler, so a SIGTERM raised KeyboardInterrupt
    # in it (a DataLoader worker terminated while in its exit handlers exited with status 1)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    signal.signal(signal.SIGHUP, signal.SIG_DFL)
    signals.install()
    ctx = multiprocessing.get_context("fork")
    ready = ctx.Event()
    child = ctx.Process(target=_sleep_after, args=(ready,))
    child.start()
    try:
        assert ready.wait(60)
        os.kill(child.pid or 0, signal.SIGTERM)
        child.join(60)
        assert child.exitcode == -signal.SIGTERM
    finally:
        if child.is_alive():
            child.kill()
            child.join()
    assert signal.getsignal(signal.SIGTERM) is not signal.SIG_DFL  # the driver keeps its own


def _sleep_after(ready: Any) -> None:
    ready.set()
    time.sleep(120)
