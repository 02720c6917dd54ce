"""TransferQueue's read layout: every tensor field with per-sample dimensions comes back as a
jagged nested tensor (``layout=torch.jagged``, ragged in its first per-sample dimension), one
value per sample (``(N,)`` fields) as a plain tensor.

``rayless.store`` returns a plain tensor wherever the samples' shapes agree; code written for
TransferQueue calls ``.to_padded_tensor()``, ``.offsets()`` or tests ``.is_nested`` on what it
reads, so the TransferQueue face hands its reads over in TransferQueue's layout. A dense
field becomes a view (its values and a row-offset vector; no copy of a contiguous field).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:
    from tensordict import TensorDictBase

__all__ = ["as_jagged", "tq_layout"]


def as_jagged(t: torch.Tensor) -> torch.Tensor:
    """``t`` (``(N, L, ...)``, dense) as a jagged nested tensor of N samples of length L,
    sharing ``t``'s memory when it is contiguous."""
    n, length = t.shape[0], t.shape[1]
    values = t.reshape(n * length, *t.shape[2:])
    offsets = torch.arange(n + 1, dtype=torch.int64, device=t.device) * length
    # (the lengths cached, as torch.nested.as_nested_tensor does: to_padded_tensor pads to them)
    return torch.nested.nested_tensor_from_jagged(
        values, offsets, min_seqlen=length, max_seqlen=length
    )


def tq_layout(td: TensorDictBase) -> TensorDictBase:
    """``td`` with each dense tensor leaf of two or more dimensions made jagged (in place;
    returns ``td``). Nested tensors, ``(N,)`` tensors and non-tensor values stay as they
    are."""
    for key in list(td.keys(include_nested=True, leaves_only=True)):
        value = td.get(key)
        if isinstance(value, torch.Tensor) and not value.is_nested and value.dim() >= 2:
            td.set(key, as_jagged(value))
    return td
