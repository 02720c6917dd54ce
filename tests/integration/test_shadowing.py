"""A user's own actors.py, store.py, transport.py and placement.py beside the driver.

rayless installs one top-level name; the user's files of the same names as our packages must
neither break rayless nor be imported by it (each of them raises on import here).
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from tests.environ import without_rayless

pytestmark = pytest.mark.integration

DRIVER = """
import asyncio

import torch
from tensordict import TensorDict

from rayless import actors, store



class Doubler(actors.Actor):
    def double(self, x: int) -> int:
        return 2 * x

    async def total(self, td: TensorDict) -> float:
        return float(td["obs"].sum())


async def main() -> None:
    async with actors.Cluster.local(nodes=1, gpus_per_node=0) as cluster:
        doubler = await cluster.spawn(Doubler)
        assert await doubler.double(21) == 42
        st = await store.Store.create(cluster, num_units=1)
        td = TensorDict({"obs": torch.arange(8.0).reshape(4, 2)}, [4])
        await st.put(td, partition="p")
        meta = await st.get_meta(partition="p", fields=["obs"], batch_size=4, task="t")
        back = await st.get(meta)
        assert torch.equal(back["obs"], td["obs"]), back
        assert await doubler.total(back) == 28.0
        await st.shutdown()
    print("SHADOW-OK")


if __name__ == "__main__":
    asyncio.run(main())
"""


@pytest.mark.slow  # fresh interpreters running drivers, ~20 s
def test_user_modules_named_like_ours_do_not_shadow_rayless(tmp_path: Path) -> None:
    for name in ("actors", "store", "transport", "placement"):
        (tmp_path / f"{name}.py").write_text(
            f"raise ImportError('the user\\'s own {name}.py was imported by rayless')\n"
        )
    (tmp_path / "driver.py").write_text(textwrap.dedent(DRIVER))
    env = without_rayless()
    env.pop("PYTHONPATH", None)
    proc = subprocess.run(
        [sys.executable, "driver.py"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "SHADOW-OK" in proc.stdout
    assert "was imported by rayless" not in proc.stderr
