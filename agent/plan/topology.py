"""Topology: NVIDIA GPUs, NUMA nodes, sockets and cores, read from sysfs under a root dir."""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from agent.errors import AgentError

NVIDIA_VENDOR = "0x10de"
GPU_CLASS_PREFIXES = ("0x0300", "0x0302")  # VGA / 3D controller; NVSwitch (0x0680) is not a GPU
_PCI = re.compile(r"^([0-9a-fA-F]+):([0-9a-fA-F]{1,2}):([0-9a-fA-F]{1,2})\.([0-7])$")


class NvmlLike(Protocol):
    """What topology needs from NVML: every GPU and MIG UUID mapped to its PCI bus id."""

    def uuids(self) -> Mapping[str, str]: ...


@dataclass(frozen=True)
class Gpu:
    pci: str  # "0000:1a:00.0", the sysfs spelling
    numa_node: int  # resolved: never -1
    local_cpus: frozenset[int]
    uuid: str | None = None


@dataclass(frozen=True)
class Topology:
    numa_cpus: Mapping[int, frozenset[int]]
    gpus: tuple[Gpu, ...]  # PCI bus order = CUDA index order under CUDA_DEVICE_ORDER=PCI_BUS_ID
    socket_cpus: Mapping[int, frozenset[int]]
    core_of: Mapping[int, tuple[int, int]]  # cpu -> (package, core_id), shared by siblings
    allowed_cpus: frozenset[int]
    warnings: tuple[str, ...] = ()


def parse_cpulist(text: str) -> frozenset[int]:
    """The kernel's list format: "0-3,8" -> {0, 1, 2, 3, 8}; "" -> {}."""
    cpus: set[int] = set()
    for part in text.strip().split(","):
        if not part:
            continue
        first, _, last = part.partition("-")
        cpus.update(range(int(first), int(last or first) + 1))
    return frozenset(cpus)


def normalize_pci(bus_id: str) -> str:
    """nvidia-smi/NVML "00000000:1A:00.0" -> sysfs "0000:1a:00.0"."""
    match = _PCI.match(bus_id.strip())
    if not match:
        raise AgentError(f"not a PCI bus id: {bus_id!r} (expected e.g. 0000:1a:00.0)")
    domain, bus, device, function = match.groups()
    return f"{int(domain, 16):04x}:{int(bus, 16):02x}:{int(device, 16):02x}.{function}"


def _pci_key(pci: str) -> tuple[int, ...]:
    domain, bus, rest = pci.split(":")
    device, function = rest.split(".")
    return int(domain, 16), int(bus, 16), int(device, 16), int(function)


def _read(path: Path, default: str = "") -> str:
    try:
        return path.read_text().strip()
    except OSError:
        return default


def _numbered(directory: Path, prefix: str) -> dict[int, Path]:
    """node0, node1 ... / cpu0, cpu1 ... -> {0: path, 1: path}; no directory -> {}."""
    pattern = re.compile(rf"^{prefix}(\d+)$")
    if not directory.is_dir():
        return {}
    found = (pattern.match(p.name) for p in directory.iterdir())
    return {int(m.group(1)): directory / m.group(0) for m in found if m}


def _online_cpus(sysdir: Path, numa: Mapping[int, frozenset[int]]) -> frozenset[int]:
    cpu_dir = sysdir / "devices/system/cpu"
    online = _read(cpu_dir / "online")
    if online:
        return parse_cpulist(online)
    return frozenset(_numbered(cpu_dir, "cpu")) or frozenset().union(*numa.values())


def _numa_cpus(sysdir: Path) -> dict[int, frozenset[int]]:
    nodes = _numbered(sysdir / "devices/system/node", "node")
    return {n: parse_cpulist(_read(path / "cpulist")) for n, path in sorted(nodes.items())}


def _cores(sysdir: Path, online: frozenset[int]) -> dict[int, tuple[int, int]]:
    """Without topology files every CPU is its own core on package 0."""
    cpu_dir = sysdir / "devices/system/cpu"
    core_of = {}
    for cpu in sorted(online):
        topo = cpu_dir / f"cpu{cpu}" / "topology"
        package = int(_read(topo / "physical_package_id", "0") or 0)
        core_of[cpu] = (max(package, 0), int(_read(topo / "core_id", str(cpu)) or cpu))
    return core_of


