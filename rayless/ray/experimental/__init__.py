"""``ray.experimental``: the parts of it Ray programs import (``state.api``, Ray's older
spelling of ``ray.util.state``)."""

from __future__ import annotations

from rayless.ray.experimental import state

__all__ = ["state"]
