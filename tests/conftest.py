"""Shared test configuration.

* CUDA tests skip without a GPU.
* Embedded clusters publish into a runtime directory of this test process (never the user's,
  where other runs' clusters live; under pytest-xdist one per worker, so that a test that
  finds "the cluster on this machine" finds its own worker's); it is removed at the end.
* Clusters fork from a torch template in ``demand`` mode (``RAYLESS_ZYGOTE_PRELOAD``).
* ``RAYLESS_TEST_TIMEOUT_SCALE`` (tests/waiting.py) scales pytest-timeout's per-test limit
  (the ini ``timeout`` and every ``@pytest.mark.timeout``) as it scales every wait.
"""

from __future__ import annotations

import os
import shutil
import tempfile

import pytest

from tests import progress
from tests.waiting import timeout_scale

_RUNTIME_ENV = "RAYLESS_RUNTIME_DIR"
_made: list[str] = []

# Every cluster the suite starts (here, in driver subprocesses, under `rayless launch`) forks
# from a template that imports torch only when an actor's module does: most tests' actors
# never touch torch, and ~3 CPU-s of torch and tensordict per cluster was a third of the
# suite's CPU. The tests of the template's modes name theirs.
os.environ.setdefault("RAYLESS_ZYGOTE_PRELOAD", "demand")


def pytest_configure(config: pytest.Config) -> None:
    worker = os.environ.get("PYTEST_XDIST_WORKER")
    if worker is not None or _RUNTIME_ENV not in os.environ:
        # a worker inherits its controller's directory: it gets its own instead
        path = tempfile.mkdtemp(prefix=f"rayless-test-rt-{worker or 'main'}-")
        _made.append(path)
        os.environ[_RUNTIME_ENV] = path


@pytest.hookimpl(trylast=True)
def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    """Remove the runtime directory once the shared clusters stopped (the rayless plugin's
    sessionfinish); not at unconfigure, which an xdist worker may not reach before its
    controller ends it."""
    while _made:
        shutil.rmtree(_made.pop(), ignore_errors=True)


def _has_cuda() -> bool:
    try:
        import torch

        return bool(torch.cuda.is_available())
    except Exception:
        return False


def _scale_timeouts(config: pytest.Config, items: list[pytest.Item]) -> None:
    scale = timeout_scale()
    if scale == 1:
        return
    default = getattr(config, "_env_timeout", None)  # pytest-timeout's ini/option/env value
    for item in items:
        marker = item.get_closest_marker("timeout")
        base = marker.args[0] if marker is not None and marker.args else None
        if base is None and marker is not None:
            base = marker.kwargs.get("timeout")
        if base is None:
            base = default
        if base:
            item.add_marker(pytest.mark.timeout(float(base) * scale), append=False)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    _scale_timeouts(config, items)
    if not any("cuda" in item.keywords for item in items) or _has_cuda():
        return  # (torch is imported only to answer the question)
    skip = pytest.mark.skip(reason="needs a CUDA GPU")
    for item in items:
        if "cuda" in item.keywords:
            item.add_marker(skip)


def pytest_runtest_logstart(nodeid: str, location: tuple[str, int | None, str]) -> None:
    progress.record("start", nodeid)


def pytest_runtest_logfinish(nodeid: str, location: tuple[str, int | None, str]) -> None:
    progress.record("end", nodeid)
