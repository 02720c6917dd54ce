"""What this host offers: node id, address, CPUs, memory and GPUs (NVML + psutil).

:func:`discover_node` is synchronous and makes blocking NVML calls; event-loop code uses
:func:`discover_node_async`, which runs it in a worker thread.

Rules (the contract the node agent and the runtime rely on):

* **Node id** — ``RAYLESS_NODE_ID`` or the ``node_id`` argument wins. Otherwise
  ``<hostname>-<8 hex digits>`` where the digits are a SHA-256 of the host's machine id
  (``/etc/machine-id``, ``/var/lib/dbus/machine-id``; else the boot id; else the MAC from
  :func:`uuid.getnode`), so it is stable across restarts of the agent and of the host.
  ``RAYLESS_AGENT_ID`` (several agents on one host, e.g. local test clusters) appends
  ``-<agent id>``.
* **IP** — the ``ip`` argument, else ``RAYLESS_NODE_IP``, else the address of the interface
  that routes to the outside (a UDP ``connect`` that sends no packet, so it needs no network),
  else ``127.0.0.1``. An explicit address that does not parse raises ValueError.
* **CPUs** — the CPUs this process may run on (``sched_getaffinity`` / psutil affinity), not
  the host total. **Memory** — psutil's total.
* **GPUs** — from NVML, in NVML (PCI bus) order. ``CUDA_VISIBLE_DEVICES`` is honoured when it
  lists indices or UUIDs (``GPU-...``, unique prefixes accepted, as CUDA does): only the listed
  GPUs are reported, in the listed order; as in CUDA, the list stops at the first entry that
  does not name a GPU (``-1``, an unknown UUID, an index out of range), duplicates are
  dropped, and an empty value means no GPU. MIG UUIDs are not supported (they end the list).
  ``GpuInfo.index`` is the **NVML index**: the value to put in a child's
  ``CUDA_VISIBLE_DEVICES``. NVML numbers GPUs in PCI bus order, so children must run with
  ``CUDA_DEVICE_ORDER=PCI_BUS_ID`` (or be given UUIDs) for the two to agree.
* **No NVML** — pynvml not installed, library missing, driver not loaded, or any other NVML
  error at start-up → zero GPUs and one log line, never an exception. A GPU that fails while
  being read is left out with a warning.
* **Fake GPUs** — ``fake_gpus=N`` or ``RAYLESS_FAKE_GPUS=N`` (the argument wins): NVML is still
  queried (same code path), then exactly N synthetic GPUs are reported, indices ``0..N-1``,
  UUIDs ``GPU-fake-<node id>-<i>``, ``gpu_memory_bytes`` each. ``CUDA_VISIBLE_DEVICES`` does
  not filter fake GPUs; ``NodeInfo.fake_gpus`` tells the two cases apart.
"""

from __future__ import annotations

import contextlib
import hashlib
import ipaddress
import logging
import os
import socket
import uuid as _uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import psutil

__all__ = ["GpuInfo", "NodeInfo", "discover_node", "discover_node_async", "parse_visible_devices"]

log = logging.getLogger(__name__)

ENV_FAKE_GPUS = "RAYLESS_FAKE_GPUS"
ENV_NODE_ID = "RAYLESS_NODE_ID"
ENV_NODE_IP = "RAYLESS_NODE_IP"
ENV_AGENT_ID = "RAYLESS_AGENT_ID"
_MACHINE_ID_FILES = ("/etc/machine-id", "/var/lib/dbus/machine-id")
_BOOT_ID_FILE = "/proc/sys/kernel/random/boot_id"


def _check_int(name: str, value: Any, *, minimum: int = 0) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"{name} must be an int, got {type(value).__name__} {value!r}")
    if value < minimum:
        raise ValueError(f"{name} must be >= {minimum}, got {value}")
    return value


def _check_str(name: str, value: Any, *, empty: bool = False) -> str:
    if not isinstance(value, str):
        raise ValueError(f"{name} must be a str, got {type(value).__name__} {value!r}")
    if not empty and not value:
        raise ValueError(f"{name} must not be empty")
    return value


