"""What the layers above the transport (the store's data plane, weight sync) may use of it
besides the public API in ``rayless.transport``: codec extensions, the host id, shared-memory
segments, atomic files, and the liveness of a pid (CUDA IPC handles: ``transport.cuda_ipc``,
which imports torch).

Code outside ``transport/`` imports it only from ``rayless.transport``,
``rayless.transport.errors``, this module and ``rayless.transport.cuda_ipc``
(``tests/unit/test_layering.py``).
"""

from __future__ import annotations

from rayless.transport.files import atomic_file, atomic_write
from rayless.transport.protocol import host_id
from rayless.transport.segments import HEADER, Segment, Superseded
from rayless.transport.shm import pid_alive

__all__ = [
    "HEADER",
    "Segment",
    "Superseded",
    "atomic_file",
    "atomic_write",
    "host_id",
    "pid_alive",
]
