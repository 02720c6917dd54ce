"""Logging at a bounded rate, so hostile traffic cannot flood the log."""

from __future__ import annotations

import logging
import time
from typing import Any


class RateLimitedLog:
    """Logs each category at most once per ``interval`` seconds, counting what it held back."""

    def __init__(self, logger: logging.Logger, interval: float = 5.0) -> None:
        self._log = logger
        self._interval = interval
        self._last: dict[str, float] = {}
        self._held: dict[str, int] = {}

    def warning(self, category: str, msg: str, *args: Any) -> None:
        """Log ``msg`` unless this category was logged less than ``interval`` seconds ago."""
        now = time.monotonic()
        last = self._last.get(category)
        if last is not None and now - last < self._interval:
            self._held[category] = self._held.get(category, 0) + 1
            return
        if len(self._last) > 1024:  # categories come from peers' input: keep the map small
            self._last.clear()
            self._held.clear()
        held = self._held.pop(category, 0)
        self._last[category] = now
        if held:
            msg += " (%d similar messages suppressed)"
            args = (*args, held)
        self._log.warning(msg, *args)
