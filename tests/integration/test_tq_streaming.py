"""TransferQueue's streaming loader (``RankAwareSampler``, ``StreamingDataset``,
``StreamingDataLoader``, ``get_meta(sampling_config=...)``) on ``rayless.transfer_queue`` and,
where TransferQueue and Ray are installed (``pip install -e '.[bench]'``), on TransferQueue
0.1.x itself in the same run: its tutorial's and recipe's programs, with their imports.

The store runs TransferQueue's streaming configuration (``RankAwareSampler``, polling mode).
Where the two differ on purpose (docs/moving-from-transferqueue.md), the test says so.
"""

from __future__ import annotations

import importlib.util
import os
import threading
from collections.abc import Iterator
from typing import Any

import pytest
import torch
from tensordict import TensorDict

from tests.waiting import wait_until_sync

pytestmark = [pytest.mark.integration, pytest.mark.xdist_group("rayless_tq_streaming")]

_HAS_TQ = (
    importlib.util.find_spec("transfer_queue") is not None
    and importlib.util.find_spec("ray") is not None
    and importlib.util.find_spec("omegaconf") is not None
)


class Api:
    """The Ray module, the TransferQueue module and the controller's config of one side."""

    conf: Any = None  # what init was given (with the sampler class)

    def __init__(self, name: str, ray: Any, tq: Any) -> None:
        self.name, self.ray, self.tq = name, ray, tq
        controller = ray.get_actor("TransferQueueController", namespace="transfer_queue")
        self.config = ray.get(controller.get_config.remote())
        self.client = tq.get_client()

    @property
    def rayless(self) -> bool:
        return self.name == "rayless"

    def dataset(self, partition: str, task: str, dp_rank: int, **kw: Any) -> Any:
        kw.setdefault("batch_size", 2)
        kw.setdefault("micro_batch_size", kw["batch_size"])
        return self.tq.StreamingDataset(
            config=self.config,
            data_fields=["x"],
            partition_id=partition,
            task_name=task,
            dp_rank=dp_rank,
            **kw,
        )

    def put(self, partition: str, values: list[int]) -> None:
        td = TensorDict({"x": torch.tensor(values)}, batch_size=len(values))
        self.client.put(td, partition_id=partition)


@pytest.fixture(
    scope="module",
    params=[
        "rayless",
        pytest.param("transfer_queue", marks=pytest.mark.skipif(not _HAS_TQ, reason="no TQ")),
    ],
)
def api(request: pytest.FixtureRequest) -> Iterator[Api]:
    if request.param == "rayless":
        import rayless.transfer_queue as tq
        from rayless import ray
    else:
        import ray  # type: ignore[import-not-found,no-redef]
        import transfer_queue as tq  # type: ignore[import-not-found,no-redef]
    conf: Any = {
        "controller": {"sampler": tq.RankAwareSampler, "polling_mode": True},
        "backend": {"SimpleStorage": {"num_data_storage_units": 2}},
    }
    if request.param == "transfer_queue":
        from omegaconf import OmegaConf

        conf = OmegaConf.create(conf, flags={"allow_objects": True})
    os.environ["TQ_STREAMING_DATASET_EMPTY_BATCH_SLEEP_INTERVAL"] = "0.2"
    ray.init(num_cpus=4)
    tq.init(conf)
    api = Api(request.param, ray, tq)
    api.conf = conf
    yield api
    tq.close()
    ray.shutdown()
    os.environ.pop("TQ_STREAMING_DATASET_EMPTY_BATCH_SLEEP_INTERVAL", None)


def ids(td: TensorDict) -> list[int]:
    return [int(v) for v in td["x"].reshape(-1)]


def test_a_rank_aware_fetch_shares_one_batch_per_group_and_step(api: Api) -> None:
    c = api.client

    def fetch(dp_rank: int, batch_index: int, batch_size: int = 2, partition: str = "ra") -> Any:
        config = {"dp_rank": dp_rank, "batch_index": batch_index}
        config.update(task_name="t", partition_id=partition)  # TransferQueue's needs them
        return c.get_meta(
            data_fields=["x"],
            batch_size=batch_size,
            partition_id=partition,
            task_name="t",
            sampling_config=config,
        )

    assert fetch(0, 0, partition="not-there").size == 0  # polling mode: empty at once
    api.put("ra", list(range(10)))
    first = list(fetch(0, 0).global_indexes)
    assert list(fetch(0, 0).global_indexes) == first  # the group's second rank
    assert list(fetch(0, 0, batch_size=3).global_indexes) == first  # its batch, whatever size
    other = list(fetch(1, 0).global_indexes)
    nxt = list(fetch(0, 1).global_indexes)
    assert len(first) == len(other) == len(nxt) == 2
    assert not set(first) & set(other) and not set(nxt) & (set(first) | set(other))
    with pytest.raises(RuntimeError):  # RankAwareSampler cannot sample without a rank
        c.get_meta(data_fields=["x"], batch_size=2, partition_id="ra", task_name="t")
    c.clear_partition("ra")


