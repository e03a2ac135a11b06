"""Topology: NVIDIA GPUs, NUMA nodes, sockets and cores, read from sysfs under a root dir."""

from __future__ import annotations

import os
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from agent.errors import AgentError

NVIDIA_VENDOR = "0x10de"
GPU_CLASS_PREFIXES = ("0x0300", "0x0302")  # VGA / 3D controller; NVSwitch (0x0680) is not a GPU
HIDE_ALL = ("-1", "NoDevFiles")  # CUDA_VISIBLE_DEVICES values that hide every GPU
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


def format_cpulist(cpus: Iterable[int]) -> str:
    """{0, 1, 2, 3, 8} -> "0-3,8", the kernel's own spelling."""
    ranges: list[list[int]] = []
    for cpu in sorted(cpus):
        if ranges and cpu == ranges[-1][1] + 1:
            ranges[-1][1] = cpu
        else:
            ranges.append([cpu, cpu])
    return ",".join(str(a) if a == b else f"{a}-{b}" for a, b in ranges)


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


def parse_visible(value: str | None) -> tuple[str, ...] | None:
    """CUDA_VISIBLE_DEVICES -> its tokens; unset -> None (all GPUs), "" -> () (none)."""
    if value is None:
        return None
    return tuple(t.strip() for t in value.split(",") if t.strip())


def _by_uuid(token: str, nvml: NvmlLike | None, topology: Topology, shown: str) -> Gpu:
    if nvml is None:
        raise AgentError(
            f"CUDA_VISIBLE_DEVICES={shown}: {token!r} is a UUID and NVML is not available to map it "
            "to a PCI address; install nvidia-ml-py (launch-agent[nvml]), use indices, "
            "or pass --numa-binding off"
        )
    uuids = nvml.uuids()
    legacy_mig = token.startswith("MIG-GPU-")  # MIG-GPU-<uuid>/<gi>/<ci>: look up the parent GPU
    wanted = token[4:].split("/")[0] if legacy_mig else token
    matches = [u for u in uuids if u == wanted] or [u for u in uuids if u.startswith(wanted)]
    if len(matches) != 1:
        why = "matches no GPU or MIG device" if not matches else "matches several devices"
        raise AgentError(f"CUDA_VISIBLE_DEVICES={shown}: {token!r} {why} that NVML reports")
    pci = normalize_pci(uuids[matches[0]])
    found = [g for g in topology.gpus if g.pci == pci]
    if not found:
        raise AgentError(
            f"CUDA_VISIBLE_DEVICES={shown}: {token!r} is at {pci}, which sysfs does not list as a GPU"
        )
    return found[0]


def _by_token(token: str, topology: Topology, nvml: NvmlLike | None, shown: str) -> Gpu:
    if token.isdigit():
        index, count = int(token), len(topology.gpus)
        if index >= count:
            has = (
                f"{count} NVIDIA GPU(s), 0..{count - 1} in PCI bus order"
                if count
                else "no NVIDIA GPU"
            )
            raise AgentError(
                f"CUDA_VISIBLE_DEVICES={shown}: index {index} is out of range; this node has {has}"
            )
        return topology.gpus[index]
    if token.startswith(("GPU-", "MIG-")):
        return _by_uuid(token, nvml, topology, shown)
    raise AgentError(
        f"CUDA_VISIBLE_DEVICES={shown}: {token!r} is neither an index nor a GPU-/MIG- UUID"
    )


def select_gpus(
    topology: Topology, visible: Sequence[str] | None, nvml: NvmlLike | None = None
) -> tuple[Gpu, ...]:
    """The GPUs the children see, in CUDA index order. CUDA would silently stop at a bad token;
    we raise instead, except for the "-1"/"NoDevFiles" idiom, which hides every GPU."""
    if visible is None:
        return topology.gpus
    tokens = [t.strip() for t in visible if t.strip()]
    if not tokens or tokens[0] in HIDE_ALL:
        return ()
    shown = ",".join(tokens)
    gpus = tuple(_by_token(t, topology, nvml, shown) for t in tokens)
    repeated = {g.pci for g in gpus if gpus.count(g) > 1}
    if repeated:
        twice = ", ".join(sorted(repeated))
        raise AgentError(f"CUDA_VISIBLE_DEVICES={shown} names GPU {twice} twice")
    return gpus


def count_gpus(env: Mapping[str, str], topology: Topology) -> int:
    """GPUs for `--nproc-per-node auto`: CUDA_VISIBLE_DEVICES (what the children will see), else
    SLURM_GPUS_ON_NODE, else the sysfs GPUs; 1 when that is 0 (a CPU-only rank)."""
    visible = parse_visible(env.get("CUDA_VISIBLE_DEVICES"))
    slurm = env.get("SLURM_GPUS_ON_NODE", "").strip()
    if visible is not None:
        count = 0 if visible[:1] and visible[0] in HIDE_ALL else len(visible)
    elif slurm.isdigit():
        count = int(slurm)
    else:
        count = len(topology.gpus)
    return max(count, 1)


class _Nvml:
    """NvmlLike over nvidia-ml-py (NVML creates no CUDA context); enumerated once."""

    def __init__(self, pynvml: Any) -> None:
        self._nvml = pynvml
        self._found: dict[str, str] | None = None

    def uuids(self) -> dict[str, str]:
        if self._found is None:
            nvml, self._found = self._nvml, {}
            for index in range(nvml.nvmlDeviceGetCount()):
                try:  # a GPU the device cgroup hides answers NO_PERMISSION: not ours
                    handle = nvml.nvmlDeviceGetHandleByIndex(index)
                    bus = _text(nvml.nvmlDeviceGetPciInfo(handle).busId)
                    uuids = [_text(nvml.nvmlDeviceGetUUID(handle)), *self._mig_uuids(handle)]
                except nvml.NVMLError:
                    continue
                self._found.update(dict.fromkeys(uuids, bus))
        return self._found

    def _mig_uuids(self, handle: Any) -> list[str]:
        nvml, uuids = self._nvml, []
        try:
            slots = nvml.nvmlDeviceGetMaxMigDeviceCount(handle)
        except nvml.NVMLError:  # not MIG-capable
            return []
        for slot in range(slots):
            try:
                mig = nvml.nvmlDeviceGetMigDeviceHandleByIndex(handle, slot)
            except nvml.NVMLError:  # empty slot
                continue
            uuids.append(_text(nvml.nvmlDeviceGetUUID(mig)))
        return uuids


def _text(value: str | bytes) -> str:
    return value.decode() if isinstance(value, bytes) else value


def load_nvml() -> NvmlLike | None:
    """The real NVML when nvidia-ml-py and a driver are present, else None."""
    try:
        import pynvml  # optional: launch-agent[nvml]

        pynvml.nvmlInit()
    except Exception:  # no module, no library, no driver: all mean "no NVML"
        return None
    return _Nvml(pynvml)
