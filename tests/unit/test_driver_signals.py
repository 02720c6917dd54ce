"""Where a driver's SIGTERM/SIGHUP handler is installed, and where it is not."""

from __future__ import annotations

import signal
import threading
from collections.abc import Iterator

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
