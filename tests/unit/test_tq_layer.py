"""rayless.transfer_queue's pieces without a cluster: KVBatchMeta (TransferQueue's methods
and its travel to a process that never imported the store), the sampler names, the config."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import msgpack
import pytest

from rayless.store import BatchMeta
from rayless.store.data.kv_meta import KVBatchMeta
from rayless.transfer_queue import interface, samplers
from rayless.transfer_queue.client import FetchTimeoutError, fetch_timeout
from rayless.transport.codec import decode, encode


def test_kv_batch_meta_travels_to_a_process_that_never_imported_the_store(
    tmp_path: Path,
) -> None:
    meta = KVBatchMeta(["a", "b"], [{"x": 1}, {"x": 2}], "p", ["f"], {"step": 3})
    assert decode(encode(meta)) == meta
    path = tmp_path / "frames.msgpack"
    path.write_bytes(msgpack.packb([bytes(f) for f in encode(meta)]))
    code = f"""
        import sys
        import msgpack
        from rayless.transport.codec import decode

        assert "rayless.store.data.kv_meta" not in sys.modules
        meta = decode(msgpack.unpackb(open({str(path)!r}, "rb").read()))
        print(type(meta).__name__, meta.keys, meta.tags, meta.extra_info)
        """
    proc = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "KVBatchMeta ['a', 'b'] [{'x': 1}, {'x': 2}] {'step': 3}"


def test_a_malformed_kv_batch_meta_record_is_refused() -> None:
    with pytest.raises(ValueError):
        KVBatchMeta.from_dict({"keys": ["a"], "tags": ["not a dict"]})
    with pytest.raises(ValueError):
        KVBatchMeta.from_dict({"keys": ["a"], "tags": [{}], "surprise": 1})


def test_kv_batch_meta_chunk_concat_and_extra_info() -> None:
    meta = KVBatchMeta([f"k{i}" for i in range(5)], [{"i": i} for i in range(5)], "p", ["f"])
    parts = meta.chunk(3)
    assert [p.keys for p in parts] == [["k0", "k1"], ["k2", "k3"], ["k4"]]
    assert [p.size for p in meta.chunk(7)].count(0) == 2
    joined = KVBatchMeta.concat(parts)
    assert joined.keys == meta.keys and joined.tags == meta.tags
    assert KVBatchMeta.concat([]).size == 0
    a = KVBatchMeta(["a"], [{}], "p", extra_info={"step": 1})
    with pytest.raises(ValueError):
        KVBatchMeta.concat([a, KVBatchMeta(["b"], [{}], "p", extra_info={"step": 2})])
    with pytest.raises(ValueError):
        KVBatchMeta.concat([a, KVBatchMeta(["b"], [{}], "q")])
    tags = [{"deep": [1]}]
    copied = KVBatchMeta(["a"], tags)
    tags[0]["deep"].append(2)
    assert copied.tags == [{"deep": [1]}]


def test_sampler_names_stand_for_store_samplers() -> None:
    assert samplers.store_spec("SequentialSampler") == "sequential"
    assert samplers.store_spec(samplers.SequentialSampler) == "sequential"
    assert samplers.store_spec(samplers.GRPOGroupNSampler(n_samples_per_prompt=4)) == {
        "name": "grouped",
        "n": 4,
    }
    balanced = samplers.store_spec(samplers.SeqlenBalancedSampler(2, dp_size=4))
    assert balanced == {"name": "seqlen_balanced", "dp_size": 4, "n": 2}
    with pytest.raises(ValueError):
        samplers.store_spec("RandomSampler")
    with pytest.raises(ValueError):
        samplers.store_spec(object())
    with pytest.raises(ValueError):
        samplers.GRPOGroupNSampler(0)


def test_config_is_merged_over_the_defaults_and_checked() -> None:
    final = interface._merge(
        interface.DEFAULTS, {"controller": {"polling_mode": True}, "extra": {"a": 1}}
    )
    assert final["controller"] == {
        "sampler": "SequentialSampler",
        "polling_mode": True,
        "zmq_info": None,
    }
    assert final["extra"] == {"a": 1}
    settings = interface._settings(final)
    assert settings["sampler"] == "sequential" and settings["polling_mode"] is True
    assert settings["rank_aware"] is False and settings["config"] == final  # get_config's
    ranked = interface._settings(
        interface._merge(final, {"controller": {"sampler": samplers.RankAwareSampler}})
    )
    assert ranked["rank_aware"] is True and ranked["sampler"] == "sequential"
    assert ranked["config"]["controller"]["sampler"] == "RankAwareSampler"  # (a JSON value)
    assert interface._units(final) == 2
    with pytest.raises(ValueError):
        interface._settings(
            interface._merge(final, {"backend": {"storage_backend": "MooncakeStore"}})
        )
    with pytest.raises(ValueError):
        interface._units({"backend": {"SimpleStorage": {"num_data_storage_units": 0}}})
    with pytest.raises(ValueError):
        interface._plain(["not", "a", "mapping"])


def test_an_omegaconf_config_is_read_as_plain_values() -> None:
    omegaconf = pytest.importorskip("omegaconf")
    conf = omegaconf.OmegaConf.create({"controller": {"sampler": "GRPOGroupNSampler"}})
    plain = interface._plain(conf)
    assert plain == {"controller": {"sampler": "GRPOGroupNSampler"}}
    assert type(plain["controller"]) is dict


def test_get_client_before_init_is_transfer_queues_assertion() -> None:
    with pytest.raises(AssertionError):
        interface.get_client()
    with pytest.raises(RuntimeError):
        interface.save_checkpoint("/nonexistent/ckpt")


def test_fetch_timeout_reads_transfer_queues_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("TQ_CONTROLLER_GET_METADATA_TIMEOUT", raising=False)
    assert fetch_timeout() == 1.0
    monkeypatch.setenv("TQ_CONTROLLER_GET_METADATA_TIMEOUT", "2.5")
    assert fetch_timeout() == 2.5
    monkeypatch.setenv("TQ_CONTROLLER_GET_METADATA_TIMEOUT", "soon")
    with pytest.raises(ValueError):
        fetch_timeout()
    assert issubclass(FetchTimeoutError, RuntimeError)
    assert issubclass(FetchTimeoutError, TimeoutError)
    assert BatchMeta("s", (), (), (), ()).size == 0


def test_the_shipped_config_yaml_holds_the_defaults() -> None:
    # TransferQueue's programs load its config.yaml: resources.files(package) / "config.yaml"
    yaml = pytest.importorskip("yaml")
    from importlib import resources

    text = (resources.files("rayless.transfer_queue") / "config.yaml").read_text()
    assert yaml.safe_load(text) == interface.DEFAULTS


def test_chunk_batch_fn_cuts_data_and_meta_alike() -> None:
    import torch
    from tensordict import TensorDict

    from rayless.transfer_queue.dataloader import chunk_batch_fn

    rows = [torch.arange(n) for n in (3, 1, 4, 2, 5)]
    jagged = torch.nested.nested_tensor(rows, layout=torch.jagged)
    strided = torch.nested.nested_tensor([torch.ones(n, 2) for n in (1, 2, 1, 2, 1)])
    td = TensorDict({"ids": jagged, "img": strided, "reward": torch.arange(5.0)}, batch_size=5)
    meta = BatchMeta("s", tuple(range(10, 15)), ("p",) * 5, (0,) * 5, (0,) * 5)
    parts = chunk_batch_fn(td, meta, micro_batch_size=2)
    assert [m.global_indexes for _, m in parts] == [(10, 11), (12, 13), (14,)]
    got = [r for part, _ in parts for r in part["ids"].unbind()]
    assert [r.tolist() for r in got] == [r.tolist() for r in rows]
    first = parts[1][0]["ids"]  # a view of the batch's values: nothing copied
    assert first.values().data_ptr() == jagged.values()[4:].data_ptr()
    assert [p["img"].size(0) for p, _ in parts] == [2, 2, 1]
    assert torch.equal(parts[2][0]["reward"], torch.tensor([4.0]))
    with pytest.raises(ValueError):
        chunk_batch_fn(td, meta, micro_batch_size=6)
    with pytest.raises(ValueError):
        chunk_batch_fn(td, meta, micro_batch_size=0)
    with pytest.raises(TypeError):
        chunk_batch_fn({"ids": jagged}, meta)  # type: ignore[arg-type]