@dataclass(frozen=True)
class GpuInfo:
    """One GPU of a node. ``index`` is the NVML index, the value for CUDA_VISIBLE_DEVICES."""

    index: int
    uuid: str
    name: str
    memory_bytes: int
    pci_bus_id: str

    def __post_init__(self) -> None:
        _check_int("GpuInfo.index", self.index)
        _check_str("GpuInfo.uuid", self.uuid)
        _check_str("GpuInfo.name", self.name, empty=True)
        _check_int("GpuInfo.memory_bytes", self.memory_bytes)
        _check_str("GpuInfo.pci_bus_id", self.pci_bus_id, empty=True)

    def to_dict(self) -> dict[str, Any]:
        """Plain, msgpack-able values."""
        return {
            "index": self.index,
            "uuid": self.uuid,
            "name": self.name,
            "memory_bytes": self.memory_bytes,
            "pci_bus_id": self.pci_bus_id,
        }

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> GpuInfo:
        """Rebuild from :meth:`to_dict`; raises ValueError on a missing key or a bad value."""
        if not isinstance(d, Mapping):
            raise ValueError(f"a GPU must be a mapping, got {type(d).__name__}")
        missing = [k for k in ("index", "uuid", "name", "memory_bytes", "pci_bus_id") if k not in d]
        if missing:
            raise ValueError(f"GPU entry lacks {missing}")
        return cls(d["index"], d["uuid"], d["name"], d["memory_bytes"], d["pci_bus_id"])


@dataclass(frozen=True)
class NodeInfo:
    """What one host (one node agent) offers to the cluster. Raises ValueError if inconsistent."""

    node_id: str
    hostname: str
    ip: str
    cpus: int
    memory_bytes: int
    gpus: tuple[GpuInfo, ...] = field(default=())
    fake_gpus: bool = False

    def __post_init__(self) -> None:
        _check_str("NodeInfo.node_id", self.node_id)
        _check_str("NodeInfo.hostname", self.hostname, empty=True)
        _check_str("NodeInfo.ip", self.ip)
        _check_int("NodeInfo.cpus", self.cpus)
        _check_int("NodeInfo.memory_bytes", self.memory_bytes)
        if not isinstance(self.fake_gpus, bool):
            raise ValueError(f"NodeInfo.fake_gpus must be a bool, got {self.fake_gpus!r}")
        if not isinstance(self.gpus, tuple) or not all(isinstance(g, GpuInfo) for g in self.gpus):
            raise ValueError("NodeInfo.gpus must be a tuple of GpuInfo")
        indices = [g.index for g in self.gpus]
        if len(set(indices)) != len(indices):
            raise ValueError(f"NodeInfo.gpus has duplicate indices {indices}")
        uuids = [g.uuid for g in self.gpus]
        if len(set(uuids)) != len(uuids):
            raise ValueError("NodeInfo.gpus has duplicate UUIDs")

    @property
    def num_gpus(self) -> int:
        """How many GPUs the node offers."""
        return len(self.gpus)

    @property
    def gpu_indices(self) -> tuple[int, ...]:
        """The GPUs' NVML indices, in reported order."""
        return tuple(g.index for g in self.gpus)

    def to_dict(self) -> dict[str, Any]:
        """Plain, msgpack-able values (str, int, bool, list, dict)."""
        return {
            "node_id": self.node_id,
            "hostname": self.hostname,
            "ip": self.ip,
            "cpus": self.cpus,
            "memory_bytes": self.memory_bytes,
            "gpus": [g.to_dict() for g in self.gpus],
            "fake_gpus": self.fake_gpus,
        }

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> NodeInfo:
        """Rebuild from :meth:`to_dict`. Unknown keys are ignored (newer peers).

        Raises ValueError on a missing key or a value of the wrong type or range.
        """
        if not isinstance(d, Mapping):
            raise ValueError(f"a node must be a mapping, got {type(d).__name__}")
        keys = ("node_id", "hostname", "ip", "cpus", "memory_bytes", "gpus")
        missing = [k for k in keys if k not in d]
        if missing:
            raise ValueError(f"node entry lacks {missing}")
        gpus = d["gpus"]
        if not isinstance(gpus, (list, tuple)):
            raise ValueError(f"'gpus' must be a list, got {type(gpus).__name__}")
        return cls(
            node_id=d["node_id"],
            hostname=d["hostname"],
            ip=d["ip"],
            cpus=d["cpus"],
            memory_bytes=d["memory_bytes"],
            gpus=tuple(GpuInfo.from_dict(g) for g in gpus),
            fake_gpus=d.get("fake_gpus", False),
        )


