"""The client's CUDA side of the same-host data plane (used by :mod:`rayless.store.samehost.plane`).

A CUDA unit exports each dense column by CUDA IPC (:mod:`rayless.store.samehost.columns_cuda`); a
client that sees the unit's GPU opens the share once per column allocation and keeps it mapped (the
mapping is given back when the column moves on or the client closes). Copies between the
client's tensors and the unit's slots are one device-to-device copy per byte, issued in a
worker thread after the caller's streams reached the point where the copy was asked for, and
finished (device synchronised) before the put commits or the get returns.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterable
from typing import Any

import torch

__all__ = ["open_column", "ready_events", "run_copies", "visible_device"]


@functools.lru_cache(maxsize=1)
def _uuids() -> dict[str, int]:
    return {
        str(torch.cuda.get_device_properties(i).uuid): i for i in range(torch.cuda.device_count())
    }


def visible_device(uuid: Any) -> torch.device | None:
    """This process's device for the GPU with ``uuid``; None when it has no CUDA or does not
    see that GPU (the socket path serves it then)."""
    if not isinstance(uuid, str) or not torch.cuda.is_available():
        return None
    index = _uuids().get(uuid)
    return None if index is None else torch.device("cuda", index)


def open_column(ipc: list[Any], dtype: torch.dtype) -> torch.Tensor:
    """The unit's column tensor from its IPC share (``CudaDense.export``). Raises
    ProtocolError for a malformed share, RuntimeError when CUDA cannot open it."""
    from rayless.transport.cuda_ipc import open_ipc

    return open_ipc(dtype, ipc, None)


def ready_events(tensors: Iterable[torch.Tensor]) -> list[Any]:
    """An event on the current stream of each CUDA device among ``tensors``: the copies wait
    for the work the caller queued before asking (call it on the caller's thread)."""
    events = []
    for dev in {t.device for t in tensors if t.device.type == "cuda"}:
        ev = torch.cuda.Event()
        ev.record(torch.cuda.current_stream(dev))
        events.append(ev)
    return events


def run_copies(events: list[Any], devices: set[torch.device], copy: Callable[[], Any]) -> Any:
    """Run ``copy`` (device copies) after ``events``, and return once they are done on every
    device in ``devices`` (so a commit or a result never races them). Blocks: call it in a
    worker thread."""
    cuda = sorted({d for d in devices if d.type == "cuda"}, key=lambda d: d.index or 0)
    for ev in events:
        ev.synchronize()
    if not cuda:
        return copy()
    with torch.cuda.device(cuda[0]):
        result = copy()
    for dev in cuda:
        torch.cuda.synchronize(dev)
    return result
