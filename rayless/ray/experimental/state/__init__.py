"""``ray.experimental.state``: Ray's older home of the state API (see ``state.api``)."""

from __future__ import annotations

from rayless.ray.experimental.state import api

__all__ = ["api"]
