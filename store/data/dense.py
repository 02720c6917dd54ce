"""The dense column: a field's rows as slots of one growable tensor.

:class:`DenseColumn` is what a storage unit's shard keeps a dense field in
(:mod:`rayless.store.unit.columns`), and the base of the same-host columns in shared memory and
GPU memory (:mod:`rayless.store.samehost.columns`). Both packages import it from here, so
neither imports the other for it.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import torch

from rayless.store.data.schema import FieldSchema, tensor_bytes

__all__ = ["DenseColumn"]


class DenseColumn:
    """A dense column: slots of one growable tensor (``index_copy_`` in, ``index_select`` out,
    growth by doubling within a byte budget, freed slots reused)."""

    def __init__(self, schema: FieldSchema, device: torch.device) -> None:
        self.schema = schema
        dtype = schema.torch_dtype or torch.float32
        self.data = torch.empty(
            (0, *(d or 0 for d in schema.shape or ())), dtype=dtype, device=device
        )
        self.slot_of: dict[int, int] = {}
        self.free: list[int] = []
        self.top = 0  # slots [top, capacity) were never used

    @property
    def capacity(self) -> int:
        return int(self.data.shape[0])

    @property
    def row_bytes(self) -> int:
        return tensor_bytes(self.data[:1]) if self.capacity else tensor_bytes(self._one_row())

    def _one_row(self) -> torch.Tensor:
        return torch.empty((1, *self.data.shape[1:]), dtype=self.data.dtype, device="meta")

    @property
    def nbytes(self) -> int:
        return tensor_bytes(self.data)

    def growth(self, indexes: Sequence[int], budget: int) -> tuple[int, int]:
        """The capacity to add ``indexes`` within ``budget`` bytes, and the bytes it costs.

        Doubles when the budget allows, else grows exactly; the capacity is -1 (with the least
        cost) when even that is over budget, and unchanged (cost 0) when spare slots suffice.
        """
        return self._growth_for(sum(1 for i in indexes if i not in self.slot_of), budget)

    def _growth_for(self, new_rows: int, budget: int) -> tuple[int, int]:
        """``growth`` for ``new_rows`` rows that need a slot of their own."""
        spare = len(self.free) + self.capacity - self.top
        if new_rows <= spare:
            return self.capacity, 0
        required = self.capacity + new_rows - spare
        row = self.row_bytes
        for cap in (max(required, 2 * self.capacity), required):
            if (cap - self.capacity) * row <= budget:
                return cap, (cap - self.capacity) * row
        return -1, (required - self.capacity) * row

    def grow(self, capacity: int) -> None:
        bigger = torch.empty(
            (capacity, *self.data.shape[1:]), dtype=self.data.dtype, device=self.data.device
        )
        if self.top:
            bigger[: self.top].copy_(self.data[: self.top])
        self.data = bigger

    def write(self, indexes: Sequence[int], value: torch.Tensor) -> None:
        slots = []
        for i in indexes:
            slot = self.slot_of.get(i)
            if slot is None:
                if self.free:
                    slot = self.free.pop()
                else:
                    slot = self.top
                    self.top += 1
                self.slot_of[i] = slot
            slots.append(slot)
        where = torch.tensor(slots, dtype=torch.int64, device=self.data.device)
        self.data.index_copy_(0, where, value.to(self.data.device))

    def read(self, indexes: Sequence[int]) -> torch.Tensor:
        where = torch.tensor(
            [self.slot_of[i] for i in indexes], dtype=torch.int64, device=self.data.device
        )
        return self.data.index_select(0, where)

    def delete(self, indexes: Iterable[int]) -> None:
        for i in indexes:
            slot = self.slot_of.pop(i, None)
            if slot is not None:
                self.free.append(slot)

    def __contains__(self, index: int) -> bool:
        return index in self.slot_of

    def holds_any(self, indexes: Iterable[int]) -> bool:
        """Whether any of ``indexes`` has a row here (one C-level pass)."""
        return not self.slot_of.keys().isdisjoint(indexes)

    def __len__(self) -> int:
        return len(self.slot_of)
