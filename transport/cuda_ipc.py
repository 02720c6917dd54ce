"""CUDA IPC shares of tensors for the layers above the transport (the store's same-host CUDA
columns, weight sync's CUDA path): the fields that describe a share, and opening one in
another process. Imports torch.
"""

from __future__ import annotations

from rayless.transport._cuda import ipc_fields, open_ipc

__all__ = ["ipc_fields", "open_ipc"]
