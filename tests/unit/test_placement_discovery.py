"""Discovery against a stand-in pynvml that behaves like the real module (errors included)."""

from __future__ import annotations

import logging
import sys
import types
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest

import rayless.placement as placement
from rayless.placement import GpuInfo, NodeInfo, discover_node, discover_node_async, discovery

# NVML return codes, as in the real pynvml.
NVML_ERROR_UNINITIALIZED = 1
NVML_ERROR_DRIVER_NOT_LOADED = 9
NVML_ERROR_LIBRARY_NOT_FOUND = 12
NVML_ERROR_GPU_IS_LOST = 15
NVML_ERROR_UNKNOWN = 999


def make_fake_pynvml(
    gpus: list[dict[str, Any]],
    *,
    init_error: int | None = None,
    count_error: int | None = None,
    lost: frozenset[int] = frozenset(),
) -> types.ModuleType:
    """A module with the real pynvml's surface: NVMLError.__new__ maps codes to subclasses."""
    mod = types.ModuleType("pynvml")
    state = {"inits": 0, "shutdowns": 0}

    class NVMLError(Exception):
        _valClassMapping: dict[int, type] = {}

        def __new__(cls, value: int) -> NVMLError:
            if cls is NVMLError:
                cls = NVMLError._valClassMapping.get(value, cls)
            obj = Exception.__new__(cls)
            obj.value = value  # type: ignore[attr-defined]
            return obj

        def __str__(self) -> str:
            return f"NVML error {self.value}"  # type: ignore[attr-defined]

    mod.NVMLError = NVMLError  # type: ignore[attr-defined]
    for name, code in [
        ("Uninitialized", NVML_ERROR_UNINITIALIZED),
        ("DriverNotLoaded", NVML_ERROR_DRIVER_NOT_LOADED),
        ("LibraryNotFound", NVML_ERROR_LIBRARY_NOT_FOUND),
        ("GpuIsLost", NVML_ERROR_GPU_IS_LOST),
        ("Unknown", NVML_ERROR_UNKNOWN),
    ]:

        def gen_new(val: int) -> Any:
            def new(typ: type, *args: Any) -> Any:
                return NVMLError.__new__(typ, val)

            return new

        sub = type(f"NVMLError_{name}", (NVMLError,), {"__new__": gen_new(code)})
        setattr(mod, sub.__name__, sub)
        NVMLError._valClassMapping[code] = sub

    def check_init() -> None:
        if state["inits"] <= state["shutdowns"]:
            raise NVMLError(NVML_ERROR_UNINITIALIZED)

    def nvmlInit() -> None:
        if init_error is not None:
            raise NVMLError(init_error)
        state["inits"] += 1

    def nvmlShutdown() -> None:
        check_init()
        state["shutdowns"] += 1

    def nvmlDeviceGetCount() -> int:
        check_init()
        if count_error is not None:
            raise NVMLError(count_error)
        return len(gpus)

    def nvmlDeviceGetHandleByIndex(i: int) -> int:
        check_init()
        if not 0 <= i < len(gpus):
            raise NVMLError(NVML_ERROR_UNKNOWN)
        return i

    def nvmlDeviceGetUUID(h: int) -> str:
        check_init()
        if h in lost:
            raise NVMLError(NVML_ERROR_GPU_IS_LOST)
        return str(gpus[h]["uuid"])

    def nvmlDeviceGetName(h: int) -> str:
        check_init()
        return str(gpus[h]["name"])

    @dataclass
    class Mem:
        total: int
        free: int
        used: int

    @dataclass
    class Pci:
        busId: bytes  # the real struct field is a c_char array: bytes

    def nvmlDeviceGetMemoryInfo(h: int) -> Mem:
        check_init()
        return Mem(int(gpus[h]["mem"]), int(gpus[h]["mem"]), 0)

    def nvmlDeviceGetPciInfo(h: int) -> Pci:
        check_init()
        return Pci(str(gpus[h]["bus"]).encode())

    for fn in (
        nvmlInit,
        nvmlShutdown,
        nvmlDeviceGetCount,
        nvmlDeviceGetHandleByIndex,
        nvmlDeviceGetUUID,
        nvmlDeviceGetName,
        nvmlDeviceGetMemoryInfo,
        nvmlDeviceGetPciInfo,
    ):
        setattr(mod, fn.__name__, fn)
    mod.state = state  # type: ignore[attr-defined]
    return mod


FOUR = [
    {
        "uuid": f"GPU-{i}aaa{i}-0000",
        "name": "NVIDIA H100",
        "mem": 80 * 2**30,
        "bus": f"0000:0{i}:00.0",
    }
    for i in range(4)
]


