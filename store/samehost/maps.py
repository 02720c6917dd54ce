"""The bookkeeping of the client's same-host plane: which units are local, mapped segments, leases.

:class:`LocalMaps` remembers which units run on this host (shared-memory or CUDA IPC columns),
keeps their column segments mapped (at most ``_MAX_OPEN`` unleased ones), takes and releases
shared leases on them (a segment's generation checked), opens CUDA columns from their IPC shares
and builds the column tensors (or zero-copy views that hold a lease of their own) that
:class:`~rayless.store.samehost.plane.LocalPlane`'s puts and gets copy into and out of.
"""

from __future__ import annotations

import os
import threading
import weakref
from collections.abc import Mapping
from typing import Any

import numpy as np
import torch

from rayless.actors import ActorDiedError
from rayless.store.data.schema import Column, FieldSchema
from rayless.store.samehost.columns import forget, tensor_on
from rayless.store.samehost.plane_cuda import open_column, visible_device
from rayless.transport.protocol import host_id
from rayless.transport.segments import HEADER, Segment, Superseded

__all__ = ["LocalMaps"]

_MAX_OPEN = 32


class _Mapped:
    def __init__(self, seg: Segment, tensor: torch.Tensor | None = None) -> None:
        self.seg = seg  # the column's segment (a CUDA column's: its lease segment)
        self.leases = 0
        self.tensor = tensor  # a CUDA column: the unit's tensor, opened by IPC


class LocalMaps:
    """One client's view of same-host units: which are local, mapped segments, leases."""

    def __init__(self) -> None:
        self.enabled = os.environ.get("RAYLESS_STORE_LOCAL", "1") != "0"
        self._host = host_id()
        self._local: dict[str, bool] = {}
        self._gpu: dict[str, torch.device] = {}  # CUDA units: their GPU as this process sees it
        self._maps: dict[str, _Mapped] = {}
        self._guard = threading.RLock()  # view finalizers may run inside it (GC)
        weakref.finalize(self, _close_unleased, self._maps, self._guard)

    def close(self) -> None:
        """Drop the mappings no view uses (views keep theirs until freed). Idempotent."""
        _close_unleased(self._maps, self._guard)
        self._local.clear()

    async def is_local(self, unit: Mapping[str, Any]) -> bool:
        """Whether ``unit`` (its info) runs on this host with shared-memory columns."""
        if not self.enabled or unit.get("handle") is None:
            return False
        key = str(unit["unit_id"])
        if key not in self._local:
            try:
                info = await unit["handle"].local_info()
            except ActorDiedError:
                return False
            except Exception:  # not reachable now: the socket path will say why
                return False
            same = info.get("host") == self._host
            gpu = visible_device(info.get("gpu_uuid")) if info.get("cuda_ipc") else None
            if same and gpu is not None:
                self._gpu[key] = gpu
            self._local[key] = same and (bool(info.get("shm")) or gpu is not None)
        return self._local[key]

    def gpu_of(self, unit: Mapping[str, Any]) -> torch.device | None:
        """A local CUDA unit's GPU (after :meth:`is_local`), None for a CPU unit."""
        return self._gpu.get(str(unit["unit_id"]))

    def dense_for(
        self, unit: Mapping[str, Any], columns: Mapping[str, Column]
    ) -> dict[str, Column]:
        """The columns a same-host put writes straight into ``unit``'s columns: dense CPU
        tensors, and for a CUDA unit dense tensors on any device."""
        cuda = self.gpu_of(unit) is not None
        return {
            k: c
            for k, c in columns.items()
            if c.dense is not None and (cuda or c.dense.device.type == "cpu")
        }

    def known(self, unit: Mapping[str, Any]) -> list[str] | None:
        """For a CUDA unit: the columns (lease segments) this client has opened, which the
        unit then sends no IPC share for; None for a CPU unit."""
        if self.gpu_of(unit) is None:
            return None
        with self._guard:
            return [k for k, m in self._maps.items() if m.tensor is not None]

    def _map_cuda(self, fields: Mapping[str, Any], schemas: Mapping[str, FieldSchema]) -> None:
        """Open the CUDA columns whose IPC shares came with ``fields`` (reserve, locate)."""
        for name, where in fields.items():
            ipc, seg_name = where.get("ipc"), where.get("segment")
            if ipc is None or seg_name is None:
                continue
            tensor = open_column(ipc, schemas[name].torch_dtype or torch.float32)
            try:
                seg = Segment.open(seg_name)
            except Superseded:
                continue  # the column moved on: the copy locates again
            with self._guard:
                old = self._maps.get(seg_name)
                if old is not None and old.tensor is not None:
                    forget(seg)
                    continue
                if old is not None and old.leases == 0:
                    forget(old.seg)
                self._maps[seg_name] = _Mapped(seg, tensor)

    # -- segments and leases ------------------------------------------------------------

    def _open(self, name: str) -> _Mapped:
        """The mapping of segment ``name``, opened if needed; call with ``_guard`` held (an
        unleased mapping may be evicted by the next open). Raises Superseded when it is gone."""
        m = self._maps.get(name)
        if m is None:
            if len(self._maps) >= _MAX_OPEN:
                for old in [k for k, v in self._maps.items() if v.leases == 0]:
                    forget(self._maps.pop(old).seg)
            m = self._maps[name] = _Mapped(Segment.open(name))
        return m

    def _acquire(
        self, name: str, generation: int | None = None, fence: int | None = None
    ) -> _Mapped | None:
        """A shared lease on segment ``name`` while it holds ``generation`` (a reader's check)
        and ``fence`` (a writer's: see columns.py); None: locate or reserve again.

        Opening and leasing happen under one hold of ``_guard``: a mapping another thread
        evicts or closes is never one this call is about to lock."""
        with self._guard:
            try:
                m = self._open(name)
            except Superseded:
                return None
            if m.leases == 0 and not m.seg.lock(False, False):
                return None  # the unit is reclaiming slots right now
            m.leases += 1
        stale_gen = generation is not None and m.seg.version != generation
        if stale_gen or (fence is not None and m.seg.fence != fence):
            self._release(m)
            return None
        return m

    def _release(self, m: _Mapped) -> None:
        with self._guard:
            m.leases -= 1
            if m.leases == 0 and m.seg.fd >= 0:
                m.seg.unlock()
                if self._maps.get(m.seg.name) is not m:
                    forget(m.seg)  # evicted or closed while a view held it

    def _view(self, m: _Mapped, schema: FieldSchema, rows: int, own: bool) -> torch.Tensor:
        """The column tensor on mapping ``m``; ``own``: its storage holds a lease of its own."""
        dtype = schema.torch_dtype or torch.float32
        shape = tuple(int(d or 0) for d in schema.shape or ())
        if m.tensor is not None:  # a CUDA column (no views with leases of their own)
            return m.tensor
        if not own:
            return tensor_on(m.seg, dtype, shape, rows)
        nbytes = rows * int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
        base = np.frombuffer(m.seg.mapping, dtype=np.uint8, count=nbytes, offset=HEADER)
        with self._guard:
            m.leases += 1  # the view's own lease, released when its storage is freed
        weakref.finalize(base, self._release, m)
        return torch.from_numpy(base).view(dtype).view(rows, *shape)


def _close_unleased(maps: dict[str, _Mapped], guard: threading.RLock) -> None:
    with guard:
        for name in [k for k, m in maps.items() if m.leases == 0]:
            forget(maps.pop(name).seg)
