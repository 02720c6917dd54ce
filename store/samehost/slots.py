"""Row copies between a client's tensors and a column's slots (CPU or CUDA, any device).

A run of slots (an arithmetic progression) is a strided view; anything else goes through
``index_select`` / ``index_copy_`` with the index on the tensor's device.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

__all__ = ["gather_rows", "run_of", "scatter_rows"]


def run_of(idx: Sequence[int]) -> tuple[int, int] | None:
    """``(start, step)`` when ``idx`` is an arithmetic progression with step >= 1, else None."""
    if not idx:
        return None
    if len(idx) == 1:
        return idx[0], 1
    start, step = idx[0], idx[1] - idx[0]
    if step < 1:
        return None
    run = range(start, start + step * len(idx), step)
    if isinstance(idx, list):  # compared in C: a put's index lists are long
        same = idx == list(run)
    elif isinstance(idx, tuple):
        same = idx == tuple(run)
    else:
        same = all(a == b for a, b in zip(idx, run, strict=True))
    return (start, step) if same else None


def gather_rows(t: torch.Tensor, idx: Sequence[int]) -> torch.Tensor:
    """Rows ``idx`` of ``t``: a view for a progression, else a gathered copy."""
    run = run_of(idx)
    if run is not None:
        start, step = run
        return t[start : start + step * (len(idx) - 1) + 1 : step]
    return t.index_select(0, torch.tensor(list(idx), dtype=torch.int64, device=t.device))


def scatter_rows(dst: torch.Tensor, idx: Sequence[int], src: torch.Tensor) -> None:
    """``dst[idx] = src`` with one pass over the bytes where possible."""
    run = run_of(idx)
    if run is not None:
        start, step = run
        dst[start : start + step * (len(idx) - 1) + 1 : step].copy_(src)
    else:
        where = torch.tensor(list(idx), dtype=torch.int64, device=dst.device)
        dst.index_copy_(0, where, src.to(dst.device))