def test_a_finite_dataset_gives_each_group_its_own_samples_and_its_ranks_the_same(
    api: Api,
) -> None:
    api.put("fin", list(range(100, 112)))
    a = api.dataset("fin", "train", 0, should_check_consumption_status=True)
    b = api.dataset("fin", "train", 0, should_check_consumption_status=True)
    g = api.dataset("fin", "train", 1, should_check_consumption_status=True)
    seen: dict[str, list[int]] = {"a": [], "b": [], "g": []}
    live = {"a": iter(a), "b": iter(b), "g": iter(g)}
    while live:  # the three ranks in turn, as three trainers stepping together
        for name in list(live):
            try:
                td, meta = next(live[name])
            except StopIteration:
                del live[name]
                continue
            assert len(ids(td)) == meta.size == 2
            seen[name] += ids(td)
    assert seen["a"] == seen["b"] and len(seen["a"]) == 6  # one group: the same batches
    assert sorted(seen["a"] + seen["g"]) == list(range(100, 112))  # groups: disjoint
    assert list(a) == []  # read out: nothing new to fetch, nothing replayed

    a.reset()  # another pass over the same samples, from the buffer
    assert [v for td, _ in a for v in ids(td)] == seen["a"]
    micro = api.dataset("fin", "other", 0, batch_size=4, micro_batch_size=3)
    it = iter(micro)
    parts = [next(it) for _ in range(3)]  # a 4-batch as 3 + 1, then the next batch's 3
    assert [len(ids(td)) for td, _ in parts] == [3, 1, 3]
    if api.rayless:  # each part's meta names its samples
        assert [m.size for _, m in parts] == [3, 1, 3]
    # (TransferQueue 0.1.11 cuts the meta into equal chunks instead: 2, 2, then 2)
    assert ids(parts[0][0]) + ids(parts[1][0]) == list(range(100, 104))

    api.put("fin2", [7, 8])
    a.step("fin2")  # the next training step's partition: batches count from 0 again
    assert [v for td, _ in a for v in ids(td)] == [7, 8] and len(a.buffer) == 1
    for p in ("fin", "fin2"):
        api.client.clear_partition(p)


def test_a_groups_trailing_rank_still_reads_the_groups_last_batch(api: Api) -> None:
    # two groups of two ranks stepping in turn: group 1's first rank takes the last samples,
    # so its second rank finds the partition consumed before it read that batch
    api.put("trail", list(range(400, 408)))
    ranks = [
        api.dataset("trail", "train", group, should_check_consumption_status=True)
        for group in (0, 0, 1, 1)
    ]
    seen: list[list[int]] = [[] for _ in ranks]
    live = dict(enumerate(iter(ds) for ds in ranks))
    while live:
        for i in list(live):
            try:
                td, _ = next(live[i])
            except StopIteration:
                del live[i]
                continue
            seen[i] += ids(td)
    if api.rayless:  # every rank read its group's batches; before: rank 3 missed the last
        assert seen[0] == seen[1] and seen[2] == seen[3] and len(seen[3]) == 4
    else:  # TransferQueue 0.1.11's loop ends there: the trailing rank misses that batch
        assert seen[2][: len(seen[3])] == seen[3] and len(seen[3]) <= 4
    assert sorted(seen[0] + seen[2]) == list(range(400, 408))
    api.client.clear_partition("trail")


def test_a_streaming_dataloader_with_workers_reads_every_batch(api: Api) -> None:
    api.put("w", list(range(200, 216)))
    ds = api.dataset("w", "train", 0, should_check_consumption_status=True)
    loader = api.tq.StreamingDataLoader(ds, num_workers=2, prefetch_factor=2)
    got = [ids(td) for td, meta in loader]
    flat = sorted(v for batch in got for v in batch)
    assert set(flat) == set(range(200, 216))
    if api.rayless:  # worker w fetches batches w, w + 2, ...: each once
        assert sorted(flat) == list(range(200, 216)) and len(got) == 8
    # (TransferQueue 0.1.11's two workers each fetch every batch index: some come twice)
    assert loader.get_buffer() == [] and not ds.buffer  # the workers' buffers stay theirs
    api.client.clear_partition("w")


def test_a_spawned_dataloader_worker_reads_from_the_drivers_cluster(api: Api) -> None:
    # a trainer that holds CUDA tensors starts its DataLoader workers with spawn: the worker
    # is a fresh interpreter with no session of its own (before: it could not find the store,
    # and its ray.init() would have started a cluster of its own)
    api.put("sp", list(range(300, 308)))
    ds = api.dataset("sp", "train", 0, should_check_consumption_status=True)
    loader = api.tq.StreamingDataLoader(ds, num_workers=1, multiprocessing_context="spawn")
    got = sorted(v for td, meta in loader for v in ids(td))
    assert got == list(range(300, 308))
    api.client.clear_partition("sp")


