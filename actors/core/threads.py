"""torch's intra-op threads in an actor process: how many it gets (its CPU share) and setting
them for a thread (torch keeps the count per thread)."""

from __future__ import annotations

import os
import sys

__all__ = ["apply_torch_threads", "torch_threads"]


def torch_threads() -> int:
    """Intra-op threads for this actor: OMP_NUM_THREADS if set, else its CPU share (min 1).

    Like Ray, an actor gets as many compute threads as CPUs it asked for: on shared nodes
    more threads than cores only spin against each other (a small MLP's forward pass went
    from 0.14 ms to 15 ms in an actor with the default thread count on 2 busy cores).
    """
    for name in ("OMP_NUM_THREADS", "RAYLESS_CPUS"):
        try:
            value = float(os.environ.get(name, ""))
        except ValueError:
            continue
        return max(1, int(value))
    return 1


def apply_torch_threads(n: int) -> None:
    """Set torch's thread count for the calling thread (it is per thread), if torch is loaded."""
    torch = sys.modules.get("torch")
    if torch is not None:
        torch.set_num_threads(n)