@pytest.fixture(autouse=True)
def clean_env(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    for var in (
        "CUDA_VISIBLE_DEVICES",
        "RAYLESS_FAKE_GPUS",
        "RAYLESS_NODE_ID",
        "RAYLESS_NODE_IP",
        "RAYLESS_AGENT_ID",
    ):
        monkeypatch.delenv(var, raising=False)
    yield


def use(monkeypatch: pytest.MonkeyPatch, mod: types.ModuleType | None) -> None:
    monkeypatch.setitem(sys.modules, "pynvml", mod)  # None makes `import pynvml` fail


def test_exported_from_package() -> None:
    assert placement.discover_node is discover_node
    assert placement.NodeInfo is NodeInfo and placement.GpuInfo is GpuInfo


def test_reads_every_gpu_and_shuts_nvml_down(monkeypatch: pytest.MonkeyPatch) -> None:
    mod = make_fake_pynvml(FOUR)
    use(monkeypatch, mod)
    info = discover_node(node_id="n0", ip="10.0.0.5")
    assert info.gpu_indices == (0, 1, 2, 3)
    assert info.gpus[2] == GpuInfo(2, "GPU-2aaa2-0000", "NVIDIA H100", 80 * 2**30, "0000:02:00.0")
    assert info.ip == "10.0.0.5" and info.node_id == "n0" and not info.fake_gpus
    assert info.cpus >= 1 and info.memory_bytes > 0
    assert mod.state == {"inits": 1, "shutdowns": 1}  # type: ignore[attr-defined]


@pytest.mark.parametrize(
    ("cvd", "expected"),
    [
        ("2,0", (2, 0)),
        ("", ()),
        ("-1", ()),
        ("1,-1,2", (1,)),
        ("1,7,2", (1,)),
        ("3,3,1", (3, 1)),
        ("GPU-3aaa3-0000,GPU-1aaa1", (3, 1)),
        ("3aaa3", (3,)),
        ("GPU-", ()),  # ambiguous prefix ends the list
        ("MIG-GPU-1aaa1-0000/1/0", ()),
        (" 1 , 2 ", (1, 2)),
    ],
)
def test_cuda_visible_devices(
    monkeypatch: pytest.MonkeyPatch, cvd: str, expected: tuple[int, ...]
) -> None:
    use(monkeypatch, make_fake_pynvml(FOUR))
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", cvd)
    assert discover_node(node_id="n").gpu_indices == expected


@pytest.mark.parametrize("code", [NVML_ERROR_LIBRARY_NOT_FOUND, NVML_ERROR_DRIVER_NOT_LOADED])
def test_no_library_or_driver_means_zero_gpus_and_one_log_line(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture, code: int
) -> None:
    mod = make_fake_pynvml(FOUR, init_error=code)
    assert isinstance(mod.NVMLError(code), mod.NVMLError)  # type: ignore[attr-defined]
    use(monkeypatch, mod)
    with caplog.at_level(logging.DEBUG, logger="rayless.placement.discovery"):
        info = discover_node(node_id="n")
    assert info.gpus == ()
    assert len([r for r in caplog.records if r.name == "rayless.placement.discovery"]) == 1


def test_missing_pynvml_module(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    use(monkeypatch, None)
    with caplog.at_level(logging.DEBUG, logger="rayless.placement.discovery"):
        assert discover_node(node_id="n").gpus == ()
    assert len(caplog.records) == 1


def test_count_error_and_lost_gpu(monkeypatch: pytest.MonkeyPatch) -> None:
    mod = make_fake_pynvml(FOUR, count_error=NVML_ERROR_UNKNOWN)
    use(monkeypatch, mod)
    assert discover_node(node_id="n").gpus == ()
    assert mod.state["shutdowns"] == 1  # type: ignore[attr-defined]
    use(monkeypatch, make_fake_pynvml(FOUR, lost=frozenset({1})))
    assert discover_node(node_id="n").gpu_indices == (0, 2, 3)


def test_fake_gpus_still_call_nvml_and_ignore_visibility(monkeypatch: pytest.MonkeyPatch) -> None:
    mod = make_fake_pynvml(FOUR)
    use(monkeypatch, mod)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "1")
    info = discover_node(fake_gpus=3, node_id="nodeA", gpu_memory_bytes=1000)
    assert mod.state["inits"] == 1  # type: ignore[attr-defined]
    assert info.fake_gpus and info.gpu_indices == (0, 1, 2)
    assert [g.uuid for g in info.gpus] == [f"GPU-fake-nodeA-{i}" for i in range(3)]
    assert {g.memory_bytes for g in info.gpus} == {1000}
    monkeypatch.setenv("RAYLESS_FAKE_GPUS", "2")
    assert discover_node(node_id="x").num_gpus == 2
    assert discover_node(node_id="x", fake_gpus=0).gpus == ()  # the argument wins


def test_fake_gpus_without_nvml(monkeypatch: pytest.MonkeyPatch) -> None:
    use(monkeypatch, make_fake_pynvml([], init_error=NVML_ERROR_LIBRARY_NOT_FOUND))
    monkeypatch.setenv("RAYLESS_FAKE_GPUS", "8")
    assert discover_node().num_gpus == 8


@pytest.mark.parametrize("bad", ["x", "-1", "1.5"])
def test_bad_fake_env(monkeypatch: pytest.MonkeyPatch, bad: str) -> None:
    use(monkeypatch, None)
    monkeypatch.setenv("RAYLESS_FAKE_GPUS", bad)
    with pytest.raises(ValueError, match="RAYLESS_FAKE_GPUS"):
        discover_node()


def test_ip_rules(monkeypatch: pytest.MonkeyPatch) -> None:
    use(monkeypatch, None)
    monkeypatch.setenv("RAYLESS_NODE_IP", "192.168.7.7")
    assert discover_node().ip == "192.168.7.7"
    assert discover_node(ip="10.1.1.1").ip == "10.1.1.1"
    with pytest.raises(ValueError, match="not an IP"):
        discover_node(ip="not-an-ip")
    monkeypatch.setenv("RAYLESS_NODE_IP", "300.1.1.1")
    with pytest.raises(ValueError, match="RAYLESS_NODE_IP"):
        discover_node()
    monkeypatch.delenv("RAYLESS_NODE_IP")
    import ipaddress

    ipaddress.ip_address(discover_node().ip)  # the UDP trick or 127.0.0.1


def test_ip_falls_back_to_loopback(monkeypatch: pytest.MonkeyPatch) -> None:
    use(monkeypatch, None)

    class NoNet:
        def __init__(self, *a: Any) -> None:
            pass

        def __enter__(self) -> NoNet:
            return self

        def __exit__(self, *a: Any) -> None:
            pass

        def connect(self, addr: Any) -> None:
            raise OSError("network unreachable")

    monkeypatch.setattr(discovery.socket, "socket", NoNet)
    assert discover_node().ip == "127.0.0.1"


def test_node_id_stable_and_agent_suffix(monkeypatch: pytest.MonkeyPatch) -> None:
    use(monkeypatch, None)
    a, b = discover_node().node_id, discover_node().node_id
    assert a == b and a.startswith(discovery.socket.gethostname())
    monkeypatch.setenv("RAYLESS_AGENT_ID", "agent2")
    assert discover_node().node_id == f"{a}-agent2"
    monkeypatch.setenv("RAYLESS_NODE_ID", "explicit")
    assert discover_node().node_id == "explicit"
    assert discover_node(node_id="param").node_id == "param"


def test_cpus_honour_affinity(monkeypatch: pytest.MonkeyPatch) -> None:
    use(monkeypatch, None)
    monkeypatch.setattr(discovery.os, "sched_getaffinity", lambda pid: {0, 3}, raising=False)
    assert discover_node().cpus == 2


def test_dict_round_trip_and_validation() -> None:
    info = NodeInfo(
        "n", "h", "10.0.0.1", 8, 1 << 30, (GpuInfo(3, "GPU-a", "H100", 5, "0000:03:00.0"),)
    )
    d = info.to_dict()
    assert NodeInfo.from_dict(d) == info
    assert NodeInfo.from_dict({**d, "future_key": 1}) == info
    for bad in [
        {k: v for k, v in d.items() if k != "ip"},
        {**d, "cpus": "8"},
        {**d, "cpus": True},
        {**d, "cpus": -1},
        {**d, "gpus": "none"},
        {**d, "gpus": [{"index": 0}]},
        {**d, "gpus": [d["gpus"][0], d["gpus"][0]]},
        {**d, "fake_gpus": "yes"},
        {**d, "node_id": ""},
        [],
    ]:
        with pytest.raises(ValueError):
            NodeInfo.from_dict(bad)  # type: ignore[arg-type]


async def test_async_form_runs_off_loop(monkeypatch: pytest.MonkeyPatch) -> None:
    import threading

    seen: list[str] = []
    mod = make_fake_pynvml(FOUR)
    real_init = mod.nvmlInit  # type: ignore[attr-defined]

    def init() -> None:
        seen.append(threading.current_thread().name)
        real_init()

    mod.nvmlInit = init  # type: ignore[attr-defined]
    use(monkeypatch, mod)
    info = await discover_node_async(node_id="n")
    assert info.num_gpus == 4
    assert seen and seen[0] != threading.main_thread().name