# --------------------------------------------------------------------------------------------
# Host facts


def _read_first(paths: Sequence[str]) -> str | None:
    for path in paths:
        try:
            with open(path, encoding="ascii", errors="replace") as f:
                text = f.read().strip()
        except OSError:
            continue
        if text:
            return text
    return None


def _default_node_id(hostname: str) -> str:
    seed = _read_first(_MACHINE_ID_FILES) or _read_first([_BOOT_ID_FILE])
    if seed is None:
        seed = f"mac-{_uuid.getnode():012x}"
    digest = hashlib.sha256(seed.encode()).hexdigest()[:8]
    base = f"{hostname or 'host'}-{digest}"
    agent = os.environ.get(ENV_AGENT_ID, "").strip()
    return f"{base}-{agent}" if agent else base


def default_node_id() -> str:
    """This host's default node id (the rule of the module docstring, without
    ``RAYLESS_NODE_ID``): ``<hostname>-<8 hex digits>[-<RAYLESS_AGENT_ID>]``."""
    return _default_node_id(socket.gethostname())


def _validate_ip(ip: str, source: str) -> str:
    try:
        return str(ipaddress.ip_address(ip.strip()))
    except ValueError:
        raise ValueError(f"{source} {ip!r} is not an IP address") from None


def _primary_ip() -> str:
    """The address of the interface that routes outward; UDP connect sends no packet."""
    for target in ("10.255.255.255", "8.8.8.8"):
        try:
            with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
                s.connect((target, 1))
                addr = str(s.getsockname()[0])
        except OSError:
            continue
        if addr and addr != "0.0.0.0":
            return addr
    return "127.0.0.1"


def _usable_cpus() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        pass
    try:
        return len(psutil.Process().cpu_affinity() or [])
    except (AttributeError, OSError, psutil.Error):
        return psutil.cpu_count() or 1


def _fake_count(fake_gpus: int | None) -> int | None:
    if fake_gpus is not None:
        return _check_int("fake_gpus", fake_gpus)
    raw = os.environ.get(ENV_FAKE_GPUS, "").strip()
    if not raw:
        return None
    try:
        return _check_int(ENV_FAKE_GPUS, int(raw))
    except ValueError:
        raise ValueError(f"{ENV_FAKE_GPUS}={raw!r} must be a non-negative integer") from None


# --------------------------------------------------------------------------------------------
# NVML


def _text(value: Any) -> str:
    return value.decode(errors="replace") if isinstance(value, bytes) else str(value)


def _import_nvml() -> Any:
    import pynvml  # optional; tests substitute the module

    return pynvml


def _nvml_gpus() -> list[GpuInfo]:
    """Every GPU NVML sees, in NVML order. Zero GPUs (one log line) when NVML is unusable."""
    try:
        nvml = _import_nvml()
    except ImportError:
        log.info("pynvml is not installed: this node reports no GPUs")
        return []
    try:
        nvml.nvmlInit()
    except nvml.NVMLError as exc:
        log.info("NVML unavailable (%s): this node reports no GPUs", exc)
        return []
    try:
        try:
            count = int(nvml.nvmlDeviceGetCount())
        except nvml.NVMLError as exc:
            log.warning("NVML could not count GPUs (%s): this node reports no GPUs", exc)
            return []
        gpus = []
        for i in range(count):
            try:
                handle = nvml.nvmlDeviceGetHandleByIndex(i)
                gpus.append(
                    GpuInfo(
                        index=i,
                        uuid=_text(nvml.nvmlDeviceGetUUID(handle)),
                        name=_text(nvml.nvmlDeviceGetName(handle)),
                        memory_bytes=int(nvml.nvmlDeviceGetMemoryInfo(handle).total),
                        pci_bus_id=_text(nvml.nvmlDeviceGetPciInfo(handle).busId),
                    )
                )
            except nvml.NVMLError as exc:
                log.warning("NVML could not read GPU %d (%s): left out", i, exc)
        return gpus
    finally:
        with contextlib.suppress(nvml.NVMLError):
            nvml.nvmlShutdown()


