"""The same-host CUDA path: flattened buckets on the publisher's GPU, shared by CUDA IPC; one
device-to-device copy per subscriber. The client's segment then carries only the version
header and the readers' lease. Chosen when every published tensor is on CUDA and the client's
``cuda_ipc`` is on."""

from __future__ import annotations

import torch

from rayless.transport.errors import ProtocolError
from rayless.weights.delta import History, changed_rows
from rayless.weights.errors import WeightSyncError
from rayless.weights.layout import bucket_sizes, write_from
from rayless.weights.messages import Entry, IpcBucket, PathKind
from rayless.weights.paths.base import PublishRequest, Slots, WeightPath, Written
from rayless.weights.paths.shm import starts_of
from rayless.weights.sinks import Sink

__all__ = ["CudaPath"]


class CudaPath(WeightPath):
    """Publishes into IPC-shared GPU buckets (kept per segment); reads them by IPC."""

    kind = PathKind.CUDA

    def __init__(self, sync: str, slots: Slots) -> None:
        super().__init__(sync, slots)
        self._buckets: dict[str, tuple[list[torch.Tensor], tuple[IpcBucket, ...]]] = {}
        self._opened: dict[tuple[str, int], tuple[bytes, torch.Tensor]] = {}  # IPC buckets
        self._used = False
        self.history = History()

    def publishes(self, request: PublishRequest) -> bool:
        tensors = request.tensors
        return (
            request.group is None
            and request.cuda_ipc
            and bool(tensors)
            and all(t.is_cuda for t in tensors.values())
        )

    def write(self, request: PublishRequest) -> Written:
        from rayless.transport.cuda_ipc import ipc_fields

        tensors, layout = request.tensors, request.layout
        sizes = bucket_sizes(layout)
        device = next(iter(tensors.values())).device
        pool = self.slots.pool()
        history = self.history
        changed = None
        prev, base = pool.newest, history.newest(layout)
        if request.delta and prev is not None and base is not None and prev.name in self._buckets:
            old = self._buckets[prev.name][0]
            if history.holds.get(prev.name) == base and old[0].device == device:
                changed = changed_rows(tensors, layout, old, None)
        seg = pool.begin(0)  # the header only: version and lease; the bytes live on the GPU
        try:
            have = self._buckets.get(seg.name)
            if have is None or [b.numel() for b in have[0]] != sizes or have[0][0].device != device:
                history.holds.pop(seg.name, None)
                buckets = [torch.empty(n, dtype=torch.uint8, device=device) for n in sizes]
                have = (buckets, tuple(IpcBucket.of(ipc_fields(b)) for b in buckets))
                self._buckets[seg.name] = have
            rows = history.to_write(seg.name, changed)
            write_from(tensors, layout if rows is None else [layout[i] for i in sorted(rows)],
                       have[0])  # fmt: skip
            torch.cuda.synchronize(device)
        except BaseException:
            history.holds.pop(seg.name, None)  # its bytes are torn
            pool.abort(seg)
            raise
        pool.commit(seg, request.version)
        history.record(layout, request.version, seg.name, changed, [])
        entry = Entry(PathKind.CUDA, request.version, layout, request.shard, seg.name,
                      starts_of(sizes), have[1],
                      deltas=history.deltas() if request.delta else ())  # fmt: skip
        return Written(entry, have[0])

    def read(self, entry: Entry, payload: memoryview, sink: Sink) -> None:
        sink.copy_part(entry, self._ipc_buckets(entry), None)
        self._used = True

    def settle(self) -> None:
        if self._used:
            self._used = False
            torch.cuda.synchronize()

    def _ipc_buckets(self, entry: Entry) -> list[torch.Tensor]:
        from rayless.transport.cuda_ipc import open_ipc

        out = []
        for i, bucket in enumerate(entry.ipc):
            key = (entry.segment, i)
            have = self._opened.get(key)
            if have is None or have[0] != bucket.handle:
                try:
                    opened = open_ipc(torch.uint8, bucket.fields(), None)
                except (ProtocolError, RuntimeError) as exc:  # no CUDA, or not this GPU
                    raise WeightSyncError(
                        f"weight sync {self.sync!r}: the weights are on the publisher's GPU "
                        f"and this process cannot open them ({exc}); publish CPU tensors or "
                        "create the sync with cuda_ipc=False"
                    ) from None
                have = (bucket.handle, opened)
                self._opened[key] = have
            out.append(have[1])
        return out

    def close(self) -> None:
        self._opened.clear()
        self._buckets.clear()
