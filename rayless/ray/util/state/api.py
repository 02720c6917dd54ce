"""``ray.util.state.api``: the module Ray's state functions live in (verl's Megatron
checkpoint manager imports it as ``from ray.util.state import api``); the same functions as
``ray.util.state``."""

from __future__ import annotations

from rayless.ray.util import state as _state
from rayless.ray.util.state import *  # noqa: F403  (the same names, as Ray's module has)

__all__ = list(_state.__all__)
