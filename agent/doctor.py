"""Doctor: what this node offers a job (GPUs, NUMA, NICs, RoCE GIDs, env) and what to set."""

from __future__ import annotations

import argparse
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from rich.console import Console
from rich.table import Table

from agent.binding import Binding, default_mode, plan_bindings
from agent.errors import AgentError
from agent.topology import (
    Gpu,
    Topology,
    format_cpulist,
    load_nvml,
    parse_visible,
    read_topology,
    select_gpus,
)

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


@dataclass(frozen=True)
class Suggestion:
    setting: str  # "NCCL_IB_GID_INDEX=3", or a command such as "unset NCCL_IB_GID_INDEX"
    why: str


@dataclass(frozen=True)
class Advice:
    suggestions: tuple[Suggestion, ...]
    notes: tuple[str, ...]  # what was not found, warnings
    mode: str  # the default --numa-binding here
    ranks: tuple[tuple[Gpu | None, Binding | None], ...]  # that default, per local rank


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
    selected, error = (), ""
    try:
        selected = select_gpus(topology, parse_visible(env.get("CUDA_VISIBLE_DEVICES")), nvml)
    except AgentError as failure:
        error = str(failure)
    nics = read_nics(root, _ipv4_addresses() if real else {})
    shown = tuple(sorted((k, v) for k, v in env.items() if k.startswith(ENV_PREFIXES)))
    return Facts(root, topology, nics, read_ib_ports(root), shown, selected, error)


def _hca_value(devices: Sequence[str], present: Sequence[str]) -> str:
    """NCCL_IB_HCA matches prefixes (mlx5_1 also takes mlx5_10): "=" for exact when that bites."""
    ambiguous = any(other != d and other.startswith(d) for d in devices for other in present)
    return ("=" if ambiguous else "") + ",".join(devices)


def _rdma_suggestions(ports: Sequence[IbPort]) -> list[Suggestion]:
    chosen = {
        p: g for p in ports if p.active and p.link_layer == "Ethernet" and (g := p.roce_v2_ipv4)
    }
    out = []
    if len({g.index for g in chosen.values()}) == 1:
        where = ", ".join(f"{p.device}:{p.port} ({g.ipv4})" for p, g in chosen.items())
        index = next(iter(chosen.values())).index
        out.append(Suggestion(f"NCCL_IB_GID_INDEX={index}", f"the RoCE v2 IPv4 GID on {where}"))
    elif chosen:
        where = ", ".join(f"{p.device}:{p.port}={g.index}" for p, g in chosen.items())
        why = f"RoCE v2 IPv4 GID indices differ ({where}); NCCL >= 2.21 picks one per device"
        out.append(Suggestion("unset NCCL_IB_GID_INDEX", why))
    usable = sorted(
        {p.device for p in ports if p.active and (p.link_layer != "Ethernet" or p in chosen)}
    )
    if usable:
        value = _hca_value(usable, sorted({p.device for p in ports}))
        why = "the HCAs with an ACTIVE InfiniBand port or a RoCE v2 IPv4 GID"
        out.append(Suggestion(f"NCCL_IB_HCA={value}", why))
    return out


def _socket_suggestion(nics: Sequence[Nic], ports: Sequence[IbPort]) -> list[Suggestion]:
    roce = sorted({g.ndev for p in ports if p.active and (g := p.roce_v2_ipv4) and g.ndev})
    up = [n for n in nics if n.physical and n.operstate in ("up", "unknown")]
    up.sort(key=lambda n: not n.ipv4)  # interfaces with an IPv4 address first
    if roce:
        name, why = ",".join(roce), "the netdev behind the RoCE GID"
    elif up:
        name, why = up[0].name, "the first physical interface that is up"
    else:
        return []
    return [Suggestion(f"NCCL_SOCKET_IFNAME={name}", f"{why} (also GLOO_SOCKET_IFNAME)")]


def _default_binding(
    facts: Facts,
) -> tuple[str, tuple[tuple[Gpu | None, Binding | None], ...], str]:
    gpus: tuple[Gpu | None, ...] = facts.selected or (None,)
    mode = default_mode(facts.topology, facts.selected)
    try:
        bindings = plan_bindings(facts.topology, gpus, mode)
    except AgentError as error:
        return mode, (), str(error)
    return mode, tuple(zip(gpus, bindings, strict=True)), ""


