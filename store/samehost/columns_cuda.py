"""Dense columns in a CUDA unit's GPU memory, exported to same-host clients by CUDA IPC.

A CUDA storage unit keeps each dense column in one tensor on its GPU (allocated by the unit,
through torch's caching allocator). A client on the same host that sees that GPU opens the
column once per allocation (:meth:`CudaDense.export` hands out a CUDA IPC share: torch's
``reduce_tensor``; the client's ``open_ipc`` caches the mapping) and then moves a put's rows
into reserved slots, and a get's rows out of their slots, with one device-to-device copy per
byte; only control messages cross the socket (:mod:`rayless.store.samehost.plane_cuda`).

Readers never see bytes change under them by the lease design of
:mod:`rayless.store.samehost.columns`,
unchanged: copy-on-write slots, quarantine, reclaim only under an exclusive ``flock`` taken
without waiting, a generation a reader checks under its shared lease. GPU memory cannot be
``flock``-ed, so each column has a small *lease segment* in ``/dev/shm`` (a header, no
payload to speak of) that carries the generation and the locks; it is what ``segment`` names
for a CUDA column, and it is cleaned up like any segment (unit exit, the agent's sweep after
kill -9).

Growing allocates a new tensor, copies the rows, and moves to a new lease segment; the old
tensor is freed by the unit, and torch keeps its memory (the IPC "limbo") until every client
that opened it has dropped its mapping. A client's mapping is valid while the unit lives
(torch.multiprocessing's rule for CUDA tensors): clients copy under a lease; zero-copy views
of CUDA columns are not offered (``get(zero_copy=True)`` copies).
"""

from __future__ import annotations

from typing import Any

import torch

from rayless.store.samehost.columns import ShmDense, forget
from rayless.transport.ext import Segment

__all__ = ["LEASE_BYTES", "CudaDense", "cuda_uuid"]

LEASE_BYTES = 64  # payload of a lease segment (unused: the header holds the generation)


def cuda_uuid(device: torch.device) -> str:
    """The UUID of ``device`` (how a client on the same host tells whether it sees that GPU)."""
    return str(torch.cuda.get_device_properties(device).uuid)


class CudaDense(ShmDense):
    """A dense column in GPU memory with a lease segment (see the module docstring).

    On a CPU ``device`` (tests) it is the same column with its tensor in ordinary memory; only
    :meth:`export` needs CUDA.
    """

    def grow(self, capacity: int) -> None:
        """Move to a new tensor of ``capacity`` rows and a new lease segment. Raises
        torch.OutOfMemoryError when the GPU has no room (nothing changed then)."""
        bigger = torch.empty(
            (capacity, *self.data.shape[1:]), dtype=self.data.dtype, device=self.data.device
        )
        seg = Segment.create(LEASE_BYTES)
        self._stamp(seg)
        if self.top:
            bigger[: self.top].copy_(self.data[: self.top])
        old, self.segment, self.data = self.segment, seg, bigger
        if old is not None:
            forget(old, unlink=True)

    def export(self) -> list[Any]:
        """A CUDA IPC share of the whole column for one client to open (``open_ipc``; the
        column's segment, generation and rows travel beside it). Each call makes a new share,
        so call it once per client and allocation (the client caches what it opened). Raises
        RuntimeError without CUDA."""
        from rayless.transport.cuda_ipc import ipc_fields

        if self.data.device.type != "cuda":
            raise RuntimeError("only a column on a CUDA device can be exported")
        return ipc_fields(self.data)

    def close(self) -> None:
        """Unlink the lease segment and drop the tensor (clients' mappings keep the memory
        until they drop them)."""
        if self.segment is not None:
            forget(self.segment, unlink=True)
            self.segment = None
