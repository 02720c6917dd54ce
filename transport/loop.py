"""Run rayless's event loops: uvloop when it is installed (an optional speed-up), else asyncio.

uvloop cuts the per-wake-up cost of the loop (measured: +12% request/reply round trips on one
side alone). It is never required; ``RAYLESS_UVLOOP=0`` turns it off. Install it with the
``fast`` extra (``pip install 'rayless[fast]'``).
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Coroutine
from typing import Any, TypeVar

T = TypeVar("T")


def uvloop_enabled() -> bool:
    """Whether :func:`run` will use uvloop."""
    if os.environ.get("RAYLESS_UVLOOP", "1") == "0":
        return False
    try:
        import uvloop  # noqa: F401
    except ImportError:
        return False
    return True


def run(main: Coroutine[Any, Any, T]) -> T:
    """``asyncio.run(main)`` on a uvloop loop when available."""
    if uvloop_enabled():
        import uvloop

        result: T = uvloop.run(main)
        return result
    return asyncio.run(main)
