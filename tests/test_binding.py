"""Per-rank CPU sets and memory nodes for each --numa-binding mode, on fake topologies."""

from __future__ import annotations

from pathlib import Path

import pytest

from agent.errors import AgentError, ExitCode
from agent.plan.binding import Binding, default_mode, plan_bindings, split_cpus
from agent.plan.gpus import parse_visible, select_gpus
from agent.plan.rank_set import format_ranges
from agent.plan.topology import (
    Gpu,
    Topology,
    parse_cpulist,
    read_topology,
)
from tests.fake_sysfs import add_cpus, add_gpu, add_node, dgx, single_node

N0 = "0-15,32-47"
N1 = "16-31,48-63"


def cpus(text: str) -> frozenset[int]:
    return parse_cpulist(text)


def table(bindings: tuple[Binding | None, ...]) -> list[tuple[str, set[int], int] | None]:
    """(cpus, mem_nodes, omp_threads) per rank, cpus in kernel spelling for readable tables."""
    return [
        (format_ranges(b.cpus), set(b.mem_nodes), b.omp_threads) if b else None for b in bindings
    ]


def topo(root: Path, allowed: str | None = None) -> Topology:
    return read_topology(dgx(root), cpus(allowed) if allowed else None)


@pytest.mark.parametrize(
    ("mode", "visible", "allowed", "expected"),
    [
        ("off", None, None, [None] * 8),
        ("node", None, None, [(N0, {0}, 4)] * 4 + [(N1, {1}, 4)] * 4),
        ("socket", None, None, [(N0, {0}, 4)] * 4 + [(N1, {1}, 4)] * 4),
        (
            "exclusive",
            None,
            None,
            [
                ("0-3,32-35", {0}, 4),
                ("4-7,36-39", {0}, 4),
                ("8-11,40-43", {0}, 4),
                ("12-15,44-47", {0}, 4),
                ("16-19,48-51", {1}, 4),
                ("20-23,52-55", {1}, 4),
                ("24-27,56-59", {1}, 4),
                ("28-31,60-63", {1}, 4),
            ],
        ),
        ("node", "2,0", None, [(N0, {0}, 8)] * 2),
        ("exclusive", "2,0", None, [("0-7,32-39", {0}, 8), ("8-15,40-47", {0}, 8)]),
        ("node", "5,1", None, [(N1, {1}, 16), (N0, {0}, 16)]),
        ("node", "0,4", "0-7,16-23", [("0-7", {0}, 8), ("16-23", {1}, 8)]),
        ("node", None, "0-7,16-23", [("0-7", {0}, 2)] * 4 + [("16-23", {1}, 2)] * 4),
        (
            "exclusive",
            "0,1,2",
            "0-7",
            [
                ("0-2", {0}, 3),
                ("3-5", {0}, 3),
                ("6-7", {0}, 2),
            ],  # uneven: first ranks get a core more
        ),
    ],
)
def test_modes(
    tmp_path: Path, mode: str, visible: str | None, allowed: str | None, expected: list
) -> None:
    topology = topo(tmp_path, allowed)
    gpus = select_gpus(topology, parse_visible(visible))
    assert table(plan_bindings(topology, gpus, mode)) == expected


@pytest.mark.parametrize(("strict", "mem"), [(False, {0}), (True, {0})])
def test_strict_flag_and_display_node(tmp_path: Path, strict: bool, mem: set[int]) -> None:
    topology = topo(tmp_path)
    (binding,) = plan_bindings(topology, topology.gpus[:1], "node", strict=strict)
    assert binding is not None
    assert (binding.strict, set(binding.mem_nodes), binding.numa_node) == (strict, mem, 0)


def snc(root: Path) -> Topology:
    """One socket split into two NUMA nodes (sub-NUMA clustering): socket mode spans both."""
    add_cpus(root, {cpu: (0, cpu) for cpu in range(8)})
    add_node(root, 0, range(4))
    add_node(root, 1, range(4, 8))
    add_gpu(root, "0000:01:00.0", 0, range(4))
    add_gpu(root, "0000:81:00.0", 1, range(4, 8))
    return read_topology(root)


@pytest.mark.parametrize(
    ("mode", "strict", "expected"),
    [
        ("node", False, [("0-3", {0}, 4), ("4-7", {1}, 4)]),
        ("socket", False, [("0-7", {0}, 4), ("0-7", {1}, 4)]),  # prefer the GPU's own node
        ("socket", True, [("0-7", {0, 1}, 4), ("0-7", {0, 1}, 4)]),  # membind the whole socket
    ],
)
def test_socket_with_two_nodes_per_socket(
    tmp_path: Path, mode: str, strict: bool, expected: list
) -> None:
    topology = snc(tmp_path)
    assert table(plan_bindings(topology, topology.gpus, mode, strict)) == expected


