"""Result tensors of same-host gets: big ones on recycled anonymous mappings.

A get's rows are copied into a new CPU tensor. For results of at least 4 MiB the tensor is laid
over an anonymous mapping that is kept (up to RESULTS_MAX_BYTES per process) once the tensor is
freed, so a steady stream of gets of one size writes into pages already faulted in.
"""

from __future__ import annotations

import contextlib
import math
import mmap
import threading
import weakref

import numpy as np
import torch

__all__ = ["RESULTS_MAX_BYTES", "result"]

_HUGE_MIN = 4 << 20  # results of at least this many bytes get recycled mappings (_result)
RESULTS_MAX_BYTES = 1 << 30  # freed result mappings kept per client process
_RESULTS: dict[int, list[mmap.mmap]] = {}
_RESULTS_HELD = [0]
_RESULTS_GUARD = threading.RLock()  # finalizers may run inside (GC)


def result(shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
    """A new CPU tensor for a get's rows. Big ones are laid over an anonymous mapping that is
    recycled once the tensor is freed (a ``weakref.finalize`` on the numpy array under it), so
    a steady stream of gets of one size writes into pages already faulted in; a fresh mapping
    asks for transparent huge pages (a fresh 64 MiB costs 32 page faults, not 16384)."""
    nbytes = math.prod(shape) * dtype.itemsize
    if nbytes < _HUGE_MIN:
        return torch.empty(shape, dtype=dtype)
    with _RESULTS_GUARD:
        free = _RESULTS.get(nbytes)
        mapping = free.pop() if free else None
        if mapping is not None:
            _RESULTS_HELD[0] -= nbytes
    if mapping is None:
        mapping = mmap.mmap(-1, nbytes, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
        with contextlib.suppress(AttributeError, OSError):
            mapping.madvise(mmap.MADV_HUGEPAGE)
    base = np.frombuffer(mapping, dtype=np.uint8)
    weakref.finalize(base, _recycle, mapping, nbytes)
    return torch.from_numpy(base).view(dtype).view(shape)


def _recycle(mapping: mmap.mmap, nbytes: int) -> None:
    """Keep a freed result's mapping for the next get of that size; older ones of other sizes
    make room (at most RESULTS_MAX_BYTES held)."""
    dropped: list[mmap.mmap] = []
    kept = False
    with _RESULTS_GUARD:
        if nbytes <= RESULTS_MAX_BYTES:
            for size in [k for k in _RESULTS if k != nbytes]:
                while _RESULTS[size] and _RESULTS_HELD[0] + nbytes > RESULTS_MAX_BYTES:
                    dropped.append(_RESULTS[size].pop(0))
                    _RESULTS_HELD[0] -= size
            if _RESULTS_HELD[0] + nbytes <= RESULTS_MAX_BYTES:
                _RESULTS.setdefault(nbytes, []).append(mapping)
                _RESULTS_HELD[0] += nbytes
                kept = True
    for m in dropped if kept else [*dropped, mapping]:
        with contextlib.suppress(BufferError):
            m.close()
