"""A driver ends on SIGTERM and SIGHUP as it ends on Ctrl-C, then dies of the signal.

SIGTERM is how Slurm, Kubernetes and ``timeout`` end a job, SIGHUP how a closed terminal or
SSH session does. Python's default for both kills the process on the spot: no ``finally``, no
``__aexit__``, no ``atexit``, so a driver's shared-memory segments (a published weight
version), its local cluster's directory and its published entry stayed behind.

:func:`install` (called by ``Cluster.local`` and ``actors.connect`` in a driver) handles both
signals the way SIGINT is handled: the handler calls the process's current SIGINT handler.
Under ``asyncio.run`` that is the runner's (it cancels the main task: ``async with`` blocks
close, then ``KeyboardInterrupt`` leaves ``asyncio.run``); in plain or threaded code it is
Python's ``default_int_handler`` (``KeyboardInterrupt`` in the main thread: ``with``
blocks close, the sync facade included). If the ``KeyboardInterrupt`` ends the program, the
exit handlers run (segments are unlinked there) and the process then kills itself with the
signal it received, with the default disposition: its exit status is the signal's (-15 for
SIGTERM, as a job scheduler expects), not SIGINT's. A program that catches the interrupt and
exits on its own terms keeps its own exit status.

A driver whose SIGINT is ignored unwinds the same way (``KeyboardInterrupt`` in the main
thread): a shell script's background command (``python train.py &``, ``srun ... &`` in an
sbatch script) starts with SIGINT ignored, and a SIGTERM must still close its cluster.

Nothing is installed outside the main thread, nor for a signal whose handler is not the default
(a trainer that set its own handler for SIGTERM keeps it, and a process started under
``nohup`` keeps ignoring SIGHUP). A second signal during the shutdown acts as a second Ctrl-C.

A child forked from the driver (a DataLoader worker, a ``multiprocessing`` fork) is not the
driver: it gets the default dispositions back, so SIGTERM ends it at once as its parent
expects (``DataLoader`` terminates a worker that does not exit in time) instead of raising
``KeyboardInterrupt`` in whatever it was doing (its exit handlers included).
"""

from __future__ import annotations

import atexit
import os
import signal
import sys
import threading
from types import FrameType

__all__ = ["TERMINATING", "install", "received"]

TERMINATING = (signal.SIGTERM, signal.SIGHUP)


class _State:
    received: int | None = None  # the terminating signal received, if any
    exit_hook = False  # _exit_with_signal is registered


def received() -> int | None:
    """The terminating signal this process received (handled by :func:`install`'s handler)."""
    return _State.received


def install() -> list[int]:
    """Handle SIGTERM and SIGHUP like SIGINT in this process (see the module docstring);
    returns the signals now handled by this module. Idempotent; does nothing outside the main
    thread."""
    if threading.current_thread() is not threading.main_thread():
        return []
    handled = []
    for sig in TERMINATING:
        current = signal.getsignal(sig)
        if current is signal.SIG_DFL:
            signal.signal(sig, _on_signal)
            current = _on_signal
        if current is _on_signal:
            handled.append(int(sig))
    if handled and not _State.exit_hook:
        _State.exit_hook = True
        atexit.register(_exit_with_signal)
    return handled


def _not_in_a_fork() -> None:
    """In a forked child: this module's handlers back to the default dispositions."""
    _State.received = None
    for sig in TERMINATING:
        try:
            if signal.getsignal(sig) is _on_signal:
                signal.signal(sig, signal.SIG_DFL)
        except ValueError:  # not the main thread (cannot happen in a fresh fork; never fatal)
            pass


os.register_at_fork(after_in_child=_not_in_a_fork)


def _on_signal(signum: int, frame: FrameType | None) -> None:
    _State.received = signum
    interrupt = signal.getsignal(signal.SIGINT)
    if callable(interrupt):
        interrupt(signal.SIGINT, frame)  # asyncio's runner, or default_int_handler (raises)
    else:  # SIGINT ignored (a shell script's `python train.py &`) or fatal: unwind all the same
        raise KeyboardInterrupt


def _exit_with_signal() -> None:
    """At exit: if the interrupt a terminating signal caused ended the program, run the other
    exit handlers now, then die of the signal."""
    sig = _State.received
    ended_by = getattr(sys, "last_exc", None) or getattr(sys, "last_value", None)
    if sig is None or not isinstance(ended_by, KeyboardInterrupt):
        return
    atexit.unregister(_exit_with_signal)
    atexit._run_exitfuncs()  # the handlers registered before this one (segments' unlink)
    _die(sig)


def _die(sig: int) -> None:
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError, AttributeError):
            pass
    signal.signal(sig, signal.SIG_DFL)
    os.kill(os.getpid(), sig)
    os._exit(128 + sig)  # not reached: the signal is fatal and not blocked
