"""How a client cuts TensorDicts into per-unit rows and puts read-back rows together."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch
from tensordict import TensorDict

from rayless.store.data.schema import Column, FieldSchema, assemble, merge_parts, mixed_shapes

__all__ = ["target_device", "merge", "place", "take"]


def take(columns: Mapping[str, Column], positions: list[int], total: int) -> TensorDict:
    """The rows at ``positions`` of ``columns`` as a TensorDict (dense: one contiguous tensor)."""
    n = len(positions)
    run = n > 0 and positions == list(range(positions[0], positions[0] + n))
    data: dict[str, tuple[FieldSchema, Any]] = {}
    device: Any = None
    for name, col in columns.items():
        if col.dense is not None:
            dense = col.dense
            device = dense.device
            if run:
                part = dense.narrow(0, positions[0], n)
            else:
                where = torch.tensor(positions, dtype=torch.int64, device=dense.device)
                part = dense.index_select(0, where)
            data[name] = (col.schema, part.contiguous())
        else:
            rows = col.rows or []
            data[name] = (col.schema, [rows[p] for p in positions])
    return assemble(n, data, device)


def target_device(device: Any, origin: str | None) -> torch.device:
    """Where a field read back should live: ``device`` if given, else its put-time device
    when this process has it (CUDA), else the CPU."""
    if device is not None:
        return torch.device(device)
    if origin and origin.startswith("cuda") and torch.cuda.is_available():
        dev = torch.device(origin)
        if dev.index is None or dev.index < torch.cuda.device_count():
            return dev
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def place(td: TensorDict, schemas: Mapping[str, FieldSchema], device: Any) -> TensorDict:
    for name, schema in schemas.items():
        if schema.is_non_tensor:
            continue
        key = tuple(name.split("."))
        value = td.get(key)
        target = target_device(device, schema.device)
        if value.device != target:
            td.set(key, value.to(target))
    return td


def merge(
    size: int, schemas: Mapping[str, FieldSchema], parts: list[tuple[list[int], TensorDict]]
) -> TensorDict:
    """``merge_parts``, with each dense field copied once into its final tensor."""
    if len(parts) == 1 and parts[0][0] == list(range(size)):
        return parts[0][1]
    dense = [
        n
        for n, s in schemas.items()
        if s.kind == "dense" and not mixed_shapes([td.get(tuple(n.split("."))) for _, td in parts])
    ]  # (a multi-shape field whose parts differ in shape is merged row by row, into nested)
    rest = {n: s for n, s in schemas.items() if n not in dense}
    out = merge_parts(size, rest, parts)
    for name in dense:
        key = tuple(name.split("."))
        first = parts[0][1].get(key)
        merged = torch.empty((size, *first.shape[1:]), dtype=first.dtype, device=first.device)
        for positions, td in parts:
            value = td.get(key)
            n = len(positions)
            if positions == list(range(positions[0], positions[0] + n)):
                merged.narrow(0, positions[0], n).copy_(value)
            else:
                where = torch.tensor(positions, dtype=torch.int64, device=merged.device)
                merged.index_copy_(0, where, value.to(merged.device))
        out.set(key, merged)
    return out