def test_an_actors_spawned_dataloader_worker_reads_from_its_cluster(api: Api) -> None:
    # an actor that never called tq.init() spawns its loader's worker: the worker has neither
    # a session nor (an actor's token is private) a token in its environment
    ray, tq = api.ray, api.tq

    @ray.remote(num_cpus=0.1)
    class Reader:
        def run(self, cfg: Any, partition: str) -> list[int]:
            ds = tq.StreamingDataset(
                config=cfg,
                batch_size=2,
                micro_batch_size=2,
                data_fields=["x"],
                partition_id=partition,
                task_name="train",
                dp_rank=0,
                should_check_consumption_status=True,
            )
            loader = tq.StreamingDataLoader(ds, num_workers=1, multiprocessing_context="spawn")
            return sorted(int(v) for td, _ in loader for v in td["x"])

    api.put("spa", list(range(310, 316)))
    got = ray.get(Reader.remote().run.remote(api.config, "spa"), timeout=180)
    assert got == list(range(310, 316))
    api.client.clear_partition("spa")


def test_the_tutorials_update_workers_read_their_groups_samples(api: Api) -> None:
    # TransferQueue's tutorial 06: two generator tasks put 20 samples each into "train"
    # while four update tasks (dp_rank 0, 0, 1, 1) read 5 batches of 2 through
    # StreamingDataLoader(num_workers=2) in streaming mode, then drop the loader
    ray, tq = api.ray, api.tq

    @ray.remote(num_cpus=0.1)
    def generate_worker(rank_id: int, num_samples: int = 20) -> None:
        tq.init()
        client = tq.get_client()
        for i in range(num_samples):
            seq_id = i + rank_id * 10000
            data = TensorDict(
                {"input_ids": torch.full((1, 16), seq_id), "meta_idx": torch.tensor([seq_id])},
                batch_size=1,
            )
            client.put(data, partition_id="train")

    @ray.remote(num_cpus=0.1)
    def update_worker(rank_id: int, dp_rank: int, max_steps: int = 5) -> dict[str, Any]:
        tq.init()
        controller = ray.get_actor("TransferQueueController", namespace="transfer_queue")
        config = ray.get(controller.get_config.remote())
        dataset = tq.StreamingDataset(
            config=config,
            batch_size=2,
            micro_batch_size=2,
            data_fields=["meta_idx"],
            partition_id="train",
            task_name="update_task",
            dp_rank=dp_rank,
            should_check_consumption_status=False,
        )
        dataloader = tq.StreamingDataLoader(dataset=dataset, num_workers=2, prefetch_factor=2)
        consumed_ids: list[int] = []
        for step, (batch, _meta) in enumerate(dataloader, 1):
            consumed_ids.extend(batch["meta_idx"].view(-1).tolist())
            if step >= max_steps:
                break
        del dataloader
        return {"dp_rank": dp_rank, "consumed_ids": consumed_ids}

    generators = [generate_worker.remote(i) for i in range(2)]
    updates = [update_worker.remote(r, d) for r, d in enumerate([0, 0, 1, 1])]
    ray.get(generators, timeout=120)
    results = ray.get(updates, timeout=180)
    by_rank = [r["consumed_ids"] for r in results]
    assert all(len(ids) == 10 for ids in by_rank)
    if api.rayless:  # (on TransferQueue 0.1.11 a worker may read a batch twice)
        assert by_rank[0] == by_rank[1] and by_rank[2] == by_rank[3]
        assert not set(by_rank[0]) & set(by_rank[2])
    api.client.clear_partition("train")


