"""Actor classes of the leftover tests (signals to a driver, head or agent); importable by
actor processes."""

from __future__ import annotations

import os

import torch

from rayless.actors import Actor
from rayless.transport import segments


class Holder(Actor):
    """Receives a large tensor (over shared memory) and holds a segment of its own, as a relay
    holds a weight version."""

    def __init__(self) -> None:
        self.kept: list[torch.Tensor] = []
        self.segment: segments.Segment | None = None

    def pid(self) -> int:
        """This process's pid."""
        return os.getpid()

    def take(self, tensor: torch.Tensor) -> int:
        """Keep ``tensor``; its size in bytes."""
        self.kept.append(tensor)
        return tensor.numel() * tensor.element_size()

    def hold(self, nbytes: int) -> str:
        """Create a segment of ``nbytes`` owned by this actor and keep it; its name."""
        self.segment = segments.Segment.create(nbytes)
        self.segment.payload[:] = b"\1" * nbytes
        return self.segment.name
