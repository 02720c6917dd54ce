"""Actor classes for test_fork_templates (importable by actor processes; no torch here)."""

from __future__ import annotations

import os
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


class EnvProbe(Probe):
    """Tells its pid, parent, working directory and environment."""

    def pid(self) -> int:
        return os.getpid()

    def parent(self) -> int:
        return os.getppid()

    def cwd(self) -> str:
        return os.getcwd()

    def env(self, name: str) -> str | None:
        return os.environ.get(name)