def parse_visible_devices(value: str | None, gpus: Sequence[GpuInfo]) -> list[GpuInfo]:
    """The GPUs ``CUDA_VISIBLE_DEVICES=value`` leaves visible, in its order (CUDA's rules).

    ``None`` (unset) leaves every GPU. Entries are NVML indices or UUIDs / unique UUID
    prefixes; the list ends at the first entry naming no GPU; duplicates are dropped.
    """
    if value is None:
        return list(gpus)
    by_index = {g.index: g for g in gpus}
    chosen: list[GpuInfo] = []
    for raw in value.split(","):
        token = raw.strip()
        if not token:
            break
        gpu: GpuInfo | None = None
        if token.lstrip("+-").isdigit():
            gpu = by_index.get(int(token))
        elif not token.upper().startswith("MIG-"):
            want = token if token.upper().startswith("GPU-") else f"GPU-{token}"
            matches = [g for g in gpus if g.uuid.lower().startswith(want.lower())]
            gpu = matches[0] if len(matches) == 1 else None
        if gpu is None:
            log.warning("CUDA_VISIBLE_DEVICES entry %r names no GPU here; the list ends", token)
            break
        if gpu not in chosen:
            chosen.append(gpu)
    return chosen


def _fake_gpu_list(n: int, node_id: str, memory_bytes: int) -> list[GpuInfo]:
    return [
        GpuInfo(
            index=i,
            uuid=f"GPU-fake-{node_id}-{i}",
            name="Fake GPU",
            memory_bytes=memory_bytes,
            pci_bus_id=f"fake:{i:02x}:00.0",
        )
        for i in range(n)
    ]


def discover_node(
    *,
    fake_gpus: int | None = None,
    node_id: str | None = None,
    ip: str | None = None,
    gpu_memory_bytes: int = 80 * 2**30,
) -> NodeInfo:
    """Describe this host (blocking: NVML calls). See the module docstring for the rules.

    Raises ValueError for a bad explicit ``ip``/``RAYLESS_NODE_IP``, ``fake_gpus`` or
    ``RAYLESS_FAKE_GPUS``; never raises because NVML is missing or broken.
    """
    n_fake = _fake_count(fake_gpus)
    _check_int("gpu_memory_bytes", gpu_memory_bytes)
    hostname = socket.gethostname()
    if node_id is None:
        node_id = os.environ.get(ENV_NODE_ID, "").strip() or _default_node_id(hostname)
    _check_str("node_id", node_id)
    if ip is not None:
        address = _validate_ip(ip, "ip")
    elif os.environ.get(ENV_NODE_IP, "").strip():
        address = _validate_ip(os.environ[ENV_NODE_IP], ENV_NODE_IP)
    else:
        address = _primary_ip()

    physical = _nvml_gpus()
    if n_fake is not None:
        gpus = _fake_gpu_list(n_fake, node_id, gpu_memory_bytes)
    else:
        gpus = parse_visible_devices(os.environ.get("CUDA_VISIBLE_DEVICES"), physical)
    return NodeInfo(
        node_id=node_id,
        hostname=hostname,
        ip=address,
        cpus=_usable_cpus(),
        memory_bytes=int(psutil.virtual_memory().total),
        gpus=tuple(gpus),
        fake_gpus=n_fake is not None,
    )


async def discover_node_async(
    *,
    fake_gpus: int | None = None,
    node_id: str | None = None,
    ip: str | None = None,
    gpu_memory_bytes: int = 80 * 2**30,
) -> NodeInfo:
    """:func:`discover_node` in a worker thread, so NVML never blocks the event loop."""
    import anyio.to_thread

    def run() -> NodeInfo:
        return discover_node(
            fake_gpus=fake_gpus, node_id=node_id, ip=ip, gpu_memory_bytes=gpu_memory_bytes
        )

    return await anyio.to_thread.run_sync(run)
