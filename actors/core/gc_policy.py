"""How rayless' processes run Python's cyclic garbage collector, so that a call's cost does
not grow with the calls in flight: actor processes, heads and node agents (:func:`apply` and
:func:`freeze`), and a driver once it makes its first call (:func:`apply` only: its objects
are the user's).

Every call in flight holds a few container objects (its task, future, coroutine frame,
arguments). CPython's collector starts a young-generation pass every 700 net allocations
(the default ``gc.get_threshold()[0]``) and each pass walks every young object that is still
alive, so with thousands of calls in flight a process spent most of its CPU walking them:
an actor answered 3,000 pipelined calls at about half the rate of 200 (measured with py-spy:
the time went to the allocations that triggered passes). :func:`apply` raises the
young-generation threshold (``RAYLESS_GC_GEN0``, default 10,000; ``0`` leaves Python's
settings alone) and, once a process has loaded its code (an actor: its class, ``__init__``
and ``setup``), :func:`freeze` moves what exists then out of the collector's sight
(``gc.freeze``), so passes never walk the modules and the model an actor holds. Objects
freed by reference counting are freed as before; only reference cycles wait for a pass.
"""

from __future__ import annotations

import gc
import os

__all__ = ["DEFAULT_GEN0", "ENV_GEN0", "apply", "freeze"]

ENV_GEN0 = "RAYLESS_GC_GEN0"
DEFAULT_GEN0 = 10_000


def _gen0(environ: dict[str, str] | os._Environ[str]) -> int:
    raw = environ.get(ENV_GEN0, "").strip()
    if not raw:
        return DEFAULT_GEN0
    try:
        value = int(raw)
    except ValueError:
        return DEFAULT_GEN0
    return max(0, value)


def apply(environ: dict[str, str] | os._Environ[str] = os.environ) -> int:
    """Raise the young generation's threshold as ``RAYLESS_GC_GEN0`` says; the threshold now
    (unchanged when the variable is ``0`` or Python's is already higher)."""
    gen0 = _gen0(environ)
    first, second, third = gc.get_threshold()
    if gen0 > first:
        gc.set_threshold(gen0, second, third)
    return gc.get_threshold()[0]


def freeze(environ: dict[str, str] | os._Environ[str] = os.environ) -> None:
    """Move every object alive now out of the collector's sight (not with
    ``RAYLESS_GC_GEN0=0``). Call it once the process has loaded what it keeps."""
    if _gen0(environ) > 0:
        gc.freeze()
