"""``ray.experimental.state.api``: Ray's deprecated spelling of ``ray.util.state``, which
Ray 2.60 still ships and verl's single controller imports (``get_actor``); the same
functions and records."""

from __future__ import annotations

from rayless.ray.util import state as _state
from rayless.ray.util.state import *  # noqa: F403  (the same names, as Ray's module does)

__all__ = list(_state.__all__)
