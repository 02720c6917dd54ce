"""Children forked from a ``rayless.ray`` driver (a ``DataLoader``'s workers, a
``multiprocessing`` fork) exit, and TransferQueue's functions work in them.

Before: a forked child closed its parent's session at exit, waiting for good on the parent's
event loop, which is not in the child (a fork ``Process`` never ended; a ``DataLoader`` waited
5 s per worker, then killed it), and ``tq.kv_batch_get`` in a ``DataLoader`` worker waited on
that loop too (the loader timed out). Each driver runs in its own interpreter.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.drivers import run_driver

pytestmark = pytest.mark.integration


def test_a_forked_child_of_a_ray_driver_exits(tmp_path: Path) -> None:
    out = run_driver(
        """
        import multiprocessing as mp
        from rayless import ray

        ray.init()

        def child():
            print("child ran", flush=True)

        p = mp.get_context("fork").Process(target=child)
        p.start()
        p.join(60)
        print("child ended", not p.is_alive(), p.exitcode)
        if p.is_alive():
            p.kill()

        @ray.remote
        def one():
            return 1

        print("driver still served", ray.get(one.remote()))
        """,
        tmp_path,
    )
    assert out == ["child ran", "child ended True 0", "driver still served 1"]


@pytest.mark.slow  # a driver, its cluster, a store and its readers: 20-25 s on 2 cores
def test_transfer_queue_reads_in_dataloader_workers(tmp_path: Path) -> None:
    out = run_driver(
        """
        import torch
        from tensordict import TensorDict
        from torch.utils.data import DataLoader, Dataset
        import rayless.transfer_queue as tq

        tq.init()
        keys = [f"k{i}" for i in range(8)]
        td = TensorDict({"x": torch.arange(8.0)}, batch_size=8)
        tq.kv_batch_put(keys=keys, partition_id="p", fields=td)

        class Rows(Dataset):
            def __len__(self):
                return 8

            def __getitem__(self, i):
                return float(tq.kv_batch_get(keys=[f"k{i}"], partition_id="p")["x"][0])

        loader = DataLoader(Rows(), batch_size=None, num_workers=2, timeout=60)
        print(sorted(loader))
        print(sorted(loader))  # a second epoch: new workers attach again
        tq.close()
        """,
        tmp_path,
    )
    values = str([float(i) for i in range(8)])
    assert out == [values, values]