def _sockets(core_of: Mapping[int, tuple[int, int]]) -> dict[int, frozenset[int]]:
    sockets: dict[int, set[int]] = {}
    for cpu, (package, _) in core_of.items():
        sockets.setdefault(package, set()).add(cpu)
    return {p: frozenset(cpus) for p, cpus in sorted(sockets.items())}


def _resolve_node(
    pci: str, raw: int, local: frozenset[int], numa: Mapping[int, frozenset[int]]
) -> tuple[int, str | None]:
    """sysfs says -1 on single-node machines and some VMs: infer the node from local_cpulist."""
    if raw >= 0:
        return raw, None
    touching = [n for n, cpus in numa.items() if cpus & local]
    if sum(1 for cpus in numa.values() if cpus) <= 1:
        return (touching or [0])[0], None
    if len(touching) == 1:
        node, how = touching[0], f"placed on node {touching[0]} from its local_cpulist"
    else:
        node, how = 0, "local_cpulist does not name one node; assuming node 0"
    return node, f"GPU {pci}: numa_node is -1; {how}"


def _is_gpu(device: Path) -> bool:
    vendor, cls = _read(device / "vendor").lower(), _read(device / "class").lower()
    return vendor == NVIDIA_VENDOR and cls.startswith(GPU_CLASS_PREFIXES)


def _driver_visible(root: Path) -> frozenset[str] | None:
    """The container runtime masks /proc/driver/nvidia/gpus down to the GPUs it exposes."""
    directory = root / "proc/driver/nvidia/gpus"
    if not directory.is_dir():
        return None
    return frozenset(p.name.lower() for p in directory.iterdir()) or None


def _read_gpus(
    root: Path, numa: Mapping[int, frozenset[int]], uuid_of: Mapping[str, str]
) -> tuple[tuple[Gpu, ...], tuple[str, ...]]:
    pci_dir = root / "sys/bus/pci/devices"
    found = [p for p in pci_dir.iterdir() if _is_gpu(p)] if pci_dir.is_dir() else []
    devices = sorted(found, key=lambda p: _pci_key(p.name))
    visible = _driver_visible(root)
    gpus, warnings = [], []
    for device in devices:
        pci = device.name.lower()
        # NVML lists only the GPUs the device cgroup lets us open; sysfs lists them all.
        if (visible is not None and pci not in visible) or (uuid_of and pci not in uuid_of):
            continue
        local = parse_cpulist(_read(device / "local_cpulist"))
        raw_node = int(_read(device / "numa_node") or -1)
        node, warning = _resolve_node(pci, raw_node, local, numa)
        gpus.append(Gpu(pci, node, local or numa.get(node, frozenset()), uuid_of.get(pci)))
        warnings += [warning] if warning else []
    return tuple(gpus), tuple(warnings)


def _uuid_by_pci(nvml: NvmlLike | None) -> dict[str, str]:
    found = nvml.uuids().items() if nvml is not None else ()
    return {normalize_pci(pci): uuid for uuid, pci in found if uuid.startswith("GPU-")}


def read_topology(
    root: Path = Path("/"), allowed_cpus: frozenset[int] | None = None, nvml: NvmlLike | None = None
) -> Topology:
    """allowed_cpus None: this process's affinity when root is "/", else every CPU of the tree."""
    sysdir = root / "sys"
    numa = _numa_cpus(sysdir)
    online = _online_cpus(sysdir, numa)
    numa = numa or {0: online}
    core_of = _cores(sysdir, online)
    uuid_of = _uuid_by_pci(nvml)
    gpus, warnings = _read_gpus(root, numa, uuid_of)
    if allowed_cpus is None:
        allowed_cpus = frozenset(os.sched_getaffinity(0)) if root == Path("/") else online
    return Topology(numa, gpus, _sockets(core_of), core_of, frozenset(allowed_cpus), warnings)
