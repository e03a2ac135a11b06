"""Fake sysfs trees under a tmp dir: CPUs, NUMA nodes, PCI devices, NICs and RDMA ports."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from pathlib import Path

from agent.plan.rank_set import format_ranges

NODE0_GPUS = ("0000:07:00.0", "0000:0f:00.0", "0000:47:00.0", "0000:4e:00.0")
NODE1_GPUS = ("0000:87:00.0", "0000:90:00.0", "0000:b7:00.0", "0000:bd:00.0")
NODE0_CPUS = frozenset(range(0, 16)) | frozenset(range(32, 48))
NODE1_CPUS = frozenset(range(16, 32)) | frozenset(range(48, 64))


def write(root: Path, relative: str, text: str) -> Path:
    path = root / relative
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text + "\n")
    return path


def add_cpus(root: Path, core_of: Mapping[int, tuple[int, int]]) -> None:
    """cpu -> (package, core_id); also writes devices/system/cpu/online."""
    for cpu, (package, core) in core_of.items():
        write(root, f"sys/devices/system/cpu/cpu{cpu}/topology/physical_package_id", str(package))
        write(root, f"sys/devices/system/cpu/cpu{cpu}/topology/core_id", str(core))
    write(root, "sys/devices/system/cpu/online", format_ranges(core_of))


def add_node(root: Path, node: int, cpus: Iterable[int]) -> None:
    write(root, f"sys/devices/system/node/node{node}/cpulist", format_ranges(cpus))


def add_pci(
    root: Path, pci: str, vendor: str, cls: str, numa_node: int, local: Iterable[int]
) -> None:
    device = f"sys/bus/pci/devices/{pci}"
    write(root, f"{device}/vendor", vendor)
    write(root, f"{device}/class", cls)
    write(root, f"{device}/numa_node", str(numa_node))
    write(root, f"{device}/local_cpulist", format_ranges(local))


def add_gpu(
    root: Path, pci: str, numa_node: int, local: Iterable[int], cls: str = "0x030200"
) -> None:
    add_pci(root, pci, "0x10de", cls, numa_node, local)


def add_nic(root: Path, name: str, operstate: str = "up", physical: bool = True) -> None:
    write(root, f"sys/class/net/{name}/operstate", operstate)
    if physical:
        (root / f"sys/class/net/{name}/device").mkdir()


def add_rdma_port(
    root: Path,
    device: str,
    port: int,
    gids: Mapping[int, tuple[str, str, str]],
    state: str = "4: ACTIVE",
    link_layer: str = "Ethernet",
) -> None:
    """gids: index -> (gid, type, netdev), as in ports/<p>/gids and gid_attrs/{types,ndevs}."""
    base = f"sys/class/infiniband/{device}/ports/{port}"
    write(root, f"{base}/state", state)
    write(root, f"{base}/link_layer", link_layer)
    for index, (gid, kind, ndev) in gids.items():
        write(root, f"{base}/gids/{index}", gid)
        write(root, f"{base}/gid_attrs/types/{index}", kind)
        write(root, f"{base}/gid_attrs/ndevs/{index}", ndev)


def two_socket_cpus(root: Path) -> None:
    """2 sockets x 16 cores x 2 threads, Linux numbering: cpu c and c+32 are siblings."""
    add_cpus(root, {cpu: ((cpu // 16) % 2, cpu % 16) for cpu in range(64)})
    add_node(root, 0, NODE0_CPUS)
    add_node(root, 1, NODE1_CPUS)


def dgx(root: Path) -> Path:
    """2 sockets, 2 NUMA nodes, 64 CPUs, 4 GPUs per node (created out of bus order), plus an
    NVSwitch, an NVIDIA audio function and a Mellanox NIC that must not count as GPUs."""
    two_socket_cpus(root)
    for pci in reversed(NODE0_GPUS):
        add_gpu(root, pci, 0, NODE0_CPUS)
    for pci in NODE1_GPUS:
        add_gpu(root, pci, 1, NODE1_CPUS)
    add_pci(root, "0000:c1:00.0", "0x10de", "0x068000", 1, NODE1_CPUS)  # NVSwitch
    add_pci(root, "0000:07:00.1", "0x10de", "0x040300", 0, NODE0_CPUS)  # HDMI audio
    add_pci(root, "0000:0c:00.0", "0x15b3", "0x020000", 0, NODE0_CPUS)  # ConnectX NIC
    return root


def single_node(root: Path, cpus: int = 2) -> Path:
    """A small box like the CI machine: one package, one node, no GPU."""
    add_cpus(root, {cpu: (0, cpu) for cpu in range(cpus)})
    add_node(root, 0, range(cpus))
    return root
