"""``ray.util.collective.types``: the backends and reduce operations of collective groups."""

from __future__ import annotations

from enum import Enum

__all__ = ["Backend", "ReduceOp"]


class Backend:
    """A collective group's backend, by name (``Backend("gloo")`` is ``Backend.GLOO``).

    Raises:
        ValueError: a name that is neither NCCL nor GLOO (``torch_gloo`` is GLOO).
    """

    NCCL = "NCCL"
    GLOO = "GLOO"
    UNRECOGNIZED = "unrecognized"

    def __new__(cls, name: str) -> str:  # type: ignore[misc]
        upper = str(name).upper()
        if upper == "TORCH_GLOO":
            return cls.GLOO
        if upper not in (cls.NCCL, cls.GLOO):
            raise ValueError(f"Unrecognized backend: '{name}'. Only NCCL and GLOO are supported")
        return upper


class ReduceOp(Enum):
    """How ``allreduce``, ``reduce`` and ``reducescatter`` combine the members' tensors."""

    SUM = 0
    PRODUCT = 1
    MIN = 2
    MAX = 3
