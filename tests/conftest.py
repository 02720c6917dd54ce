"""Shared test configuration: CUDA tests skip without a GPU; embedded clusters publish into a
runtime directory of this test run (never the user's, where other runs' clusters live)."""

from __future__ import annotations

import os
import tempfile

import pytest


def pytest_configure(config: pytest.Config) -> None:
    os.environ.setdefault("RAYLESS_RUNTIME_DIR", tempfile.mkdtemp(prefix="rayless-test-rt-"))


def _has_cuda() -> bool:
    try:
        import torch

        return bool(torch.cuda.is_available())
    except Exception:
        return False


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if _has_cuda():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU")
    for item in items:
        if "cuda" in item.keywords:
            item.add_marker(skip)
