"""CUDA tensors for the codec: IPC handles on one host, pinned host staging across hosts.

IPC uses torch's own storage sharing (``torch.multiprocessing.reductions``): the producer's
``storage._share_cuda_()`` hands out the allocation's IPC handle plus a shared ref-counter and
an event; the consumer's ``rebuild_cuda_tensor`` opens it (once per process, through torch's
cache), waits on the event, and releases the ref-counter when its storage dies. The producer's
caching allocator keeps the memory until then, so the sender may drop its tensor right after
sending, but the producing process must outlive every consumer's use of the memory (the
same rule as ``torch.multiprocessing``).

Device choice on receive (``decode(device=...)``), for tensors that were on CUDA when sent:

* ``None`` ("keep"): an IPC tensor stays on the GPU that holds it when this process sees that
  GPU (matched by UUID, so differing ``CUDA_VISIBLE_DEVICES`` are fine); otherwise, and for
  staged tensors, it lands on this process's current CUDA device; with no CUDA, on the CPU.
* ``"cpu"``: the CPU. ``"cuda"``, ``"cuda:N"``, an int or a ``torch.device``: that device.

Tensors that were on the CPU when sent stay on the CPU whatever ``device`` says.
"""

from __future__ import annotations

import functools
import os
from typing import Any

import torch

from rayless.transport.errors import ProtocolError


def parse_device(device: str | int | torch.device | None) -> torch.device | None:
    """Normalise the ``device`` argument of decode; None (or ``"keep"``) means keep.

    Raises ValueError for anything but CPU and CUDA devices (a caller error, not the peer's).
    """
    if device is None or device == "keep":
        return None
    if isinstance(device, bool):
        raise ValueError(f"bad device {device!r}")
    target = torch.device("cuda", device) if isinstance(device, int) else torch.device(device)
    if target.type not in ("cpu", "cuda"):
        raise ValueError(f"decode can place tensors on cpu or cuda, not {target}")
    return target


def target_for(device: torch.device | None) -> torch.device:
    """Where a tensor that was on CUDA when sent should land, given decode's ``device``."""
    if device is not None:
        return device
    if torch.cuda.is_available():
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def origin_device(name: Any) -> torch.device:
    """Parse a device name from the wire; ProtocolError unless it names a cpu or cuda device."""
    try:
        dev = torch.device(name) if type(name) is str else None
    except RuntimeError:
        dev = None
    if dev is None or dev.type not in ("cpu", "cuda"):
        raise ProtocolError(f"bad device {name!r}")
    return dev


def stage(t: torch.Tensor) -> torch.Tensor:
    """Start copying the CUDA tensor ``t`` into pinned host memory; call :func:`sync` after."""
    host = torch.empty(t.shape, dtype=t.dtype, pin_memory=True)
    host.copy_(t.detach(), non_blocking=True)
    return host


def sync(devices: set[torch.device]) -> None:
    """Wait for the staging copies issued on each device's current stream."""
    for dev in devices:
        torch.cuda.current_stream(dev).synchronize()


@functools.lru_cache(maxsize=1)
def _local_uuids() -> dict[str, int]:
    return {
        str(torch.cuda.get_device_properties(i).uuid): i for i in range(torch.cuda.device_count())
    }


def ipc_fields(t: torch.Tensor) -> list[Any]:
    """The wire fields of an IPC share of the CUDA tensor ``t`` (no copy, strides kept)."""
    from torch.multiprocessing.reductions import reduce_tensor

    _, args = reduce_tensor(t.detach())
    (_, size, stride, offset, _, _, index, handle, nbytes, byte_offset, _, rc_handle,
     rc_offset, ev_handle, ev_sync) = args  # fmt: skip
    uuid = str(torch.cuda.get_device_properties(index).uuid)
    _remember(handle, byte_offset, t)
    return [list(size), list(stride), offset, index, uuid, handle, nbytes, byte_offset,
            rc_handle, rc_offset, ev_handle, bool(ev_sync), os.getpid()]  # fmt: skip


# Storages this process shared, by (handle, byte offset): CUDA cannot open an IPC handle in the
# process that made it, so a message decoded by its own sender takes the storage from here.
_SENT: dict[tuple[bytes, int], Any] = {}


def _remember(handle: Any, byte_offset: int, t: torch.Tensor) -> None:
    from torch.multiprocessing.reductions import StorageWeakRef

    if len(_SENT) > 1024:
        for key in [k for k, ref in _SENT.items() if ref.expired()]:
            del _SENT[key]
    _SENT[(handle, byte_offset)] = StorageWeakRef(t.untyped_storage())


def _own(fields: list[Any], dtype: torch.dtype) -> torch.Tensor:
    size, stride, offset, index, _, handle, _, byte_offset, rc_handle, rc_offset = fields[:10]
    ref = _SENT.get((handle, byte_offset))
    if ref is None or ref.expired():
        raise ProtocolError("CUDA IPC tensor sent by this process is gone")
    storage = torch.UntypedStorage._new_with_weak_ptr(ref.cdata)
    torch.UntypedStorage._release_ipc_counter(rc_handle, rc_offset, device=index)
    return torch.empty(0, dtype=dtype, device=storage.device).set_(storage, offset, size, stride)


def _int(value: Any) -> int:
    if type(value) is not int or value < 0:
        raise ProtocolError(f"bad CUDA IPC field {value!r}")
    return value


def open_ipc(dtype: torch.dtype, fields: list[Any], device: torch.device | None) -> torch.Tensor:
    """Open an IPC share described by :func:`ipc_fields` and place it per ``device``.

    Raises ProtocolError for malformed fields or when this process has no CUDA.
    """
    if len(fields) != 13:
        raise ProtocolError("bad CUDA IPC record")
    size, stride, offset, index, uuid, handle, nbytes, byte_offset = fields[:8]
    rc_handle, rc_offset, ev_handle, ev_sync, pid = fields[8:]
    if not torch.cuda.is_available():
        raise ProtocolError("received a CUDA IPC handle but this process has no CUDA")
    if type(size) is not list or type(stride) is not list or len(size) != len(stride):
        raise ProtocolError("bad CUDA IPC shape")
    for value in (*size, *stride, offset, index, nbytes, byte_offset, rc_offset, pid):
        _int(value)
    if not all(isinstance(h, bytes) or h is None for h in (handle, rc_handle, ev_handle)):
        raise ProtocolError("bad CUDA IPC handle")
    if pid == os.getpid():
        mine = _own(fields, dtype)
        return mine if device is None or mine.device == device else mine.to(device)
    from torch.multiprocessing.reductions import rebuild_cuda_tensor

    local = _local_uuids().get(uuid) if type(uuid) is str else None
    opened_on = torch.cuda.current_device() if local is None else local
    t: torch.Tensor = rebuild_cuda_tensor(
        torch.Tensor, torch.Size(size), tuple(stride), offset, torch.storage.TypedStorage,
        dtype, opened_on, handle, nbytes, byte_offset, False, rc_handle, rc_offset,
        ev_handle, bool(ev_sync),
    )  # fmt: skip
    if device is not None and t.device != device:
        t = t.to(device)
    return t
