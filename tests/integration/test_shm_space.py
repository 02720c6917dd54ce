"""Shared memory the store frees goes back to the host, not only to the store.

Each scenario runs in a subprocess with a /dev/shm of its own, a small tmpfs in a private
mount namespace (``unshare -m``; skipped where that is not allowed), so "full" is cheap and
no other test's segments share it.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

from tests import waiting

pytestmark = pytest.mark.integration

MOUNT = "mount -t tmpfs -o size=64m tmpfs /dev/shm"


def _in_small_shm(script: str) -> subprocess.CompletedProcess[str]:
    """Run ``script`` with a 64 MiB /dev/shm of its own; skip where namespaces are refused."""
    argv = ["unshare", "-m", "--propagation", "private", "sh", "-c"]
    try:
        probe = subprocess.run([*argv, MOUNT], capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired) as exc:
        pytest.skip(f"no private mount namespace here: {exc}")
    if probe.returncode != 0:
        pytest.skip(f"no private mount namespace here: {probe.stderr.strip()}")
    env = {**os.environ, "PY": sys.executable, "SCRIPT": textwrap.dedent(script)}
    return subprocess.run(
        [*argv, f'{MOUNT} && exec "$PY" -c "$SCRIPT"'],
        capture_output=True,
        text=True,
        env=env,
        timeout=waiting.scaled(120),
    )


def test_a_dropped_column_leaves_room_for_a_weight_version() -> None:
    done = _in_small_shm(
        """
        import torch
        from rayless.store.data.schema import FieldSchema
        from rayless.store.samehost.columns import ShmDense
        from rayless.transport.segments import Segment

        col = ShmDense(FieldSchema("dense", "float32", (1 << 18,)), torch.device("cpu"))
        col.grow(32)  # a 32 MiB column (1 MiB rows) in a 64 MiB /dev/shm
        col.close()  # the partition is dropped: the store counts these bytes free
        del col  # and forgets the column (its tensor held the mapping)
        seg = Segment.create(40 << 20)  # a weight publish of 40 MiB
        seg.close(unlink=True)
        print("room")
        """
    )
    assert done.stdout.strip() == "room", done.stderr[-2000:]


def test_a_full_dev_shm_drains_the_pool_before_failing_a_column() -> None:
    done = _in_small_shm(
        """
        import torch
        from rayless.store.data.schema import FieldSchema
        from rayless.store.samehost import columns
        from rayless.transport.segments import Segment

        row = FieldSchema("dense", "float32", (1 << 16,))  # 256 KiB rows
        kept = []
        for _ in range(4):  # pooled columns within the pool's share of /dev/shm (8 MiB)
            col = columns.ShmDense(row, torch.device("cpu"))
            col.grow(4 + len(kept))  # 1, 1.25, ... MiB: no later column reuses them
            kept.append(col)
        for col in kept:
            col.close()
        del kept, col
        assert columns._POOL, "pooled"
        hog = Segment.create(57 << 20)  # someone else takes all but 1.5 MiB of /dev/shm
        col = columns.ShmDense(row, torch.device("cpu"))
        col.grow(8)  # 2 MiB: only there once the pool gave its room back
        print("room", len(columns._POOL))
        hog.close(unlink=True)
        """
    )
    assert done.stdout.strip() == "room 0", done.stderr[-2000:]
