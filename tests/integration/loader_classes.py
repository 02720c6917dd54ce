"""Actors of the engine-loader tests (importable by actor processes)."""

from __future__ import annotations

from collections.abc import Iterator

import torch

from rayless.actors import Actor
from rayless.weights import SyncWeightSync


class TiedModel(torch.nn.Module):
    """An embedding tied to the output head (as a Hugging Face causal LM with
    ``tie_word_embeddings``), a layer between them."""

    def __init__(self, vocab: int = 32, width: int = 16) -> None:
        super().__init__()
        self.embed_tokens = torch.nn.Embedding(vocab, width)
        self.layer = torch.nn.Linear(width, width)
        self.lm_head = torch.nn.Linear(width, vocab, bias=False)
        self.lm_head.weight = self.embed_tokens.weight


class EngineWorker(Actor):
    """An inference engine's worker: a sync hook (as vLLM's worker extension) that pulls with
    the blocking face into its model's loader."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.model = TiedModel().to(torch.float32)
        self.calls: list[list[tuple[str, str]]] = []

    def load_weights(self, weights: Iterator[tuple[str, torch.Tensor]]) -> None:
        """The engine's loader: HF's load_state_dict(strict=False), one bucket at a time."""
        got = dict(weights)
        self.calls.append([(k, str(v.dtype)) for k, v in got.items()])
        self.model.load_state_dict(got, strict=False)

    def update(self, min_version: int) -> int:
        """Pull through SyncWeightSync into ``load_weights`` (fp32 here, whatever the wire)."""
        ws = SyncWeightSync.connect(self.name)
        try:
            return ws.pull(
                min_version=min_version, timeout=30, into=self.load_weights, dtype=torch.float32
            )
        finally:
            ws.close()

    def seen(self) -> list[list[tuple[str, str]]]:
        """Per loader call: the (name, dtype) pairs it got."""
        return self.calls

    def values(self) -> dict[str, float]:
        """The mean of each tensor of the model now (the tied head is the embedding)."""
        out = {k: float(v.float().mean()) for k, v in self.model.state_dict().items()}
        out["tied"] = float(self.model.lm_head.weight is self.model.embed_tokens.weight)
        return out
