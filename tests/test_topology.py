"""Topology from fake sysfs trees: GPUs in bus order, NUMA nodes, sockets, CUDA_VISIBLE_DEVICES."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import pytest

from agent.errors import AgentError, ExitCode
from agent.plan.gpus import gpu_count, parse_visible, select_gpus
from agent.plan.rank_set import format_ranges
from agent.plan.topology import (
    Topology,
    normalize_pci,
    parse_cpulist,
    read_topology,
)
from tests.fake_sysfs import (
    NODE0_CPUS,
    NODE0_GPUS,
    NODE1_CPUS,
    NODE1_GPUS,
    add_gpu,
    add_node,
    dgx,
    single_node,
    two_socket_cpus,
    write,
)

ALL_GPUS = NODE0_GPUS + NODE1_GPUS


@dataclass(frozen=True)
class FakeNvml:
    """NvmlLike: uuid -> bus id, spelled the way nvidia-smi prints it."""

    table: dict[str, str]

    def uuids(self) -> dict[str, str]:
        return self.table


NVML = FakeNvml(
    {
        "GPU-aaaa1111": "00000000:07:00.0",
        "GPU-bbbb2222": "00000000:0F:00.0",
        "MIG-cccc3333": "00000000:0F:00.0",
        "GPU-dddd4444": "00000000:87:00.0",
    }
)


@pytest.fixture
def box(tmp_path: Path) -> Topology:
    return read_topology(dgx(tmp_path))


@pytest.mark.parametrize(
    ("text", "cpus", "spelled"),
    [
        ("", set(), ""),
        ("0", {0}, "0"),
        ("0-3,8,10-11\n", {0, 1, 2, 3, 8, 10, 11}, "0-3,8,10-11"),
        ("5,1-2", {1, 2, 5}, "1-2,5"),
    ],
)
def test_cpulist_round_trip(text: str, cpus: set[int], spelled: str) -> None:
    assert parse_cpulist(text) == cpus
    assert format_ranges(cpus) == spelled


@pytest.mark.parametrize(
    ("bus_id", "sysfs"),
    [
        ("00000000:1A:00.0", "0000:1a:00.0"),
        ("0000:1a:00.0", "0000:1a:00.0"),
        ("00000001:B7:1F.3", "0001:b7:1f.3"),
        ("10000:01:00.0", "10000:01:00.0"),
    ],
)
def test_normalize_pci(bus_id: str, sysfs: str) -> None:
    assert normalize_pci(bus_id) == sysfs


def test_normalize_pci_rejects_garbage() -> None:
    with pytest.raises(AgentError, match="not a PCI bus id"):
        normalize_pci("GPU-1234")


def test_gpus_in_bus_order_without_nvswitch_audio_or_nic(box: Topology) -> None:
    assert [g.pci for g in box.gpus] == list(ALL_GPUS)
    assert [g.numa_node for g in box.gpus] == [0] * 4 + [1] * 4
    assert box.gpus[0].local_cpus == NODE0_CPUS
    assert box.warnings == ()


def test_nodes_sockets_cores_and_allowed(box: Topology) -> None:
    assert dict(box.numa_cpus) == {0: NODE0_CPUS, 1: NODE1_CPUS}
    assert dict(box.socket_cpus) == {0: NODE0_CPUS, 1: NODE1_CPUS}
    assert box.core_of[0] == box.core_of[32] == (0, 0)  # hyperthread siblings
    assert box.core_of[16] == (1, 0)
    assert box.allowed_cpus == frozenset(range(64))  # a fake root: every CPU of the tree


def test_allowed_cpus_passed_in(tmp_path: Path) -> None:
    assert read_topology(dgx(tmp_path), frozenset({1, 2})).allowed_cpus == {1, 2}


@pytest.mark.parametrize(
    ("local", "node", "warned"),
    [
        (NODE1_CPUS, 1, "placed on node 1"),
        (NODE0_CPUS | NODE1_CPUS, 0, "assuming node 0"),
        (frozenset(), 0, "assuming node 0"),
    ],
)
def test_gpu_with_numa_node_minus_one(
    tmp_path: Path, local: frozenset[int], node: int, warned: str
) -> None:
    two_socket_cpus(tmp_path)
    add_gpu(tmp_path, "0000:b7:00.0", -1, local)
    topology = read_topology(tmp_path)
    assert topology.gpus[0].numa_node == node
    assert len(topology.warnings) == 1
    assert "0000:b7:00.0" in topology.warnings[0]
    assert warned in topology.warnings[0]


def test_minus_one_on_a_single_node_is_silent(tmp_path: Path) -> None:
    single_node(tmp_path)
    add_gpu(tmp_path, "0000:01:00.0", -1, {0, 1})
    topology = read_topology(tmp_path)
    assert topology.gpus[0].numa_node == 0
    assert topology.warnings == ()


def test_no_node_directory_means_one_node_of_all_cpus(tmp_path: Path) -> None:
    write(tmp_path, "sys/devices/system/cpu/online", "0-3")
    topology = read_topology(tmp_path)
    assert dict(topology.numa_cpus) == {0: frozenset(range(4))}
    assert dict(topology.socket_cpus) == {0: frozenset(range(4))}
    assert topology.core_of[3] == (0, 3)  # no topology files: every CPU its own core


def test_cpu_less_node_is_kept(tmp_path: Path) -> None:
    single_node(tmp_path)
    add_node(tmp_path, 1, [])  # e.g. GPU or CXL memory exposed as a NUMA node
    assert dict(read_topology(tmp_path).numa_cpus) == {0: {0, 1}, 1: frozenset()}


def test_container_mask_in_proc_driver_nvidia(tmp_path: Path) -> None:
    dgx(tmp_path)
    (tmp_path / "proc/driver/nvidia/gpus/0000:90:00.0").mkdir(parents=True)
    (tmp_path / "proc/driver/nvidia/gpus/0000:4e:00.0").mkdir(parents=True)
    assert [g.pci for g in read_topology(tmp_path).gpus] == ["0000:4e:00.0", "0000:90:00.0"]


def test_nvml_fills_uuids_and_limits_to_its_gpus(tmp_path: Path) -> None:
    gpus = read_topology(dgx(tmp_path), nvml=NVML).gpus
    assert [(g.pci, g.uuid) for g in gpus] == [
        ("0000:07:00.0", "GPU-aaaa1111"),
        ("0000:0f:00.0", "GPU-bbbb2222"),
        ("0000:87:00.0", "GPU-dddd4444"),
    ]


@pytest.mark.parametrize(
    ("visible", "expected"),
    [
        (None, ALL_GPUS),
        ("2,0", (NODE0_GPUS[2], NODE0_GPUS[0])),
        ("7", (NODE1_GPUS[3],)),
        (" 4 , 1 ", (NODE1_GPUS[0], NODE0_GPUS[1])),
        ("", ()),
        ("-1", ()),
        ("NoDevFiles", ()),
        ("GPU-dddd4444,0", (NODE1_GPUS[0], NODE0_GPUS[0])),
        ("GPU-bbbb", (NODE0_GPUS[1],)),  # a unique prefix, as CUDA accepts
        ("MIG-cccc3333", (NODE0_GPUS[1],)),
        ("MIG-GPU-aaaa1111/1/0", (NODE0_GPUS[0],)),  # legacy MIG spelling
    ],
)
def test_select_gpus(box: Topology, visible: str | None, expected: tuple[str, ...]) -> None:
    assert [g.pci for g in select_gpus(box, parse_visible(visible), NVML)] == list(expected)


@pytest.mark.parametrize(
    ("visible", "nvml", "message"),
    [
        ("0,9,1", NVML, "index 9 is out of range; this node has 8 NVIDIA GPU"),
        ("GPU-aaaa1111", None, "'GPU-aaaa1111' is a UUID and NVML is not available"),
        ("GPU-ffff", NVML, "'GPU-ffff' matches no GPU"),
        ("GPU-", NVML, "matches several devices"),
        ("1,1", NVML, "names GPU 0000:0f:00.0 twice"),
        ("gpu0", NVML, "'gpu0' is neither an index nor"),
    ],
)
def test_select_gpus_errors(
    box: Topology, visible: str, nvml: FakeNvml | None, message: str
) -> None:
    with pytest.raises(AgentError, match="CUDA_VISIBLE_DEVICES") as caught:
        select_gpus(box, parse_visible(visible), nvml)
    assert message in str(caught.value)
    assert caught.value.code == ExitCode.USAGE


def test_uuid_of_a_gpu_sysfs_does_not_list(box: Topology) -> None:
    with pytest.raises(AgentError, match="0000:99:00.0, which sysfs does not list"):
        select_gpus(box, ["GPU-e"], FakeNvml({"GPU-eeee": "00000000:99:00.0"}))


@pytest.mark.parametrize(
    ("visible", "slurm_gpus", "count"),
    [
        (None, None, 8),
        (None, 4, 4),
        ("2,0", 4, 2),
        ("", None, 0),
        ("-1", None, 0),
        (None, 0, 0),
    ],
)
def test_gpu_count(box: Topology, visible: str | None, slurm_gpus: int | None, count: int) -> None:
    """CUDA_VISIBLE_DEVICES, else Slurm's GPUs on the node (both as the World read them), else
    sysfs."""
    assert gpu_count(parse_visible(visible), slurm_gpus, box) == count


def test_gpu_count_without_gpus_is_zero(tmp_path: Path) -> None:
    assert gpu_count(None, None, read_topology(single_node(tmp_path))) == 0


def test_this_machine() -> None:
    topology = read_topology()
    assert topology.allowed_cpus == os.sched_getaffinity(0)
    assert topology.allowed_cpus <= frozenset().union(*topology.numa_cpus.values())
    assert all(g.numa_node in topology.numa_cpus for g in topology.gpus)
