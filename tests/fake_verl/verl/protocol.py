"""A faithful stand-in for ``verl.protocol.DataProto`` (verl's fields, ``chunk``, ``concat``,
``__len__``, padding, ``select_idxs``, ``from_dict``), for tests without verl installed."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
from tensordict import TensorDict


class DataProtoConfig:
    auto_padding = False
    auto_padding_key = "_verl_auto_padding"


@dataclass
class DataProto:
    """verl's batch: a TensorDict, a dict of numpy (object) arrays, and a meta_info dict."""

    batch: TensorDict | None = None
    non_tensor_batch: dict[str, np.ndarray] = field(default_factory=dict)
    meta_info: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.check_consistency()

    def check_consistency(self) -> None:
        if self.batch is not None:
            assert len(self.batch.batch_size) == 1, "only support num_batch_dims=1"
        for key, val in self.non_tensor_batch.items():
            assert isinstance(val, np.ndarray), f"{key} is not a numpy array"
        if self.batch is not None and self.non_tensor_batch:
            n = self.batch.batch_size[0]
            for key, val in self.non_tensor_batch.items():
                assert val.shape[0] == n, f"key {key} length {len(val)} != batch size {n}"

    def __len__(self) -> int:
        if self.batch is not None:
            return int(self.batch.batch_size[0])
        if self.non_tensor_batch:
            return int(next(iter(self.non_tensor_batch.values())).shape[0])
        return 0

    @classmethod
    def from_dict(
        cls,
        tensors: dict[str, torch.Tensor] | None = None,
        non_tensors: dict[str, Any] | None = None,
        meta_info: dict[str, Any] | None = None,
    ) -> DataProto:
        assert tensors, "tensors must not be empty"
        n = next(iter(tensors.values())).shape[0]
        nt = {k: np.array(v, dtype=object) for k, v in (non_tensors or {}).items()}
        batch = TensorDict(source=tensors, batch_size=(n,))
        return cls(batch=batch, non_tensor_batch=nt, meta_info=dict(meta_info or {}))

    def is_padding_enabled(self) -> bool:
        return bool(self.meta_info.get(DataProtoConfig.auto_padding_key, False)) or bool(
            DataProtoConfig.auto_padding
        )

    def select_idxs(self, idxs: Any) -> DataProto:
        index = np.asarray(idxs)
        if index.dtype == bool:
            index = np.nonzero(index)[0]
        batch = None
        if self.batch is not None:
            batch = self.batch[torch.as_tensor(index, dtype=torch.long)]
        nt = {k: v[index] for k, v in self.non_tensor_batch.items()}
        return type(self)(batch=batch, non_tensor_batch=nt, meta_info=self.meta_info)

    def padding(self, padding_size: int, padding_candidate: str = "") -> None:
        """verl's: append ``padding_size`` copies of the first or (default) the last row."""
        if padding_size == 0:
            return
        row = 0 if padding_candidate == "first" else len(self) - 1
        padded = DataProto.concat([self, self.select_idxs([row] * padding_size)])
        self.batch = padded.batch
        self.non_tensor_batch = padded.non_tensor_batch

    def chunk(self, chunks: int) -> list[DataProto]:
        if not self.is_padding_enabled():
            assert len(self) % chunks == 0, (
                f"only support equal chunk. Got size of DataProto {len(self)} and chunk {chunks}."
            )
        if self.batch is not None:
            batch_lst: list[Any] = list(self.batch.chunk(chunks=chunks, dim=0))
            sizes = np.array([b.batch_size[0] for b in batch_lst])
            indices = np.cumsum(sizes)[:-1].tolist()
        else:
            batch_lst = [None] * chunks
            indices = None
        parts: list[dict[str, np.ndarray]] = [{} for _ in range(chunks)]
        for key, val in self.non_tensor_batch.items():
            split = np.array_split(val, indices if indices is not None else chunks)
            for i in range(chunks):
                parts[i][key] = split[i]
        return [
            type(self)(batch=batch_lst[i], non_tensor_batch=parts[i], meta_info=self.meta_info)
            for i in range(chunks)
        ]

    @staticmethod
    def concat(data: list[DataProto]) -> DataProto:
        batches = [d.batch for d in data]
        new_batch = torch.cat(batches, dim=0) if batches[0] is not None else None  # type: ignore[arg-type]
        keys = data[0].non_tensor_batch.keys()
        nt = {k: np.concatenate([d.non_tensor_batch[k] for d in data], axis=0) for k in keys}
        cls = type(data[0]) if data else DataProto
        return cls(batch=new_batch, non_tensor_batch=nt, meta_info=data[0].meta_info)
