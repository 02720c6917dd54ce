"""Actor classes for test_fork_templates (importable by actor processes; no torch here)."""

from __future__ import annotations

import sys

from rayless.actors import Actor


class Probe(Actor):
    """Tells whether its process has torch, and uses it."""

    def torch_loaded(self) -> bool:
        return "torch" in sys.modules

    def use_torch(self) -> float:
        import torch

        return float(torch.ones(3).sum())


class TorchProbe(Probe):
    """A Probe whose fork template imports torch for it (its module does not)."""

    template_imports = ("torch",)


class BadImports(Probe):
    template_imports = "torch"  # type: ignore[assignment]  # a str, not a tuple
