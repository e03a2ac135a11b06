"""What this node offers a job, read from sysfs, NVML, its addresses and the environment."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from agent.errors import AgentError
from agent.plan.gpus import parse_visible, select_gpus
from agent.plan.nvml import load_nvml
from agent.plan.topology import Gpu, Topology, read_topology

ENV_PREFIXES = ("NCCL_", "OMP_", "CUDA_", "KMP_")
IPV4_MAPPED = "0000:0000:0000:0000:0000:ffff:"
_ZERO_GID = "0000:0000:0000:0000:0000:0000:0000:0000"


@dataclass(frozen=True)
class Gid:
    index: int
    gid: str
    kind: str  # "RoCE v2" or "IB/RoCE v1"
    ndev: str  # the netdev behind a RoCE GID, "" for InfiniBand

    @property
    def ipv4(self) -> str | None:
        if not self.gid.startswith(IPV4_MAPPED):
            return None
        packed = int(self.gid[len(IPV4_MAPPED) :].replace(":", ""), 16)
        return ".".join(str(packed >> shift & 0xFF) for shift in (24, 16, 8, 0))


@dataclass(frozen=True)
class IbPort:
    device: str
    port: int
    state: str  # "4: ACTIVE"
    link_layer: str  # "InfiniBand", or "Ethernet" for RoCE
    gids: tuple[Gid, ...]

    @property
    def active(self) -> bool:
        return "ACTIVE" in self.state

    @property
    def roce_v2_ipv4(self) -> Gid | None:
        """The GID NCCL should use on a RoCE port: the lowest RoCE v2 index with an IPv4."""
        found = [g for g in self.gids if g.kind == "RoCE v2" and g.ipv4]
        return min(found, key=lambda g: g.index) if found else None


@dataclass(frozen=True)
class Nic:
    name: str
    operstate: str
    physical: bool  # backed by a device: not lo, a bridge, veth or ifb
    ipv4: tuple[str, ...] = ()


@dataclass(frozen=True)
class Facts:
    root: Path
    topology: Topology
    nics: tuple[Nic, ...]
    ib_ports: tuple[IbPort, ...]
    env: tuple[tuple[str, str], ...]  # the NCCL_/OMP_/CUDA_/KMP_ variables only
    selected: tuple[Gpu, ...]  # what CUDA_VISIBLE_DEVICES leaves visible, in CUDA order
    selection_error: str = ""


def _read(path: Path) -> str:
    try:
        return path.read_text().strip()
    except OSError:  # unpopulated GID slots answer EINVAL
        return ""


def _entries(directory: Path) -> list[Path]:
    """Children in natural order (2 before 10); none when the directory is missing."""
    if not directory.is_dir():
        return []
    return sorted(directory.iterdir(), key=lambda p: (len(p.name), p.name))


def _gids(port: Path) -> tuple[Gid, ...]:
    gids = []
    for slot in _entries(port / "gids"):
        gid = _read(slot)
        if gid and gid != _ZERO_GID:
            kind = _read(port / "gid_attrs/types" / slot.name)
            gids.append(Gid(int(slot.name), gid, kind, _read(port / "gid_attrs/ndevs" / slot.name)))
    return tuple(gids)


def read_ib_ports(root: Path) -> tuple[IbPort, ...]:
    return tuple(
        IbPort(dev.name, int(p.name), _read(p / "state"), _read(p / "link_layer"), _gids(p))
        for dev in _entries(root / "sys/class/infiniband")
        for p in _entries(dev / "ports")
    )


def read_nics(root: Path, addresses: Mapping[str, Sequence[str]]) -> tuple[Nic, ...]:
    nics = _entries(root / "sys/class/net")
    ipv4 = {n.name: tuple(addresses.get(n.name, ())) for n in nics}
    return tuple(
        Nic(n.name, _read(n / "operstate"), (n / "device").exists(), ipv4[n.name]) for n in nics
    )


def _ipv4_addresses() -> dict[str, list[str]]:
    import socket

    import psutil

    found = psutil.net_if_addrs().items()
    return {name: [a.address for a in addrs if a.family == socket.AF_INET] for name, addrs in found}


def read_facts(root: Path, env: Mapping[str, str], allowed: frozenset[int] | None = None) -> Facts:
    """Addresses and NVML describe the running kernel, so they are read for the real root only."""
    real = root == Path("/")
    nvml = load_nvml() if real else None
    topology = read_topology(root, allowed, nvml)
    selected: tuple[Gpu, ...] = ()
    error = ""
    try:
        selected = select_gpus(topology, parse_visible(env.get("CUDA_VISIBLE_DEVICES")), nvml)
    except AgentError as failure:
        error = str(failure)
    nics = read_nics(root, _ipv4_addresses() if real else {})
    shown = tuple(sorted((k, v) for k, v in env.items() if k.startswith(ENV_PREFIXES)))
    return Facts(root, topology, nics, read_ib_ports(root), shown, selected, error)