def _missing(facts: Facts) -> list[str]:
    root, topology = facts.root, facts.topology
    notes = []
    if not topology.gpus:
        notes.append(f"found no NVIDIA GPUs under {root / 'sys/bus/pci/devices'}")
    cpu_nodes = [n for n, cpus in topology.numa_cpus.items() if cpus]
    if len(cpu_nodes) < 2:
        notes.append(f"found {len(cpu_nodes)} NUMA node with CPUs: binding has nothing to choose")
    if not facts.ib_ports:
        where = root / "sys/class/infiniband"
        notes.append(f"found no InfiniBand/RoCE devices under {where}: NCCL will use TCP sockets")
    return notes


def advise(facts: Facts) -> Advice:
    """Pure: the suggestions, the default binding and what was not found."""
    env = dict(facts.env)
    found = _rdma_suggestions(facts.ib_ports) + _socket_suggestion(facts.nics, facts.ib_ports)
    suggestions = []
    for s in found:
        name = s.setting.split("=")[0].split()[-1]
        why = f"{s.why}; now {name}={env[name]}" if name in env else s.why
        suggestions.append(Suggestion(s.setting, why))
    mode, ranks, error = _default_binding(facts)
    notes = [*facts.topology.warnings, *_missing(facts), facts.selection_error, error]
    if not suggestions:
        notes.append("nothing to suggest for NCCL: its defaults fit what was found")
    return Advice(tuple(suggestions), tuple(n for n in notes if n), mode, ranks)


def _table(title: str, *columns: str) -> Table:
    table = Table(title=title, title_justify="left")
    for column in columns:
        table.add_column(column, overflow="fold")
    return table


def _tables(facts: Facts) -> list[Table]:
    topology = facts.topology
    gpus = _table("GPUs (PCI bus order)", "index", "PCI", "NUMA node", "local CPUs", "UUID")
    for i, g in enumerate(topology.gpus):
        gpus.add_row(str(i), g.pci, str(g.numa_node), format_cpulist(g.local_cpus), g.uuid or "")
    nodes = _table("NUMA nodes", "node", "CPUs", "allowed", "GPUs")
    for node, cpus in topology.numa_cpus.items():
        here = ", ".join(g.pci for g in topology.gpus if g.numa_node == node)
        nodes.add_row(
            str(node), format_cpulist(cpus), format_cpulist(cpus & topology.allowed_cpus), here
        )
    nics = _table("Network interfaces", "name", "state", "physical", "IPv4")
    for n in facts.nics:
        nics.add_row(n.name, n.operstate, "yes" if n.physical else "no", ", ".join(n.ipv4))
    ports = _table("InfiniBand/RoCE ports", "port", "state", "link", "RoCE v2 IPv4 GID", "netdev")
    for p in facts.ib_ports:
        gid = p.roce_v2_ipv4
        shown = (f"{gid.index} ({gid.ipv4})", gid.ndev) if gid else ("-", "")
        ports.add_row(f"{p.device}:{p.port}", p.state, p.link_layer, *shown)
    return [t for t in (gpus, nodes, nics, ports) if t.row_count]


def render(facts: Facts, advice: Advice, console: Console) -> None:
    allowed = facts.topology.allowed_cpus
    for table in _tables(facts):
        console.print(table)
    console.print(f"Allowed CPUs: {format_cpulist(allowed)} ({len(allowed)})")
    console.print(f"Default --numa-binding here: {advice.mode}")
    for rank, (gpu, b) in enumerate(advice.ranks):
        if b is not None:
            where = f"CPUs {format_cpulist(b.cpus)}, memory node {format_cpulist(b.mem_nodes)}"
            console.print(f"  local rank {rank} ({gpu.pci if gpu else 'no GPU'}): {where}")
    lines = [f"  {name}={value}" for name, value in facts.env]
    lines = (
        ["Environment in force:", *lines]
        if lines
        else ["Environment: no NCCL_/OMP_/CUDA_/KMP_ set"]
    )
    for s in advice.suggestions:
        lines.append(f"Suggest: {'export ' if '=' in s.setting else ''}{s.setting}  # {s.why}")
    lines += [f"Note: {note}" for note in advice.notes]
    for line in lines:
        console.print(line, markup=False, highlight=False, soft_wrap=True)


def main(
    argv: list[str], env: Mapping[str, str], root: Path = Path("/"), console: Console | None = None
) -> int:
    parser = argparse.ArgumentParser(prog="python -m agent doctor", description=__doc__)
    parser.add_argument(
        "--sysfs-root", type=Path, default=root, help="the directory holding sys/ (default: /)"
    )
    facts = read_facts(parser.parse_args(argv).sysfs_root, env)
    render(facts, advise(facts), console or Console())
    return 0