def test_a_stage_pipeline_moves_to_a_new_partition_per_step(api: Api) -> None:
    # TransferQueue's relax demo: a stage worker per dp_rank reads a step's partition to
    # its end (consumption check), writes its output fields back with put(metadata=meta),
    # the next stage reads them; the same dataloader moves on with step(partition)
    client = api.client

    def stage(
        fields: list[str], task: str, dp_rank: int, out: str, loaders: dict[int, Any], p: str
    ) -> list[int]:
        if dp_rank in loaders:
            loaders[dp_rank].step(p)
        else:
            ds = api.tq.StreamingDataset(
                config=api.config,
                batch_size=2,
                micro_batch_size=2,
                data_fields=fields,
                partition_id=p,
                task_name=task,
                dp_rank=dp_rank,
                should_check_consumption_status=True,
            )
            loaders[dp_rank] = api.tq.StreamingDataLoader(ds, num_workers=0)
        read = []
        for batch, meta in loaders[dp_rank]:
            x = batch[fields[-1]].reshape(-1)
            client.put(TensorDict({out: x + 1}, batch_size=len(x)), metadata=meta)
            read += [int(v) for v in x]
        return read

    rollout: dict[int, Any] = {}
    update: dict[int, Any] = {}
    for step in range(2):
        p = f"relax_{step}"
        api.put(p, [10 * step + i for i in range(8)])
        results: dict[str, list[int]] = {}

        def run(name: str, *args: Any) -> None:
            results[name] = stage(*args)  # noqa: B023 (joined within the iteration)

        threads = [
            threading.Thread(target=run, args=(f"roll{r}", ["x"], "rollout", r, "y", rollout, p))
            for r in range(2)
        ]
        threads.append(
            threading.Thread(target=run, args=("update", ["x", "y"], "update", 0, "z", update, p))
        )
        for t in threads:
            t.start()
        for t in threads:
            t.join(120)
        assert not any(t.is_alive() for t in threads)
        rolled = sorted(results["roll0"] + results["roll1"])
        assert rolled == [10 * step + i for i in range(8)]  # the two groups split the prompts
        assert sorted(results["update"]) == [v + 1 for v in rolled]  # then read every output
        client.clear_partition(p)


def test_a_stage_actor_built_with_the_config_reads_through_its_own_loader(api: Api) -> None:
    # the relax recipe hands each stage actor TransferQueue's config (its sampler a class)
    ray, tq = api.ray, api.tq

    @ray.remote(num_cpus=0.1)
    class Stage:
        def __init__(self, tq_config: Any, dp_rank: int) -> None:
            tq.init(tq_config)
            controller = ray.get_actor("TransferQueueController", namespace="transfer_queue")
            self.cfg = ray.get(controller.get_config.remote())
            self.dp_rank = dp_rank

        def run(self, partition: str) -> list[int]:
            dataset = tq.StreamingDataset(
                config=self.cfg,
                batch_size=2,
                micro_batch_size=1,
                data_fields=["x"],
                partition_id=partition,
                task_name="stage",
                dp_rank=self.dp_rank,
                should_check_consumption_status=True,
            )
            return [int(td["x"][0]) for td, _ in tq.StreamingDataLoader(dataset)]

    api.put("actors", list(range(300, 308)))
    stages = [Stage.remote(api.conf, r) for r in range(2)]
    got = ray.get([s.run.remote("actors") for s in stages], timeout=120)
    assert sorted(got[0] + got[1]) == list(range(300, 308))
    sampler = api.config["controller"]["sampler"]  # ours names it (the config is JSON)
    assert sampler == "RankAwareSampler" if api.rayless else sampler is tq.RankAwareSampler
    api.client.clear_partition("actors")


def test_a_rank_waiting_for_its_batch_says_what_the_partition_holds(
    api: Api, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    # a newcomer's typo in data_fields, or a producer that never came: the loop waits for
    # good, so it says what it waits for and what is there (rayless' own warning)
    if not api.rayless:
        pytest.skip("rayless' own warning")
    from rayless.transfer_queue import dataloader

    monkeypatch.setattr(dataloader, "REPORT_AFTER", 0.3)
    ds = api.dataset("late", "train", 0)
    got: list[list[int]] = []
    reader = threading.Thread(target=lambda: got.append(ids(next(iter(ds))[0])), daemon=True)
    with caplog.at_level("WARNING", logger=dataloader.__name__):
        reader.start()
        wait_until_sync(
            lambda: "does not exist (yet)" in caplog.text, 30, "the waiting rank's warning"
        )
    assert "no batch of 2 samples holding ['x']" in caplog.text
    api.put("late", [5, 6])  # the producer comes: the rank reads it
    reader.join(30)
    assert got == [[5, 6]]
    api.client.clear_partition("late")


def test_a_dataset_out_of_polling_mode_says_how_to_wait_for_new_samples(
    api: Api, monkeypatch: pytest.MonkeyPatch
) -> None:
    # tq.init() with the defaults (no polling mode) and an endless dataset: once the samples
    # run out, a fetch times out as TransferQueue's does; the error says what makes it wait
    if not api.rayless:
        pytest.skip("rayless' own message")
    from rayless.transfer_queue.dataloader import default_fetch_batch_fn

    monkeypatch.setattr(api.client, "_polling", False)
    monkeypatch.setenv("TQ_CONTROLLER_GET_METADATA_TIMEOUT", "0.2")
    config = {"dp_rank": 0, "task_name": "t"}
    with pytest.raises(RuntimeError, match=r"polling_mode.*TQ_CONTROLLER_GET_METADATA_TIMEOUT"):
        default_fetch_batch_fn(api.client, ["x"], 2, "none-yet", "t", config, 0)
