"""How a state dict lies in weight-sync buckets, and the copies in and out of them.

A layout is a list of ``[name, dtype, shape, bucket, offset, nbytes]`` rows: each tensor sits
whole in one bucket (a bucket holds ``bucket_bytes`` or one bigger tensor), 64-byte aligned.
On the CPU path the buckets lie back to back in one shared-memory segment; on the CUDA path
each bucket is one flat CUDA allocation shared by IPC. The copies convert dtypes on the way
and check names and shapes first, naming the tensor that does not match.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import torch

from rayless.weights.errors import WeightMismatchError

__all__ = ["bucket_sizes", "make_layout", "read_into", "targets_of", "write_from"]

ALIGN = 64
Layout = list[list[Any]]


def _dtype(name: str) -> torch.dtype:
    dtype = getattr(torch, name.removeprefix("torch."), None)
    if not isinstance(dtype, torch.dtype):
        raise WeightMismatchError(name, f"unknown dtype {name!r}")
    return dtype


def tensors_of(state: Mapping[str, Any]) -> dict[str, torch.Tensor]:
    """The tensors of a state dict (other entries, e.g. extra state, are skipped)."""
    return {k: v.detach() for k, v in state.items() if isinstance(v, torch.Tensor)}


def make_layout(tensors: Mapping[str, torch.Tensor], bucket_bytes: int) -> Layout:
    """Place every tensor in a bucket of ``bucket_bytes`` (one bigger tensor gets its own)."""
    rows: Layout = []
    bucket, used = 0, 0
    for name, t in tensors.items():
        n = t.numel() * t.element_size()
        if used and used + n > bucket_bytes:
            bucket, used = bucket + 1, 0
        rows.append([name, str(t.dtype), list(t.shape), bucket, used, n])
        used += -(-n // ALIGN) * ALIGN
    return rows


def bucket_sizes(layout: Layout) -> list[int]:
    """Bytes of each bucket of ``layout``."""
    sizes: list[int] = []
    for _, _, _, bucket, offset, n in layout:
        while len(sizes) <= bucket:
            sizes.append(0)
        sizes[bucket] = max(sizes[bucket], -(-(offset + n) // ALIGN) * ALIGN)
    return sizes


def _view(buffer: torch.Tensor, row: Sequence[Any], base: int) -> torch.Tensor:
    _, dtype, shape, _, offset, n = row
    flat = buffer[base + offset : base + offset + n]
    return flat.view(_dtype(dtype)).view(shape) if n else torch.empty(shape, dtype=_dtype(dtype))


def write_from(
    tensors: Mapping[str, torch.Tensor],
    layout: Layout,
    buckets: Sequence[torch.Tensor],
    starts: Sequence[int] | None = None,
) -> None:
    """Copy every tensor into its place: ``buckets[b]`` (flat uint8), at ``starts[b]`` in it."""
    for row in layout:
        b = row[3]
        if row[5]:
            _view(buckets[b], row, starts[b] if starts else 0).copy_(tensors[row[0]])


def targets_of(target: Any) -> dict[str, torch.Tensor]:
    """The tensors to fill: a module's parameters and buffers, or a dict of tensors.

    Raises TypeError for anything else.
    """
    if isinstance(target, torch.nn.Module):
        return tensors_of(target.state_dict(keep_vars=True))
    if isinstance(target, Mapping):
        return {k: v for k, v in target.items() if isinstance(v, torch.Tensor)}
    raise TypeError(f"pull fills a torch.nn.Module or a dict of tensors, not {type(target)}")


def check(layout: Layout, targets: Mapping[str, torch.Tensor], strict: bool) -> None:
    """Raise WeightMismatchError naming the first tensor whose name or shape differs."""
    names = {row[0] for row in layout}
    if strict:
        for name in targets:
            if name not in names:
                raise WeightMismatchError(name, "is not in the published weights")
    for name, _, shape, *_ in layout:
        t = targets.get(name)
        if t is None:
            if strict:
                raise WeightMismatchError(name, "is published but the target has no such tensor")
            continue
        if list(t.shape) != list(shape):
            raise WeightMismatchError(
                name, f"has shape {list(t.shape)} here but {list(shape)} in the published weights"
            )


def read_into(
    layout: Layout,
    buckets: Sequence[torch.Tensor],
    targets: Mapping[str, torch.Tensor],
    starts: Sequence[int] | None = None,
) -> None:
    """Copy each published tensor into its target in place (dtype and device converted)."""
    with torch.no_grad():
        for row in layout:
            dst = targets.get(row[0])
            if dst is not None and row[5]:
                dst.copy_(_view(buckets[row[3]], row, starts[row[3]] if starts else 0))