def test_exclusive_on_this_machine_shape(tmp_path: Path) -> None:
    topology = read_topology(single_node(tmp_path, 2))
    bindings = plan_bindings(topology, [], "exclusive", nproc=2)
    assert table(bindings) == [("0", {0}, 1), ("1", {0}, 1)]
    assert [b.numa_node for b in bindings if b] == [None, None]


def test_exclusive_on_the_real_machine() -> None:
    topology = read_topology()
    if len(topology.allowed_cpus) < 2:
        pytest.skip("needs 2 allowed CPUs")
    first, second = plan_bindings(topology, [], "exclusive", nproc=2)
    assert first and second and first.cpus and second.cpus
    assert not first.cpus & second.cpus
    assert first.cpus | second.cpus == topology.allowed_cpus


@pytest.mark.parametrize(
    ("mode", "expected"),
    [
        ("node", [(N0, {0}, 16), (N1, {1}, 16)]),  # CPU-only ranks: blocks of ranks per node
        ("socket", [(N0, {0}, 16), (N1, {1}, 16)]),
        ("exclusive", [("0-15,32-47", {0}, 16), ("16-31,48-63", {1}, 16)]),
    ],
)
def test_ranks_without_gpus(tmp_path: Path, mode: str, expected: list) -> None:
    assert table(plan_bindings(topo(tmp_path), [None, None], mode)) == expected


def test_more_ranks_than_gpus(tmp_path: Path) -> None:
    topology = topo(tmp_path)
    bindings = plan_bindings(topology, topology.gpus[:1], "node", nproc=2)
    assert [b.numa_node for b in bindings if b] == [0, None]


def test_hyperthreads_split_when_cores_run_out(tmp_path: Path) -> None:
    add_cpus(tmp_path, {0: (0, 0), 1: (0, 0)})  # one core, two threads
    add_node(tmp_path, 0, [0, 1])
    topology = read_topology(tmp_path)
    assert split_cpus(topology, frozenset({0, 1}), 2) == [{0}, {1}]
    assert split_cpus(topology, frozenset({0, 1}), 1) == [{0, 1}]
    assert split_cpus(topology, frozenset({0, 1}), 3)[2] == frozenset()


@pytest.mark.parametrize(
    ("mode", "gpus", "allowed", "nproc", "message"),
    [
        (
            "node",
            [Gpu("0000:e1:00.0", 5, frozenset())],
            None,
            None,
            "NUMA node 5, which is not one",
        ),
        (
            "node",
            [None, None, "0000:87:00.0"],
            "0-15",
            None,
            "local rank 2 (GPU 0000:87:00.0, NUMA node 1)",
        ),
        ("socket", ["0000:87:00.0"], "0-15", None, "none of socket 1's CPUs is allowed"),
        ("exclusive", [], "0-1", 3, "3 ranks share the 2 allowed CPU(s)"),
        ("numa", [], None, 1, "unknown --numa-binding 'numa'; valid: off, node, socket, exclusive"),
    ],
)
def test_errors(
    tmp_path: Path, mode: str, gpus: list, allowed: str | None, nproc: int | None, message: str
) -> None:
    topology = topo(tmp_path, allowed)
    by_pci = {g.pci: g for g in topology.gpus}
    ranks = [by_pci[g] if isinstance(g, str) else g for g in gpus]
    with pytest.raises(AgentError) as caught:
        plan_bindings(topology, ranks, mode, nproc=nproc)
    assert message in str(caught.value)
    assert caught.value.code == ExitCode.USAGE
    assert "--numa-binding" in str(caught.value)


@pytest.mark.parametrize(
    ("allowed", "visible", "mode"),
    [
        (None, None, "node"),
        ("0-15", None, "off"),  # the allowed CPUs sit on one node: nothing to choose
        ("0-15,16", "4", "node"),
        ("0-15,16", "", "off"),  # no GPU visible
    ],
)
def test_default_mode(tmp_path: Path, allowed: str | None, visible: str | None, mode: str) -> None:
    topology = topo(tmp_path, allowed)
    assert default_mode(topology, select_gpus(topology, parse_visible(visible))) == mode


def test_default_mode_single_node_and_cpu_less_gpu_node(tmp_path: Path) -> None:
    assert default_mode(read_topology(single_node(tmp_path / "a"))) == "off"
    topology = topo(tmp_path / "b")
    stray = Gpu("0000:e1:00.0", 3, frozenset())
    assert default_mode(topology, [topology.gpus[0], stray]) == "off"  # the default never fails
