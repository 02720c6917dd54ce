"""``ray.util.state.exception``: the state API's error."""

from __future__ import annotations

__all__ = ["RayStateApiException"]


class RayStateApiException(Exception):
    """A state query the cluster cannot answer (a filter on a column that does not exist)."""
